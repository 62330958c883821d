"""The studies of ppo_continuous_action.py's options, from the runs of `bash benchmark/ppo.sh mujoco objective
distribution dmc bootstrap`: one results file per study with its tables, set beside the default's runs (the
`mujoco` block) and the published numbers.

    python -m benchmark.studies.options runs/benchmark   # every study whose runs are there, into
                                                          # runs/benchmark/studies/study_<name>.md
    python -m benchmark.studies.options runs/benchmark --only dmc --out-dir benchmark/results  # the committed file

Objective: PPO-Clip, adaptive KL (d_targ 0.01) and fixed KL (beta 1), each also normalised as in the PPO paper's
Table 1 (per task 0 = a random policy, 1 = the best setting's mean) beside the paper's figures. Distribution: Beta
beside Gaussian. Dmc: DeepMind Control beside CleanRL's published returns. Bootstrap: HalfCheetah-v4 with and
without the time-limit bootstrap (seeds 1-10 a side, each run's posture from its last checkpoint: on its back when
the torso's mean pitch cosine is negative), and four more tasks without it. A run's score: the mean return of its
last 100 training episodes; what is written below a file's `## Verdict` line is kept.
"""

import argparse
import contextlib
import math
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

from benchmark.scores import finished, group_runs, load_references, published, summarize_run
from benchmark.scripts import import_script, machine, table_head, utc_now

SCRIPT = "ppo_continuous_action"
LAST = 100
VERDICT = "## Verdict\n"  # what follows it in a results file is written by hand and kept
# Schulman et al. 2017, Table 1 (7 MuJoCo tasks, 1M steps, 3 seeds, normalised 0 = random, 1 = best setting)
PAPER = {"clip": ("clipping, epsilon = 0.2", 0.82), "adaptive_kl": ("adaptive KL, d_targ = 0.01", 0.74)}
PAPER["fixed_kl"] = ("fixed KL, beta = 1", 0.71)
OBJECTIVES = {"clip": SCRIPT, "adaptive_kl": f"{SCRIPT}_adaptive_kl", "fixed_kl": f"{SCRIPT}_fixed_kl"}
RANDOM_EPISODES = 20
STEPS = 1_000_000  # every study's budget: a run counts once it has finished it (benchmark.scores.finished)


def done(run_dir: Path) -> bool:
    return finished(summarize_run(run_dir, LAST)["steps"], STEPS)


def runs_of(root: Path, block: str, exp_name: str, env_id: str) -> list[tuple[Path, str]]:
    """The finished run folders (and seeds) of one (env, exp_name) in one block, by seed."""
    runs = group_runs(root / block).get((env_id, exp_name), []) if (root / block).is_dir() else []
    return [run for run in runs if done(run[0])]


def provenance(root: Path, name: str) -> str:
    """Where the tables come from: the recipe's blocks, when their runs started, and each block's own table."""
    blocks = BLOCKS[name]
    starts = [int(run_dir.name.split("__")[-1]) for block in blocks if (root / block).is_dir()
              for runs in group_runs(root / block).values() for run_dir, _ in runs]  # fmt: skip
    when = " to ".join(sorted({time.strftime("%Y-%m-%d", time.gmtime(t)) for t in (min(starts), max(starts))}))
    tables = ", ".join(f"[{block}.md]({block}.md)" for block in blocks)
    if not starts:
        return ""
    return (f"Runs: `bash benchmark/ppo.sh {' '.join(blocks)}`, started {when} (UTC), one at a time with "
            f"`OMP_NUM_THREADS=1`; each block's own table, with the IQM and the curves: {tables}.\n\n")  # fmt: skip


def unfinished(root: Path, blocks: list[str]) -> str:
    """A line naming the runs of `blocks` that the tables leave out, not having reached their budget yet."""
    found = [run_dir for block in blocks if (root / block).is_dir() for runs in group_runs(root / block).values()
             for run_dir, _ in runs]  # fmt: skip
    left = [
        f"{run_dir.name} ({summarize_run(run_dir, LAST)['steps']:,} steps)" for run_dir in found if not done(run_dir)
    ]
    return f"\n\nUnfinished runs, left out of the tables: {', '.join(left)}." if left else ""


