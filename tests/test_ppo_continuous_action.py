"""ppo_continuous_action.py's own tests (besides the topic tests that run on every script, and
test_end_to_end.py): observation normalisation and reward scaling (on ppolab's running statistics), and its
evaluation with the checkpoint's statistics, frozen."""

from dataclasses import asdict

import numpy as np
import pytest
import torch

import ppo_continuous_action as pca
import ppolab
from helpers import FIXED_ENV, FIXED_LENGTH


def test_running_mean_std_equals_statistics_of_all_data():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 3)) * [1, 10, 0.1] for n in (1, 7, 50, 200, 13)]
    rms = ppolab.RunningMeanStd(shape=(3,))
    for batch in batches:
        rms.update(batch)
    data = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean, data.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(rms.var, data.var(axis=0), rtol=1e-5, atol=1e-6)  # prior: var 1, count 1e-4
    assert rms.count == pytest.approx(len(data), abs=1e-3)


def test_reward_scaler_restarts_the_discounted_return_at_done():
    gamma = 0.9
    rewards = np.array([[1.0, 2.0], [3.0, -1.0], [2.0, 0.5], [4.0, 1.0], [1.0, 2.0]])
    dones = np.array([[False, False], [True, False], [False, False], [False, True], [False, False]])
    scaler = pca.RewardScaler(num_envs=2, gamma=gamma, clip=1e6)
    # discounted returns by hand: G_t = r_t + gamma * G_{t-1}, with G_{t-1} = 0 after an episode end
    seen, G, previous_done = [], np.zeros(2), np.zeros(2, bool)
    for r, d in zip(rewards, dones):
        G = r + gamma * np.where(previous_done, 0.0, G)
        seen.append(G.copy())
        previous_done = d
        scaled = scaler(r, d)
        seen_so_far = np.concatenate(seen)
        np.testing.assert_allclose(scaler.rms.mean, seen_so_far.mean(), rtol=1e-3)
        np.testing.assert_allclose(scaler.rms.var, seen_so_far.var(), rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(scaled, r / np.sqrt(scaler.rms.var + 1e-8))
    np.testing.assert_allclose(scaler.returns, np.where(dones[-1], 0.0, G))


def test_reward_scaler_clips():
    scaler = pca.RewardScaler(num_envs=1, gamma=0.99, clip=2.0)
    for _ in range(20):
        scaler(np.array([0.01]), np.array([False]))
    assert scaler(np.array([1e3]), np.array([False]))[0] == 2.0


def test_normaliser_state_round_trip_gives_identical_outputs():
    rng = np.random.default_rng(1)
    source = pca.ObsNormalizer((4,), clip=5.0)
    for _ in range(5):
        source(rng.normal(2.0, 3.0, size=(8, 4)), update=True)
    state = source.rms.state_dict()
    copy = pca.ObsNormalizer((4,), clip=5.0)
    copy.rms.load_state_dict(state)
    probe = rng.normal(2.0, 3.0, size=(16, 4))
    np.testing.assert_array_equal(copy(probe, update=False), source(probe, update=False))
    assert np.abs(source(probe, update=False)).max() <= 5.0
    source(probe * 100, update=True)  # the saved state is a copy, not a view of the live statistics
    np.testing.assert_array_equal(copy.rms.mean, state["mean"])
    assert not np.array_equal(source.rms.mean, state["mean"])


def test_normalisation_and_scaling_run_on_the_package_statistics():
    assert type(pca.ObsNormalizer((3,), clip=1.0).rms) is ppolab.RunningMeanStd
    assert type(pca.RewardScaler(num_envs=1, gamma=0.99, clip=1.0).rms) is ppolab.RunningMeanStd


def test_evaluation_normalises_with_the_checkpoint_statistics_frozen(monkeypatch):
    """evaluate() plays on observations normalised with the statistics the checkpoint holds, which it never
    updates: neither the normaliser it builds from them nor the checkpoint's data changes."""
    normalizer = pca.ObsNormalizer((2,), clip=10.0)
    normalizer(np.array([[0.0, 1.0], [2.0, 1.0], [5.0, 1.0]], np.float32), update=True)
    saved = normalizer.rms.state_dict()
    checkpoint = {
        "args": asdict(pca.Args(env_id=FIXED_ENV["ppo_continuous_action"])),
        "model": pca.Agent(2, 2).state_dict(),
        "obs_rms": normalizer.rms.state_dict(),
    }
    seen = []  # (observation, update, mean, var) at every call of an ObsNormalizer
    normalise = pca.ObsNormalizer.__call__

    def recording(self, obs, update):
        seen.append((obs.copy(), update, self.rms.mean.copy(), self.rms.var.copy()))
        return normalise(self, obs, update)

    monkeypatch.setattr(pca.ObsNormalizer, "__call__", recording)
    returns = pca.evaluate(checkpoint, episodes=3, deterministic=False, seed=0)
    assert returns == [float(FIXED_LENGTH)] * 3  # reward 1 per step, whatever the actions
    # the observation of every step the policy acted on: [t, 1] for t = 0, 1, 2 of each episode
    assert [obs[0, 0] for obs, *_ in seen] == list(range(FIXED_LENGTH)) * 3
    for _, update, mean, var in seen:
        assert not update
        np.testing.assert_array_equal(mean, saved["mean"].numpy())
        np.testing.assert_array_equal(var, saved["var"].numpy())
    for key in ("mean", "var"):
        assert torch.equal(checkpoint["obs_rms"][key], saved[key])
    assert checkpoint["obs_rms"]["count"] == saved["count"]
