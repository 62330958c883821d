"""benchmark.studies.cleanrl parity's table from run folders written here: a run's score is the mean of the games that end
in its last `window` steps, each pair sets every seed of both sides beside each other, and the verdict follows the
seeds' spread; `run` starts only what is asked and stops its jobs on SIGTERM."""

import os
import signal
import subprocess
import sys
import time

from torch.utils.tensorboard import SummaryWriter

from benchmark.studies import cleanrl as cleanrl_parity
from helpers import REPO, alive, still_alive


def write_run(root, name, games):
    """A run folder as the scripts name it, with `charts/episodic_return` at the given (step, score) points."""
    writer = SummaryWriter(str(root / name))
    for step, value in games:
        writer.add_scalar("charts/episodic_return", value, step)
    writer.close()


def test_the_score_counts_only_the_games_that_end_in_the_last_window(tmp_path):
    write_run(tmp_path, "BreakoutNoFrameskip-v4__ppo_atari__1__1", [(10_000, 100.0), (260_000, 4.0), (300_000, 8.0)])
    mean, games, last = cleanrl_parity.parity_score(tmp_path / "BreakoutNoFrameskip-v4__ppo_atari__1__1", 50_000)
    assert (mean, games, last) == (6.0, 2, 300_000)


def test_the_verdict_compares_the_gap_with_the_larger_spread():
    assert cleanrl_parity.parity_verdict([10.0, 12.0], [11.0, 13.0]) == "at parity"
    assert cleanrl_parity.parity_verdict([20.0, 21.0], [10.0, 11.0]) == "ours higher"
    assert cleanrl_parity.parity_verdict([10.0, 11.0], [20.0, 21.0]) == "ours lower: follow it to its cause"
    assert cleanrl_parity.parity_verdict([10.0], [20.0, 21.0]) == "too few seeds"


def test_the_table_sets_both_sides_of_each_pair_beside_each_other(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "cleanrl" / "runs"
    for seed, score in ((1, 10.0), (2, 14.0)):
        write_run(ours, f"BreakoutNoFrameskip-v4__ppo_atari__{seed}__1", [(300_000, score)])
        write_run(theirs, f"BreakoutNoFrameskip-v4__ppo_atari__{seed}__1", [(300_000, score + 30.0)])
        write_run(ours, f"BreakoutNoFrameskip-v4__ppo_atari_multigpu__{seed}__1", [(300_000, score + 1.0)])
    text = cleanrl_parity.parity_table(ours, theirs, 50_000, 300_000)
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()}
    assert rows["ppo_atari.py"].startswith(
        "| ppo_atari.py | CleanRL's ppo_atari.py | 10.00 (seed 1, 1 games, 300,000 steps), 14.00 (seed 2, 1 games, "
        "300,000 steps) | 40.00 (seed 1, 1 games, 300,000 steps), 44.00 (seed 2, 1 games, 300,000 steps) "
        "| 12.00 ± 2.00 | 42.00 ± 2.00 | ours lower"
    )
    assert rows["ppo_atari_multigpu.py"].endswith("| 13.00 ± 2.00 | 12.00 ± 2.00 | at parity |")
    assert "| ppo_atari_lstm.py | CleanRL's ppo_atari_lstm.py | not run | not run |" in text


