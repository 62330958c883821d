"""The vector environment of `ppo.py` and `ppo_continuous_action.py` (what their `make_envs` builds)
against gymnasium's pair (`SyncVectorEnv` with same-step autoreset, `copy=False`, under its vector
`RecordEpisodeStatistics`), at each script's default environment and number of environments:
CartPole-v1 x4 and Hopper-v4 x1.

    OMP_NUM_THREADS=1 python -m benchmark.vector_env_speed step --rounds 5
    OMP_NUM_THREADS=1 python -m benchmark.vector_env_speed run --rounds 3

`step`: one vector step, timed over `--steps` steps of random actions (the same sequence for every
variant), as this thread's CPU time (which other processes on the machine disturb less) and wall time.
`run`: whole training runs, each a process of its own (interpreter start to exit), of the script at its
defaults with `--total-timesteps` (CartPole-v1 500,000, Hopper-v4 200,000 unless given) whose `make_envs`
builds the variant. `--baseline REV` adds a third variant: the script as it is at a git revision, with
its own `make_envs` (e.g. `--baseline main`). In each round every variant runs once, in an order that
reverses from one round to the next; the tables give the median over rounds, the range, and the ratio to
gymnasium's pair (below 1: faster than gymnasium's).
"""

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

from benchmark.speed_vs_cleanrl import machine, our_commit, our_versions
from benchmark.throughput import ROOT, import_script

BUDGETS = {"ppo": 500_000, "ppo_continuous_action": 200_000}  # whole-run steps per script


def gymnasium_make_envs(script):
    """A `make_envs` for `script` that builds gymnasium's pair from the script's own `make_env`."""

    def make_envs(args, run_dir: str):
        envs = gym.vector.SyncVectorEnv(
            [script.make_env(args.env_id, i, args.capture_video, run_dir) for i in range(args.num_envs)],
            copy=False,
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
        return gym.wrappers.vector.RecordEpisodeStatistics(envs)

    return make_envs


def script_at(name: str, revision: str, folder: str) -> Path:
    """The file `name.py` as it is at a git revision, written into `folder`."""
    path = Path(folder) / f"{name}.py"
    path.write_text(
        subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{revision}:{name}.py"], check=True, capture_output=True, text=True
        ).stdout
    )
    return path


