"""Scaling of the three multi-process scripts, one subcommand each (results/speed.md, multigpu_scaling.md,
shared_memory_workers.md, redis_samplers.md):

    python -m benchmark.studies.scaling multigpu                                   # W = 1 2 4, both modes
    python -m benchmark.studies.scaling multigpu --world-sizes 1 2 --iterations 4  # a quicker look
    python -m benchmark.studies.scaling workers                                    # CartPole-v1, 1, 2, 4 workers
    python -m benchmark.studies.scaling workers --atari-game Pong                  # also beside ppo_atari_lstm.py
    python -m benchmark.studies.scaling samplers                                   # Hopper-v4, 1, 2, 4 samplers

`multigpu`: ppo_atari_multigpu.py, one torchrun job per world size W (one thread per rank) on Breakout, with fixed
per-rank work (weak scaling) and with a fixed global batch (strong scaling). SPS between the end of the first and of
the last iteration; speedup S = SPS_W / SPS_1, efficiency E = S / W; rank 0's split into rollout, learning and
communication (`perf/comm_time`, the wait for slower ranks included). `--straggler-delay S` also runs the largest W
with its last rank sleeping S seconds per step (benchmark/straggler), without and with `--preempt-fraction 0.5`;
`--target-return R` adds the wall time to a mean score of R. `workers`: ppo_shared_memory_lstm.py against its rollout
workers, a fixed global batch and fixed environments per worker (`--atari-game`: beside ppo_atari_lstm.py).
`samplers`: ppo_continuous_action_redis.py against its samplers, beside ppo_continuous_action.py, and one multi-host
run simulated with separate commands. Each setting is a fresh run (OMP_NUM_THREADS=1), medians over the iterations
after the first; a row says when the processes outnumber the cores.
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmark.events import read_scalars, read_timed_scalars
from benchmark.scripts import ROOT, child_env, pyplot, table_head

# multigpu: ppo_atari_multigpu.py against the world size ---------------------------------------------------------------
MODES = {"per-rank": "fixed per-rank work", "global": "fixed global batch"}
STRAGGLER = ROOT / "benchmark" / "straggler"  # its sitecustomize slows the last rank (STRAGGLER_DELAY)


def num_envs(mode: str, world_size: int, args) -> int:
    """The global --num-envs of a job: grows with W for fixed per-rank work, fixed otherwise."""
    return args.envs_per_rank * world_size if mode == "per-rank" else args.num_envs


def run_job(world_size: int, envs: int, args, runs_dir: Path, *extra: str, delay: float = 0.0, iterations=None) -> Path:
    """One torchrun job (`extra`: more flags of the script; `delay`: seconds the last rank sleeps after each
    environment step, injected by benchmark/straggler/sitecustomize.py); returns its run folder."""
    runs_dir.mkdir(parents=True)
    steps = (iterations or args.iterations) * envs * args.num_steps
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}"]
    command += [str(ROOT / "ppo_atari_multigpu.py"), "--env-id", args.env_id, "--num-envs", str(envs)]
    command += ["--num-steps", str(args.num_steps), "--total-timesteps", str(steps), "--torch-threads", "1"]
    command += ["--runs-dir", str(runs_dir), *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if delay:
        path = os.pathsep.join(filter(None, [str(STRAGGLER), env.get("PYTHONPATH")]))
        env.update(PYTHONPATH=path, STRAGGLER_DELAY=str(delay))
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"scaling: W={world_size} failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    (run_dir,) = [p for p in runs_dir.iterdir() if p.is_dir()]
    return run_dir


def measure(run_dir: Path) -> dict[str, float]:
    """SPS after the first iteration, and rank 0's time split over the same iterations."""
    _, scalars = read_timed_scalars(run_dir)
    iterations = scalars["charts/SPS"]  # one event per iteration: (global step, wall time, value)
    if len(iterations) < 2:
        raise SystemExit(f"scaling: {run_dir} has fewer than 2 iterations; pass more --iterations")
    (first_step, first_time, _), (last_step, last_time, _) = iterations[0], iterations[-1]
    rollout, update, comm = (
        sum(v for _, _, v in scalars[f"perf/{part}_time"][1:]) for part in ("rollout", "update", "comm")
    )
    split = {"rollout": rollout, "learn": update - comm, "comm": comm}  # the update's time includes its collectives
    return {
        "sps": (last_step - first_step) / (last_time - first_time),
        **{k: v / (rollout + update) for k, v in split.items()},
    }


