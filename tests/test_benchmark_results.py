"""benchmark.results on event files written here with known values: the table follows from them."""

import re

import numpy as np
from torch.utils.tensorboard import SummaryWriter

from benchmark.results import table


def write_run(root, seed, returns, sps):
    writer = SummaryWriter(root / f"Fake-v0__ppo__{seed}__1700000000")
    for step, value in enumerate(returns, start=1):
        writer.add_scalar("charts/episodic_return", value, step * 10)
    writer.add_scalar("charts/SPS", sps, len(returns) * 10)
    writer.close()


def test_table_has_last_episodes_mean_per_seed_and_mean_std_over_seeds(tmp_path):
    rng = np.random.default_rng(0)
    runs = {seed: rng.normal(100 * seed, 5, size=150).round(2) for seed in (1, 2, 3)}
    for seed, returns in runs.items():
        write_run(tmp_path, seed, returns, sps=1000 * seed)
    (row,) = [line for line in table(tmp_path, last=100).splitlines() if "Fake-v0" in line]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    per_seed = np.array([float(x) for x in cells[3].split(",")])
    expected = np.array([runs[seed][-100:].mean() for seed in (1, 2, 3)])
    np.testing.assert_allclose(per_seed, expected, atol=0.01)
    mean, std = map(float, re.match(r"(-?[\d.]+) ± ([\d.]+)", cells[4]).groups())
    assert abs(mean - expected.mean()) < 0.01 and abs(std - expected.std()) < 0.01
    assert cells[5] == "1,500" and float(cells[7]) == 2000  # final step and mean SPS
