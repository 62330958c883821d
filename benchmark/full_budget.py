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

The record (`--record`, by default the `--out` file with `.json` for `.md`) keeps each run's row as numbers, so that
a table outlives its run folders: a run of a (env, script, seed) that no folder under the root holds any more keeps
its recorded row, marked as such, and a folder that is there replaces the record of its (env, script, seed).
"""

import argparse
import json
import sys
import time
from importlib import metadata
from pathlib import Path

import numpy as np

from benchmark.events import read_hyperparameters, read_timed_scalars
from benchmark.scores import (
    REFERENCES,
    finished,
    group_runs,
    label,
    load_references,
    plot,
    published,
    seed_order,
    short_steps,
)
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


ROW_KEYS = {"exp_name", "env_id", "seed", "score", "episodes", "steps", "seconds", "sps", "threads", "read"}


def read_runs(root: Path, last: int) -> list[dict]:
    """A row per run folder under root: its script (exp_name), env, seed and folder name, run_summary's numbers, and
    when they were read."""
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return [
        {
            "exp_name": exp_name,
            "env_id": env_id,
            "seed": seed,
            "run": run_dir.name,
            **run_summary(run_dir, last),
            "read": now,
        }
        for (env_id, exp_name), runs in group_runs(root).items()
        for run_dir, seed in runs
    ]


def merge(recorded: list[dict], present: list[dict]) -> list[dict]:
    """The rows of the runs present, and the recorded row of every (env, script, seed) that none of them has, marked
    `kept`; in the order of env, script and seed."""
    have = {(row["env_id"], row["exp_name"], row["seed"]) for row in present}
    kept = [{**row, "kept": True} for row in recorded if (row["env_id"], row["exp_name"], row["seed"]) not in have]
    return sorted(present + kept, key=lambda row: (row["env_id"], row["exp_name"], seed_order(row["seed"])))


def load_record(path: Path | None, last: int) -> list[dict]:
    """The rows a record holds (none where there is no record); its scores must average `last` episodes, as ours."""
    if not (path and path.exists()):
        return []
    record = json.loads(path.read_text())
    if record["last"] != last:
        raise ValueError(f"its scores average the last {record['last']} episodes, not --last {last}")
    for row in record["runs"]:
        missing = ROW_KEYS - set(row)
        if missing:
            raise ValueError(f"a row has no {', '.join(sorted(missing))}")
    return record["runs"]


def save_record(path: Path, rows: list[dict], last: int):
    runs = [{key: value for key, value in row.items() if key != "kept"} for row in rows]
    path.write_text(json.dumps({"last": last, "runs": runs}, indent=1) + "\n")


def table(rows: list[dict], budget: int, last: int, references: dict, root: Path, record: Path | None = None) -> str:
    lines = [
        f"| script | env | seed | score (last {last} episodes) | steps | training time | SPS | PyTorch threads "
        "| published (CleanRL) | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    sources = []
    for s in rows:
        reference = references.get((f"{s['exp_name']}.py", s["env_id"]))
        cell, mean_std = "—", None
        if reference:
            cell, mean_std = published(reference), (reference["mean"], reference["std"])
            sources += [reference["source"]] * (reference["source"] not in sources)
        done = finished(s["steps"], budget)
        score = f"{s['score']:.2f} ({s['episodes']:,} episodes)"
        if not s["episodes"]:
            judged = "no episode ended"
        elif done:
            judged = verdict(s["score"], *mean_std) if mean_std else "no published score"
        else:
            score, judged = f"unfinished: {score} so far", f"unfinished ({s['steps'] / budget:.0%} of the budget)"
        seed = f"{s['seed']} *" if s.get("kept") else s["seed"]
        lines.append(
            f"| {label(s['exp_name'])} | {s['env_id']} | {seed} | {score} | {s['steps']:,} | {hours(s['seconds'])} "
            f"| {s['sps']:.0f} | {s['threads']} | {cell} | {judged} |"
        )
    kept = [s for s in rows if s.get("kept")]
    if kept:
        when = ", ".join(dict.fromkeys(s["read"] for s in kept))
        lines += [
            "",
            f"\\* No folder under {root} holds this row's run any more: the row is the one {record} recorded when the "
            f"run's folder was last read ({when}).",
        ]
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
    parser.add_argument(
        "--record", type=Path, help="the rows as numbers, read and written again (default: --out with .json)"
    )
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        parser.error(f"no folder {args.root}")
    record = args.record or (args.out.with_suffix(".json") if args.out else None)
    references = load_references(args.references)
    try:
        recorded = load_record(record, args.last)
    except (KeyError, TypeError, ValueError) as error:  # a JSONDecodeError is a ValueError
        problem = f"it has no {error}" if isinstance(error, KeyError) else error
        parser.error(f"{record} cannot be read as the record of this table: {problem}")
    rows = merge(recorded, read_runs(args.root, args.last))
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
            table(rows, args.steps, args.last, references, args.root, record),
        ]
    )
    if args.plots:
        for path in plot(args.root, args.plots, args.window, references):
            print(f"wrote {path}")
    if record:
        record.parent.mkdir(parents=True, exist_ok=True)
        save_record(record, rows, args.last)
        print(f"wrote {record}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
        print(f"wrote {args.out}")
    else:
        print(text)


if __name__ == "__main__":
    main()
