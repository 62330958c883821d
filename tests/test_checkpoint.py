"""Checkpoints of ppo.py and ppo_continuous_action.py: round trip of everything saved (normalisation
statistics included), through the package. A run killed by SIGKILL and resumed: test_ppo.py; every script's
checkpoint and resume: test_contract.py."""

import random

import numpy as np
import pytest
import torch

from helpers import tiny_args
from ppolab.checkpoints import (
    checkpoint_data,
    load_checkpoint,
    read_checkpoint,
    restore,
    write_checkpoint_file,
)


def test_checkpoint_round_trip(script, tmp_path):
    """A script's objects (agent, Adam, the continuous script's statistics) through a checkpoint file and
    back (ppolab.checkpoints: checkpoint_data, write_checkpoint_file, load_checkpoint, restore): everything
    restored, the RNG states included, so the next update is the same on both sides."""
    continuous = hasattr(script, "ObsNormalizer")
    args = tiny_args(script, tmp_path, seed=7, learning_rate=1e-3)
    obs_dim, act_dim = 3, 2

    def objects():
        agent = script.Agent(obs_dim, act_dim)
        saved = {"model": agent, "optimizer": torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)}
        if continuous:
            saved.update(
                obs_rms=script.ObsNormalizer((obs_dim,), 10.0).rms, reward_rms=script.RewardScaler(1, 0.99, 10.0).rms
            )
        return saved

    saved, x = objects(), torch.randn(5, obs_dim)
    saved["model"].get_value(x).square().mean().backward()
    saved["optimizer"].step()  # non-empty optimizer state
    if continuous:
        saved["obs_rms"].update(np.random.default_rng(0).normal(size=(9, obs_dim)))
        saved["reward_rms"].update(np.array([2.5]))
    random.seed(11), np.random.seed(11), torch.manual_seed(11)
    rng = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    path = str(tmp_path / "checkpoint.pt")
    write_checkpoint_file(checkpoint_data(saved, args, 5, 1234), path)

    checkpoint = load_checkpoint(path, f"{script.__name__}.py")
    assert checkpoint["iteration"] == 5 and checkpoint["global_step"] == 1234
    assert script.Args(**checkpoint["args"]) == args
    restored = objects()
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    assert restore(checkpoint, restored) == (6, 1234)
    assert torch.equal(torch.get_rng_state(), rng[0])
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), rng[1]))
    assert random.getstate() == rng[2]
    if continuous:
        for key in ("obs_rms", "reward_rms"):
            np.testing.assert_array_equal(restored[key].mean, saved[key].mean)
            np.testing.assert_array_equal(restored[key].var, saved[key].var)
            assert restored[key].count == saved[key].count

    # weights and optimizer state restored: the same next update on both copies gives the same weights
    for objects_ in (saved, restored):
        objects_["optimizer"].zero_grad()
        objects_["model"].get_value(x).square().mean().backward()
        objects_["optimizer"].step()
    for (name, p), q in zip(saved["model"].state_dict().items(), restored["model"].state_dict().values()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("delay, refused", [(0.0, False), (0.05, True)])
def test_a_retired_flag_at_its_neutral_value_is_read_as_absent_and_any_other_value_refused(tmp_path, delay, refused):
    """ppo_atari_multigpu.py's --straggler-delay left Args (tests inject a straggler from outside): a checkpoint that
    holds it at 0 (no delay, what every training run had) reads as if it never had it; one trained with a delay is
    refused in one line, not a TypeError from Args."""
    import ppo_atari_multigpu

    model = torch.nn.Linear(2, 1)
    args = ppo_atari_multigpu.Args()
    saved = {"model": model, "optimizer": torch.optim.Adam(model.parameters())}
    checkpoint = checkpoint_data(saved, args, iteration=1, global_step=8)
    checkpoint["args"]["straggler_delay"] = delay
    write_checkpoint_file(checkpoint, str(tmp_path / "checkpoint.pt"))
    read = read_checkpoint(str(tmp_path / "checkpoint.pt"), "ppo_atari_multigpu.py", ppo_atari_multigpu.Args)
    if refused:
        assert isinstance(read, str) and "was trained with --straggler-delay 0.05, which this" in read, read
    else:
        assert isinstance(read, dict) and "straggler_delay" not in read["args"]
        assert ppo_atari_multigpu.Args(**read["args"]) == args
