"""Shared test helpers: the contract's runs, fast Args, TensorBoard reading, running a script, the process table."""

import fcntl
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

import ppolab.run
from ppolab.checkpoints import read_checkpoint
import atari_fakes  # noqa: F401  (registers MixedEndsAtari-v0, which RUNS names)
from benchmark.events import read_scalars  # noqa: F401  (re-exported for the tests)
from benchmark.scripts import ENV_ID as REAL_ENV  # a script's real environment, beside the fake ones below
from fake_envs import FIXED_LENGTH, TIME_LIMIT  # noqa: F401  (registered when fake_envs is imported)
from scripts import REPO

# fake environments of tests/fake_envs.py
FIXED_ENV = {"ppo": "FixedLength-v0", "ppo_continuous_action": "FixedLengthBox-v0"}
CONSTANT_ENV = {"ppo": "Constant-v0", "ppo_continuous_action": "ConstantBox-v0"}

# The per-iteration line every script prints at its first and last iteration and at most every few seconds
# between them: captures iteration, total, step, episode count (since the previous line), mean return (nan
# when none ended)
LINE = re.compile(
    r"^iteration (\d+)/(\d+) global_step=(\d+) episodes=(\d+) mean_return=(-?[\d.]+|nan) SPS=\d+ "
    r"ETA=\d+:\d\d:\d\d \(rollout [\d.]+s, update [\d.]+s[^)]*\)$",
    re.M,
)

METRICS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/old_approx_kl",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
    "debug/first_minibatch_ratio_deviation",
    "perf/rollout_time",
    "perf/update_time",
]


# The contract's runs (tests/test_contract.py, and the `contract` fixture of conftest.py): a few tiny
# in-process iterations of every script on environments whose episodes end both ways
ATARI = dict(env_id="MixedEndsAtari-v0", num_envs=2, num_steps=64, num_minibatches=2, update_epochs=1)
ENVPOOL = dict(num_envs=2, num_steps=16, num_minibatches=2, update_epochs=1)
RUNS = {  # the Args of a run of ITERATIONS iterations
    "ppo": dict(env_id="MixedEnds-v0", num_envs=2, num_steps=16, num_minibatches=2, update_epochs=2),
    "ppo_continuous_action": dict(
        env_id="MixedEndsBox-v0", num_envs=2, num_steps=16, num_minibatches=2, update_epochs=2
    ),
    "ppo_atari": ATARI,
    "ppo_atari_lstm": ATARI,
    "ppo_atari_multigpu": ATARI,
    "ppo_atari_envpool": dict(ENVPOOL, env_id="Breakout"),
    # annealed (its default is a constant rate) so that each iteration's learning rate tells a resume where it is
    "ppo_procgen": dict(ENVPOOL, env_id="starpilot", anneal_lr=True),
    # spawned rollout workers import tests/fake_envs.py by the id's module part, which registers the id
    "ppo_shared_memory_lstm": dict(
        env_id="tests.fake_envs:MixedEnds-v0",
        num_workers=2,
        num_envs_per_worker=1,
        num_steps=16,
        seq_len=8,
        num_minibatches=2,
        update_epochs=2,
    ),
    # its own redis-server and one sampler process: with two, which sampler fills which column races, so
    # same seed, same run holds only with one
    "ppo_continuous_action_redis": dict(
        env_id="tests.fake_envs:MixedEndsBox-v0",
        num_samplers=1,
        num_chunks=2,
        num_steps=16,
        num_minibatches=2,
        update_epochs=2,
    ),
}
ITERATIONS = 3


def batch_size(config: dict) -> int:
    if "num_chunks" in config:  # the Redis script: chunks of one sampler's environment
        return config["num_chunks"] * config["num_steps"]
    envs = config["num_envs"] if "num_envs" in config else config["num_workers"] * config["num_envs_per_worker"]
    return envs * config["num_steps"]


def make_args(script, runs_dir, **overrides):
    config = RUNS[script.__name__]
    fields = dict(
        config,
        runs_dir=str(runs_dir),
        cuda=False,
        total_timesteps=ITERATIONS * batch_size(config),
        checkpoint_every=1,
        save_model=True,
        eval_episodes=1,
    )
    fields.update(overrides)
    return script.Args(**fields)


def tiny_args(script, runs_dir, **overrides):
    """Args for a run of a few seconds: 2 envs x 16 steps, 3 iterations, small update."""
    fields = dict(
        runs_dir=str(runs_dir),
        cuda=False,
        num_envs=2,
        num_steps=16,
        num_minibatches=2,
        update_epochs=2,
        total_timesteps=2 * 16 * 3,
        eval_episodes=2,
        env_id=REAL_ENV[script.__name__],
    )
    fields.update(overrides)
    return script.Args(**fields)


