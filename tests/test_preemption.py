"""Preemption as clusters do it, and signals that come in storms: the scheduler's warning (--requeue-signal, SIGUSR1
by default, SIGTERM where asked) makes a run write its checkpoint at the end of the iteration and exit with code 75,
and the same command with `--resume auto` continues it (or starts a run where there is none to continue); under
torchrun the signal to one rank stops every rank at the same iteration. However many signals arrive a few
milliseconds apart, the first decides the exit code and the one line, and no line claims work that was not done."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ended, load, only_run_dir, process_table, run_script, script_command, start_script
from scripts import REPO

pytestmark = pytest.mark.exclusive  # signals to torchrun ranks; the process table

# long enough iterations (about a second) that a storm lands inside one
ARGV = ["--num-envs", 4, "--num-steps", 512, "--num-minibatches", 2, "--update-epochs", 2, "--runs-dir", "runs"]


def wait_for_iteration(process: subprocess.Popen) -> str:
    """Reads the run's stdout until its first iteration's line; returns what it read."""
    read = ""
    for line in process.stdout:
        read += line
        if line.startswith("iteration 1/"):
            return read
    pytest.fail(f"the run ended before its first iteration: {ended(process, 60)[1]}")


def storm(pid: int, signals: list[int], gap: float = 0.003):
    for signum in signals:
        os.kill(pid, signum)
        time.sleep(gap)


@pytest.mark.parametrize(
    "signals, code, said",
    [
        ([signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGINT], 130, "interrupted"),
        ([signal.SIGTERM, signal.SIGINT, signal.SIGINT, signal.SIGHUP], 143, "terminated (SIGTERM)"),
        ([signal.SIGHUP, signal.SIGTERM, signal.SIGINT], 129, "hung up (SIGHUP)"),
    ],
)
def test_a_signal_storm_is_one_line_with_the_first_signals_code(signals, code, said, tmp_path):
    """Signals 3 ms apart during a run: one line, the first signal's, with the last checkpoint and the resume command;
    the first signal's exit code; never "its work was done" for a run stopped mid-way."""
    process = start_script("ppo", *ARGV, "--total-timesteps", 10**7, "--checkpoint-every", 1, cwd=tmp_path)
    wait_for_iteration(process)
    storm(process.pid, signals)
    _, stderr = ended(process, 120)
    assert process.returncode == code, stderr
    lines = stderr.splitlines()
    hint = r"(last checkpoint runs/\S+; continue with: python \S+ --resume runs/\S+|no checkpoint in runs/\S+ yet)"
    assert len(lines) == 1 and re.fullmatch(rf"ppo\.py: {re.escape(said)}: {hint}", lines[0]), stderr


def requeued(tmp_path: Path, *extra, signum: int = signal.SIGUSR1) -> tuple[int, list[str], Path]:
    """ppo.py started, sent `signum` once its first iteration ended: its exit code, stderr lines and run folder."""
    process = start_script("ppo", *ARGV, "--total-timesteps", 8 * 2048, *extra, cwd=tmp_path)
    wait_for_iteration(process)
    process.send_signal(signum)
    _, stderr = ended(process, 120)
    return process.returncode, stderr.splitlines(), only_run_dir(tmp_path / "runs")