def test_an_unfinished_run_is_listed_but_not_counted_and_a_rerun_of_its_seed_supersedes_it(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "cleanrl" / "runs"
    write_run(ours, "Breakout-v5__ppo_atari_envpool__1__1", [(299_008, 10.0)])
    write_run(ours, "Breakout-v5__ppo_atari_envpool__2__1", [(9_210, 2.0)])  # stopped early
    write_run(ours, "Breakout-v5__ppo_atari_envpool__3__1", [(9_210, 2.0)])  # stopped early, then run again:
    write_run(ours, "Breakout-v5__ppo_atari_envpool__3__2", [(299_008, 12.0)])
    write_run(theirs, "Breakout-v5__ppo_atari_envpool__1__1", [(299_008, 11.0)])
    write_run(theirs, "Breakout-v5__ppo_atari_envpool__2__1", [(299_008, 13.0)])
    text = cleanrl_parity.parity_table(ours, theirs, 50_000, 300_000)
    (row,) = [line for line in text.splitlines() if line.startswith("| ppo_atari_envpool.py")]
    assert row == (
        "| ppo_atari_envpool.py | CleanRL's ppo_atari_envpool.py | 10.00 (seed 1, 1 games, 299,008 steps), "
        "unfinished (seed 2, 9,210 steps), 12.00 (seed 3, 1 games, 299,008 steps) | 11.00 (seed 1, 1 games, "
        "299,008 steps), 13.00 (seed 2, 1 games, 299,008 steps) | 11.00 ± 1.00 | 12.00 ± 1.00 | at parity |"
    )


def test_run_starts_only_the_scripts_asked_for_and_skips_the_finished_ones(tmp_path):
    python = tmp_path / "venv" / "bin" / "python"  # stands in for CleanRL's virtualenv: says what it was asked
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\necho "$@" >> "$0.calls"\n')
    python.chmod(0o755)
    calls = tmp_path / "venv" / "bin" / "python.calls"
    assert cleanrl_parity.parity_run(tmp_path / "venv", tmp_path / "runs", 2048, [1, 2], 1, ["ppo_atari_envpool"]) == 0
    lines = calls.read_text().splitlines()
    assert len(lines) == 2 and all(
        line.startswith("-m cleanrl.ppo_atari_envpool --total-timesteps 2048") for line in lines
    )
    assert [line.split("--seed ")[1].split()[0] for line in lines] == ["1", "2"]
    assert cleanrl_parity.parity_run(tmp_path / "venv", tmp_path / "runs", 2048, [1, 2], 1, ["ppo_atari_envpool"]) == 0
    assert len(calls.read_text().splitlines()) == 2  # both finished: not run again


def test_run_stops_its_jobs_on_sigterm_and_dies_of_sigint(tmp_path):
    """SIGTERM (what `bash benchmark/ppo.sh` sends on Ctrl-C) ends `run` as Ctrl-C does: its jobs stopped, then the
    process itself ended by SIGINT, which tells a calling shell that it was interrupted."""
    python = tmp_path / "venv" / "bin" / "python"  # stands in for CleanRL's virtualenv: a job that waits
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\necho $$ > "$0.pid.tmp"; mv "$0.pid.tmp" "$0.pid"; exec sleep 60\n')
    python.chmod(0o755)
    argv = [sys.executable, "-m", "benchmark.studies.cleanrl", "parity", "run", "--venv", str(tmp_path / "venv")]
    argv += ["--runs-dir", str(tmp_path / "runs"), "--seeds", "1", "--scripts", "ppo_atari_envpool"]
    runner = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid_file = python.parent / "python.pid"
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and runner.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        job = int(pid_file.read_text())
        runner.send_signal(signal.SIGTERM)
        _, stderr = runner.communicate(timeout=30)
        assert runner.returncode == -signal.SIGINT and "interrupted" in stderr, stderr
        assert not still_alive([job])
    finally:
        runner.kill()
        if pid_file.exists() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_the_plots_draw_only_the_runs_the_table_counts(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "cleanrl" / "runs"
    games = [(k * 30_000, float(k)) for k in range(1, 11)]
    for seed in (1, 2):
        write_run(ours, f"Breakout-v5__ppo_atari_envpool__{seed}__1", games)
        write_run(theirs, f"Breakout-v5__ppo_atari_envpool__{seed}__1", games)
    write_run(ours, "BreakoutNoFrameskip-v4__ppo_atari_lstm__1__1", [(1_000, 1.0), (9_000, 2.0)])  # stopped early
    write_run(theirs, "BreakoutNoFrameskip-v4__ppo_atari_lstm__1__1", games)
    write_run(ours, "BreakoutNoFrameskip-v4__ppo_atari__1__1", games)  # the multigpu pair's other side only
    written = cleanrl_parity.parity_plots(ours, theirs, tmp_path / "plots", 300_000, window=1)
    assert [path.name for path in written] == ["ppo_atari_envpool.png"]  # both sides finished: the only pair drawn
