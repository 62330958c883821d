"""Result tables from run folders: per seed the mean return of the last 100 episodes, then the mean
and standard deviation over seeds, with steps, runtime and SPS.

    python -m benchmark.results runs/            # every run folder below runs/
    python -m benchmark.results runs/ --last 100 --out results.md

Run folders are named `<env>__<exp_name>__<seed>__<time>` by the training scripts; runs of the same
env and exp_name are the seeds of one row.
"""

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmark.events import read_scalars


def summarize_run(run_dir: Path, last: int) -> dict:
    """Mean of the last `last` episodic returns, the final step, the training time (s, final step over
    final SPS) and the final SPS of one run."""
    scalars = read_scalars(run_dir)
    returns = [v for _, v in scalars.get("charts/episodic_return", [])]
    sps = scalars.get("charts/SPS", [(0, float("nan"))])
    return {
        "return": float(np.mean(returns[-last:])) if returns else float("nan"),
        "episodes": len(returns),
        "steps": sps[-1][0],
        "sps": sps[-1][1],
        "runtime": sps[-1][0] / sps[-1][1] if sps[-1][1] > 0 else float("nan"),
    }


def table(root: Path, last: int) -> str:
    groups = defaultdict(list)
    for run_dir in sorted({events.parent for events in root.rglob("events.out.tfevents.*")}):
        parts = run_dir.name.split("__")
        if len(parts) == 4:
            groups[(parts[0], parts[1])].append((run_dir, parts[2]))
    lines = [f"| script | env | seeds | per seed (mean of last {last} episodes) | mean ± std | steps | runtime (s) | SPS |",
             "|---|---|---|---|---|---|---|---|"]
    for (env_id, exp_name), runs in sorted(groups.items()):
        summaries = [summarize_run(run_dir, last) for run_dir, _ in runs]
        per_seed = ", ".join(f"{s['return']:.2f}" for s in summaries)
        means = np.array([s["return"] for s in summaries])
        lines.append(
            f"| {exp_name}.py | {env_id} | {', '.join(seed for _, seed in runs)} | {per_seed} "
            f"| {means.mean():.2f} ± {means.std():.2f} | {int(np.mean([s['steps'] for s in summaries])):,} "
            f"| {np.mean([s['runtime'] for s in summaries]):.0f} | {np.mean([s['sps'] for s in summaries]):.0f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, help="folder holding run folders")
    parser.add_argument("--last", type=int, default=100, help="episodes averaged per seed")
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    args = parser.parse_args()
    text = table(args.root, args.last)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