@pytest.mark.parametrize("signum, extra", [(signal.SIGUSR1, ()), (signal.SIGTERM, ("--requeue-signal", "TERM"))])
def test_the_requeue_signal_checkpoints_the_iteration_and_resume_auto_continues_it(signum, extra, tmp_path):
    """SIGUSR1 (or SIGTERM with --requeue-signal TERM) during a run that never asked for checkpoints: a checkpoint of
    the iteration the signal came in, one line naming it and the resume command, exit 75. The same command again
    with --resume auto continues that run in its folder from that checkpoint, and finishes."""
    code, lines, run_dir = requeued(tmp_path, *extra, signum=signum)
    assert code == 75, lines
    checkpoint = load(run_dir / "checkpoint.pt")
    iteration = checkpoint["iteration"]
    name = signal.Signals(signum).name
    assert lines == [
        f"ppo.py: {name}: checkpoint written at iteration {iteration}, exiting with code 75 to be requeued; last "
        f"checkpoint runs/{run_dir.name}/checkpoint.pt; continue with: python {script_command('ppo')[1]} --resume "
        f"runs/{run_dir.name}/checkpoint.pt (or the same command with --resume auto)"
    ]
    again = run_script("ppo", *ARGV, "--total-timesteps", 8 * 2048, *extra, "--resume", "auto", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"resumed from runs/{run_dir.name}/checkpoint.pt at iteration {iteration}," in again.stdout
    assert only_run_dir(tmp_path / "runs") == run_dir  # no new run folder
    assert "iteration 8/8 " in again.stdout


def test_a_stop_signal_before_the_requeue_checkpoint_ends_the_run_with_the_requeue_code(tmp_path):
    """SIGUSR1, then SIGTERM 3 ms later (before the iteration ends): the run ends at once with the code the first
    signal decided (75: requeue, from the last checkpoint) and one line that says the checkpoint was not written."""
    process = start_script("ppo", *ARGV, "--total-timesteps", 10**7, "--checkpoint-every", 1, cwd=tmp_path)
    wait_for_iteration(process)
    storm(process.pid, [signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR1, signal.SIGINT])
    _, stderr = ended(process, 120)
    assert process.returncode == 75, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("ppo.py: terminated (SIGTERM) before the checkpoint SIGUSR1 asked for was written: ")


def test_resume_auto_starts_a_run_where_there_is_none_of_the_same_seed(tmp_path):
    """--resume auto without a checkpoint of the same script, environment, experiment name and seed under --runs-dir:
    a new run (a run of another seed, or one without a checkpoint, is not continued)."""
    code, _, first = requeued(tmp_path)
    assert code == 75
    other = run_script("ppo", *ARGV, "--total-timesteps", 2048, "--seed", 2, "--resume", "auto", cwd=tmp_path)
    assert other.returncode == 0, other.stderr
    assert "resumed" not in other.stdout
    folders = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(folders) == 2 and first.name in folders and any("__ppo__2__" in name for name in folders)


def test_every_rank_stops_at_the_same_iteration_when_one_rank_gets_the_requeue_signal(tmp_path):
    """torchrun, 2 ranks on the CPU: SIGUSR1 to rank 1 alone: rank 0 writes the checkpoint of the iteration at which
    every rank stops, with every rank's random streams, says so in one line, and both ranks exit with code 75."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(REPO / "ppo_atari_multigpu.py"), "--env-id", "Breakout", "--num-envs", 4, "--num-steps", 32,
        "--num-minibatches", 2, "--max-episode-steps", 60, "--total-timesteps", 10**7, "--no-cuda",
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    job = subprocess.Popen(list(map(str, command)), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    ranks = {}
    try:
        wait_for_iteration(job)
        ranks = {rank_of(pid): pid for pid, (ppid, _, _) in process_table().items() if ppid == job.pid}
        os.kill(ranks[1], signal.SIGUSR1)
        output = job.communicate(timeout=180)[0]
    finally:
        if job.poll() is None:
            for pid in [job.pid, *ranks.values()]:  # (torchrun's workers are not in its process group)
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            pytest.fail(f"the job did not stop: {job.communicate(timeout=60)[0]}")
    checkpoint = load(only_run_dir(tmp_path / "runs") / "checkpoint.pt")
    said = [line for line in output.splitlines() if "SIGUSR1" in line]
    assert len(said) == 1, output
    assert f"SIGUSR1: checkpoint written at iteration {checkpoint['iteration']}, exiting with code 75" in said[0]
    assert len(checkpoint["rank_rng"]) == 2
    assert len(re.findall(r"exitcode\s+: 75 \(pid", output)) == 2, output  # torchrun's summary of each rank


def rank_of(pid: int) -> int | None:
    """The RANK of a training process, from its environment (None: gone, or none)."""
    try:
        environ = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((int(item[5:]) for item in environ if item.startswith(b"RANK=")), None)