def load(path: Path, name: str):
    """The script at `path` as the module `name` (its functions and Args, without running it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and tyro look their classes up there
    spec.loader.exec_module(module)
    return module


def variants(name: str, baseline: str | None, folder: str) -> dict[str, Path]:
    """Variant name -> the file of the script to run (gymnasium's pair runs the current file)."""
    found = {"script": ROOT / f"{name}.py", "gymnasium": ROOT / f"{name}.py"}
    if baseline:
        found[f"script at {baseline}"] = script_at(name, baseline, folder)
    return found


def step_times(make_envs, args, steps: int, folder: str) -> tuple[float, float]:
    """CPU and wall seconds of one vector step, over `steps` steps after a seeded reset."""
    envs = make_envs(args, folder)
    rng = np.random.default_rng(0)
    space = envs.single_action_space
    if isinstance(space, gym.spaces.Discrete):
        actions = rng.integers(space.n, size=(steps, envs.num_envs))
    else:
        actions = rng.uniform(space.low, space.high, (steps, envs.num_envs, *space.shape)).astype(np.float32)
    envs.reset(seed=args.seed)
    step = envs.step
    wall, cpu = time.perf_counter(), time.thread_time()
    for action in actions:
        step(action)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    envs.close()
    return cpu / steps, wall / steps


def child(path: str, variant: str, flags: list[str]):
    """One whole training run in this process: the script at `path` with the variant's `make_envs`."""
    import tyro

    script = load(Path(path), Path(path).stem)
    if variant == "gymnasium":
        script.make_envs = gymnasium_make_envs(script)
    script.main(tyro.cli(script.Args, args=flags))


def run_time(path: Path, variant: str, flags: list[str]) -> float:
    """Wall seconds of one whole training process."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "benchmark.vector_env_speed", "child", str(path), variant, *flags],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"{variant} run of {path} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def table(unit: str, times: dict[tuple[str, str], list[float]], scale: float) -> str:
    """Markdown: per (case, variant) every round, the median, the range and the ratio to gymnasium's."""
    rounds = max(len(t) for t in times.values())
    lines = [
        f"| case | variant | {' | '.join(f'round {r + 1}' for r in range(rounds))} | median ({unit}) "
        f"| range ({unit}) | / gymnasium |",
        "|---|---|" + "---|" * (rounds + 3),
    ]
    for (case, variant), values in times.items():
        median = statistics.median(values)
        ratio = median / statistics.median(times[case, "gymnasium"])
        lines.append(
            f"| {case} | {variant} | {' | '.join(f'{v * scale:.1f}' for v in values)} | "
            f"{median * scale:.1f} | {min(values) * scale:.1f}-{max(values) * scale:.1f} | {ratio:.3f} |"
        )
    return "\n".join(lines)


LOADS: list[float] = []  # 1-minute load average before each measurement


def rounds_of(cases: dict[str, dict[str, Path]], rounds: int):
    """(round, script, variant) in the measuring order: each variant once a round, the order reversed
    every other round. Records the load average before each."""
    for r in range(rounds):
        for name, files in cases.items():
            for variant in list(files) if r % 2 == 0 else list(files)[::-1]:
                LOADS.append(os.getloadavg()[0])
                yield r, name, variant


def measure_steps(cases: dict[str, dict[str, Path]], rounds: int, steps: int, folder: str) -> str:
    """The `step` command: per-step CPU and wall times as markdown tables."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")  # as the scripts set it
    modules = {
        (name, variant): import_script(name) if path.parent == ROOT else load(path, f"{name}_baseline")
        for name, files in cases.items()
        for variant, path in files.items()
    }
    cpu_times, wall_times = {}, {}
    for r, name, variant in rounds_of(cases, rounds):
        module = modules[name, variant]
        args = module.Args()
        make_envs = gymnasium_make_envs(module) if variant == "gymnasium" else module.make_envs
        cpu, wall = step_times(make_envs, args, steps, folder)
        case = f"{args.env_id} x{args.num_envs}"
        cpu_times.setdefault((case, variant), []).append(cpu)
        wall_times.setdefault((case, variant), []).append(wall)
        print(f"round {r + 1} {case} {variant}: {cpu * 1e6:.1f} us", file=sys.stderr, flush=True)
    return (
        f"One vector step, CPU time of this thread:\n\n{table('us', cpu_times, 1e6)}\n\n"
        f"One vector step, wall time:\n\n{table('us', wall_times, 1e6)}"
    )


def measure_runs(cases: dict[str, dict[str, Path]], rounds: int, total: int | None, folder: str) -> str:
    """The `run` command: whole-process wall times as a markdown table."""
    times = {}
    for r, name, variant in rounds_of(cases, rounds):
        steps = total or BUDGETS[name]
        flags = ["--total-timesteps", str(steps), "--runs-dir", f"{folder}/runs"]
        seconds = run_time(cases[name][variant], variant, flags)
        case = f"{name}.py {steps:,} steps"
        times.setdefault((case, variant), []).append(seconds)
        print(f"round {r + 1} {case} {variant}: {seconds:.1f} s", file=sys.stderr, flush=True)
    return f"Whole training process, wall time:\n\n{table('s', times, 1)}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for command in ("step", "run"):
        sub = commands.add_parser(command)
        sub.add_argument("--rounds", type=int, default=3)
        sub.add_argument("--scripts", default=",".join(BUDGETS), help="comma-separated")
        sub.add_argument("--baseline", help="also the script at this git revision (e.g. main)")
        if command == "step":
            sub.add_argument("--steps", type=int, default=20_000, help="vector steps per variant and round")
        else:
            sub.add_argument(
                "--total-timesteps",
                type=int,
                help="for every script (default: "
                + ", ".join(f"{name} {steps:,}" for name, steps in BUDGETS.items())
                + ")",
            )
    inner = commands.add_parser("child", help="one training run (what `run` starts)")
    inner.add_argument("path")
    inner.add_argument("variant")
    inner.add_argument("flags", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    if options.command == "child":
        return child(options.path, options.variant, options.flags)

    wanted = ("python", "numpy", "gymnasium", "mujoco")
    versions = ", ".join(f"{k} {v}" for k, v in our_versions().items() if k in wanted)
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(
        f"{machine()}; commit {our_commit()}; {versions}; OMP_NUM_THREADS={threads}; "
        f"command: python -m benchmark.vector_env_speed {' '.join(sys.argv[1:])}"
    )
    with tempfile.TemporaryDirectory() as folder:
        cases = {name: variants(name, options.baseline, folder) for name in options.scripts.split(",")}
        if options.command == "step":
            result = measure_steps(cases, options.rounds, options.steps, folder)
        else:
            result = measure_runs(cases, options.rounds, options.total_timesteps, folder)
    print(f"1-minute load average before each measurement: {min(LOADS):.2f}-{max(LOADS):.2f}\n\n{result}")


if __name__ == "__main__":
    main()
