"""Run one command for every (environment, seed) pair, in parallel on this machine.

    python -m benchmark.run_seeds --command "python ppo.py --total-timesteps 500000" \\
        --env-ids CartPole-v1 Acrobot-v1 --seeds 1 2 3 --workers 2 --logs benchmark/logs

Each job runs `<command> --env-id ENV --seed SEED` (the command is split like a shell would split it,
but no shell runs it). At most `--workers` jobs run at once (default: the number of CPUs). Every job
gets OMP_NUM_THREADS=1 in its environment, always, whatever the caller's environment says: jobs
share the machine, and one thread per job is the setting that does not collapse when they do. A script
still sets its own PyTorch threads (`--torch-threads`: 2 by default in ppo_atari.py, ppo_atari_lstm.py,
ppo_atari_envpool.py and ppo_procgen.py, 1 in the others); a job that wants another count says so in its
own command. Each job's stdout and stderr go to one log file, `<logs>/<env>__<seed>.log`, which starts with
the command line and the code that runs it (`# code: COMMIT at TIME`, the checkout's commit, `+uncommitted`
where tracked files differ from it); a resumed job appends both again, so the log says which code trained
which part of a long run.

With `--resume` the runner continues an earlier invocation of the same command: a job whose log ends with
the runner's `# exit 0` is done and not run again; a job whose log names its run folder (`run folder: DIR`, as
every script prints it) and whose DIR/checkpoint.pt exists is continued from it (`--resume DIR/checkpoint.pt`
appended, the log appended to); any other job starts anew. So long runs started with `--checkpoint-every`
survive the end of a session.

One line is printed per finished job (done or failed, its time, the counts so far); at the end a
summary lists every failed job with its exit code, its log file and the last line of that log. The
exit code is 0 only if every job succeeded. Ctrl-C (or SIGTERM) kills every running job with its
whole process group (a job's own children, e.g. torchrun's workers, too) and exits non-zero.
"""

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmark.scripts import code_changed, git


@dataclass
class Job:
    env_id: str
    seed: int
    argv: list[str]
    log: Path
    process: subprocess.Popen | None = None
    started: float = 0.0
    elapsed: float = 0.0
    returncode: int | None = None
    resumed: bool = False  # continued from the checkpoint its log names: the log is appended to
    cwd: Path | None = None  # the job's working folder (a script that writes its runs to ./runs)
    die_with_parent: bool = False  # SIGTERM to the job when the process that started it dies, even by SIGKILL

    @property
    def name(self) -> str:
        return f"{self.env_id} seed {self.seed}"


def make_jobs(command: str, env_ids: list[str], seeds: list[int], logs: Path, resume: bool = False) -> list[Job]:
    """A job per (env, seed); with `resume`, those an earlier invocation finished are left out and those it left
    with a checkpoint continue from it."""
    base, jobs = shlex.split(command), []
    for env_id in env_ids:
        for seed in seeds:
            job = Job(
                env_id,
                seed,
                base + ["--env-id", env_id, "--seed", str(seed)],
                logs / f"{env_id.replace('/', '_')}__{seed}.log",
            )
            if resume and job.log.is_file():
                text = job.log.read_text(errors="replace")
                if text.rstrip().endswith("# exit 0"):
                    continue
                folders = re.findall(r"^run folder: (.+)$", text, re.M)
                if folders and (Path(folders[-1]) / "checkpoint.pt").is_file():
                    job.argv += ["--resume", str(Path(folders[-1]) / "checkpoint.pt")]
                    job.resumed = True
            jobs.append(job)
    return jobs


def code_version(folder: Path | None) -> str:
    """The commit checked out in `folder` (the runner's working folder by default), with `+uncommitted` where its code
    differs from it (results, docs and Markdown aside: `code_changed`); `unknown` outside a git checkout."""
    folder = folder or Path.cwd()
    try:
        commit = git(folder, "rev-parse", "HEAD")
        changed = code_changed(folder)
    except OSError:  # no git on this machine
        return "unknown"
    return (commit + "+uncommitted" * changed) if commit else "unknown"