def scaling_table(results: dict[tuple[str, int], dict], cpus: int) -> list[dict]:
    """Rows with speedup S = SPS_W / SPS_1 and efficiency E = S / W against each mode's W = 1 job."""
    rows = []
    for (mode, world_size), result in results.items():
        speedup = result["sps"] / results[(mode, 1)]["sps"]
        rows.append(dict(mode=mode, world_size=world_size, speedup=speedup, efficiency=speedup / world_size,
                         oversubscribed=world_size > cpus, **result))  # fmt: skip
    return rows


def multigpu_markdown(rows: list[dict], args, cpus: int) -> str:
    lines = [
        f"`python -m benchmark.studies.scaling {' '.join(args.argv)}` on {args.env_id}, {args.num_steps} steps per "
        f"rollout, one thread per rank, {cpus} CPUs, gloo.",
        "",
        *table_head("mode", "W", "envs per rank", "SPS", "speedup S", "efficiency E", "rollout", "learn", "comm"),
    ]
    for row in rows:
        envs = num_envs(row["mode"], row["world_size"], args) // row["world_size"]
        note = " (oversubscribed)" if row["oversubscribed"] else ""
        lines.append(
            f"| {MODES[row['mode']]} | {row['world_size']}{note} | {envs} | {row['sps']:.0f} | {row['speedup']:.2f} "
            f"| {row['efficiency']:.2f} | {row['rollout']:.0%} | {row['learn']:.0%} | {row['comm']:.0%} |"
        )
    return "\n".join(lines) + "\n"


def straggler_rows(args, tmp: Path) -> str:
    """The largest W with an injected straggler, without and with preemption (a markdown table)."""
    world_size = max(args.world_sizes)
    lines = [
        f"Straggler: W={world_size}, fixed global batch, the last rank sleeps {args.straggler_delay:g} s after "
        "every environment step.",
        "",
        *table_head("preemption", "SPS", "rollout", "learn", "comm"),
    ]
    for name, extra in (("off", ()), ("--preempt-fraction 0.5", ("--preempt-fraction", "0.5"))):
        runs_dir = tmp / f"straggler-{len(extra)}"
        result = measure(run_job(world_size, args.num_envs, args, runs_dir, *extra, delay=args.straggler_delay))
        lines.append(
            f"| {name} | {result['sps']:.0f} | {result['rollout']:.0%} | {result['learn']:.0%} | {result['comm']:.0%} |"
        )
        print(f"straggler, preemption {name}: {result['sps']:.0f} SPS", file=sys.stderr)
    return "\n".join(lines) + "\n"


def time_to_return(run_dir: Path, target: float, games: int) -> tuple[float, int] | None:
    """(seconds since the run's first event, global step) at which the mean score of the last `games`
    games first reached `target`; None if it never did."""
    start, scalars = read_timed_scalars(run_dir)
    scores = scalars.get("charts/episodic_return", [])
    for k in range(games, len(scores) + 1):
        if sum(value for _, _, value in scores[k - games : k]) / games >= target:
            step, wall, _ = scores[k - 1]
            return wall - start, step
    return None


def target_rows(args, tmp: Path) -> str:
    """For each W, the fixed-global-batch job trained for --target-steps: when it reached the target."""
    lines = [
        f"Time to a mean score of {args.target_return:g} over {args.target_games} games, fixed global batch "
        f"({args.num_envs} environments), {args.target_steps} steps per job, seed 1.",
        "",
        *table_head("W", "reached at step", "wall time (s)", "speedup in time"),
    ]
    times, games = {}, args.target_games
    for world_size in args.world_sizes:
        iterations = args.target_steps // (args.num_envs * args.num_steps)
        run_dir = run_job(world_size, args.num_envs, args, tmp / f"target-{world_size}", iterations=iterations)
        reached = time_to_return(run_dir, args.target_return, games)
        times[world_size] = reached[0] if reached else None
        print(f"time to return, W={world_size}: {reached}", file=sys.stderr)
        if reached:
            speedup = f"{times[1] / reached[0]:.2f}" if times.get(1) else "-"
            lines.append(f"| {world_size} | {reached[1]} | {reached[0]:.0f} | {speedup} |")
            continue
        scores = [value for _, _, value in read_timed_scalars(run_dir)[1].get("charts/episodic_return", [])]
        best = max((sum(scores[k - games : k]) / games for k in range(games, len(scores) + 1)), default=float("nan"))
        lines.append(f"| {world_size} | not reached (best mean {best:.2f}) | - | - |")
    return "\n".join(lines) + "\n"


