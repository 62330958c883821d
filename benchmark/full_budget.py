"""Runs at their published step budget beside the published scores, from learning curves kept as data.

    python -m benchmark.full_budget export runs/benchmark/fullbudget --curves benchmark/results/fullbudget/curves
    python -m benchmark.full_budget table benchmark/results/fullbudget/curves \\
        --out benchmark/results/fullbudget.md --plots benchmark/results/fullbudget

`export` reads every run folder under a root (TensorBoard events; a resumed run's segments read as one run by
benchmark.events) and writes two files per run into the curves folder, named `<env>__<script>__<seed>`:
- `.csv.gz`, the learning curve: one line per finished episode with its global step, return (for Atari the game score
  over all lives, unclipped, as the scripts log it), length and training time in seconds (the stops between a run and
  its resumes left out);
- `.json`, what the table needs beside it: the script, env, seed and run folder, the run's own step budget
  (`--total-timesteps`), the steps reached, the training time, the PyTorch threads of each process, the machine, when
  it was exported (the last export that changed it), and the code that trained it (`code`: each start and resume of the job with its commit and the
  first step it trained, from the job's log where `benchmark.run_seeds` wrote it).
`bash benchmark/ppo.sh fullbudget` exports while its runs train, so a run folder lost with its machine loses the steps
since the last export, not the row. A `.json` without a curve is a row re-typed from an earlier table whose run
folder was lost; it says so (`retyped`), holds its numbers, and stays until a run of its (env, script, seed) replaces
it.

`stash` carries the runs to another machine: for every job of the block (a job log of benchmark.run_seeds under
ROOT/logs) it writes into a folder (`benchmark/results/fullbudget/resume`, committed) the log's own lines (the run
folder, each start's commit, the exit), and for a job not yet finished its run's latest checkpoint (gzip-compressed:
15-22 MB for an Atari agent with its Adam moments) with the curve up to the checkpoint's step; `unstash` on a new
machine puts the logs and the checkpoints back under the runs folder, so that the same `bash benchmark/ppo.sh
fullbudget` skips the finished jobs and resumes the others from their checkpoints, and `export` joins the restored
curve and the resumed run's episodes into one curve (training time continued from the checkpoint's, to the nearest
episode). A stash changes only when its checkpoint moved on; the stash of a finished run is its log alone.

`table` makes the table and the curves from the curves folder alone, so that a checkout regenerates them. Per run:
the score (mean of the last `--last` episodes), the score as CleanRL computed its envpool numbers (the mean of its
last 20 games at each game's end, averaged over the last `--last` games), steps and share of the published budget,
training time, SPS, threads, code. Per script and game, the rule stated in the file (RULE): no verdict for a run
short of 90% of the published budget; one or two seeds are placed against the published mean ± 2 std in words, never
judged; three or more seeds get a verdict from Welch's t-test and an equivalence test.
"""

import argparse
import calendar
import gzip
import io
import json
import math
import re
import time
from pathlib import Path

import numpy as np

from benchmark.events import first_steps, read_hyperparameters, read_segments, read_timed_scalars
from benchmark.scores import (
    REFERENCES,
    group_runs,
    label,
    load_references,
    published,
    save_figure,
    seed_order,
    smooth,
)

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ("global_step", "return", "length", "seconds")
PRIOR, PRIOR_CURVE = "prior.json", "prior.csv.gz"  # in a run folder `unstash` restored: the run up to its checkpoint
FINISHED = 0.9  # of the published budget: a run short of it gets no verdict
CLEANRL_WINDOW = 20  # the games CleanRL's envpool script averages in charts/avg_episodic_return
EQUIVALENCE = 0.1  # of |published mean|: the margin inside which "matches" may be said
ALPHA = 0.05
RULE = (
    f"How a row is read. A run short of {FINISHED:.0%} of the published budget is unfinished and never judged. One "
    "or two seeds of ours are a draw, not a verdict: the cell says where their mean lies against the published mean "
    "m ± 2 s. Three or more seeds get a verdict from Welch's t-test of our per-seed scores (sample std) against the "
    "published mean and std over its seeds (taken as a sample std): **above** or **below** when the two-sided p < "
    f"{ALPHA}; **matches** when the 90% confidence interval of the difference lies within ±{EQUIVALENCE:.0%} of m "
    f"(two one-sided tests at {ALPHA}); **undecided** otherwise. The score compared is the one computed as the "
    "published one was: for ppo_atari_envpool.py CleanRL's 20-game running mean averaged over its last 100 values "
    "(column *CleanRL-style*), else the mean of the last 100 episodes."
)