def scores(runs: list[tuple[Path, str]]) -> dict[str, float]:
    return {seed: summarize_run(run_dir, LAST)["return"] for run_dir, seed in runs}


def mean_std(values) -> str:
    values = list(values)
    if not values:
        return "not run"
    return f"{np.mean(values):.2f} ± {np.std(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def per_seed(by_seed: dict[str, float]) -> str:
    return ", ".join(f"{value:.1f} ({seed})" for seed, value in by_seed.items()) or "not run"


def side_by_side(root: Path, envs: list[str], first: tuple[str, str], second: tuple[str, str]) -> list[str]:
    """A row per task setting two kinds of run (each a block and an exp_name) beside each other: per seed, then
    mean ± std."""
    rows = []
    for env in envs:
        a, b = (scores(runs_of(root, block, exp_name, env)) for block, exp_name in (first, second))
        rows.append(f"| {env} | {per_seed(a)} | {per_seed(b)} | {mean_std(a.values())} | {mean_std(b.values())} |")
    return rows


def random_return(env_id: str, episodes: int = RANDOM_EPISODES, seed: int = 0) -> float:
    """The mean return of uniformly random actions over `episodes` episodes (seeded)."""
    env = gym.make(env_id)
    env.action_space.seed(seed)
    total = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        done, ret = False, 0.0
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            ret, done = ret + float(reward), terminated or truncated
        total.append(ret)
    env.close()
    return float(np.mean(total))


def objective(root: Path) -> str:
    tasks = ["Hopper-v4", "HalfCheetah-v4", "Walker2d-v4"]
    found = {(name, env): scores(runs_of(root, block, exp, env)) for env in tasks for name, exp, block in (
        ("clip", OBJECTIVES["clip"], "mujoco"),
        ("adaptive_kl", OBJECTIVES["adaptive_kl"], "objective"),
        ("fixed_kl", OBJECTIVES["fixed_kl"], "objective"),
    )}  # fmt: skip
    lines = ["| task | objective | per seed (seed) | mean ± std |", "|---|---|---|---|"]
    for env in tasks:
        for name in OBJECTIVES:
            by_seed = found[(name, env)]
            lines.append(f"| {env} | {name.replace('_', '-')} | {per_seed(by_seed)} | {mean_std(by_seed.values())} |")
    complete = [env for env in tasks if all(found[(name, env)] for name in OBJECTIVES)]
    lines += ["", f"Normalised as in the PPO paper's Table 1, over {', '.join(complete) or 'no task yet'}:", ""]
    lines += ["| objective | random policy (per task) | ours, normalised | the paper's Table 1 |", "|---|---|---|---|"]
    randoms = {env: random_return(env) for env in complete}
    for name in OBJECTIVES:
        normalised = []
        for env in complete:
            best = max(np.mean(list(found[(other, env)].values())) for other in OBJECTIVES)
            mean = np.mean(list(found[(name, env)].values()))
            normalised.append((mean - randoms[env]) / (best - randoms[env]))
        ours = f"{np.mean(normalised):.2f}" if normalised else "not yet"
        label, paper = PAPER[name]
        random_text = ", ".join(f"{randoms[env]:.1f}" for env in complete)
        lines.append(f"| {name.replace('_', '-')} | {random_text} | {ours} | {paper:.2f} ({label}) |")
    return "\n".join(lines)


def distribution(root: Path) -> str:
    lines = ["| task | normal: per seed | beta: per seed | normal mean ± std | beta mean ± std |"]
    lines.append("|---|---|---|---|---|")
    envs = ["Hopper-v4", "HalfCheetah-v4", "Walker2d-v4", "InvertedPendulum-v4"]
    return "\n".join(lines + side_by_side(root, envs, ("mujoco", SCRIPT), ("distribution", f"{SCRIPT}_beta")))