def plot_multigpu(rows: list[dict], path: Path):
    plt = pyplot()
    fig, (ax_s, ax_e) = plt.subplots(1, 2, figsize=(9, 3.5))
    for mode, label in MODES.items():
        points = [row for row in rows if row["mode"] == mode]
        ax_s.plot([row["world_size"] for row in points], [row["speedup"] for row in points], "o-", label=label)
        ax_e.plot([row["world_size"] for row in points], [row["efficiency"] for row in points], "o-", label=label)
    sizes = sorted({row["world_size"] for row in rows})
    ax_s.plot(sizes, sizes, "k:", label="ideal")
    ax_e.axhline(1.0, color="k", linestyle=":")
    for ax, name in ((ax_s, "speedup S = T1 / TW"), (ax_e, "efficiency E = S / W")):
        ax.set(xlabel="world size W (processes)", ylabel=name, xticks=sizes)
    ax_s.legend()
    fig.suptitle("ppo_atari_multigpu.py scaling (CPU, gloo)")
    save(fig, path)


def save(fig, path):
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def multigpu_arguments(parser: argparse.ArgumentParser):
    add = parser.add_argument
    add("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    add("--modes", nargs="+", choices=sorted(MODES), default=["per-rank", "global"])
    add("--iterations", type=int, default=6, help="iterations per job (the first is not measured)")
    add("--envs-per-rank", type=int, default=4, help="fixed per-rank work: environments per rank")
    add("--num-envs", type=int, default=8, help="fixed global batch: environments in all")
    add("--num-steps", type=int, default=128)
    add("--env-id", default="Breakout")
    add("--straggler-delay", type=float, default=0.0, help="also run the largest W (fixed global batch) with its last "
        "rank sleeping this many seconds per step, without and with --preempt-fraction 0.5")  # fmt: skip
    add("--target-return", type=float, help="also measure the time to this mean score")
    add("--target-steps", type=int, default=200_000, help="steps of each time-to-return job")
    add("--target-games", type=int, default=20, help="games in the mean score of --target-return")
    add("--skip-sps", action="store_true", help="only the straggler and time-to-return jobs")
    add("--out", type=Path, help="folder for multigpu_scaling.md (with --skip-sps: multigpu_scaling_extra.md) and "
        "plots/multigpu_scaling.png")  # fmt: skip


def multigpu(args, parser: argparse.ArgumentParser):
    if 1 not in args.world_sizes:
        parser.error("--world-sizes must include 1, the baseline of the speedup")
    if any(args.num_envs % w for w in args.world_sizes):
        parser.error(f"--num-envs {args.num_envs} must be a multiple of every world size")
    cpus, results = os.cpu_count(), {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in [] if args.skip_sps else args.modes:
            for world_size in args.world_sizes:
                job = run_job(world_size, num_envs(mode, world_size, args), args, Path(tmp) / f"{mode}-{world_size}")
                results[(mode, world_size)] = measure(job)
                print(f"{MODES[mode]}, W={world_size}: {results[(mode, world_size)]['sps']:.0f} SPS", file=sys.stderr)
        extra = [straggler_rows(args, Path(tmp))] if args.straggler_delay else []
        extra += [target_rows(args, Path(tmp))] if args.target_return is not None else []
    rows = scaling_table(results, cpus)
    table = "\n".join([multigpu_markdown(rows, args, cpus)] * bool(rows) + extra)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        # with --skip-sps the straggler and time-to-return tables go beside the scaling table, not over it
        (args.out / ("multigpu_scaling.md" if rows else "multigpu_scaling_extra.md")).write_text(table)
        if rows:
            plot_multigpu(rows, args.out / "plots" / "multigpu_scaling.png")


# workers and samplers: ppo_shared_memory_lstm.py and ppo_continuous_action_redis.py against their processes -----------
WORKERS_SCRIPT = "ppo_shared_memory_lstm"
SAMPLERS_SCRIPT = "ppo_continuous_action_redis"
SAMPLERS_BATCH = 2048


def run(script: str, iterations: int, batch: int, *flags) -> dict[str, list[tuple[int, float]]]:
    """Trains `script` for `iterations` iterations of `batch` steps in a fresh process; its scalars."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, str(ROOT / f"{script}.py"), "--total-timesteps", str(iterations * batch)]
        command += ["--runs-dir", tmp, *map(str, flags)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=child_env(), cwd=ROOT)
        (run_dir,) = Path(tmp).iterdir()
        return read_scalars(run_dir)


def later(scalars: dict[str, list[tuple[int, float]]], tag: str) -> list[float]:
    """The values of `tag` after the first iteration."""
    return [value for _, value in scalars[tag][1:]]


def time_split(scalars: dict[str, list[tuple[int, float]]]) -> str:
    """The shares of rollout, (where logged) transfer, update and publication in the time after the first iteration,
    as `58.1% rollout / 41.8% update / 0.1% publish`."""
    parts = [part for part in ("rollout", "transfer", "update", "publish") if f"perf/{part}_time" in scalars]
    times = {part: float(np.sum(later(scalars, f"perf/{part}_time"))) for part in parts}
    return " / ".join(f"{value / sum(times.values()):.1%} {part}" for part, value in times.items())


def summarize(scalars: dict[str, list[tuple[int, float]]]) -> dict:
    """Medians over the iterations after the first of the speeds a script logs (experience, learner, bytes per step),
    the end-to-end SPS at the end, the time split."""
    tags = ("experience_SPS", "learning_SPS", "learner_SPS", "bytes_per_step")
    found = {
        tag.lower(): float(np.median(later(scalars, f"charts/{tag}"))) for tag in tags if f"charts/{tag}" in scalars
    }
    return {**found, "sps": scalars["charts/SPS"][-1][1], "time_split": time_split(scalars)}


def workers_scaling(args) -> tuple[list[str], dict[str, list[dict]]]:
    """The table rows of both modes and their measurements, worker count by worker count."""
    cores = os.cpu_count()
    modes = {
        "fixed global batch": lambda w: args.total_envs // w,
        "fixed envs per worker": lambda w: args.envs_per_worker,
    }
    rows = table_head("mode", "workers", "envs per worker", "batch", "experience SPS", "speedup", "learner SPS",
                      "end-to-end SPS", "time split", "note")  # fmt: skip
    results = {mode: [] for mode in modes}
    for mode, envs_per_worker in modes.items():
        for workers in args.workers:
            n = envs_per_worker(workers)
            batch = workers * n * args.num_steps
            flags = [
                "--env-id",
                args.env_id,
                "--num-workers",
                workers,
                "--num-envs-per-worker",
                n,
                "--num-steps",
                args.num_steps,
            ]
            result = summarize(run(WORKERS_SCRIPT, args.iterations, batch, *flags))
            results[mode].append({"workers": workers, **result})
            speedup = result["experience_sps"] / results[mode][0]["experience_sps"]
            note = f"{workers} workers + learner on {cores} cores: oversubscribed" if workers > cores else ""
            rows.append(
                f"| {mode} | {workers} | {n} | {batch} | {result['experience_sps']:,.0f} | {speedup:.2f}x "
                f"| {result['learning_sps']:,.0f} | {result['sps']:,.0f} | {result['time_split']} | {note} |"
            )
            print(rows[-1], flush=True)
    return rows, results


def atari_side_by_side(game: str, iterations: int) -> list[str]:
    """End-to-end SPS of ppo_atari_lstm.py and of this script with 2 and 4 workers, same settings."""
    common = ["--env-id", game, "--num-steps", 128, "--num-minibatches", 4, "--update-epochs", 4]
    batch = 8 * 128
    rows = table_head("script", "processes", "env-steps per iteration", "end-to-end SPS", "time split")
    lstm = run("ppo_atari_lstm", iterations, batch, *common, "--num-envs", 8)
    rows.append(
        f"| ppo_atari_lstm.py | 1 (8 games) | {batch} | {lstm['charts/SPS'][-1][1]:,.0f} | {time_split(lstm)} |"
    )
    print(rows[-1], flush=True)
    for workers in (2, 4):
        flags = ["--num-workers", workers, "--num-envs-per-worker", 8 // workers, "--seq-len", 128]
        flags += ["--clip-coef", 0.1, "--learning-rate", 2.5e-4, "--torch-threads", 2]
        result = summarize(run(WORKERS_SCRIPT, iterations, batch, *common, *flags))
        rows.append(
            f"| {WORKERS_SCRIPT}.py | 1 learner + {workers} workers ({8 // workers} games each) | {batch} | "
            f"{result['sps']:,.0f} | {result['time_split']} |"
        )
        print(rows[-1], flush=True)
    return rows


def report(text: str, out: str | None):
    """Prints the markdown result and writes it to the file `out` too, if given."""
    print(f"\n{text}")
    if out:
        Path(out).write_text(text + "\n")


def plot_sps(panels: dict[str, dict[str, list[tuple[int, float]]]], xlabel: str, path: str, title: str):
    """One panel per entry of `panels` ({panel title: {line label: [(processes, SPS), ...]}}), the core count marked."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (panel, lines) in zip(axes[0], panels.items()):
        for label, points in lines.items():
            ax.plot(*zip(*points), marker="o", label=label)
        ax.axvline(os.cpu_count(), color="grey", linestyle=":", label=f"{os.cpu_count()} cores")
        ax.set(xlabel=xlabel, xticks=[x for x, _ in next(iter(lines.values()))], title=panel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.suptitle(title)
    save(fig, path)


def workers_arguments(parser: argparse.ArgumentParser):
    add = parser.add_argument
    add("--env-id", default="CartPole-v1")
    add("--workers", type=int, nargs="+", default=[1, 2, 4])
    add("--total-envs", type=int, default=8, help="environments in all, fixed-global-batch mode")
    add("--envs-per-worker", type=int, default=4, help="environments per worker, the other mode")
    add("--num-steps", type=int, default=128)
    add("--iterations", type=int, default=12, help="iterations per run (the first is left out)")
    add("--atari-game", default=None, help="also compare with ppo_atari_lstm.py on this game")
    add("--atari-iterations", type=int, default=4)
    add("--out", default=None, help="also write the markdown to this file")
    add("--plot", default=None, help="write the PNG plot of SPS against workers here")


def workers(args, parser: argparse.ArgumentParser):
    if args.iterations < 2 or args.atari_iterations < 2 or any(args.total_envs % w for w in args.workers):
        parser.error("--iterations and --atari-iterations must be at least 2 (the first is left out) and every "
                     "--workers count must divide --total-envs")  # fmt: skip
    rows, results = workers_scaling(args)
    lines = [
        f"{WORKERS_SCRIPT}.py on {args.env_id}, {args.num_steps} steps per rollout, {args.iterations} iterations per "
        f"run (medians of iterations 2..{args.iterations}); machine: {os.cpu_count()} cores",
        "",
        *rows,
    ]
    for mode, points in results.items():
        if len(points) > 1 and points[1]["workers"] == 2 * points[0]["workers"]:
            lines.append(
                f"\n{mode}: experience SPS {points[0]['workers']} -> {points[1]['workers']} workers: "
                f"{points[1]['experience_sps'] / points[0]['experience_sps']:.2f}x"
            )
    if args.atari_game:
        lines += ["", f"End to end on {args.atari_game}, {args.atari_iterations} iterations each, one after the other:"]
        lines += ["", *atari_side_by_side(args.atari_game, args.atari_iterations)]
    report("\n".join(lines), args.out)
    if args.plot:
        panels = {title: {mode: [(p["workers"], p[key]) for p in points] for mode, points in results.items()}
                  for key, title in (("experience_sps", "experience SPS"), ("learning_sps", "learner SPS"))}  # fmt: skip
        plot_sps(panels, "rollout workers", args.plot, f"{WORKERS_SCRIPT}.py on {args.env_id}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def multi_host(env_id: str, iterations: int, samplers: int) -> dict:
    """A learner and `samplers` sampler commands started separately against a redis-server of their own."""
    port, run_id = free_port(), f"benchmark-{os.getpid()}"
    url = f"redis://127.0.0.1:{port}/0"
    server = ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"]
    processes = [subprocess.Popen(server, stdout=subprocess.DEVNULL)]
    script = [sys.executable, str(ROOT / f"{SAMPLERS_SCRIPT}.py"), "--redis-url", url, "--run-id", run_id]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            time.sleep(0.5)  # the server's start
            steps = str(iterations * SAMPLERS_BATCH)
            learner = [
                *script,
                "--env-id",
                env_id,
                "--num-samplers",
                "0",
                "--total-timesteps",
                steps,
                "--runs-dir",
                tmp,
            ]
            # the learner, then what another machine runs
            for command in [learner] + [[*script, "--role", "sampler"]] * samplers:
                processes.append(subprocess.Popen(command, env=child_env(), cwd=ROOT, stdout=subprocess.DEVNULL))
            if processes[1].wait() != 0:
                raise RuntimeError("the multi-host learner failed")
            (run_dir,) = Path(tmp).iterdir()
            return summarize(read_scalars(run_dir))
    finally:
        for process in processes[1:] + processes[:1]:
            process.terminate()
            process.wait()


def samplers_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("--env-id", default="Hopper-v4")
    parser.add_argument("--samplers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--iterations", type=int, default=6, help="iterations per run (the first is left out)")
    parser.add_argument("--out", default=None, help="also write the markdown to this file")
    parser.add_argument("--plot", default=None, help="write the PNG plot of SPS against samplers here")


def samplers(args, parser: argparse.ArgumentParser):
    if args.iterations < 2:
        parser.error("--iterations must be at least 2 (the first is left out)")
    cores, points = os.cpu_count(), []
    rows = table_head("run", "samplers", "experience SPS", "speedup", "learner SPS", "end-to-end SPS", "bytes/step",
                      "time split", "note")  # fmt: skip
    for samplers in args.samplers:
        flags = ["--env-id", args.env_id, "--num-samplers", samplers]
        result = summarize(run(SAMPLERS_SCRIPT, args.iterations, SAMPLERS_BATCH, *flags))
        points.append({"samplers": samplers, **result})
        note = (
            f"{samplers} samplers + learner + redis-server on {cores} cores: oversubscribed"
            if samplers + 1 > cores
            else ""
        )
        rows.append(
            f"| embedded server | {samplers} | {result['experience_sps']:,.0f} | "
            f"{result['experience_sps'] / points[0]['experience_sps']:.2f}x | {result['learner_sps']:,.0f} | "
            f"{result['sps']:,.0f} | {result['bytes_per_step']:,.0f} | {result['time_split']} | {note} |"
        )
        print(rows[-1], flush=True)
    remote = multi_host(args.env_id, args.iterations, 2)
    rows.append(
        f"| separate commands (multi-host, simulated) | 2 | {remote['experience_sps']:,.0f} | | "
        f"{remote['learner_sps']:,.0f} | {remote['sps']:,.0f} | {remote['bytes_per_step']:,.0f} | "
        f"{remote['time_split']} | server, learner and samplers started apart |"
    )
    print(rows[-1], flush=True)
    plain = run("ppo_continuous_action", args.iterations, SAMPLERS_BATCH, "--env-id", args.env_id)
    rows.append(
        f"| ppo_continuous_action.py | (1 env in the learner) | | | | {plain['charts/SPS'][-1][1]:,.0f} | | "
        f"{time_split(plain)} | same batch and update |"
    )
    print(rows[-1], flush=True)
    lines = [
        f"{SAMPLERS_SCRIPT}.py on {args.env_id}, batch {SAMPLERS_BATCH}, {args.iterations} iterations per run (medians of "
        f"iterations 2..{args.iterations}); machine: {cores} cores",
        "",
        *rows,
    ]
    report("\n".join(lines), args.out)
    if args.plot:
        lines = {label: [(p["samplers"], p[key]) for p in points]
                 for key, label in (("experience_sps", "experience SPS"), ("sps", "end-to-end SPS"))}  # fmt: skip
        plot_sps({"": lines}, "sampler processes", args.plot, f"{SAMPLERS_SCRIPT}.py on {args.env_id}")


SUBCOMMANDS = {
    "multigpu": (multigpu_arguments, multigpu, "ppo_atari_multigpu.py against the world size"),
    "workers": (workers_arguments, workers, "ppo_shared_memory_lstm.py against its rollout workers"),
    "samplers": (samplers_arguments, samplers, "ppo_continuous_action_redis.py against its samplers"),
}


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(prog="python -m benchmark.studies.scaling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (arguments, _, help_text) in SUBCOMMANDS.items():
        arguments(commands.add_parser(name, help=help_text))
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    SUBCOMMANDS[args.command][1](args, commands.choices[args.command])


if __name__ == "__main__":
    main()
