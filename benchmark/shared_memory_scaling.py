"""Scaling of ppo_shared_memory_lstm.py with the number of rollout workers, and its speed beside
ppo_atari_lstm.py, measured in one run.

    python -m benchmark.shared_memory_scaling                                  # CartPole-v1, 1, 2, 4 workers
    python -m benchmark.shared_memory_scaling --atari-game Pong                # also the side-by-side on Pong
    python -m benchmark.shared_memory_scaling --out benchmark/results/shared_memory_workers.md \\
        --plot benchmark/results/plots/shared_memory_workers.png

Each setting is a fresh run of the script (OMP_NUM_THREADS=1, the learner on one thread, the script's
defaults otherwise) for `--iterations` iterations; its numbers come from its TensorBoard log:
- experience SPS: steps / rollout time (the learner sends Start until every worker is done),
- learner SPS: steps / update time (checksums, GAE and the PPO update),
- end-to-end SPS: the script's own `charts/SPS` at the end,
- the split of the time into `perf/rollout_time`, `perf/update_time` and, where the script has it,
  `perf/publish_time` (the weights' publication).
The first iteration is left out of the medians and of the time split (first-touch of memory, lazy
initialisation).

Two ways to add workers: a fixed global batch (`--total-envs` environments shared by the workers, so
each worker steps fewer) and fixed environments per worker (`--envs-per-worker`, so the batch grows).
A table row says when the workers outnumber the machine's cores (then they take turns on them).

`--atari-game` compares the end-to-end SPS of the two recurrent Atari scripts on the same game and
settings (8 games in all, 128 steps, 4 minibatches, 4 epochs, whole 128-step sequences, 2 learner
threads as ppo_atari_lstm.py's default), one after the other, for `--atari-iterations` iterations.
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmark.events import read_scalars
from benchmark.scripts import ROOT, child_env

SCRIPT = "ppo_shared_memory_lstm"


def run(script: str, iterations: int, batch: int, *flags) -> dict[str, list[tuple[int, float]]]:
    """Trains `script` for `iterations` iterations of `batch` steps in a fresh process; its scalars."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            str(ROOT / f"{script}.py"),
            "--total-timesteps",
            str(iterations * batch),
            "--runs-dir",
            tmp,
            *map(str, flags),
        ]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=child_env(), cwd=ROOT)
        (run_dir,) = Path(tmp).iterdir()
        return read_scalars(run_dir)


def later(scalars: dict[str, list[tuple[int, float]]], tag: str) -> list[float]:
    """The values of `tag` after the first iteration."""
    return [value for _, value in scalars[tag][1:]]


def time_split(scalars: dict[str, list[tuple[int, float]]]) -> str:
    """The shares of rollout, (where logged) transfer, update and publication in the time after the first iteration,
    as `58.1% rollout / 41.8% update / 0.1% publish`."""
    times = {
        part: float(np.sum(later(scalars, f"perf/{part}_time")))
        for part in ("rollout", "transfer", "update", "publish")
        if f"perf/{part}_time" in scalars
    }
    total = sum(times.values())
    return " / ".join(f"{value / total:.1%} {part}" for part, value in times.items())


def summarize(scalars: dict[str, list[tuple[int, float]]]) -> dict:
    """Medians over the iterations after the first, the end-to-end SPS at the end, the time split."""
    return {
        "experience_sps": float(np.median(later(scalars, "charts/experience_SPS"))),
        "learning_sps": float(np.median(later(scalars, "charts/learning_SPS"))),
        "sps": scalars["charts/SPS"][-1][1],
        "time_split": time_split(scalars),
    }


