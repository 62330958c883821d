"""Distributed scaling of ppo_atari_multigpu.py: SPS, speedup and efficiency against the world size.

    python -m benchmark.multigpu_scaling                                   # W = 1 2 4, both modes
    python -m benchmark.multigpu_scaling --world-sizes 1 2 --iterations 4  # a quicker look

For each world size W, one torchrun job (`--standalone --nproc_per_node=W`, OMP_NUM_THREADS=1 and one
PyTorch thread per rank) of `--iterations` iterations on Breakout, in two modes:
- fixed per-rank work (weak scaling): every rank runs `--envs-per-rank` environments, so the global
  batch grows with W;
- fixed global batch (strong scaling): `--num-envs` environments in all, split among the ranks: the
  same algorithm as W = 1, with each rank doing 1/W of the work.
SPS comes from the wall times of the run's TensorBoard events between the end of the first iteration
and the end of the last (start-up and the first iteration left out). Speedup S = SPS_W / SPS_1, which
is T1 / TW for a fixed amount of work; efficiency E = S / W. The time split is rank 0's: rollout
(`perf/rollout_time`), learning compute (`perf/update_time` minus `perf/comm_time`) and communication
(`perf/comm_time`: all collectives, including the wait for slower ranks), as fractions of the
measured iterations' rollout + update time. A world size above the CPU count is oversubscribed: its ranks
take turns on the cores, and the table says so.

`--target-return R --target-steps S` adds the time to a return: for each W, a job with the fixed global
batch trains for S steps (its learning-rate schedule spans S), and the table gives the wall time (from
the run's first event) and the step at which the mean score of the last `--target-games` games first
reached R. The W jobs run the same algorithm with the same seed, so they need about the same number of
steps, and the time shows what the speed buys.

Prints a markdown table and, with `--out DIR`, writes it to DIR/multigpu_scaling.md (with
`--skip-sps`: DIR/multigpu_scaling_extra.md) and a plot of S and
E against W to DIR/plots/multigpu_scaling.png.
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmark.events import read_timed_scalars
from benchmark.scripts import ROOT

MODES = {"per-rank": "fixed per-rank work", "global": "fixed global batch"}


def num_envs(mode: str, world_size: int, envs_per_rank: int, global_envs: int) -> int:
    """The global --num-envs of a job: grows with W for fixed per-rank work, fixed otherwise."""
    return envs_per_rank * world_size if mode == "per-rank" else global_envs


STRAGGLER = Path(__file__).with_name("straggler")  # its sitecustomize slows the last rank (STRAGGLER_DELAY)


def run_job(
    world_size: int, envs: int, args: argparse.Namespace, runs_dir: Path, *extra: str, straggler_delay: float = 0.0
) -> Path:
    """One torchrun job (`extra`: more flags of the script; `straggler_delay`: seconds the last rank sleeps after
    each environment step, injected by benchmark/straggler/sitecustomize.py); returns its run folder."""
    runs_dir.mkdir(parents=True)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={world_size}",
        str(ROOT / "ppo_atari_multigpu.py"),
        "--env-id",
        args.env_id,
        "--num-envs",
        str(envs),
        "--num-steps",
        str(args.num_steps),
        "--total-timesteps",
        str(args.iterations * envs * args.num_steps),
        "--torch-threads",
        "1",
        "--runs-dir",
        str(runs_dir),
        *extra,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if straggler_delay:
        path = os.pathsep.join(filter(None, [str(STRAGGLER), env.get("PYTHONPATH")]))
        env.update(PYTHONPATH=path, STRAGGLER_DELAY=str(straggler_delay))
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
        sum(value for _, _, value in scalars[f"perf/{part}_time"][1:]) for part in ("rollout", "update", "comm")
    )
    split = {"rollout": rollout, "learn": update - comm, "comm": comm}  # the update's time includes its collectives
    total = rollout + update
    return {"sps": (last_step - first_step) / (last_time - first_time), **{k: v / total for k, v in split.items()}}


def scaling_table(results: dict[tuple[str, int], dict], cpus: int) -> list[dict]:
    """Rows with speedup S = SPS_W / SPS_1 and efficiency E = S / W against each mode's W = 1 job."""
    rows = []
    for (mode, world_size), result in results.items():
        speedup = result["sps"] / results[(mode, 1)]["sps"]
        rows.append(
            dict(
                mode=mode,
                world_size=world_size,
                speedup=speedup,
                efficiency=speedup / world_size,
                oversubscribed=world_size > cpus,
                **result,
            )
        )
    return rows


