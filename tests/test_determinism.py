"""Same seed, same machine, CPU, same thread count: same numbers."""

import numpy as np
import torch

from helpers import load, read_scalars, tiny_args


def test_same_seed_same_run(script, tmp_path):
    runs = []
    for attempt, seed in (("a", 3), ("b", 3), ("c", 4)):
        args = tiny_args(script, tmp_path / attempt, seed=seed, checkpoint_every=3, total_timesteps=2 * 16 * 3)
        run_dir = script.main(args)
        returns = [value for _, value in read_scalars(run_dir)["charts/episodic_return"]]
        runs.append((returns, load(f"{run_dir}/checkpoint.pt")))
    (returns_a, ckpt_a), (returns_b, ckpt_b), (returns_c, ckpt_c) = runs
    assert returns_a and returns_a == returns_b
    for key, value in ckpt_a["model"].items():
        assert torch.equal(value, ckpt_b["model"][key]), key
    if "obs_rms" in ckpt_a:
        np.testing.assert_array_equal(ckpt_a["obs_rms"]["mean"], ckpt_b["obs_rms"]["mean"])
    # a different seed gives a different run, so the equality above is not vacuous
    assert any(not torch.equal(value, ckpt_c["model"][key]) for key, value in ckpt_a["model"].items())
