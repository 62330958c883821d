"""benchmark.scores on event files written here with known values: the table follows from them."""

import re
import shutil
import sys

import numpy as np
import pytest
from torch.utils.tensorboard import SummaryWriter

from benchmark.scores import (
    aggregate_table,
    block_scores,
    group_runs,
    header,
    iqm_with_ci,
    load_references,
    normalise,
    parse_run_name,
    plot_profiles,
    published,
    table,
)
from benchmark.scores import main as scores_main


def write_run(root, seed, returns, sps, name="Fake-v0__ppo__{seed}__1700000000"):
    writer = SummaryWriter(root / name.format(seed=seed))
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


def test_runs_are_in_the_order_of_their_seeds_as_numbers(tmp_path):
    for seed in (10, 2, 1):
        write_run(tmp_path, seed, [float(seed)] * 3, sps=100)
    assert [seed for _, seed in group_runs(tmp_path)[("Fake-v0", "ppo")]] == ["1", "2", "10"]
    (row,) = [line for line in table(tmp_path, last=100).splitlines() if "Fake-v0" in line]
    assert "| 1, 2, 10 | 1.00, 2.00, 10.00 |" in row


def test_the_reference_cell_gives_the_budget_and_seeds_of_the_published_runs():
    references = load_references()
    # CleanRL's DeepMind Control numbers come from 8M-step runs of 10 seeds, its MuJoCo v4 ones from 1M and 3
    dmc = references[("ppo_continuous_action.py", "dm_control/walker-walk-v0")]
    assert published(dmc) == "392.51 ± 56.25 (8M steps, 10 seeds)"
    hopper = references[("ppo_continuous_action.py", "Hopper-v4")]
    assert published(hopper) == "2382.86 ± 271.74 (1M steps, 3 seeds)"


def test_a_written_table_names_the_command_that_wrote_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = header([str(tmp_path / "runs" / "dmc"), "--out", "results/dmc.md", "--plots", "/elsewhere/dmc"])
    assert line.startswith("Written 20")
    assert "by `python -m benchmark.scores runs/dmc --out results/dmc.md --plots /elsewhere/dmc` on " in line


def write_constant_run(root, env_id, seed, value):
    """A run of `ppo` on env_id whose every episode returns `value`."""
    writer = SummaryWriter(root / f"{env_id}__ppo__{seed}__1700000000")
    for step in range(1, 11):
        writer.add_scalar("charts/episodic_return", value, step * 10)
    writer.add_scalar("charts/SPS", 100, 100)
    writer.close()


REPS = 300  # bootstrap resamples: enough to order the interval around the IQM, quick


def test_iqm_with_bootstrap_intervals_per_env_and_over_normalised_envs(tmp_path):
    cartpole, acrobot = [100.0, 200.0, 300.0, 1000.0], [-80.0, -90.0, -100.0, -500.0]
    for seed, (c, a) in enumerate(zip(cartpole, acrobot), start=1):
        write_constant_run(tmp_path, "CartPole-v1", seed, c)
        write_constant_run(tmp_path, "Acrobot-v1", seed, a)
    write_constant_run(tmp_path, "MountainCar-v0", 1, -150.0)
    text = aggregate_table(tmp_path, last=100, reps=REPS)
    rows = {
        tuple(cells[:2]): cells[2:]
        for cells in (
            [cell.strip() for cell in line.strip("|").split("|")]
            for line in text.splitlines()
            if line.startswith("| ppo.py")
        )
    }

    def estimate(cell):
        return [float(x) for x in re.match(r"(-?[\d.]+) \[(-?[\d.]+), (-?[\d.]+)\]", cell).groups()]

    # 4 seeds: the IQM drops the lowest and the highest and averages the two in the middle
    iqm, low, high = estimate(rows[("ppo.py", "CartPole-v1")][1])
    assert iqm == 250.0 and 100.0 <= low < iqm < high <= 1000.0
    iqm, low, high = estimate(rows[("ppo.py", "Acrobot-v1")][1])
    assert iqm == -95.0 and -500.0 <= low < iqm < high <= -80.0
    # one seed, and over the environments the seeds run on every one of them (MountainCar-v0: seed 1 only), so
    # 3 normalised scores: fewer than 4, where the IQM trims none, so no row but a line that names them
    assert ("ppo.py", "MountainCar-v0") not in rows
    assert not any(", " in env for _, env in rows)
    assert (
        "No IQM of fewer than 4 seeds (it trims none of them: it would be their mean): ppo.py on MountainCar-v0 (1)."
        in text
    )
    assert (
        "No IQM of fewer than 4 seed-env scores (it trims none of them: it would be their mean): ppo.py on "
        "Acrobot-v1, CartPole-v1, MountainCar-v0 (3)." in text
    )
    assert normalise(-86.36 * 2, -86.36) == 0.0 and normalise(245.02, 490.04) == 0.5
    # with the MountainCar run removed, the block has all 4 seeds of both environments: their 8 scores normalised
    # against the published means (490.04 and -86.36), the middle 4 averaged
    normalised = sorted([c / 490.04 for c in cartpole] + [1 + (a + 86.36) / 86.36 for a in acrobot])
    for run in tmp_path.glob("MountainCar-v0__*"):
        shutil.rmtree(run)
    envs, scores = block_scores(tmp_path, 100, load_references())["ppo"]
    assert envs == ["Acrobot-v1", "CartPole-v1"] and scores.shape == (4, 2)
    iqm, low, high = iqm_with_ci(scores, reps=REPS)
    assert iqm == pytest.approx(np.mean(normalised[2:6]), abs=1e-9) and low < iqm < high
    row = f"| ppo.py | Acrobot-v1, CartPole-v1 | 4 | {iqm:.3f} [{low:.3f}, {high:.3f}] |"
    assert row in aggregate_table(tmp_path, last=100, reps=REPS)
    assert iqm_with_ci(scores, reps=REPS) == (iqm, low, high)  # a seeded bootstrap
    (profile,) = plot_profiles(tmp_path, tmp_path / "plots", 100, reps=REPS)
    assert profile.name == "profile__ppo.png" and profile.stat().st_size > 10_000