def key(env_id: str, exp_name: str, seed: str) -> str:
    return f"{env_id.replace('/', '_')}__{exp_name}__{seed}"


# Export: run folders -> curves as data ------------------------------------------------------------------------


def job_log(logs: Path, run_dir: Path) -> str:
    """The text of the job log (benchmark.run_seeds) that names `run_dir` as its run folder; empty where none does."""
    for log in sorted(logs.rglob("*.log")) if logs.is_dir() else []:
        text = log.read_text(errors="replace")
        if re.search(rf"^run folder: {re.escape(str(run_dir))}/?$", text, re.M):
            return text
    return ""


def code_history(log_text: str, segments: list) -> list[dict]:
    """Each start and resume of the job (`# code: COMMIT at TIME` in its log), with the first step its process logged:
    that of the first events file opened after it."""
    opened = [opened for opened, _ in segments]
    steps = first_steps(segments)
    history = []
    for commit, when in re.findall(r"^# code: (\S+) at (.+ UTC)$", log_text, re.M):
        started = calendar.timegm(time.strptime(when, "%Y-%m-%d %H:%M:%S UTC"))
        later = [k for k, t in enumerate(opened) if t >= started - 1]
        step = steps[later[0]] if later and steps[later[0]] is not None else None
        history.append({"commit": commit, "started": when, "from_step": step})
    return history


def export_run(run_dir: Path, seed: str, logs: Path) -> tuple[dict, list[tuple]]:
    """The record (.json) and the curve (one tuple per episode, COLUMNS) of one run folder."""
    from benchmark.scripts import machine

    env_id, exp_name = run_dir.name.split("__")[:2]
    segments = read_segments(run_dir)
    start, scalars = read_timed_scalars(run_dir, segments)
    returns = scalars.get("charts/episodic_return", [])
    lengths = scalars.get("charts/episodic_length", [])
    if len(lengths) != len(returns):
        lengths = [(step, wall, float("nan")) for step, wall, _ in returns]
    curve = [(step, value, length, wall - start) for (step, wall, value), (_, _, length) in zip(returns, lengths)]
    points = [point for tag_points in scalars.values() for point in tag_points]
    arguments = read_hyperparameters(run_dir)
    prior = json.loads((run_dir / PRIOR).read_text()) if (run_dir / PRIOR).is_file() else None
    record = {
        "exp_name": exp_name,
        "env_id": env_id,
        "seed": seed,
        "run": run_dir.name,
        "budget": int(arguments[-1]["total_timesteps"]) if arguments and "total_timesteps" in arguments[-1] else None,
        "steps": max((step for step, _, _ in points), default=0),
        "seconds": max((wall for _, wall, _ in points), default=start) - start if points else 0.0,
        "threads": list(dict.fromkeys(params["torch_threads"] for params in arguments if "torch_threads" in params)),
        "machine": machine(),
        "exported": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "code": code_history(job_log(logs, run_dir), segments),
    }
    if prior is not None:  # a run restored by `unstash`: the curve up to its checkpoint came with it
        before = read_curve(run_dir / PRIOR_CURVE)
        curve = [(int(s), r, n, t) for s, r, n, t in zip(*(before[column] for column in COLUMNS))] + [
            (s, r, n, t + prior["seconds"]) for s, r, n, t in curve if s > prior["from_step"]
        ]
        record["seconds"] += prior["seconds"]
        record["threads"] = list(dict.fromkeys(prior["threads"] + record["threads"]))
        known = {(c["commit"], c["started"]) for c in prior["code"]}
        record["code"] = prior["code"] + [c for c in record["code"] if (c["commit"], c["started"]) not in known]
    return record, curve


