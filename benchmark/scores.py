"""Result tables and learning curves from run folders.

    python -m benchmark.scores runs/                     # the table of every run folder below runs/
    python -m benchmark.scores runs/ --last 100 --out results.md --plots plots/

The table: per seed the mean return of the last `--last` episodes, then the mean and standard
deviation over seeds, with steps, runtime and SPS, and the published reference beside ours where
benchmark/reference.json has one (with its step budget and seed count; its sources are listed under
the table).

Beside it, the aggregates of Agarwal et al. (2021, "Deep RL at the edge of the statistical precipice"),
computed with their library `rliable`: the interquartile mean (IQM, the mean of the middle 50% of the
scores) with a 95% stratified-bootstrap confidence interval, per (env, script) over seeds, and per script
over seeds and environments with scores normalised against the published reference (see `normalise`),
where a group has at least MIN_IQM_RUNS scores: of fewer the IQM trims nothing (it is their mean, and the
interval of 3 seeds their min-max: both in the table above), so a line under the IQM table names those groups.
With `--plots`, a performance profile per script (`DIR/profile__<exp_name>.png`): the fraction of runs
whose normalised score exceeds each threshold tau, with its bootstrap band.

The plots (`--plots DIR`), for each (env, script): `DIR/<env>__<exp_name>.png`, the episodic return
against the global step, and `DIR/<env>__<exp_name>-time.png`, against the wall time since each run's
first event: the mean over seeds as a line and the min-max range over seeds as a shaded band, with
the published reference as a dashed line where there is one. See `curves` for how seeds whose
episodes end at different steps are averaged.

Run folders are named `<env>__<exp_name>__<seed>__<time>` by the training scripts; runs of the same
env and exp_name are the seeds of one row (and of one plot).
"""

import argparse
import contextlib
import json
import re
import shlex
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmark.events import read_scalars, read_timed_scalars
from benchmark.scripts import SCRIPTS

REFERENCES = Path(__file__).with_name("reference.json")


def seed_order(seed: str) -> tuple[int, str]:
    """Seeds in numeric order (2 before 10, a branch after its seed's first run), any other name first."""
    number = re.match(r"-?\d+", seed)
    return (int(number.group()) if number else 0), seed


# the folders the scripts write: `<env>__<exp_name>__<seed>__<time>` (`-2`, `-3` when two started in the same second;
# the exp_name may hold `__`), and a --resume's branch of one, `<folder>__from-iteration-<i>` (a branch of a branch too)
RUN_NAME = re.compile(r"(?P<env>.+?)__(?P<exp>.+)__(?P<seed>[^_]+)__\d+(-\d+)?")
BRANCH = re.compile(r"__from-iteration-(\d+)(-\d+)?$")


def parse_run_name(name: str) -> tuple[str, str, str] | None:
    """(env_id, exp_name, seed) of a run folder's name, None for another folder. A branch's seed says where it
    branched: "1 (from iteration 40)"."""
    iterations = []
    while found := BRANCH.search(name):
        iterations.insert(0, found.group(1))
        name = name[: found.start()]
    run = RUN_NAME.fullmatch(name)
    if run is None:
        return None
    seed = run["seed"] + (f" (from iteration {', then '.join(iterations)})" if iterations else "")
    return run["env"], run["exp"], seed


def group_runs(root: Path, skipped: list[str] | None = None) -> dict[tuple[str, str], list[tuple[Path, str]]]:
    """{(env_id, exp_name): [(run_dir, seed), ...]} for every run folder with event files below root (branches
    included), each group's runs in the order of their seeds (2 before 10) and start times. A folder with event
    files whose name is not a run folder's is named in `skipped`, when given."""
    groups = defaultdict(list)
    for run_dir in sorted({events.parent for events in root.rglob("events.out.tfevents.*")}):
        parsed = parse_run_name(run_dir.name)
        if parsed is None:
            if skipped is not None:
                skipped.append(f"{run_dir} (not named <env>__<exp-name>__<seed>__<time>)")
            continue
        groups[parsed[:2]].append((run_dir, parsed[2]))
    return {
        key: sorted(runs, key=lambda run: (*seed_order(run[1]), run[0].name)) for key, runs in sorted(groups.items())
    }


