"""ppo_atari_lstm.py: the LSTM run over stretches between episode starts equals the usual step-by-step
loop, states reset where episodes start, the LSTM details, in-process runs on the fake game of
atari_fakes.py (truncation bootstrap, episode starts carried from one rollout into the next), and a
short run whose first minibatch replays the rollout exactly (ratio 1)."""

import pytest
import torch

import atari_fakes  # noqa: F401  (registers the FakeAtari games)
import ppo_atari_lstm as script
from helpers import (
    finished_run,
    LINE,
    METRICS,
    assert_evaluate_flag_matches_training,
    assert_evaluation_videos,
    assert_progress_lines,
    fake_atari_args,
    load,
    run_script,
)
from lstm_reference import lstm_step_by_step

T, B = 40, 3


def rollout_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(T, B, 512, generator=g, requires_grad=True)
    starts = (torch.rand(T, B, generator=g) < 0.05).float()
    starts[0, 0] = 1  # env 0 starts an episode at step 0: the carried-in state must be dropped
    starts[T // 2, 1] = 1
    state = (torch.randn(1, B, 128, generator=g), torch.randn(1, B, 128, generator=g))
    return hidden, starts, state


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_run_lstm_equals_the_step_by_step_loop_with_gradients(seed):
    torch.manual_seed(seed)
    agent = script.Agent(4)
    hidden, starts, state = rollout_inputs(seed)
    results = []
    cuts = script.episode_cuts(starts)
    # cut where episodes start (the eager update), at every step (the rollout, the compiled update), the reference
    for run in (lambda *a: agent.run_lstm(*a, cuts), agent.run_lstm, lambda *a: lstm_step_by_step(agent, *a)):
        agent.zero_grad()
        hidden.grad = None
        out, (h, c) = run(hidden, starts, state)
        (out.square().sum() + h.sum() + c.sum()).backward()
        results.append((out, h, c, hidden.grad.clone(), agent.lstm.weight_hh_l0.grad.clone()))
    assert 0 < len(cuts) < T - 1  # fewer calls than steps, or the comparison is moot
    for fast, every_step, slow in zip(*results):
        torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(every_step, slow, rtol=1e-5, atol=1e-5)


def test_episode_cuts_are_the_steps_where_some_environment_starts():
    starts = torch.zeros(6, 3)
    starts[0, 1] = starts[2, 0] = starts[2, 2] = starts[5, 1] = 1
    assert script.episode_cuts(starts) == [2, 5]  # step 0 is no cut: the sequence begins there anyway


def test_state_is_reset_where_an_episode_starts():
    torch.manual_seed(0)
    agent = script.Agent(4)
    hidden, starts, state = rollout_inputs(0)
    other = (torch.randn(1, B, 128), torch.randn(1, B, 128))
    with torch.no_grad():
        out_a, _ = agent.run_lstm(hidden, starts, state, script.episode_cuts(starts))
        out_b, _ = agent.run_lstm(hidden, starts, other, script.episode_cuts(starts))
    # env 0 starts at step 0 and env 1 at T // 2: from there on the carried-in state does not matter
    torch.testing.assert_close(out_a[:, 0], out_b[:, 0])
    torch.testing.assert_close(out_a[T // 2 :, 1], out_b[T // 2 :, 1])
    assert not torch.allclose(out_a[: T // 2, 1], out_b[: T // 2, 1])
    # and where no episode starts, the state carries over: env 2 has no start in the first steps
    first_start = int(torch.nonzero(starts[:, 2]).min()) if starts[:, 2].any() else T
    assert first_start > 0 and not torch.allclose(out_a[:first_start, 2], out_b[:first_start, 2])


def test_lstm_is_orthogonal_with_zero_biases_and_starts_from_zeros():
    agent = script.Agent(4)
    for name, param in agent.lstm.named_parameters():
        if "bias" in name:
            assert torch.count_nonzero(param) == 0, name
        else:  # (4 * 128, n) with orthonormal columns, n = 512 inputs or 128 hidden units
            torch.testing.assert_close(param.T @ param, torch.eye(param.shape[1]), atol=1e-4, rtol=0)
    h, c = agent.initial_state(5, torch.device("cpu"))
    assert h.shape == c.shape == (1, 5, 128) and not h.any() and not c.any()


def spy_on_gae(monkeypatch) -> list[dict]:
    """Records the keyword arguments of every compute_gae call of the training loop."""
    calls, real_gae = [], script.compute_gae

    def spy(**kwargs):
        calls.append({name: value.clone() if torch.is_tensor(value) else value for name, value in kwargs.items()})
        return real_gae(**kwargs)

    monkeypatch.setattr(script, "compute_gae", spy)
    return calls


@pytest.mark.parametrize(
    "env_id, max_episode_steps, bootstraps",
    [
        ("FakeAtari-v0", 12, True),  # ALE's frame limit (4 x 12 frames) cuts every game before its first lost life
        ("FakeAtariLifeLossTruncation-v0", 27_000, False),  # the frame limit falls on a lost life: terminated too
    ],
)
def test_only_truncated_and_not_terminated_episodes_bootstrap(
    env_id, max_episode_steps, bootstraps, tmp_path, monkeypatch
):
    calls = spy_on_gae(monkeypatch)
    script.main(fake_atari_args(script, tmp_path, env_id=env_id, max_episode_steps=max_episode_steps))
    dones = torch.cat([call["dones"] for call in calls]).bool()
    final_values = torch.cat([call["final_values"] for call in calls])
    assert dones.sum() >= 4
    assert (final_values[~dones] == 0).all()
    # V(final observation, state after the step) where only truncated, 0 where also terminated
    assert (final_values[dones] != 0).all() if bootstraps else (final_values[dones] == 0).all()


def test_a_rollout_starts_with_the_episode_starts_the_previous_one_ended_with(tmp_path, monkeypatch):
    """The starts of a rollout's first step are the dones of the previous rollout's last step, even once
    the dones buffer row they came from has been written again (a view of it would follow the new values)."""
    calls, real_gae = [], script.compute_gae

    def gae_then_overwrite_the_last_row(**kwargs):
        calls.append(kwargs["dones"][-1].clone())
        result = real_gae(**kwargs)
        kwargs["dones"][-1] = 1 - kwargs["dones"][-1]  # the row is overwritten before the next rollout reads starts
        return result

    starts_seen, real_act = [], script.Agent.act

    def act(self, x, starts, state):
        starts_seen.append(starts.clone())
        return real_act(self, x, starts, state)

    monkeypatch.setattr(script, "compute_gae", gae_then_overwrite_the_last_row)
    monkeypatch.setattr(script.Agent, "act", act)
    # a 5-step limit: episodes end at the last step of a rollout too
    script.main(fake_atari_args(script, tmp_path, num_steps=5, total_timesteps=2 * 5 * 6, max_episode_steps=5))
    assert len(calls) == 6 and len(starts_seen) == 6 * 5
    assert torch.cat(calls).any()  # some rollout ended an episode at its last step
    for iteration in range(1, 6):
        torch.testing.assert_close(starts_seen[5 * iteration], calls[iteration - 1], rtol=0, atol=0)


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    """A short run whose 20-step time limit starts episodes inside every rollout."""
    cwd = tmp_path_factory.mktemp("lstm")
    result = run_script(
        "ppo_atari_lstm",
        "--env-id",
        "Breakout",
        "--num-envs",
        2,
        "--num-steps",
        48,
        "--num-minibatches",
        2,
        "--total-timesteps",
        3 * 96,
        "--max-episode-steps",
        20,
        "--save-model",
        "--eval-episodes",
        2,
        "--checkpoint-every",
        1,
        cwd=cwd,
    )
    assert result.returncode == 0, result.stderr
    return finished_run(result, cwd)


def test_first_minibatch_replays_the_rollout(e2e):
    scalars = e2e["scalars"]
    assert not [tag for tag in METRICS if tag not in scalars]
    assert load(e2e["run_dir"] / "model.pt")["global_step"] == 3 * 96
    # episodes started inside the rollouts (20-step limit), so the replay had states to reset
    lengths = [value for _, value in scalars["charts/episodic_length"]]
    assert len(lengths) >= 8 and max(lengths) <= 20
    deviations = [value for _, value in scalars["debug/first_minibatch_ratio_deviation"]]
    assert len(deviations) == 3 and max(deviations) < 1e-5


def test_stdout_has_a_line_per_iteration_with_episodes(e2e):
    assert_progress_lines(e2e["result"].stdout, LINE, e2e["scalars"]["charts/episodic_return"], 3, 96)


def test_evaluate_flag_plays_the_same_games_as_after_training(e2e):
    assert_evaluate_flag_matches_training("ppo_atari_lstm", e2e, episodes=2)


def test_minibatch_count_must_divide_the_envs(tmp_path):
    result = run_script("ppo_atari_lstm", "--num-envs", 6, "--num-minibatches", 4, cwd=tmp_path)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert "--num-minibatches 4 does not divide --num-envs 6" in line


def test_evaluate_capture_video_records_the_first_game(e2e, capsys):
    assert_evaluation_videos(script, e2e["run_dir"] / "model.pt", 1, 1, capsys)
