"""Checkpoints of ppo.py and ppo_continuous_action.py: round trip of everything saved (normalisation
statistics included), resume after SIGKILL. Every script's checkpoint and resume: test_contract.py."""

import random
import signal
import time

import numpy as np
import torch

from helpers import REAL_ENV, load, only_run_dir, run_script, start_script, tiny_args


def test_checkpoint_round_trip(script, tmp_path):
    continuous = hasattr(script, "ObsNormalizer")
    args = tiny_args(script, tmp_path, seed=7, learning_rate=1e-3)
    obs_dim, act_dim = 3, 2
    agent = script.Agent(obs_dim, act_dim)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    x = torch.randn(5, obs_dim)
    agent.get_value(x).square().mean().backward()
    optimizer.step()  # non-empty optimizer state
    extra = {}
    if continuous:
        obs_normalizer, reward_scaler = script.ObsNormalizer((obs_dim,), 10.0), script.RewardScaler(1, 0.99, 10.0)
        obs_normalizer(np.random.default_rng(0).normal(size=(9, obs_dim)), update=True)
        reward_scaler(np.array([2.5]), np.array([False]))
        extra = dict(obs_normalizer=obs_normalizer, reward_scaler=reward_scaler)
    random.seed(11), np.random.seed(11), torch.manual_seed(11)
    rng = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    path = str(tmp_path / "checkpoint.pt")
    script.save_checkpoint(path, agent, optimizer, args, 5, 1234, **extra)

    checkpoint = script.load_checkpoint(path)
    assert checkpoint["iteration"] == 5 and checkpoint["global_step"] == 1234
    assert script.Args(**checkpoint["args"]) == args
    assert torch.equal(checkpoint["rng"]["torch"], rng[0])
    assert all(np.array_equal(a, b) for a, b in zip(checkpoint["rng"]["numpy"], rng[1]))
    assert checkpoint["rng"]["python"] == rng[2]
    if continuous:
        for key, rms in (("obs_rms", obs_normalizer.rms), ("reward_rms", reward_scaler.rms)):
            np.testing.assert_array_equal(checkpoint[key]["mean"], rms.mean)
            np.testing.assert_array_equal(checkpoint[key]["var"], rms.var)
            assert checkpoint[key]["count"] == rms.count

    # weights and optimizer state restored: the same next update on both copies gives the same weights
    restored = script.Agent(obs_dim, act_dim)
    restored.load_state_dict(checkpoint["model"])
    restored_optimizer = torch.optim.Adam(restored.parameters(), lr=args.learning_rate, eps=1e-5)
    restored_optimizer.load_state_dict(checkpoint["optimizer"])
    for a, opt in ((agent, optimizer), (restored, restored_optimizer)):
        opt.zero_grad()
        a.get_value(x).square().mean().backward()
        opt.step()
    for (name, p), q in zip(agent.state_dict().items(), restored.state_dict().values()):
        assert torch.equal(p, q), name


def test_resume_after_sigkill(tmp_path):
    total, batch = 3000, 4 * 32
    proc = start_script(
        "ppo",
        "--env-id",
        REAL_ENV["ppo"],
        "--total-timesteps",
        total,
        "--num-steps",
        32,
        "--checkpoint-every",
        1,
        "--save-model",
        "--eval-episodes",
        1,
        "--runs-dir",
        tmp_path,
        cwd=tmp_path,
    )
    deadline = time.time() + 120
    while not list(tmp_path.glob("*/checkpoint.pt")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    run_dir = only_run_dir(tmp_path)
    assert not (run_dir / "model.pt").exists()
    killed_at = load(run_dir / "checkpoint.pt")["global_step"]
    assert killed_at < total // batch * batch

    result = run_script("ppo", "--resume", run_dir / "checkpoint.pt", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "resumed from" in result.stdout
    assert load(run_dir / "model.pt")["global_step"] == total // batch * batch