def markdown(rows: list[dict], args: argparse.Namespace, cpus: int) -> str:
    lines = [
        f"`python -m benchmark.multigpu_scaling {' '.join(args.argv)}` on {args.env_id}, {args.num_steps} steps per "
        f"rollout, one thread per rank, {cpus} CPUs, gloo.",
        "",
        "| mode | W | envs per rank | SPS | speedup S | efficiency E | rollout | learn | comm |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        envs = num_envs(row["mode"], row["world_size"], args.envs_per_rank, args.num_envs) // row["world_size"]
        note = " (oversubscribed)" if row["oversubscribed"] else ""
        lines.append(
            f"| {MODES[row['mode']]} | {row['world_size']}{note} | {envs} | {row['sps']:.0f} | "
            f"{row['speedup']:.2f} | {row['efficiency']:.2f} | {row['rollout']:.0%} | {row['learn']:.0%} | "
            f"{row['comm']:.0%} |"
        )
    return "\n".join(lines) + "\n"


def straggler_rows(args: argparse.Namespace, tmp: Path) -> str:
    """The largest W with an injected straggler, without and with preemption (a markdown table)."""
    world_size = max(args.world_sizes)
    lines = [
        f"Straggler: W={world_size}, fixed global batch, the last rank sleeps {args.straggler_delay:g} s after "
        "every environment step.",
        "",
        "| preemption | SPS | rollout | learn | comm |",
        "|---|---|---|---|---|",
    ]
    for name, extra in (("off", ()), ("--preempt-fraction 0.5", ("--preempt-fraction", "0.5"))):
        runs_dir = tmp / f"straggler-{len(extra)}"
        result = measure(
            run_job(world_size, args.num_envs, args, runs_dir, *extra, straggler_delay=args.straggler_delay)
        )
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


def target_rows(args: argparse.Namespace, tmp: Path) -> str:
    """For each W, the fixed-global-batch job trained for --target-steps: when it reached the target."""
    lines = [
        f"Time to a mean score of {args.target_return:g} over {args.target_games} games, fixed global batch "
        f"({args.num_envs} environments), {args.target_steps} steps per job, seed 1.",
        "",
        "| W | reached at step | wall time (s) | speedup in time |",
        "|---|---|---|---|",
    ]
    times = {}
    for world_size in args.world_sizes:
        steps = args.target_steps // (args.num_envs * args.num_steps)
        run_dir = run_job(
            world_size,
            args.num_envs,
            argparse.Namespace(**{**vars(args), "iterations": steps}),
            tmp / f"target-{world_size}",
        )
        reached = time_to_return(run_dir, args.target_return, args.target_games)
        times[world_size] = reached[0] if reached else None
        print(f"time to return, W={world_size}: {reached}", file=sys.stderr)
        baseline = times.get(1)
        speedup = f"{baseline / reached[0]:.2f}" if reached and baseline else "-"
        if not reached:
            scores = [value for _, _, value in read_timed_scalars(run_dir)[1].get("charts/episodic_return", [])]
            best = max(
                (
                    sum(scores[k - args.target_games : k]) / args.target_games
                    for k in range(args.target_games, len(scores) + 1)
                ),
                default=float("nan"),
            )
        lines.append(
            f"| {world_size} | {reached[1] if reached else f'not reached (best mean {best:.2f})'} | "
            f"{f'{reached[0]:.0f}' if reached else '-'} | {speedup} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_s, ax_e) = plt.subplots(1, 2, figsize=(9, 3.5))
    for mode, label in MODES.items():
        points = [(row["world_size"], row["speedup"], row["efficiency"]) for row in rows if row["mode"] == mode]
        ax_s.plot([w for w, _, _ in points], [s for _, s, _ in points], "o-", label=label)
        ax_e.plot([w for w, _, _ in points], [e for _, _, e in points], "o-", label=label)
    sizes = sorted({row["world_size"] for row in rows})
    ax_s.plot(sizes, sizes, "k:", label="ideal")
    ax_e.axhline(1.0, color="k", linestyle=":")
    for ax, name in ((ax_s, "speedup S = T1 / TW"), (ax_e, "efficiency E = S / W")):
        ax.set_xlabel("world size W (processes)")
        ax.set_ylabel(name)
        ax.set_xticks(sizes)
    ax_s.legend()
    fig.suptitle("ppo_atari_multigpu.py scaling (CPU, gloo)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--modes", nargs="+", choices=sorted(MODES), default=["per-rank", "global"])
    parser.add_argument("--iterations", type=int, default=6, help="iterations per job (the first is not measured)")
    parser.add_argument("--envs-per-rank", type=int, default=4, help="fixed per-rank work: environments per rank")
    parser.add_argument("--num-envs", type=int, default=8, help="fixed global batch: environments in all")
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--env-id", default="Breakout")
    parser.add_argument(
        "--straggler-delay",
        type=float,
        default=0.0,
        help="also run the largest W (fixed global batch) with its last rank sleeping this many seconds "
        "per step, without and with --preempt-fraction 0.5",
    )
    parser.add_argument("--target-return", type=float, help="also measure the time to this mean score")
    parser.add_argument("--target-steps", type=int, default=200_000, help="steps of each time-to-return job")
    parser.add_argument("--target-games", type=int, default=20, help="games in the mean score of --target-return")
    parser.add_argument("--skip-sps", action="store_true", help="only the straggler and time-to-return jobs")
    parser.add_argument("--out", type=Path, help="folder for multigpu_scaling.md and plots/multigpu_scaling.png")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    if 1 not in args.world_sizes:
        parser.error("--world-sizes must include 1, the baseline of the speedup")
    if any(args.num_envs % w for w in args.world_sizes):
        parser.error(f"--num-envs {args.num_envs} must be a multiple of every world size")
    cpus = os.cpu_count()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in [] if args.skip_sps else args.modes:
            for world_size in args.world_sizes:
                envs = num_envs(mode, world_size, args.envs_per_rank, args.num_envs)
                results[(mode, world_size)] = measure(
                    run_job(world_size, envs, args, Path(tmp) / f"{mode}-{world_size}")
                )
                print(f"{MODES[mode]}, W={world_size}: {results[(mode, world_size)]['sps']:.0f} SPS", file=sys.stderr)
        extra = [straggler_rows(args, Path(tmp))] if args.straggler_delay else []
        extra += [target_rows(args, Path(tmp))] if args.target_return is not None else []
    rows = scaling_table(results, cpus)
    table = "\n".join([markdown(rows, args, cpus)] * bool(rows) + extra)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        # with --skip-sps the straggler and time-to-return tables go beside the scaling table, not over it
        (args.out / ("multigpu_scaling.md" if rows else "multigpu_scaling_extra.md")).write_text(table)
        if rows:
            plot(rows, args.out / "plots" / "multigpu_scaling.png")


if __name__ == "__main__":
    main()