def write_curve(path: Path, curve: list[tuple]):
    """The curve as gzip-compressed CSV, byte for byte the same for the same curve (no time stamp in the header)."""
    text = ",".join(COLUMNS) + "\n" + "".join(f"{s},{r:.9g},{n:.9g},{t:.3f}\n" for s, r, n, t in curve)
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as f:
        f.write(text.encode())
    path.write_bytes(buffer.getvalue())


def read_curve(path: Path) -> dict[str, np.ndarray]:
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    if not lines or tuple(lines[0].split(",")) != COLUMNS:
        raise ValueError(f"{path} is not a curve: its first line is not {','.join(COLUMNS)}")
    values = np.array([line.split(",") for line in lines[1:]], dtype=float).reshape(-1, len(COLUMNS))
    return dict(zip(COLUMNS, values.T))


def export(root: Path, curves: Path, logs: Path | None = None) -> list[Path]:
    """Writes the curve and record of every run folder under root into `curves`; returns the records' paths. Job logs
    are looked for under `logs` (root/logs by default)."""
    curves.mkdir(parents=True, exist_ok=True)
    written = []
    for (env_id, exp_name), runs in group_runs(root).items():
        for run_dir, seed in runs:  # a seed run again (a new folder) replaces the older folder's curve
            record, curve = export_run(run_dir, seed, logs or root / "logs")
            name = key(env_id, exp_name, seed)
            write_curve(curves / f"{name}.csv.gz", curve)
            path = curves / f"{name}.json"
            before = json.loads(path.read_text()) if path.is_file() else {}
            if {**before, "exported": record["exported"]} == record:  # nothing new: the record stays as it was
                record["exported"] = before.get("exported", record["exported"])
            path.write_text(json.dumps(record, indent=1) + "\n")
            written.append(path)
    return written


# Stash and unstash: the runs carried to another machine through the repository -------------------------------------


def stash(root: Path, to: Path, logs: Path | None = None) -> list[Path]:
    """Writes into `to`, for every job log under `logs` (root/logs by default), `<key>.json` (the log, where it lies
    under `logs`, and for an unfinished job its run folder's name, the checkpoint's step, the training time and code up
    to it), and for an unfinished job with a checkpoint `<key>.checkpoint.pt.gz` and `<key>.prior.csv.gz` (its curve
    up to the checkpoint's step). Returns the paths of the records written or changed."""
    import torch

    logs = logs or root / "logs"
    folders = {run_dir.name: (run_dir, seed) for runs in group_runs(root).values() for run_dir, seed in runs}
    to.mkdir(parents=True, exist_ok=True)
    written = []
    for log in sorted(logs.rglob("*.log")) if logs.is_dir() else []:
        text = log.read_text(errors="replace")
        named = re.findall(r"^run folder: (.+)$", text, re.M)
        if not named or Path(named[-1]).name not in folders:
            continue
        run_dir, seed = folders[Path(named[-1]).name]
        env_id, exp_name = run_dir.name.split("__")[:2]
        name = key(env_id, exp_name, seed)
        entry = {"run": run_dir.name, "log": str(log.relative_to(logs)), "log_text": log_summary(text)}
        path, checkpoint = to / f"{name}.json", run_dir / "checkpoint.pt"
        before = json.loads(path.read_text()) if path.is_file() else {}
        if not text.rstrip().endswith("# exit 0") and checkpoint.is_file():
            step = int(torch.load(checkpoint, map_location="cpu", weights_only=True)["global_step"])
            if before.get("run") == run_dir.name and before.get("from_step") == step:
                continue  # the checkpoint has not moved on since the last stash
            record, curve = export_run(run_dir, seed, logs)
            prior = [row for row in curve if row[0] <= step]
            entry |= {
                "from_step": step,
                "seconds": prior[-1][3] if prior else 0.0,
                "threads": record["threads"],
                "code": [c for c in record["code"] if c["from_step"] is None or c["from_step"] <= step],
            }
            write_curve(to / f"{name}.prior.csv.gz", prior)
            with gzip.GzipFile(to / f"{name}.checkpoint.pt.gz", "wb", mtime=0) as f:
                f.write(checkpoint.read_bytes())
        else:  # finished (or no checkpoint to go on from): its log alone, so that the job is not run again
            for stale in (to / f"{name}.prior.csv.gz", to / f"{name}.checkpoint.pt.gz"):
                stale.unlink(missing_ok=True)
        if entry != before:
            path.write_text(json.dumps(entry, indent=1) + "\n")
            written.append(path)
    return written