def fake_atari_args(script, runs_dir, **overrides):
    """Args of an Atari script (ppo_atari, ppo_atari_lstm, ppo_atari_multigpu) for a run of a second or two on the
    fake game FakeAtari-v0 (atari_fakes): 2 envs x 32 steps, 2 iterations, one thread."""
    fields = dict(
        env_id="FakeAtari-v0",
        runs_dir=str(runs_dir),
        num_envs=2,
        num_steps=32,
        num_minibatches=2,
        update_epochs=2,
        total_timesteps=2 * 32 * 2,
        torch_threads=1,
    )
    return script.Args(**{**fields, **overrides})


def script_command(name: str, *argv) -> list[str]:
    """`python <repo>/<name>.py argv... --no-cuda`: the suite runs on the CPU wherever it runs, so it
    gives the same verdict on a machine with a GPU (the GPU tests in test_gpu.py ask for CUDA)."""
    return [sys.executable, str(REPO / f"{name}.py"), *map(str, argv), "--no-cuda"]


def run_script(name: str, *argv, cwd, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python <repo>/<name>.py argv...` as a user runs it, on the CPU with one thread, output captured."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        script_command(name, *argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def default_ctrl_c():
    """Run in a child before it starts: Ctrl-C (SIGINT) and SIGHUP get their default dispositions, whatever the
    suite inherited. A job started in the background (`nohup ... &`, some CI runners and schedulers) starts with
    SIGINT ignored, and under `nohup` SIGHUP too, its children as well; a test that sends either would then see
    nothing happen (a script leaves SIGHUP ignored where it was ignored when it started, as `nohup` asks)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def start_script(name: str, *argv, cwd) -> subprocess.Popen:
    """Like run_script, but returns the running process (with the default Ctrl-C disposition, and Python's fault
    handler on, so that `ended` can show where a process that should have ended is stuck)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    return subprocess.Popen(
        script_command(name, *argv),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_ctrl_c,
    )


def ended(process: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """The output of a `start_script` process (stdout, stderr) once it ends. One still running `timeout` seconds
    later fails the test with where it is stuck: its fault handler prints every thread's Python stack at SIGABRT."""
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        try:
            stdout, stderr = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        pytest.fail(
            f"still running {timeout:g}s later; its stderr, stacks last:\n{stderr}\nits last output:\n{stdout[-1500:]}"
        )


def only_run_dir(runs_dir) -> Path:
    """The single run folder a script created under runs_dir."""
    runs = [p for p in Path(runs_dir).iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def finished_run(result: subprocess.CompletedProcess, cwd: Path) -> dict:
    """A script's run from the command line in `cwd`, as the end-to-end tests share it: the process's result, its
    run folder and its scalars (None for both when it failed)."""
    run_dir = only_run_dir(cwd / "runs") if result.returncode == 0 else None
    return dict(cwd=cwd, result=result, run_dir=run_dir, scalars=read_scalars(run_dir) if run_dir else None)


def load(path) -> dict:
    """A checkpoint, read as data only (what every script's read_checkpoint does): a checkpoint that needs more
    fails here."""
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_evaluate_flag_matches_training(name: str, e2e: dict, episodes: int):
    """`--evaluate model.pt` (with another --seed) prints the mean return that the evaluation right after
    training printed: it plays the trained run's own seeded episodes."""
    pattern = rf": {episodes} episodes, mean return (-?[\d.]+)"
    trained = re.search(rf"^evaluation{pattern}", e2e["result"].stdout, re.M)
    result = run_script(
        name, "--evaluate", e2e["run_dir"] / "model.pt", "--eval-episodes", episodes, "--seed", 7, cwd=e2e["cwd"]
    )
    assert result.returncode == 0, result.stderr
    evaluated = re.search(rf"^evaluation of .*model\.pt on \S+{pattern}", result.stdout, re.M)
    assert trained and evaluated and evaluated[1] == trained[1]


def resume_args(script, path, **changes):
    """The Args of `--resume path` with `changes`, as the command line gives them: the checkpoint's arguments
    (ppolab.parse reads them as the defaults), `resume` and the changed flags."""
    checkpoint = read_checkpoint(str(path), f"{script.__name__}.py")  # a format-2 file's arguments too
    return script.Args(**{**checkpoint["args"], "resume": str(path), **changes})


def check_resume_after_interruption(
    script, make_args, iterations: int, batch: int, monkeypatch, full_dir=None, **resume_overrides
):
    """A run interrupted right after its second checkpoint and resumed from it ends like an
    uninterrupted run: same final step, every iteration logged once, at the same learning rates.
    `make_args(folder)` gives the Args of both runs (checkpoint_every=1, save_model=True); `full_dir`,
    if given, is the folder of an uninterrupted run with those Args made already."""
    full_dir = full_dir or script.main(make_args("full"))
    full = read_scalars(full_dir)["charts/learning_rate"]

    real_write, calls = ppolab.run.write_checkpoint_file, []

    def write_then_die(checkpoint, path):  # the run is killed right after its second checkpoint
        real_write(checkpoint, path)
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(ppolab.run, "write_checkpoint_file", write_then_die)
    with pytest.raises(KeyboardInterrupt):
        script.main(make_args("killed"))
    monkeypatch.setattr(ppolab.run, "write_checkpoint_file", real_write)
    checkpoint_path = calls[-1]
    assert load(checkpoint_path)["iteration"] == 2

    resumed_dir = script.main(resume_args(script, checkpoint_path, **resume_overrides))
    assert resumed_dir == str(Path(checkpoint_path).parent)
    assert load(f"{resumed_dir}/model.pt")["global_step"] == load(f"{full_dir}/model.pt")["global_step"]
    assert load(f"{full_dir}/model.pt")["global_step"] == iterations * batch
    # the interrupted run logged iterations 1-2, the resumed one the rest, each once, at the same learning rates
    resumed = read_scalars(resumed_dir)["charts/learning_rate"]
    assert [step for step, _ in resumed] == [step for step, _ in full] == [k * batch for k in range(1, iterations + 1)]
    assert [lr for _, lr in resumed] == pytest.approx([lr for _, lr in full], rel=1e-6)
    assert len({lr for _, lr in full}) == iterations  # annealing happened, so the comparison means something


def assert_progress_lines(stdout: str, line: re.Pattern, returns, iterations: int, batch: int):
    """The first and the last iteration print a line (`line` captures iteration, total, step, count, mean),
    iterations between them may (at most every few seconds); each line gives its step, the number of
    episodes that ended since the previous line and their mean return (nan when none ended)."""
    lines = {int(m[0]): m for m in line.findall(stdout)}
    assert 1 in lines and iterations in lines, stdout
    previous = 0
    for k in sorted(lines):
        _, total, step, count, mean = lines[k]
        episodes = [value for step_, value in returns if previous * batch < step_ <= k * batch]
        assert (int(total), int(step), int(count)) == (iterations, k * batch, len(episodes))
        if episodes:
            assert float(mean) == pytest.approx(np.mean(episodes), abs=0.006)
        else:
            assert mean == "nan"
        previous = k


def assert_evaluation_videos(script, model: Path, episodes: int, videos: int, capsys):
    """`--evaluate MODEL --capture-video` (in-process) records `videos` non-empty mp4 files into videos/
    beside the model, named after it, and prints where they are."""
    capsys.readouterr()
    script.main(script.Args(evaluate=str(model), eval_episodes=episodes, capture_video=True, cuda=False))
    folder = model.parent / "videos"
    recorded = sorted(folder.glob(f"{model.stem}-eval-episode-*.mp4"))
    assert len(recorded) == videos and all(video.stat().st_size > 1000 for video in recorded), recorded
    assert (
        f"videos of the evaluation in {folder}: {', '.join(video.name for video in recorded)}"
        in capsys.readouterr().out
    )


def process_table() -> dict[int, tuple[int, str, int]]:
    """pid -> (parent pid, state, start time in clock ticks) of every process, from /proc."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        table[int(stat.parent.name)] = (int(fields[1]), fields[0], int(fields[19]))
    return table


def descendants(pid: int) -> set[tuple[int, int]]:
    """(pid, start time) of every living process below `pid` now (the start time tells a reused pid apart)."""
    table, found, frontier = process_table(), set(), {pid}
    while frontier:
        frontier = {p for p, (parent, state, _) in table.items() if parent in frontier and state != "Z"}
        frontier -= {p for p, _ in found}
        found |= {(p, table[p][2]) for p in frontier}
    return found


def running(processes: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """Those of `processes` that still run (same pid and start time, not a zombie)."""
    table = process_table()
    return {(p, t) for p, t in processes if p in table and table[p][2] == t and table[p][1] != "Z"}


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def still_alive(pids, seconds: float = 5) -> list[int]:
    """The processes among `pids` still alive after waiting up to `seconds` for all of them to end."""
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


def suite_locks(run: str) -> tuple[Path, Path]:
    """The gate and the room of alone_or_side_by_side for the xdist run `run`, in the temp folder."""
    folder = Path(tempfile.gettempdir())
    return folder / f"ppo-lab-tests-{run}.gate", folder / f"ppo-lab-tests-{run}.room"


@contextmanager
def alone_or_side_by_side(run: str | None, exclusive: bool):
    """Under pytest-xdist (the README's `-n 2`) two workers run tests side by side. A test marked `exclusive`
    (many processes, timeouts, the machine's process table or /dev/shm) runs alone: it waits for the other
    worker's test to end, and the other worker waits for it. Two locks shared by the workers of the run `run`
    (xdist's id of it; None without xdist: no lock): the room (shared by side-by-side tests, held alone by an
    exclusive one) and a gate that an exclusive test holds while it waits, so that new tests queue behind it
    instead of keeping the room busy. Only the workers themselves lock: a pytest that a test starts (the GPU
    benchmark's dry run does) is not a worker, so it cannot wait for a lock its own test holds. xdist's controller
    removes the two files at the end of the run (conftest.py)."""
    if run is None:
        yield
        return
    gate_file, room_file = suite_locks(run)
    with open(gate_file, "a") as gate, open(room_file, "a") as room:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(room, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
        yield
