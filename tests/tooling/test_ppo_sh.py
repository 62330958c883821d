"""benchmark/ppo.sh: the classic-control block in quick mode end to end (runs, logs, table, plots),
block selection, skipping a script that is not in the repository, and stopping a block (Ctrl-C, SIGTERM)."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, alive, default_ctrl_c, still_alive

pytestmark = pytest.mark.exclusive  # lanes of jobs side by side, stopped by signals; the process table

CLASSIC = ["CartPole-v1", "Acrobot-v1", "MountainCar-v0"]


def ppo_sh(script, tmp_path, **variables) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        RUNS_DIR=str(tmp_path / "runs"),
        RESULTS_DIR=str(tmp_path / "results"),
        **variables,
    )
    return subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_quick_classic_block_runs_every_env_and_writes_the_table_and_plots(tmp_path):
    result = ppo_sh(REPO / "benchmark" / "ppo.sh", tmp_path, QUICK="1", BLOCKS="classic", SEEDS="1", WORKERS="2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "classic needs: gymnasium[classic-control]" in result.stdout
    runs = sorted(p.name.split("__")[0] for p in (tmp_path / "runs" / "classic").iterdir() if p.name != "logs")
    assert runs == sorted(CLASSIC)
    assert all((tmp_path / "runs" / "classic" / "logs" / "ppo" / f"{env_id}__1.log").exists() for env_id in CLASSIC)
    rows = {}
    # the command that wrote it, the mean ± std table, then the IQMs
    header, table, aggregates = (tmp_path / "results" / "classic.md").read_text().split("\n\n", 2)
    assert header.startswith("Written ") and "by `python -m benchmark.scores " in header and "--out " in header
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0] == "ppo.py":
            rows[cells[1]] = cells
    # one seed: no IQM (it would trim nothing), the groups named instead
    assert (
        "No IQM of fewer than 4 seeds (it trims none of them: it would be their mean): ppo.py on Acrobot-v1 (1);"
        in aggregates
    )
    assert (
        "seed-env scores (it trims none of them: it would be their mean): ppo.py on Acrobot-v1, CartPole-v1, MountainCar-v0 (3)."
        in aggregates
    )
    assert (tmp_path / "results" / "classic" / "profile__ppo.png").read_bytes().startswith(b"\x89PNG")
    assert sorted(rows) == sorted(CLASSIC)
    for env_id, cells in rows.items():
        assert cells[2] == "1" and cells[5] == "2,048"  # one seed, the quick step budget
    assert rows["CartPole-v1"][8] == "490.04 ± 6.12 (500k steps, 3 seeds)"
    png = tmp_path / "results" / "classic" / "CartPole-v1__ppo.png"
    assert png.read_bytes().startswith(b"\x89PNG")


def test_an_unknown_block_fails_before_anything_runs(tmp_path):
    result = ppo_sh(REPO / "benchmark" / "ppo.sh", tmp_path, BLOCKS="classic nonsense")
    assert result.returncode == 2 and "unknown block 'nonsense'" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_a_script_not_in_the_repository_is_skipped_with_a_message(tmp_path):
    # ppo.sh in a repository that holds none of the scripts
    (tmp_path / "repo" / "benchmark").mkdir(parents=True)
    script = shutil.copy(REPO / "benchmark" / "ppo.sh", tmp_path / "repo" / "benchmark" / "ppo.sh")
    result = ppo_sh(script, tmp_path, BLOCKS="procgen multigpu")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "procgen needs: envpool" in result.stdout and "libqt5gui5" in result.stdout
    assert "skipping ppo_procgen.py, which is not in this repository yet" in result.stdout
    assert "skipping ppo_atari_multigpu.py, which is not in this repository yet" in result.stdout
    assert not (tmp_path / "runs").exists()


FAKE_PPO = """import os, sys
runs_dir, env_id = sys.argv[sys.argv.index("--runs-dir") + 1], sys.argv[sys.argv.index("--env-id") + 1]
os.makedirs(f"{runs_dir}/{env_id}__fake", exist_ok=True)
"""


def fake_repo(path, scripts: dict[str, str]):
    """A repository at `path`: our benchmark/ folder (no results) beside the given scripts (name: source)."""
    shutil.copytree(REPO / "benchmark", path / "benchmark", ignore=shutil.ignore_patterns("results", "__pycache__"))
    for name, source in scripts.items():
        (path / name).write_text(source)


def test_runs_go_to_the_folder_it_is_started_from_and_printed_paths_exist_from_there(tmp_path):
    """ppo.sh started from another folder than the repository (the default RUNS_DIR, relative): the run
    folders are made there, and the folders it prints exist from there (here a repository whose ppo.py
    only makes its run folder)."""
    repo, user = tmp_path / "repo", tmp_path / "user"
    fake_repo(repo, {"ppo.py": FAKE_PPO})
    user.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RUNS_DIR", "RESULTS_DIR")}
    result = subprocess.run(
        ["bash", str(repo / "benchmark" / "ppo.sh")],
        cwd=user,
        capture_output=True,
        text=True,
        env=dict(env, PYTHON=sys.executable, QUICK="1", BLOCKS="classic", SEEDS="1", WORKERS="2"),
        timeout=120,
    )
    runs = user / "runs" / "benchmark-quick" / "classic"
    assert sorted(p.name for p in runs.iterdir() if p.name != "logs") == sorted(f"{e}__fake" for e in CLASSIC)
    assert not (repo / "runs").exists()
    printed = [line.split(" logs in ")[1].split("/:")[0] for line in result.stdout.splitlines() if " logs in " in line]
    printed.append(result.stdout.split("== runs and logs go to ")[1].split("/<block>/")[0])
    assert len(printed) == 2
    for path in printed:
        assert (user / path).is_dir(), (path, result.stdout)


# a training job that only says it started (its process and its runner's, by env id) and then waits to be stopped
SLOW_JOB = """import os, sys, time
started = os.path.join(os.environ["STARTED"], os.path.basename(sys.argv[0]) + "__" + sys.argv[sys.argv.index("--env-id") + 1])
with open(started + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {os.getppid()}")
os.rename(started + ".tmp", started)
time.sleep(300)
"""


@pytest.mark.parametrize("stop", ["ctrl-c", "sigint", "sigterm", "a runner stopped"])
def test_a_stopped_fullbudget_block_stops_both_lanes_and_starts_no_next_job(tmp_path, stop):
    """The two-lane block, stopped while each lane runs its first job: by Ctrl-C at a terminal (SIGINT to the whole
    process group), by SIGINT or SIGTERM to ppo.sh alone (`kill`), or by SIGTERM to the runner of one lane. Every job,
    runner and the curve watcher end within seconds, ppo.sh exits 130, and neither lane starts its next job."""
    repo, started = tmp_path / "repo", tmp_path / "started"
    scripts = ("ppo_shared_memory_lstm.py", "ppo_atari_lstm.py", "ppo_atari.py", "ppo_atari_envpool.py")
    fake_repo(repo, {name: SLOW_JOB for name in scripts})
    started.mkdir()
    env = dict(os.environ, PYTHON=sys.executable, QUICK="1", RUNS_DIR=str(tmp_path / "runs"), STARTED=str(started))
    block = subprocess.Popen(
        ["bash", str(repo / "benchmark" / "ppo.sh"), "fullbudget"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal gives a command
        preexec_fn=default_ctrl_c,
    )
    first = {"ppo_shared_memory_lstm.py__CartPole-v1", "ppo_atari_lstm.py__Breakout"}
    try:
        deadline = time.monotonic() + 60
        while {p.name for p in started.iterdir()} != first and block.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert {p.name for p in started.iterdir()} == first, block.communicate(timeout=30)[0]
        jobs = {name: [int(n) for n in (started / name).read_text().split()] for name in first}
        if stop == "ctrl-c":
            os.killpg(block.pid, signal.SIGINT)
        elif stop in ("sigint", "sigterm"):
            os.kill(block.pid, signal.SIGINT if stop == "sigint" else signal.SIGTERM)
        else:
            os.kill(jobs["ppo_atari_lstm.py__Breakout"][1], signal.SIGTERM)
        output = block.communicate(timeout=60)[0]
        assert block.returncode == 130, output
        assert "ppo.sh: interrupted" in output
        assert not still_alive([pid for pids in jobs.values() for pid in pids]), output
        time.sleep(2)  # a next job would have started by now
        assert {p.name for p in started.iterdir()} == first, output
    finally:
        if block.poll() is None:
            os.killpg(block.pid, signal.SIGKILL)
        for path in started.iterdir():
            for pid in map(int, path.read_text().split()):
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