def log_summary(text: str) -> str:
    """What a job log must carry to a new machine: the runner's own lines (`# code: ...` of each start and resume,
    `# exit N`) and the run folder, as `run folder: {ROOT}/NAME`; not the script's output, nor the commands with this
    machine's paths."""
    lines = [line for line in text.splitlines() if line.startswith("# ") or line.startswith("run folder: ")]
    return "".join(re.sub(r"^run folder: .*/", "run folder: {ROOT}/", line) + "\n" for line in lines)


def unstash(stashed: Path, root: Path, logs: Path | None = None) -> list[Path]:
    """Puts what `stash` wrote back under `root`: each job's log (where none is), and each unfinished run's folder
    with its checkpoint and the curve up to it (where no folder of that name is: a live run is newer). Returns the
    logs and folders written."""
    logs = logs or root / "logs"
    written = []
    for path in sorted(stashed.glob("*.json")):
        entry = json.loads(path.read_text())
        name, run_dir, log = path.name[: -len(".json")], root / entry["run"], logs / entry["log"]
        if "from_step" in entry and not run_dir.exists():
            run_dir.mkdir(parents=True)
            (run_dir / "checkpoint.pt").write_bytes(
                gzip.decompress((stashed / f"{name}.checkpoint.pt.gz").read_bytes())
            )
            (run_dir / PRIOR_CURVE).write_bytes((stashed / f"{name}.prior.csv.gz").read_bytes())
            prior = {field: entry[field] for field in ("from_step", "seconds", "threads", "code")}
            (run_dir / PRIOR).write_text(json.dumps(prior, indent=1) + "\n")
            written.append(run_dir)
        if not log.exists():  # the log names the run folder where it now lies, as benchmark.run_seeds reads it
            log.parent.mkdir(parents=True, exist_ok=True)
            text = entry["log_text"].replace("run folder: {ROOT}/", f"run folder: {root}/")
            log.write_text(text)
            written.append(log)
    return written


# Table: curves -> scores, verdicts, plots -------------------------------------------------------------------------


def cleanrl_score(returns: np.ndarray, last: int) -> float:
    """The score as CleanRL's envpool script logs and the published table averages it: at each game's end the mean of
    the last 20 games (fewer at the start), then the mean of the last `last` of those values."""
    if not len(returns):
        return float("nan")
    return float(np.mean(smooth(np.asarray(returns, dtype=float), CLEANRL_WINDOW)[-last:]))


def position(score: float, mean: float, std: float) -> str:
    """Where a score lies against the published mean ± 2 std, in words."""
    if score > mean + 2 * std:
        return "above the published mean + 2 std"
    if score < mean - 2 * std:
        return "below the published mean − 2 std"
    return "inside the published mean ± 2 std"


def welch(scores: list[float], mean: float, std: float, seeds: int) -> tuple[float, float, float, float]:
    """Welch's t-test of our per-seed scores against a published mean and std over `seeds` seeds: (difference of the
    means, two-sided p, and the 90% confidence interval of the difference)."""
    from scipy import stats

    ours = np.asarray(scores, dtype=float)
    difference = float(ours.mean() - mean)
    v1, v2 = ours.var(ddof=1) / len(ours), std**2 / seeds
    se = math.sqrt(v1 + v2)
    if se == 0:  # every score the same on both sides
        return difference, 1.0 if difference == 0 else 0.0, difference, difference
    df = (v1 + v2) ** 2 / (v1**2 / (len(ours) - 1) + v2**2 / (seeds - 1))
    p = float(2 * stats.t.sf(abs(difference) / se, df))
    half = float(stats.t.ppf(1 - ALPHA, df)) * se
    return difference, p, difference - half, difference + half