def scaling(args) -> tuple[list[str], dict[str, list[dict]]]:
    """The table rows of both modes and their measurements, worker count by worker count."""
    cores = os.cpu_count()
    modes = {
        "fixed global batch": lambda w: args.total_envs // w,
        "fixed envs per worker": lambda w: args.envs_per_worker,
    }
    rows = [
        "| mode | workers | envs per worker | batch | experience SPS | speedup | learner SPS | end-to-end SPS "
        "| time split | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    results = {mode: [] for mode in modes}
    for mode, envs_per_worker in modes.items():
        for workers in args.workers:
            n = envs_per_worker(workers)
            batch = workers * n * args.num_steps
            result = summarize(
                run(
                    SCRIPT,
                    args.iterations,
                    batch,
                    "--env-id",
                    args.env_id,
                    "--num-workers",
                    workers,
                    "--num-envs-per-worker",
                    n,
                    "--num-steps",
                    args.num_steps,
                )
            )
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
    rows = ["| script | processes | env-steps per iteration | end-to-end SPS | time split |", "|---|---|---|---|---|"]
    lstm = run("ppo_atari_lstm", iterations, batch, *common, "--num-envs", 8)
    rows.append(
        f"| ppo_atari_lstm.py | 1 (8 games) | {batch} | {lstm['charts/SPS'][-1][1]:,.0f} | {time_split(lstm)} |"
    )
    print(rows[-1], flush=True)
    for workers in (2, 4):
        result = summarize(
            run(
                SCRIPT,
                iterations,
                batch,
                *common,
                "--num-workers",
                workers,
                "--num-envs-per-worker",
                8 // workers,
                "--seq-len",
                128,
                "--clip-coef",
                0.1,
                "--learning-rate",
                2.5e-4,
                "--torch-threads",
                2,
            )
        )
        rows.append(
            f"| {SCRIPT}.py | 1 learner + {workers} workers ({8 // workers} games each) | {batch} | "
            f"{result['sps']:,.0f} | {result['time_split']} |"
        )
        print(rows[-1], flush=True)
    return rows


def report(text: str, out: str | None):
    """Prints the markdown result and writes it to the file `out` too, if given."""
    print(f"\n{text}")
    if out:
        Path(out).write_text(text + "\n")


def plot(results: dict[str, list[dict]], path: str, env_id: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in zip(axes, ("experience_sps", "learning_sps"), ("experience SPS", "learner SPS")):
        for mode, points in results.items():
            ax.plot([p["workers"] for p in points], [p[key] for p in points], marker="o", label=mode)
        ax.axvline(os.cpu_count(), color="grey", linestyle=":", label=f"{os.cpu_count()} cores")
        ax.set_xlabel("rollout workers")
        ax.set_xticks([p["workers"] for p in next(iter(results.values()))])
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"{SCRIPT}.py on {env_id}")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--total-envs", type=int, default=8, help="environments in all, fixed-global-batch mode")
    parser.add_argument("--envs-per-worker", type=int, default=4, help="environments per worker, the other mode")
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=12, help="iterations per run (the first is left out)")
    parser.add_argument("--atari-game", default=None, help="also compare with ppo_atari_lstm.py on this game")
    parser.add_argument("--atari-iterations", type=int, default=4)
    parser.add_argument("--out", default=None, help="also write the markdown to this file")
    parser.add_argument("--plot", default=None, help="write the PNG plot of SPS against workers here")
    args = parser.parse_args()
    if args.iterations < 2 or args.atari_iterations < 2 or any(args.total_envs % w for w in args.workers):
        parser.error(
            "--iterations and --atari-iterations must be at least 2 (the first is left out) and every "
            "--workers count must divide --total-envs"
        )

    rows, results = scaling(args)
    lines = [
        f"{SCRIPT}.py on {args.env_id}, {args.num_steps} steps per rollout, {args.iterations} iterations per "
        f"run (medians of iterations 2..{args.iterations}); machine: {os.cpu_count()} cores",
        "",
    ] + rows
    for mode, points in results.items():
        if len(points) > 1 and points[1]["workers"] == 2 * points[0]["workers"]:
            lines.append(
                f"\n{mode}: experience SPS {points[0]['workers']} -> {points[1]['workers']} workers: "
                f"{points[1]['experience_sps'] / points[0]['experience_sps']:.2f}x"
            )
    if args.atari_game:
        lines += [
            "",
            f"End to end on {args.atari_game}, {args.atari_iterations} iterations each, one after the other:",
            "",
        ] + atari_side_by_side(args.atari_game, args.atari_iterations)
    report("\n".join(lines), args.out)
    if args.plot:
        plot(results, args.plot, args.env_id)


if __name__ == "__main__":
    main()