def test_branches_and_exp_names_with_double_underscores_are_read_and_what_is_left_out_is_named(tmp_path):
    """A --resume's branch `<run>__from-iteration-<i>` is a run of its seed (the run of a seed that went furthest
    counts), an --exp-name may hold `__`, and a garbage events file is named, not a row of nan."""
    write_run(tmp_path, 1, [1.0] * 3, sps=100)  # to step 30
    write_run(tmp_path, 1, [5.0] * 6, sps=100, name="Fake-v0__ppo__{seed}__1700000000__from-iteration-2")  # step 60
    write_run(tmp_path, 2, [3.0] * 3, sps=100, name="Fake-v0__my__exp__{seed}__1700000001-2")
    garbage = tmp_path / "Fake-v0__other__1__1700000002"
    garbage.mkdir()
    (garbage / "events.out.tfevents.1700000002.host").write_bytes(b"not an events file" * 10)
    assert parse_run_name("Fake-v0__ppo__1__1700000000__from-iteration-2__from-iteration-7") == (
        "Fake-v0",
        "ppo",
        "1 (from iteration 2, then 7)",
    )
    text = table(tmp_path, last=100)
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if "Fake-v0" in line and line.startswith("|")}
    assert set(rows) == {"| ppo.py", "| my__exp (--exp-name)"}
    assert "| 1 (from iteration 2) | 5.00 |" in rows["| ppo.py"]
    assert "| 2 | 3.00 |" in rows["| my__exp (--exp-name)"]
    assert "nan" not in text
    (left_out,) = [line for line in text.splitlines() if line.startswith("Not counted: ")]
    assert "Fake-v0__ppo__1__1700000000 (seed 1 counted from Fake-v0__ppo__1__1700000000__from-iteration-2" in left_out
    assert "Fake-v0__other__1__1700000002 (no episode in its event files" in left_out


@pytest.mark.parametrize("make, message", [
    (lambda root: None, "no such folder"),
    (lambda root: root.mkdir(), "no run folder below"),
    (lambda root: (root / "Fake-v0__ppo__1__1").mkdir(parents=True) or
     (root / "Fake-v0__ppo__1__1" / "events.out.tfevents.1").write_bytes(b"garbage"), "no run to count below"),
])  # fmt: skip
def test_a_missing_folder_or_nothing_to_count_is_an_error_in_one_line(tmp_path, monkeypatch, capsys, make, message):
    make(tmp_path / "runs")
    monkeypatch.setattr(sys, "argv", ["scores", str(tmp_path / "runs")])
    with pytest.raises(SystemExit) as exit:
        scores_main()
    err = capsys.readouterr().err
    assert (
        exit.value.code == 2 and err.count("\n") == 1 and err.startswith("benchmark.scores: error: ") and message in err
    )