def verdict(scores: list[float], mean: float, std: float, seeds: int) -> str:
    """RULE's words for the finished seeds' scores of one script and game."""
    if len(scores) < 3:
        words = {1: "one seed", 2: "two seeds, their mean"}[len(scores)]
        return f"{words}: {position(float(np.mean(scores)), mean, std)} (no verdict)"
    difference, p, low, high = welch(scores, mean, std, seeds)
    if p < ALPHA:
        return f"**{'above' if difference > 0 else 'below'}** (Welch p = {p:.3f})"
    margin = EQUIVALENCE * abs(mean)
    if -margin < low and high < margin:
        return f"**matches** (Welch p = {p:.2f}; 90% CI of the difference {low:+.2f} to {high:+.2f})"
    return f"**undecided** (Welch p = {p:.2f}; 90% CI of the difference {low:+.2f} to {high:+.2f})"


def load_runs(curves: Path, last: int) -> list[dict]:
    """Every record of the curves folder with its scores: `score` (mean of the last `last` episodes) and
    `cleanrl_score` from the curve, or the recorded numbers of a re-typed row."""
    runs = []
    for path in sorted(curves.glob("*.json")):
        run = json.loads(path.read_text())
        curve_path = path.with_name(path.name[: -len(".json")] + ".csv.gz")
        if curve_path.exists():
            curve = read_curve(curve_path)
            run["curve"] = curve
            run["score"] = float(np.mean(curve["return"][-last:])) if len(curve["return"]) else float("nan")
            run["cleanrl_score"] = cleanrl_score(curve["return"], last)
            run["episodes"] = len(curve["return"])
        elif "retyped" not in run:
            raise ValueError(f"{path} has no curve beside it and is not a re-typed row")
        runs.append(run)
    return sorted(runs, key=lambda run: (run["env_id"], run["exp_name"], seed_order(str(run["seed"]))))


def code_cell(run: dict) -> str:
    """The commits that trained a run, each once in order, shortened (`+` where the checkout had changes)."""
    commits = [entry["commit"].replace("+uncommitted", "+") for entry in run.get("code", [])]
    return ", ".join(dict.fromkeys(commit[:7] + "+" * commit.endswith("+") for commit in commits)) or "—"


def duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def budget_of(run: dict, references: dict) -> int | None:
    reference = references.get((f"{run['exp_name']}.py", run["env_id"]))
    return reference["steps"] if reference else run.get("budget")