def counted_runs(root: Path, skipped: list[str] | None = None) -> dict[tuple[str, str], list[tuple[Path, str]]]:
    """group_runs, with one run per seed in a group and only runs with episodes: of a seed's runs (its first and its
    branches) the one that went furthest counts. What is left out is named in `skipped`, when given, with why."""
    skipped = [] if skipped is None else skipped
    counted = {}
    for group, runs in group_runs(root, skipped).items():
        furthest = {}
        for run_dir, seed in runs:
            scalars = read_scalars(run_dir)
            if not scalars.get("charts/episodic_return"):
                skipped.append(f"{run_dir} (no episode in its event files: unreadable, or none ended yet)")
                continue
            steps = max(step for points in scalars.values() for step, _ in points)
            base = seed.split(" ")[0]
            if base in furthest and furthest[base][2] >= steps:
                skipped.append(f"{run_dir} (seed {base} counted from {furthest[base][0].name}, which went further)")
                continue
            if base in furthest:
                skipped.append(f"{furthest[base][0]} (seed {base} counted from {run_dir.name}, which went further)")
            furthest[base] = (run_dir, seed, steps)
        if furthest:
            counted[group] = sorted(
                [(run_dir, seed) for run_dir, seed, _ in furthest.values()],
                key=lambda run: (*seed_order(run[1]), run[0].name),
            )
    return counted


FINISHED = 0.99  # a run counts once it reached this share of its step budget (runs end on whole iterations)


def finished(last_step: int, budget: int) -> bool:
    return last_step >= FINISHED * budget


def load_references(path: Path = REFERENCES) -> dict[tuple[str, str], dict]:
    """{(script, env_id): entry} for every env id an entry of the reference file names."""
    entries = json.loads(Path(path).read_text())["references"]
    return {(entry["script"], env_id): entry for entry in entries for env_id in entry["env_ids"]}


def label(exp_name: str) -> str:
    """How a row names its runs: the script where the runs kept its name, else the --exp-name they were given
    (a study's runs of one script with other flags, e.g. ppo_continuous_action_beta)."""
    return f"{exp_name}.py" if exp_name in SCRIPTS else f"{exp_name} (--exp-name)"


def short_steps(steps: int) -> str:
    """500000 -> 500k, 10000000 -> 10M."""
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if steps >= size and steps % size == 0:
            return f"{steps // size}{unit}"
    return f"{steps:,}"


def published(reference: dict) -> str:
    """A reference cell: mean ± std, then the budget and seed count of CleanRL's runs, e.g. "(8M steps, 10 seeds)"."""
    return (
        f"{reference['mean']:.2f} ± {reference['std']:.2f} "
        f"({short_steps(reference['steps'])} steps, {reference['seeds']} seeds)"
    )


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