def dmc(root: Path) -> str:
    references = load_references()
    lines = ["| task | per seed (seed) | mean ± std | CleanRL (published) |", "|---|---|---|---|"]
    for env in ["dm_control/cartpole-swingup-v0", "dm_control/walker-walk-v0", "dm_control/cheetah-run-v0"]:
        ours = scores(runs_of(root, "dmc", SCRIPT, env.replace("/", "-")))  # (the run folder's name has no "/")
        reference = references.get((f"{SCRIPT}.py", env))
        cell = published(reference) if reference else "—"
        lines.append(f"| {env} | {per_seed(ours)} | {mean_std(ours.values())} | {cell} |")
    env = "dm_control/cartpole-swingup-v0"  # the bootstrap's share: every episode here ends at its time limit
    without = scores(runs_of(root, "dmc", f"{SCRIPT}_no_bootstrap", env.replace("/", "-")))
    lines.append(f"| {env} without the bootstrap | {per_seed(without)} | {mean_std(without.values())} | |")
    return "\n".join(lines)


class Pitch(gym.Wrapper):
    """Records the torso's pitch (qpos[2] of HalfCheetah, Hopper and Walker2d) after every step."""

    def __init__(self, env):
        super().__init__(env)
        self.pitches = []

    def step(self, action):
        result = self.env.step(action)
        self.pitches.append(float(self.env.unwrapped.data.qpos[2]))
        return result


def on_its_back(checkpoint_path: Path) -> tuple[bool, float]:
    """(whether the policy of the checkpoint runs on its back, the mean cosine of its pitch) over one
    deterministic episode of its script's own evaluation (HalfCheetah: 1,000 steps)."""
    import ppolab
    from ppolab.checkpoints import load_checkpoint

    module = import_script(SCRIPT)
    checkpoint = load_checkpoint(str(checkpoint_path), f"{SCRIPT}.py")
    recorders = []

    def make_recorded(*args, **kwargs):
        recorders.append(Pitch(make_eval_env(*args, **kwargs)))
        return recorders[-1]

    make_eval_env = ppolab.make_eval_env
    with contextlib.ExitStack() as stack:
        stack.callback(setattr, ppolab, "make_eval_env", make_eval_env)
        ppolab.make_eval_env = make_recorded
        module.evaluate(checkpoint, 1, True, 0)
    cosine = float(np.mean(np.cos(recorders[-1].pitches)))
    return cosine < 0, cosine