def runs_table(runs: list[dict], references: dict, last: int) -> list[str]:
    lines = [
        f"| script | env | seed | score (last {last} episodes) | CleanRL-style | episodes | steps (of the published "
        "budget) | training time | SPS | PyTorch threads | code |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        budget = budget_of(run, references)
        share = f" ({run['steps'] / budget:.0%})" if budget else ""
        style = f"{run['cleanrl_score']:.2f}" if "cleanrl_score" in run else "—"
        threads = ", ".join(map(str, run["threads"])) if isinstance(run["threads"], list) else str(run["threads"])
        seed = f"{run['seed']} *" if "retyped" in run else str(run["seed"])
        lines.append(
            f"| {label(run['exp_name'])} | {run['env_id']} | {seed} | {run['score']:.2f} | {style} "
            f"| {run['episodes']:,} | {run['steps']:,}{share} | {duration(run['seconds'])} "
            f"| {run['steps'] / run['seconds'] if run['seconds'] else float('nan'):.0f} | {threads or '—'} "
            f"| {code_cell(run)} |"
        )
    return lines


def scores_table(runs: list[dict], references: dict) -> tuple[list[str], list[str]]:
    """A row per script and game: the finished seeds' scores, their mean, the published score and RULE's words; and
    the sources of the published scores."""
    lines = [
        "| script | env | seeds finished | compared score, per seed | mean ± std (ddof 1) | published (CleanRL) "
        "| reading |",
        "|---|---|---|---|---|---|---|",
    ]
    sources, groups = [], {}
    for run in runs:
        groups.setdefault((run["exp_name"], run["env_id"]), []).append(run)
    for (exp_name, env_id), group in groups.items():
        reference = references.get((f"{exp_name}.py", env_id))
        budget = budget_of(group[0], references)
        done = [run for run in group if budget and run["steps"] >= FINISHED * budget]
        cleanrl_style = bool(reference) and reference.get("metric") == "avg_episodic_return"
        column = "CleanRL-style" if cleanrl_style else "score"
        scores = [run.get("cleanrl_score", run["score"]) if cleanrl_style else run["score"] for run in done]
        if cleanrl_style and any("cleanrl_score" not in run for run in done):
            scores = []  # a re-typed row has no curve to compute CleanRL's score from: nothing comparable
        per_seed = ", ".join(f"{score:.2f}" for score in scores) or "—"
        spread = f"{np.mean(scores):.2f} ± {np.std(scores, ddof=1):.2f}" if len(scores) > 1 else "—"
        if not done:
            furthest = max(run["steps"] for run in group)
            reading = f"unfinished ({furthest / budget:.0%} of the budget)" if budget else "no budget known"
        elif not scores:
            reading = "no curve to compute the CleanRL-style score from (re-typed row): not compared"
        elif not reference:
            reading = "no published score"
        else:
            reading = verdict(scores, reference["mean"], reference["std"], reference["seeds"])
        cell = published(reference) if reference else "—"
        if reference and reference["source"] not in sources:
            sources.append(reference["source"])
        lines.append(
            f"| {label(exp_name)} | {env_id} | {len(done)} | {column}: {per_seed} | {spread} | {cell} | {reading} |"
        )
    return lines, sources


def plot_curves(runs: list[dict], out_dir: Path, references: dict, window: int) -> list[Path]:
    """Per script and game, the mean curve over its finished seeds, or over its seeds while none has finished
    (smoothed over `window` episodes, on the range every seed drawn covers), against steps and against training time,
    the published mean dashed; returns the PNGs' paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    groups, written = {}, []
    for run in runs:
        if "curve" in run and len(run["curve"]["return"]):
            groups.setdefault((run["env_id"], run["exp_name"]), []).append(run)
    for (env_id, exp_name), group in groups.items():
        reference = references.get((f"{exp_name}.py", env_id))
        budget = budget_of(group[0], references)
        finished = [run for run in group if budget and run["steps"] >= FINISHED * budget]
        group = finished or group  # an unfinished seed joins the plot once it finishes
        for axis, suffix, xlabel in (("global_step", "", "global step"), ("seconds", "-time", "training time (h)")):
            xs = [run["curve"][axis] / (3600 if axis == "seconds" else 1) for run in group]
            ys = [smooth(run["curve"]["return"], window) for run in group]
            first, final = max(x[0] for x in xs), min(x[-1] for x in xs)
            grid = np.linspace(first, final, 200) if first < final else np.array([first])
            values = np.stack([np.interp(grid, x, y) for x, y in zip(xs, ys)])
            seeds = ", ".join(str(run["seed"]) for run in group)
            fig, ax = plt.subplots(figsize=(6, 4))
            ax.plot(grid, values.mean(0), label=f"{label(exp_name)}, seed{'s' * (len(group) > 1)} {seeds}")
            if len(group) > 1:
                ax.fill_between(grid, values.min(0), values.max(0), alpha=0.25, label="min-max over seeds")
            if reference:
                ax.axhline(reference["mean"], color="grey", linestyle="--", label="CleanRL's published mean")
                low, high = ax.get_ylim()  # fitted to the curve alone: room for the dashed line off the frame
                low, high = min(low, reference["mean"]), max(high, reference["mean"])
                ax.set_ylim(low - 0.05 * (high - low), high + 0.05 * (high - low))
            ax.set(title=f"{label(exp_name)} on {env_id}", xlabel=xlabel, ylabel=f"episodic return ({window} games)")
            ax.legend(loc="best", fontsize="small")
            written.append(save_figure(fig, out_dir / f"{env_id.replace('/', '_')}__{exp_name}{suffix}.png"))
    return written


def shown(path: Path) -> str:
    """A path as typed from the repository root where it lies inside it."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if ROOT in path.parents else str(path)


def document(runs: list[dict], references: dict, curves: Path, last: int) -> str:
    scores, sources = scores_table(runs, references)
    machines = sorted({run["machine"] for run in runs if run.get("machine")})
    exported = max((run.get("exported", "") for run in runs), default="")
    lines = [
        "# Every script at its published budget, beside CleanRL's published scores",
        "",
        f"Made by `python -m benchmark.full_budget table {shown(curves)}` from the learning curves in that folder "
        f"alone (exported up to {exported or 'never'}); the runs: `bash benchmark/ppo.sh fullbudget` on "
        f"{'; '.join(machines) or 'no machine recorded'}, each script at its defaults.",
        "",
        RULE,
        "",
        *scores,
        "",
        "## The runs",
        "",
        *runs_table(runs, references, last),
        "",
        "code: the commit checked out at each start and resume of the run, in order; `+`: the checkout's tracked "
        "files differed from it then (its code only for starts from 2026-12-02 20:34 UTC on; before, any tracked "
        "file, the block's own curves and table included, so an older `+` may be results alone).",
    ]
    retyped = [run for run in runs if "retyped" in run]
    if retyped:
        notes = "; ".join(
            f"{label(run['exp_name'])} on {run['env_id']}, seed {run['seed']}: {run['retyped']}" for run in retyped
        )
        lines += ["", f"\\* Re-typed row, no curve: {notes}."]
    if sources:
        lines += ["", "Published scores: " + "; ".join(sources) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmark.full_budget",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    exporting = commands.add_parser("export", help="run folders -> curves and records (data)")
    exporting.add_argument("root", type=Path, help="folder holding the run folders")
    exporting.add_argument("--curves", type=Path, required=True, help="write the curves and records into this folder")
    exporting.add_argument("--logs", type=Path, help="folder of the job logs (default: ROOT/logs)")
    stashing = commands.add_parser("stash", help="run folders -> what carries them to another machine")
    stashing.add_argument("root", type=Path, help="folder holding the run folders")
    stashing.add_argument("--to", type=Path, required=True, help="write the stash into this folder")
    stashing.add_argument("--logs", type=Path, help="folder of the job logs (default: ROOT/logs)")
    unstashing = commands.add_parser("unstash", help="a stash -> job logs and run folders to resume")
    unstashing.add_argument("stash", type=Path, help="folder that stash wrote")
    unstashing.add_argument("root", type=Path, help="folder to put the run folders in")
    unstashing.add_argument("--logs", type=Path, help="folder of the job logs (default: ROOT/logs)")
    tabling = commands.add_parser("table", help="curves -> the table and the plots")
    tabling.add_argument("curves", type=Path, help="folder of curves and records (what export wrote)")
    tabling.add_argument("--out", type=Path, help="write the markdown here (else print it)")
    tabling.add_argument("--plots", type=Path, help="write the learning curves into this folder")
    tabling.add_argument("--last", type=int, default=100, help="episodes a score averages")
    tabling.add_argument("--window", type=int, default=100, help="episodes each point of a plotted curve averages")
    tabling.add_argument("--references", type=Path, default=REFERENCES, help="published numbers (JSON)")
    args = parser.parse_args(argv)
    if args.command == "export":
        if not args.root.is_dir():
            parser.error(f"no folder {args.root}")
        for path in export(args.root, args.curves, args.logs):
            print(f"wrote {path}")
        return
    if args.command in ("stash", "unstash"):
        source = args.root if args.command == "stash" else args.stash
        if not source.is_dir():
            parser.error(f"no folder {source}")
        done = (
            stash(args.root, args.to, args.logs)
            if args.command == "stash"
            else unstash(args.stash, args.root, args.logs)
        )
        for path in done:
            print(f"wrote {path}")
        return
    if not args.curves.is_dir():
        parser.error(f"no folder {args.curves}")
    references = load_references(args.references)
    try:
        runs = load_runs(args.curves, args.last)
    except (KeyError, TypeError, ValueError) as error:  # a JSONDecodeError is a ValueError
        parser.error(f"{args.curves} cannot be read as curves: {error}")
    if not runs:
        parser.error(f"{args.curves} holds no run (no .json record)")
    text = document(runs, references, args.curves, args.last)
    if args.plots:
        for path in plot_curves(runs, args.plots, references, args.window):
            print(f"wrote {path}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