def start(job: Job):
    """Starts the job in a new process group (a new session: Ctrl-C at the terminal reaches only the
    runner, which then stops the jobs itself). A command that cannot start fails the job at once."""
    job.log.parent.mkdir(parents=True, exist_ok=True)
    job.started = time.monotonic()
    preexec = None
    if job.die_with_parent:  # (the package, and with it torch, imported only then)
        from ppolab.redis_server import die_with_parent as preexec
    with open(job.log, "a" if job.resumed else "w") as log:
        log.write(f"$ {shlex.join(job.argv)}\n")
        log.write(f"# code: {code_version(job.cwd)} at {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}\n")
        log.flush()
        try:
            job.process = subprocess.Popen(
                job.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, OMP_NUM_THREADS="1"),
                cwd=job.cwd,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except OSError as error:
            log.write(f"cannot start the command: {error}\n")
            job.returncode = 127


def kill(job: Job):
    """SIGTERM to the job's process group; up to 5 s for the job to end; then SIGKILL to what is left
    of the group (children that outlived their parent)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(job.process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            job.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def last_line(path: Path) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
        lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("# exit ")]  # the runner's own line
    return lines[-1] if lines else ""


def run_jobs(jobs: list[Job], workers: int) -> list[Job]:
    """Runs the jobs, `workers` at a time, printing a line as each one finishes; returns them finished."""
    pending, running, finished = list(jobs), [], []
    width = len(str(len(jobs)))

    def finish(job: Job):
        job.elapsed = time.monotonic() - job.started
        finished.append(job)
        with open(job.log, "a") as log:  # what --resume reads
            log.write(f"\n# exit {job.returncode}\n")
        failed = sum(j.returncode != 0 for j in finished)
        status = "done  " if job.returncode == 0 else f"FAILED (exit {job.returncode})"
        print(
            f"[{len(finished):{width}}/{len(jobs)}] {status:<16} {job.name:<28} {job.elapsed:8.1f}s   "
            f"running {len(running)}, pending {len(pending)}, failed {failed}",
            flush=True,
        )

    try:
        while pending or running:
            while pending and len(running) < workers:
                job = pending.pop(0)
                start(job)
                if job.process is None:
                    finish(job)
                else:
                    running.append(job)
            for job in [job for job in running if job.process.poll() is not None]:
                running.remove(job)
                job.returncode = job.process.returncode
                finish(job)
            time.sleep(0.05)
    finally:  # Ctrl-C, SIGTERM or any error: no job outlives the runner
        for job in running:
            kill(job)
    return finished


def summary(jobs: list[Job], elapsed: float) -> str:
    failed = [job for job in jobs if job.returncode != 0]
    lines = [f"{len(jobs)} jobs in {elapsed:.1f}s: {len(jobs) - len(failed)} done, {len(failed)} failed"]
    for job in failed:
        lines += [f"FAILED {job.name} (exit {job.returncode}): {job.log}", f"    last line: {last_line(job.log)}"]
    return "\n".join(lines)


def interrupt(signum, frame):
    """The SIGTERM handler of the runners: SIGTERM ends them as Ctrl-C does (their jobs stopped first)."""
    raise KeyboardInterrupt


def die_interrupted(message: str):
    """Prints the message and ends this process by SIGINT (exit code 130), as a shell that runs it as one command
    of a script expects of an interrupted command."""
    print(message, file=sys.stderr, flush=True)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    sys.exit(130)  # not reached where SIGINT ends the process


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--command", required=True, help="the command; --env-id ENV --seed SEED are appended")
    parser.add_argument("--env-ids", nargs="+", required=True)
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="jobs at once (default: CPU count)")
    parser.add_argument("--logs", type=Path, default=Path("benchmark/logs"), help="folder of the log files")
    parser.add_argument("--resume", action="store_true", help="continue an earlier invocation (see above)")
    args = parser.parse_args()
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    try:
        if not shlex.split(args.command):
            raise ValueError("it is empty")
    except ValueError as error:  # one line, as for any bad input: the command is a shell's words
        print(f"benchmark.run_seeds: error: --command {args.command!r}: {error}", file=sys.stderr)
        sys.exit(2)

    jobs = make_jobs(args.command, args.env_ids, args.seeds, args.logs, args.resume)
    print(f"{len(jobs)} jobs, {args.workers} at a time, logs in {args.logs}/: {args.command}", flush=True)
    signal.signal(signal.SIGTERM, interrupt)
    began = time.monotonic()
    try:
        finished = run_jobs(jobs, args.workers)
    except KeyboardInterrupt:
        die_interrupted("interrupted: running jobs killed")
    print(summary(finished, time.monotonic() - began), flush=True)
    sys.exit(0 if all(job.returncode == 0 for job in finished) else 1)


if __name__ == "__main__":
    main()
