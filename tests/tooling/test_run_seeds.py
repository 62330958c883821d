"""benchmark.run_seeds on a tiny job written here: every (env, seed) pair runs with one thread and its own
log, a failing job is reported and fails the run, jobs overlap up to --workers, Ctrl-C kills them."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, alive, default_ctrl_c, still_alive

pytestmark = pytest.mark.exclusive  # jobs side by side, their timing and Ctrl-C

JOB = """
import json, os, subprocess, sys, time
out, seconds, spawn = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "spawn"
env_id, seed = sys.argv[sys.argv.index("--env-id") + 1], sys.argv[sys.argv.index("--seed") + 1]
name = os.path.join(out, f"{env_id}__{seed}")
start = time.time()
child = subprocess.Popen(["sleep", "60"]) if spawn else None
with open(name + ".pids", "w") as f:
    f.write(" ".join(str(p) for p in (os.getpid(), child and child.pid) if p))
print(f"job {env_id} seed {seed} started", flush=True)
time.sleep(seconds)
with open(name + ".json", "w") as f:
    json.dump({"start": start, "end": time.time(), "omp": os.environ.get("OMP_NUM_THREADS")}, f)
if env_id.startswith("Bad"):
    print(f"error: cannot make {env_id}")
    sys.exit(3)
"""


@pytest.fixture
def job(tmp_path):
    """The runner's command line for the job: `python job.py OUT SECONDS MODE`."""
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "out").mkdir()
    return lambda seconds, mode="plain": f"{sys.executable} {tmp_path / 'job.py'} {tmp_path / 'out'} {seconds} {mode}"


def runner_argv(command, env_ids, seeds, workers, logs):
    return [
        sys.executable,
        "-m",
        "benchmark.run_seeds",
        "--command",
        command,
        "--env-ids",
        *env_ids,
        "--seeds",
        *map(str, seeds),
        "--workers",
        str(workers),
        "--logs",
        str(logs),
    ]


