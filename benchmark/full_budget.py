"""Runs at a published step budget beside the published scores: the table and the curves of `bash benchmark/ppo.sh
atari10m` (one seed per game, 10M steps), or of any folder of runs that have a reference in benchmark/reference.json.

    python -m benchmark.full_budget runs/benchmark/atari10m --steps 10000000 \\
        --out benchmark/results/atari10m.md --plots benchmark/results/atari10m

Per run (a row per run, not per group: the runs are single seeds): our score, the mean of its last `--last`
episodes (for Atari the game score over all lives, unclipped, as the scripts log it); the steps reached; the
training time (the events' wall time, the stops between a run and its resumes left out: benchmark.events) and the
SPS over it, with the PyTorch threads it trained with (its `--torch-threads`, from the arguments each of its processes
wrote); the published mean ± std with its seed count and source; and a verdict by `verdict`'s rule. A run
short of its budget is marked unfinished, with its score so far, and gets no verdict. The curves (benchmark.scores'
plots, against steps and against training time) draw the published mean as a dashed line.
"""

import argparse
import sys
import time
from importlib import metadata
from pathlib import Path

import numpy as np

from benchmark.events import read_hyperparameters, read_timed_scalars
from benchmark.scores import REFERENCES, finished, group_runs, label, load_references, plot, published, short_steps
from benchmark.speed_vs_cleanrl import machine

TOLERANCE = 0.05  # of the published mean: the least band a verdict allows (a near-zero std, e.g. Pong's 0.09)
RULE = (
    "Verdict, for one seed of ours against the published mean m ± s over the published seeds: **at the published "
    f"level** when our score lies within m ± max(2 s, {TOLERANCE:.0%} of |m|) (where about 95% of the published "
    "seeds would fall, were they normal; the floor keeps a game at its ceiling, e.g. Pong, from a band narrower than "
    "one point), **above** or **below** it otherwise. One seed is one draw: a verdict says where this run landed, "
    "not where the script's mean lies."
)
STACK = ["torch", "gymnasium", "ale-py", "envpool", "numpy"]


def run_summary(run_dir: Path, last: int) -> dict:
    """Score (mean of the last `last` episodes), episodes, steps reached, training time (s), SPS and PyTorch threads of
    one run."""
    start, scalars = read_timed_scalars(run_dir)
    threads = [params["torch_threads"] for params in read_hyperparameters(run_dir) if "torch_threads" in params]
    returns = [value for _, _, value in scalars.get("charts/episodic_return", [])]
    points = [point for tag_points in scalars.values() for point in tag_points]
    steps = max((step for step, _, _ in points), default=0)
    seconds = max((wall for _, wall, _ in points), default=start) - start
    return {
        "score": float(np.mean(returns[-last:])) if returns else float("nan"),
        "episodes": len(returns),
        "steps": steps,
        "seconds": seconds,
        "sps": steps / seconds if seconds > 0 else float("nan"),
        "threads": ", ".join(dict.fromkeys(threads)) or "—",  # each value once, in the order the processes ran
    }


def verdict(score: float, mean: float, std: float) -> str:
    band = max(2 * std, TOLERANCE * abs(mean))
    if abs(score - mean) <= band:
        return "at the published level"
    return "above" if score > mean else "below"


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


def table(root: Path, budget: int, last: int, references: dict) -> str:
    lines = [
        f"| script | env | seed | score (last {last} episodes) | steps | training time | SPS | PyTorch threads "
        "| published (CleanRL) | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    sources = []
    for (env_id, exp_name), runs in group_runs(root).items():
        reference = references.get((f"{exp_name}.py", env_id))
        cell, mean_std = "—", None
        if reference:
            cell, mean_std = published(reference), (reference["mean"], reference["std"])
            sources += [reference["source"]] * (reference["source"] not in sources)
        for run_dir, seed in runs:
            s = run_summary(run_dir, last)
            done = finished(s["steps"], budget)
            score = f"{s['score']:.2f} ({s['episodes']:,} episodes)"
            if not s["episodes"]:
                judged = "no episode ended"
            elif done:
                judged = verdict(s["score"], *mean_std) if mean_std else "no published score"
            else:
                score, judged = f"unfinished: {score} so far", f"unfinished ({s['steps'] / budget:.0%} of the budget)"
            lines.append(
                f"| {label(exp_name)} | {env_id} | {seed} | {score} | {s['steps']:,} | {hours(s['seconds'])} "
                f"| {s['sps']:.0f} | {s['threads']} | {cell} | {judged} |"
            )
    if sources:
        lines += ["", "Published scores: " + "; ".join(sources) + "."]
    return "\n".join(lines)


def versions() -> str:
    found = [f"python {sys.version.split()[0]}"]
    for package in STACK:
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(found)


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmark.full_budget",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("root", type=Path, help="folder holding the run folders")
    parser.add_argument("--steps", type=int, default=10_000_000, help="the step budget a run must reach")
    parser.add_argument("--last", type=int, default=100, help="episodes a score averages")
    parser.add_argument("--out", type=Path, help="write the markdown here (else print it)")
    parser.add_argument("--plots", type=Path, help="write the learning curves into this folder")
    parser.add_argument("--window", type=int, default=100, help="episodes each point of a curve averages")
    parser.add_argument("--references", type=Path, default=REFERENCES, help="published numbers (JSON)")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        parser.error(f"no folder {args.root}")
    references = load_references(args.references)
    command = " ".join(["python -m benchmark.full_budget", *(argv if argv is not None else sys.argv[1:])])
    text = "\n".join(
        [
            f"# Runs at {short_steps(args.steps)} steps beside the published scores",
            "",
            f"Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{command}` on {machine()} "
            f"({versions()}); the runs: `bash benchmark/ppo.sh atari10m` (each script at its defaults, the two lanes "
            "side by side, a run in each; the PyTorch threads of a run are its `--torch-threads`, whatever the job "
            "runner's `OMP_NUM_THREADS=1` says).",
            "",
            RULE,
            "",
            table(args.root, args.steps, args.last, references),
        ]
    )
    if args.plots:
        for path in plot(args.root, args.plots, args.window, references):
            print(f"wrote {path}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
        print(f"wrote {args.out}")
    else:
        print(text)


if __name__ == "__main__":
    main()