def table(root: Path, last: int, references: dict[tuple[str, str], dict] | None = None) -> str:
    references = load_references() if references is None else references
    lines = [
        f"| script | env | seeds | per seed (mean of last {last} episodes) | mean ± std | steps | runtime (s) "
        "| SPS | published reference |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    sources, skipped = [], []
    for (env_id, exp_name), runs in counted_runs(root, skipped).items():
        summaries = [summarize_run(run_dir, last) for run_dir, _ in runs]
        per_seed = ", ".join(f"{s['return']:.2f}" for s in summaries)
        means = np.array([s["return"] for s in summaries])
        reference = references.get((f"{exp_name}.py", env_id))
        cell = "—"
        if reference:
            cell = published(reference)
            sources += [reference["source"]] * (reference["source"] not in sources)
        lines.append(
            f"| {label(exp_name)} | {env_id} | {', '.join(seed for _, seed in runs)} | {per_seed} "
            f"| {means.mean():.2f} ± {means.std():.2f} | {int(np.mean([s['steps'] for s in summaries])):,} "
            f"| {np.mean([s['runtime'] for s in summaries]):.0f} | {np.mean([s['sps'] for s in summaries]):.0f} "
            f"| {cell} |"
        )
    if sources:
        lines += ["", "Published references (CleanRL): " + "; ".join(sources) + "."]
    if skipped:
        lines += ["", "Not counted: " + "; ".join(shown(entry, root) for entry in skipped) + "."]
    return "\n".join(lines)


def shown(entry: str, root: Path) -> str:
    """A skipped folder's line with its path relative to the folder read."""
    return entry.replace(f"{root}/", "", 1) if entry.startswith(f"{root}/") else entry


def normalise(score: float, reference: float) -> float:
    """A score on the scale of the published reference: 1 at the reference's mean and 0 at score 0 for a
    positive reference (score / reference); in general 1 + (score - reference) / |reference|, which keeps
    "higher is better" for negative references (Acrobot, MountainCar)."""
    return 1.0 + (score - reference) / abs(reference)


def iqm_with_ci(scores: np.ndarray, reps: int, seed: int = 0) -> tuple[float, float, float]:
    """IQM of a (runs, tasks) score matrix and its 95% stratified-bootstrap confidence interval (runs
    resampled within each task), from rliable: (iqm, low, high). The same scores give the same interval:
    see `seeded_numpy`."""
    from rliable import library as rly, metrics

    with seeded_numpy(seed):
        points, intervals = rly.get_interval_estimates(
            {"scores": scores}, lambda x: np.array([metrics.aggregate_iqm(x)]), reps=reps
        )
    return float(points["scores"][0]), float(intervals["scores"][0, 0]), float(intervals["scores"][1, 0])


@contextlib.contextmanager
def seeded_numpy(seed: int):
    """rliable 1.2.0 draws its bootstrap resamples from NumPy's global generator (the `random_state` it
    takes is not used for them): seed that generator for the block, then give back its state."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def block_scores(root: Path, last: int, references: dict[tuple[str, str], dict]) -> dict[str, tuple[list, np.ndarray]]:
    """{exp_name: (env ids, normalised scores of shape (seeds, envs))} for every script with a published
    reference on at least one environment; seeds are those run on every such environment of the script."""
    per_script = defaultdict(dict)
    for (env_id, exp_name), runs in counted_runs(root).items():
        reference = references.get((f"{exp_name}.py", env_id))
        if reference and reference["mean"] != 0:
            per_script[exp_name][env_id] = {
                seed: normalise(summarize_run(run_dir, last)["return"], reference["mean"]) for run_dir, seed in runs
            }
    blocks = {}
    for exp_name, envs in per_script.items():
        seeds = sorted(set.intersection(*(set(by_seed) for by_seed in envs.values())))
        if seeds:
            blocks[exp_name] = (sorted(envs), np.array([[envs[env][seed] for env in sorted(envs)] for seed in seeds]))
    return blocks


MIN_IQM_RUNS = 4  # the IQM trims a quarter of the scores at each end: of fewer than 4 it trims none


def aggregate_table(
    root: Path, last: int, references: dict[tuple[str, str], dict] | None = None, reps: int = 10_000
) -> str:
    """The IQM tables: per (env, script) over seeds (raw returns), then per script over seeds and the
    environments with a reference (normalised scores). A group of fewer than MIN_IQM_RUNS scores is named
    in a line under its table instead of a row (its IQM would be its mean)."""
    references = load_references() if references is None else references
    rows, few = [], []
    for (env_id, exp_name), runs in counted_runs(root).items():
        if len(runs) < MIN_IQM_RUNS:
            few.append(f"{label(exp_name)} on {env_id} ({len(runs)})")
            continue
        scores = np.array([[summarize_run(run_dir, last)["return"]] for run_dir, _ in runs])
        iqm, low, high = iqm_with_ci(scores, reps)
        rows.append(f"| {label(exp_name)} | {env_id} | {len(runs)} | {iqm:.2f} [{low:.2f}, {high:.2f}] |")
    header = f"| script | env | seeds | IQM of the seeds' mean of last {last} episodes [95% CI] |"
    parts = iqm_section(header, rows, few, "seeds")
    rows, few = [], []
    for exp_name, (envs, scores) in block_scores(root, last, references).items():
        if scores.size < MIN_IQM_RUNS:
            few.append(f"{label(exp_name)} on {', '.join(envs)} ({scores.size})")
            continue
        iqm, low, high = iqm_with_ci(scores, reps)
        rows.append(f"| {label(exp_name)} | {', '.join(envs)} | {len(scores)} | {iqm:.3f} [{low:.3f}, {high:.3f}] |")
    header = "| script | envs (normalised: 1 = published reference) | seeds | IQM [95% CI] |"
    return "\n\n".join(parts + iqm_section(header, rows, few, "seed-env scores"))


def iqm_section(header: str, rows: list[str], few: list[str], what: str) -> list[str]:
    """An IQM table of `rows` (where there are any), and a line naming the groups with too few scores for one."""
    parts = ["\n".join([header, "|---|---|---|---|", *rows])] if rows else []
    if few:
        parts.append(
            f"No IQM of fewer than {MIN_IQM_RUNS} {what} (it trims none of them: it would be their mean): "
            f"{'; '.join(few)}."
        )
    return parts


def plot_profiles(
    root: Path, out_dir: Path, last: int, references: dict[tuple[str, str], dict] | None = None, reps: int = 2000
) -> list[Path]:
    """Writes one performance profile per script (`profile__<exp_name>.png`): the fraction of its runs
    (seeds x envs) whose normalised score exceeds tau, with rliable's stratified-bootstrap 95% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rliable import library as rly, plot_utils

    references = load_references() if references is None else references
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for exp_name, (envs, scores) in block_scores(root, last, references).items():
        taus = np.linspace(min(0.0, scores.min()), max(1.5, scores.max()), 101)
        with seeded_numpy(0):
            profiles, bands = rly.create_performance_profile({exp_name: scores}, taus, reps=reps)
        fig, ax = plt.subplots(figsize=(6, 4))
        plot_utils.plot_performance_profiles(
            profiles,
            taus,
            performance_profile_cis=bands,
            ax=ax,
            colors={exp_name: "tab:blue"},
            xlabel=r"normalised score $\tau$ (1 = published reference)",
            ylabel=r"fraction of runs with score $> \tau$",
        )
        ax.set_title(f"{label(exp_name)}: {len(scores)} seeds x {len(envs)} envs", fontsize="medium")
        written.append(save_figure(fig, out_dir / f"profile__{exp_name}.png"))
    return written


def save_figure(fig, path: Path) -> Path:
    """Writes a figure as a PNG (100 dpi, tight layout), closes it, and returns the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Each value replaced by the mean of itself and the `window - 1` values before it (fewer at the
    start); window 1 leaves the values as they are."""
    sums = np.cumsum(np.concatenate([[0.0], values]))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(ends - window, 0)
    return (sums[ends] - sums[starts]) / (ends - starts)


def curves(run_dirs: list[Path], axis: str = "step", window: int = 1, points: int = 200):
    """The episodic-return curves of the seeds of one group on a common grid: (grid, values) with
    values of shape (seeds, points); values.mean(0) is the mean curve, values.min(0) and values.max(0)
    the band.

    `axis` is "step" (the global step each episode ended at) or "time" (the wall time of that episode's
    event, in seconds since the run's first event). Each seed's returns, smoothed over `window`
    episodes (`smooth`), are linearly interpolated (np.interp) onto `points` evenly spaced grid points
    from the latest first episode to the earliest last episode over the seeds: the range that every
    seed covers, so that no seed is extrapolated and every grid point averages all seeds. Seeds
    without any episode are left out; returns None when no seed has one or the seeds' ranges do not
    overlap."""
    xs, ys = [], []
    for run_dir in run_dirs:
        start, scalars = read_timed_scalars(run_dir)
        episodes = scalars.get("charts/episodic_return", [])
        if episodes:
            step, wall_time, value = map(np.array, zip(*episodes))
            xs.append(step.astype(float) if axis == "step" else wall_time - start)
            ys.append(smooth(value, window))
    if not xs:
        return None
    first, last = max(x[0] for x in xs), min(x[-1] for x in xs)
    if first > last:
        return None
    grid = np.linspace(first, last, points)
    return grid, np.stack([np.interp(grid, x, y) for x, y in zip(xs, ys)])


def plot(
    root: Path, out_dir: Path, window: int = 10, references: dict[tuple[str, str], dict] | None = None
) -> list[Path]:
    """Writes the learning-curve PNGs of every group below root into out_dir (curves smoothed over
    `window` episodes); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    references = load_references() if references is None else references
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for (env_id, exp_name), runs in counted_runs(root).items():
        reference = references.get((f"{exp_name}.py", env_id))
        for axis, suffix, xlabel in (("step", "", "global step"), ("time", "-time", "wall time (s)")):
            curve = curves([run_dir for run_dir, _ in runs], axis, window)
            if curve is None:
                print(
                    f"no {axis} curve for {label(exp_name)} on {env_id}: "
                    f"no episodes, or no {axis} range that all seeds cover"
                )
                continue
            grid, values = curve
            fig, ax = plt.subplots(figsize=(6, 4))
            ax.plot(
                grid, values.mean(0), label=f"{label(exp_name)}, mean of {len(values)} seed{'s' * (len(values) > 1)}"
            )
            ax.fill_between(grid, values.min(0), values.max(0), alpha=0.25, label="min-max over seeds")
            if reference:
                ax.axhline(
                    reference["mean"],
                    color="grey",
                    linestyle="--",
                    label=f"CleanRL at {short_steps(reference['steps'])} steps",
                )
            ax.set(title=f"{label(exp_name)} on {env_id}", xlabel=xlabel, ylabel="episodic return")
            ax.legend(loc="best", fontsize="small")
            written.append(save_figure(fig, out_dir / f"{env_id.replace('/', '_')}__{exp_name}{suffix}.png"))
    return written


def fail(message: str):
    """One line on stderr and exit 2, as the training scripts do for bad input."""
    print(f"benchmark.scores: error: {message}", file=sys.stderr)
    sys.exit(2)


def header(argv: list[str]) -> str:
    """The first line of a written table: when, the command that wrote it (paths below the current folder relative
    to it, so that the line reads as it was typed from the repository root) and the machine."""
    from benchmark.scripts import machine

    here = Path.cwd()
    relative = [
        str(Path(a).relative_to(here)) if Path(a).is_absolute() and here in Path(a).parents else a for a in argv
    ]
    written = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return f"Written {written} by `python -m benchmark.scores {shlex.join(relative)}` on {machine()}."


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, help="folder holding run folders")
    parser.add_argument("--last", type=int, default=100, help="episodes averaged per seed")
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    parser.add_argument("--plots", type=Path, default=None, help="write learning-curve PNGs into this folder")
    parser.add_argument("--window", type=int, default=10, help="episodes each point of a plotted curve averages")
    parser.add_argument("--references", type=Path, default=REFERENCES, help="published numbers (JSON)")
    parser.add_argument("--reps", type=int, default=10_000, help="bootstrap resamples of the IQM intervals")
    args = parser.parse_args()
    if not args.root.is_dir():
        fail(f"{args.root}: no such folder")
    skipped = []
    if not counted_runs(args.root, skipped):
        if skipped:
            fail(f"no run to count below {args.root}: " + "; ".join(shown(entry, args.root) for entry in skipped))
        fail(f"no run folder below {args.root} (a folder <env>__<exp-name>__<seed>__<time> with events.out.tfevents.*)")
    references = load_references(args.references)
    aggregates = aggregate_table(args.root, args.last, references, args.reps)
    text = table(args.root, args.last, references) + ("\n\n" + aggregates if aggregates else "")
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(header(sys.argv[1:]) + "\n\n" + text + "\n")
    if args.plots:
        for path in plot(args.root, args.plots, args.window, references) + plot_profiles(
            args.root, args.plots, args.last, references
        ):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
