"""What every benchmark tool shares, so that no tool borrows from another: the one list of the nine training
scripts, the environment each is measured on, the repository root, importing a script or starting one in a
fresh process, its environment's own speed, the machine and the commit a results file names, the one way
CleanRL is installed, and the small pieces of a results file (a table's head, the date, a plot, a busy core).
tests/test_copies.py fails when a ppo*.py at the repository root is missing from SCRIPTS."""

import contextlib
import functools
import importlib
import inspect
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPTS = ["ppo", "ppo_continuous_action", "ppo_atari", "ppo_atari_lstm", "ppo_atari_envpool", "ppo_procgen"]
SCRIPTS += ["ppo_atari_multigpu", "ppo_shared_memory_lstm", "ppo_continuous_action_redis"]  # the multi-process ones

# script -> the real environment it is measured and run end to end on: its default (the Atari scripts:
# the short id they expand; ppo_procgen: the game, in easy mode)
ENV_ID = {
    "ppo": "CartPole-v1",
    "ppo_continuous_action": "Hopper-v4",
    "ppo_atari": "Breakout",
    "ppo_atari_lstm": "Breakout",
    "ppo_atari_envpool": "Breakout-v5",
    "ppo_procgen": "starpilot",
}


def import_script(script: str):
    """The training script as a module (its functions and Args, without running it). The environment
    variables are as before the import: what a script sets for itself (the pixel scripts'
    OMP_WAIT_POLICY) must not reach the other processes started from here, CleanRL's among them."""
    sys.path.insert(0, str(ROOT))
    environ = dict(os.environ)
    try:
        return importlib.import_module(script)
    finally:
        for name in set(os.environ) - set(environ):
            del os.environ[name]
        os.environ.update(environ)


def child_env() -> dict[str, str]:
    """The environment of a script started in a fresh process: one thread, the repository importable."""
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))


def machine() -> str:
    """CPU model, cores, GPUs (those nvidia-smi lists) and OS, for a results file's header."""
    model = platform.processor() or platform.machine()
    try:
        names = re.findall(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text())
        model = names[0] if names else model
    except OSError:
        pass
    return ", ".join([model, f"{os.cpu_count()} logical cores", *nvidia_gpus(), platform.platform()])


@functools.cache
def nvidia_gpus() -> list[str]:
    """The NVIDIA GPUs as `N x NAME` per model, from nvidia-smi; none where it is missing or fails."""
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    names = [line.strip() for line in listed.stdout.splitlines() if line.strip()] if listed.returncode == 0 else []
    return [f"{names.count(name)} x {name}" for name in dict.fromkeys(names)]


# Tracked files that are data or prose, not code: a change to them is not "uncommitted code". The fullbudget block
# itself rewrites its curves, stash and table in the checkout as its runs go, and a run restarted then still trains
# on the commit's code.
NOT_CODE = (":(exclude)benchmark/results", ":(exclude)docs", ":(exclude)*.md")


def git(root: Path, *args: str) -> str:
    """A git command's output in `root` (raises OSError where there is no git)."""
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True).stdout.strip()


def code_changed(root: Path) -> bool:
    """Whether tracked files other than results, docs and Markdown differ from the commit checked out in `root`."""
    return bool(git(root, "status", "--porcelain", "--untracked-files=no", "--", ".", *NOT_CODE))


def our_commit(root: Path = ROOT) -> str:
    """The checkout's short commit, and whether its code differs from it (`code_changed`)."""
    commit = git(root, "rev-parse", "--short", "HEAD") or "unknown"
    return commit + (" + uncommitted changes" if code_changed(root) else "")


def env_only_sps(script: str, env_id: str, steps: int) -> float:
    """Steps per second of the script's own vector environment (its `make_envs`) under pre-drawn random actions."""
    import numpy as np

    module = import_script(script)
    with tempfile.TemporaryDirectory() as tmp:
        args = module.Args(env_id=env_id, runs_dir=tmp)
        # the scripts' make_envs take some of: the number of envs, the run folder, the seed (envpool)
        wanted = inspect.signature(module.make_envs).parameters
        given = {"num_envs": args.num_envs, "run_dir": tmp, "seed": 0}
        envs = module.make_envs(args, **{name: value for name, value in given.items() if name in wanted})
        if "seed" in wanted:
            envs.reset()
        else:
            envs.reset(seed=0)
        space = getattr(envs, "single_action_space", envs.action_space)
        space.seed(0)
        actions = [np.array([space.sample() for _ in range(args.num_envs)]) for _ in range(steps // args.num_envs)]
        start = time.perf_counter()
        for action in actions:
            envs.step(action)
        elapsed = time.perf_counter() - start
        envs.close()
    return len(actions) * args.num_envs / elapsed


def env_only_in_child(script: str, env_id: str, steps: int) -> float:
    """env_only_sps in a fresh process with one thread, like the training runs it is compared with."""
    code = f"from benchmark.scripts import env_only_sps; print(env_only_sps({script!r}, {env_id!r}, {steps}))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, env=child_env(), cwd=ROOT
    )
    return float(out.stdout.strip().splitlines()[-1])


# CleanRL, the one way every tool installs it: its scripts only (its pinned requirements are of 2023 and it declares
# Python < 3.11), beside the packages a tool chooses
CLEANRL_VERSION = "1.2.0"


def pip_cleanrl(python: str, *pip_args: str) -> list[str]:
    """The pip command that installs (or, with `download`, fetches) CleanRL's scripts for `python`."""
    verb, *rest = pip_args or ("install",)
    return [python, "-m", "pip", verb, *rest, "--no-deps", "--ignore-requires-python", f"cleanrl=={CLEANRL_VERSION}"]


def versions(packages) -> dict[str, str]:
    """This Python's version and those of the `packages` installed here, by name."""
    from importlib import metadata

    found = {"python": platform.python_version()}
    for package in packages:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return found


# the small pieces of a results file ---------------------------------------------------------------------------------


def table_head(*columns: str) -> list[str]:
    """A markdown table's first two lines."""
    return ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]


def utc_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def pyplot():
    """matplotlib's pyplot, drawing to files (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@contextlib.contextmanager
def busy_core(busy: bool = True):
    """While the block runs, a process busy on one core (when `busy`): a measurement beside a loaded machine."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        yield
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