def difference_ci(a: list[float], b: list[float], reps: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """mean(b) - mean(a) and its 95% percentile interval, the seeds of each side resampled with replacement."""
    rng = np.random.default_rng(seed)
    a, b = np.asarray(a), np.asarray(b)
    resampled = rng.choice(b, (reps, len(b))).mean(1) - rng.choice(a, (reps, len(a))).mean(1)
    low, high = np.percentile(resampled, [2.5, 97.5])
    return float(b.mean() - a.mean()), float(low), float(high)


def fisher_exact(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p-value of Fisher's exact test for k1 of n1 against k2 of n2: the probability, with the margins
    fixed, of a split no more likely than the one seen."""
    total = k1 + k2
    p = [math.comb(n1, k) * math.comb(n2, total - k) / math.comb(n1 + n2, total) for k in range(total + 1)]
    return min(1.0, sum(q for q in p if q <= p[k1] * (1 + 1e-9)))


def bootstrap(root: Path) -> str:
    lines = table_head(
        "HalfCheetah-v4", "seed", "mean of the last 100 episodes", "posture (mean cosine of the torso's pitch)"
    )
    summary = {}
    for label, exp in (("with the bootstrap", SCRIPT), ("without it", f"{SCRIPT}_no_bootstrap")):
        rows = []
        for run_dir, seed in runs_of(root, "bootstrap", exp, "HalfCheetah-v4"):
            score = summarize_run(run_dir, LAST)["return"]
            checkpoint = run_dir / "checkpoint.pt"
            back, cosine = on_its_back(checkpoint) if checkpoint.is_file() else (None, float("nan"))
            posture = "no checkpoint" if back is None else f"{'on its back' if back else 'upright'} ({cosine:.2f})"
            lines.append(f"| {label} | {seed} | {score:.2f} | {posture} |")
            rows.append((score, back))
        summary[label] = rows
    lines += ["", "| HalfCheetah-v4 | runs | mean ± std | on its back | mean ± std upright | mean ± std on its back |"]
    lines.append("|---|---|---|---|---|---|")
    for label, rows in summary.items():
        upright = [score for score, back in rows if back is False]
        flipped = [score for score, back in rows if back]
        lines.append(
            f"| {label} | {len(rows)} | {mean_std(score for score, _ in rows)} "
            f"| {len(flipped)} of {sum(back is not None for _, back in rows)} with a checkpoint "
            f"| {mean_std(upright)} | {mean_std(flipped)} |"
        )
    with_it, without = summary["with the bootstrap"], summary["without it"]
    if len(with_it) > 1 and len(without) > 1:
        difference, low, high = difference_ci([score for score, _ in with_it], [score for score, _ in without])
        backs = [sum(bool(back) for _, back in rows) for rows in (with_it, without)]
        p = fisher_exact(backs[0], len(with_it), backs[1], len(without))
        lines.append(
            f"\nWithout the bootstrap minus with it: {difference:+.2f} [{low:+.2f}, {high:+.2f}] (the difference of "
            f"the means, its 95% interval from 10,000 resamples of each side's seeds); on their backs: {backs[0]} of "
            f"{len(with_it)} with it, {backs[1]} of {len(without)} without, Fisher's exact test p = {p:.3f}."
        )
    lines += ["", "| task | with the bootstrap (mujoco block): per seed | without it: per seed | with | without |"]
    lines.append("|---|---|---|---|---|")
    envs = ["Hopper-v4", "Walker2d-v4", "InvertedPendulum-v4", "Humanoid-v4"]
    return "\n".join(lines + side_by_side(root, envs, ("mujoco", SCRIPT), ("bootstrap", f"{SCRIPT}_no_bootstrap")))


STUDIES = {"objective": objective, "distribution": distribution, "dmc": dmc, "bootstrap": bootstrap}
BLOCKS = {"objective": ["mujoco", "objective"], "distribution": ["mujoco", "distribution"], "dmc": ["dmc"]}
BLOCKS["bootstrap"] = ["bootstrap", "mujoco"]
TITLES = {
    "objective": "Policy objective: PPO-Clip, adaptive KL and fixed KL (ppo_continuous_action.py, 1M steps)",
    "distribution": "Distribution: Beta beside Gaussian (ppo_continuous_action.py, 1M steps)",
    "dmc": "DeepMind Control (ppo_continuous_action.py, 1M steps)",
    "bootstrap": "The time-limit bootstrap (ppo_continuous_action.py, 1M steps)",
}


def write(name: str, text: str, out_dir: Path, command: str) -> Path:
    """out_dir/study_<name>.md: the title, the command, the tables, and the hand-written verdict kept."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"study_{name}.md"
    kept = path.read_text().split(VERDICT, 1)[1] if path.is_file() and VERDICT in path.read_text() else "\n(not yet)\n"
    header = (
        f"# {TITLES[name]}\n\nTables written {utc_now()} by `{command}` on {machine()}. A run's score: the mean return "
        f"of its last {LAST} training episodes; ± the standard deviation over seeds (ddof 0, as benchmark.scores).\n\n"
    )
    path.write_text(header + text + "\n\n" + VERDICT + kept)
    return path


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(prog="python -m benchmark.studies.options", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("runs", type=Path, help="the RUNS_DIR of ppo.sh (its block folders below it)")
    parser.add_argument("--only", choices=list(STUDIES), nargs="+", default=list(STUDIES))
    parser.add_argument("--out-dir", type=Path, help="where study_<name>.md goes (default: RUNS/studies)")
    args = parser.parse_args(argv)
    out_dir = args.out_dir or args.runs / "studies"
    command = "python -m benchmark.studies.options " + " ".join(argv if argv is not None else sys.argv[1:])
    for name in args.only:
        text = provenance(args.runs, name) + STUDIES[name](args.runs) + unfinished(args.runs, BLOCKS[name])
        print(f"wrote {write(name, text, out_dir, command)}")


if __name__ == "__main__":
    main()