def run_runner(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="4")  # the jobs get 1 whatever the caller has
    return subprocess.run(runner_argv(*args), cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def records(tmp_path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (tmp_path / "out").glob("*.json")}


def test_every_env_and_seed_runs_with_one_thread_and_its_own_log(tmp_path, job):
    result = run_runner(job(0.1), ["A-v0", "B-v0"], [1, 2], 2, tmp_path / "logs")
    assert result.returncode == 0, result.stdout + result.stderr
    runs = records(tmp_path)
    assert sorted(runs) == ["A-v0__1", "A-v0__2", "B-v0__1", "B-v0__2"]
    assert {run["omp"] for run in runs.values()} == {"1"}
    log = (tmp_path / "logs" / "B-v0__2.log").read_text().splitlines()
    assert log[0].startswith("$ ") and log[0].endswith("--env-id B-v0 --seed 2")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert re.fullmatch(rf"# code: {commit}(\+uncommitted)? at \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC", log[1]), log[1]
    assert log[2] == "job B-v0 seed 2 started"
    assert result.stdout.count(" done ") == 4 and "4 jobs in" in result.stdout and "4 done, 0 failed" in result.stdout


def test_a_failing_job_is_reported_with_its_log_and_fails_the_run(tmp_path, job):
    result = run_runner(job(0.1), ["A-v0", "Bad-v0"], [1], 2, tmp_path / "logs")
    assert result.returncode == 1
    assert sorted(records(tmp_path)) == ["A-v0__1", "Bad-v0__1"]  # the other job ran to its end
    summary = result.stdout[result.stdout.index("2 jobs in") :]
    assert "1 done, 1 failed" in summary
    assert f"FAILED Bad-v0 seed 1 (exit 3): {tmp_path / 'logs' / 'Bad-v0__1.log'}" in summary
    assert "last line: error: cannot make Bad-v0" in summary
    assert "A-v0" not in summary


def test_a_command_that_cannot_start_fails_its_job(tmp_path):
    result = run_runner(str(tmp_path / "no-such-program"), ["A-v0"], [1], 1, tmp_path / "logs")
    assert result.returncode == 1 and "FAILED A-v0 seed 1 (exit 127)" in result.stdout


@pytest.mark.parametrize("command, why", [("python 'x", "No closing quotation"), ("  ", "it is empty")])
def test_a_malformed_command_is_refused_in_one_line_before_any_job(tmp_path, command, why):
    result = run_runner(command, ["A-v0"], [1], 1, tmp_path / "logs")
    assert result.returncode == 2 and result.stdout == "" and not (tmp_path / "logs").exists()
    assert result.stderr == f"benchmark.run_seeds: error: --command {command!r}: {why}\n"


@pytest.mark.parametrize("workers", [1, 2])
def test_jobs_overlap_up_to_the_number_of_workers(tmp_path, job, workers):
    result = run_runner(job(1.0), ["A-v0", "B-v0", "C-v0"], [1], workers, tmp_path / "logs")
    assert result.returncode == 0, result.stdout + result.stderr
    runs = list(records(tmp_path).values())
    # the most jobs running at one time: at some job's start, those that started and have not ended
    most = max(sum(r["start"] <= run["start"] < r["end"] for r in runs) for run in runs)
    assert len(runs) == 3 and most == workers


def test_ctrl_c_kills_the_running_jobs_and_their_children(tmp_path, job):
    runner = subprocess.Popen(
        runner_argv(job(60, "spawn"), ["A-v0", "B-v0"], [1], 2, tmp_path / "logs"),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_ctrl_c,
    )
    pid_files = [tmp_path / "out" / f"{env_id}__1.pids" for env_id in ("A-v0", "B-v0")]
    deadline = time.time() + 30
    while not all(p.exists() and len(p.read_text().split()) == 2 for p in pid_files):
        assert time.time() < deadline and runner.poll() is None
        time.sleep(0.1)
    pids = [int(pid) for p in pid_files for pid in p.read_text().split()]  # two jobs and their children
    assert all(alive(pid) for pid in pids)
    runner.send_signal(signal.SIGINT)
    _, stderr = runner.communicate(timeout=20)
    assert runner.returncode != 0 and "interrupted" in stderr
    assert not still_alive(pids)
    assert not records(tmp_path)  # no job got to its end


RESUMABLE = """
import json, os, sys
out = sys.argv[1]
env_id, seed = sys.argv[sys.argv.index("--env-id") + 1], sys.argv[sys.argv.index("--seed") + 1]
folder = os.path.join(out, f"{env_id}__{seed}")
os.makedirs(folder, exist_ok=True)
print(f"run folder: {folder}", flush=True)
with open(folder + ".runs", "a") as f:
    f.write(json.dumps(sys.argv[2:]) + "\\n")
open(os.path.join(folder, "checkpoint.pt"), "w").close()
sys.exit(3 if env_id.startswith("Bad") and "--resume" not in sys.argv else 0)
"""


def test_resume_skips_finished_jobs_and_continues_the_others_from_their_checkpoint(tmp_path):
    (tmp_path / "job.py").write_text(RESUMABLE)
    (tmp_path / "out").mkdir()
    command = f"{sys.executable} {tmp_path / 'job.py'} {tmp_path / 'out'}"
    first = run_runner(command, ["A-v0", "Bad-v0"], [1], 1, tmp_path / "logs")
    assert first.returncode == 1 and "1 done, 1 failed" in first.stdout
    (tmp_path / "logs" / "C-v0__1.log").write_text("$ an earlier run that stopped before its run folder\n")
    again = subprocess.run(
        runner_argv(command, ["A-v0", "Bad-v0", "C-v0"], [1], 1, tmp_path / "logs") + ["--resume"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 0 and "2 jobs in" in again.stdout, again.stdout + again.stderr
    runs = {
        p.stem: [json.loads(line) for line in p.read_text().splitlines()] for p in (tmp_path / "out").glob("*.runs")
    }
    assert runs["A-v0__1"] == [["--env-id", "A-v0", "--seed", "1"]]  # finished: not run again
    checkpoint = str(tmp_path / "out" / "Bad-v0__1" / "checkpoint.pt")
    assert runs["Bad-v0__1"][1] == ["--env-id", "Bad-v0", "--seed", "1", "--resume", checkpoint]
    assert runs["C-v0__1"] == [["--env-id", "C-v0", "--seed", "1"]]  # no checkpoint: anew
    log = (tmp_path / "logs" / "Bad-v0__1.log").read_text()
    assert log.count("run folder:") == 2 and log.rstrip().endswith("# exit 0")  # appended to


def test_a_job_is_marked_uncommitted_for_changed_code_only(tmp_path):
    """The fullbudget block rewrites its curves and table in the checkout while its runs go: a run restarted then
    trains on the commit's code, and its log says so. A changed script, or any other tracked code, is marked."""
    from benchmark.run_seeds import code_version

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    files = ["ppo.py", "ppolab/run.py", "benchmark/results/table.md", "benchmark/results/curve.csv", "docs/ppo.md"]
    for name in [*files, "README.md"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("1\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    commit = code_version(tmp_path)
    assert re.fullmatch("[0-9a-f]{40}", commit)
    for name in ["benchmark/results/table.md", "benchmark/results/curve.csv", "docs/ppo.md", "README.md"]:
        (tmp_path / name).write_text("2\n")
    (tmp_path / "untracked.py").write_text("2\n")
    assert code_version(tmp_path) == commit  # results, docs, prose and untracked files are not the code
    for name in ["ppolab/run.py", "ppo.py"]:
        (tmp_path / name).write_text("2\n")
        assert code_version(tmp_path) == commit + "+uncommitted", name
        git("checkout", name)
