"""Early learning on Atari beside CleanRL, on this machine: CleanRL 1.2.0's Atari scripts on their own pinned stack,
and the table that sets our scripts beside theirs (and the multi-process scripts beside our single-process ones).

    python -m benchmark.cleanrl_parity build     # once: downloads CleanRL 1.2.0 and its stack (a virtualenv)
    python -m benchmark.cleanrl_parity run --runs-dir runs/benchmark/parity-cleanrl --steps 300000 --seeds 1 2
    python -m benchmark.cleanrl_parity table --ours runs/benchmark/parity --cleanrl runs/benchmark/parity-cleanrl \\
        --out parity.md --plots parity

`bash benchmark/ppo.sh parity` runs both sides (the build aside) with the seeds of results/parity.md and writes that
table; the table reads every run in the two folders, each seed once.

The build: CleanRL 1.2.0's ppo_atari.py and ppo_atari_lstm.py play through gym 0.23.1, ale-py 0.7.4 and
Stable-Baselines3 1.2.0's Atari wrappers, as its pinned requirements say; ale-py 0.7.4 has no wheel for Python 3.11,
so the virtualenv is made with a Python 3.10 (pyenv's, or --python). Its ROMs came from AutoROM, a download that this
machine cannot make: the build copies the game files that our ale-py bundles into ale-py 0.7.4's ROM folder (ale-py
identifies each ROM it loads by its MD5, so only the same games load). ppo_atari_envpool.py gets envpool 0.8.4, whose
ROMs are its own. Torch is ours (2.13.0). CleanRL's code is run from the virtualenv, never copied here.

The runs: each CleanRL script at its defaults (our scripts' defaults are the same hyperparameters) on
BreakoutNoFrameskip-v4 (Breakout-v5 for envpool), tracking, video and CUDA off, one thread per job
(benchmark.run_seeds), in RUNS_DIR, where CleanRL writes runs/<env>__<script>__<seed>__<time>.

The score of a run, as CleanRL's Atari pages report: the mean game score (all lives, unclipped:
`charts/episodic_return` on both sides) of the games that end in the last `--window` steps (50k) of the run. Per
pair the table gives every seed on both sides, mean ± std, and a verdict: "at parity" when the means differ by no
more than the seeds' spread (the larger of the two sides' standard deviations), else which side is higher.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmark.events import read_scalars
from benchmark.run_seeds import die_interrupted, interrupt, make_jobs, run_jobs, summary
from benchmark.scores import FINISHED, curves, finished, group_runs, save_figure
from benchmark.speed_vs_cleanrl import machine

VERSION = "1.2.0"
VENV = Path(os.environ.get("PPO_LAB_PARITY_DIR") or Path.home() / ".cache" / "ppo-lab" / "cleanrl-parity")
PACKAGES = [
    "torch==2.13.0",
    "numpy<2",
    "gym==0.23.1",
    "ale-py==0.7.4",
    "stable-baselines3==1.2.0",
    "opencv-python==4.8.1.78",
    "envpool==0.8.4",
    "tensorboard",
    "protobuf<5",
]
ROMS = ["breakout"]  # the games the parity runs play
# CleanRL's script -> its env id; our side's scripts and the id our scripts are given
CLEANRL = {"ppo_atari": "BreakoutNoFrameskip-v4", "ppo_atari_lstm": "BreakoutNoFrameskip-v4"}
CLEANRL["ppo_atari_envpool"] = "Breakout-v5"
# the pairs of the table: (our script, the side it is set beside: "cleanrl:<script>" or our own script)
PAIRS = [
    ("ppo_atari", "cleanrl:ppo_atari"),
    ("ppo_atari_envpool", "cleanrl:ppo_atari_envpool"),
    ("ppo_atari_lstm", "cleanrl:ppo_atari_lstm"),
    ("ppo_atari_multigpu", "ppo_atari"),
    ("ppo_shared_memory_lstm", "ppo_atari_lstm"),
]
OFF = ["--track", "False", "--capture-video", "False", "--cuda", "False"]


def fail(message: str):
    print(f"benchmark.cleanrl_parity: error: {message}", file=sys.stderr)
    sys.exit(2)


def find_python310() -> str:
    for candidate in ["python3.10", str(Path.home() / ".pyenv" / "versions" / "3.10.13" / "bin" / "python")]:
        found = shutil.which(candidate)
        if found:
            return found
    fail("no Python 3.10 found (ale-py 0.7.4, CleanRL's, has no wheel for 3.11): give one with --python")


def build(venv: Path, python: str):
    """The virtualenv: CleanRL and its Atari stack, our ale-py's ROM files for the games played, an import check."""
    from importlib import resources

    venv_python = str(venv / "bin" / "python")
    for command in [
        [python, "-m", "venv", "--clear", str(venv)],
        [venv_python, "-m", "pip", "install", "-q", "--upgrade", "pip", "setuptools<70", "wheel"],
        [venv_python, "-m", "pip", "install", "-q", *PACKAGES],
        [venv_python, "-m", "pip", "install", "-q", "--no-deps", "--ignore-requires-python", f"cleanrl=={VERSION}"],
    ]:
        print("$", " ".join(command), flush=True)
        subprocess.run(command, check=True)
    roms = subprocess.run(
        [venv_python, "-c", "import ale_py.roms, os; print(os.path.dirname(ale_py.roms.__file__))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    for game in ROMS:
        shutil.copy(resources.files("ale_py") / "roms" / f"{game}.bin", roms)
    check = "import gym, envpool, cleanrl.ppo_atari; gym.make('BreakoutNoFrameskip-v4').reset(); print('ok')"
    subprocess.run([venv_python, "-c", check], check=True, cwd="/tmp")
    print(f"CleanRL {VERSION} ready in {venv}")


def run(venv: Path, runs_dir: Path, steps: int, seeds: list[int], workers: int, scripts: list[str]) -> int:
    """CleanRL's `scripts` on Breakout, every seed; a job that finished before is not run again."""
    python = venv / "bin" / "python"
    if not python.is_file():
        fail(f"no CleanRL virtualenv in {venv}: python -m benchmark.cleanrl_parity build")
    runs_dir.mkdir(parents=True, exist_ok=True)
    jobs = []
    for script in scripts:
        env_id = CLEANRL[script]
        command = f"{python} -m cleanrl.{script} --total-timesteps {steps} {' '.join(OFF)}"
        for job in make_jobs(command, [env_id], seeds, runs_dir / "logs" / script, resume=True):
            job.cwd = runs_dir  # (CleanRL prints no run folder: an unfinished job starts anew)
            jobs.append(job)
    print(f"CleanRL {VERSION}: {len(jobs)} jobs, {workers} at a time, runs in {runs_dir}/runs", flush=True)
    finished = run_jobs(jobs, workers)
    print(summary(finished, sum(job.elapsed for job in finished)), flush=True)
    return 0 if all(job.returncode == 0 for job in finished) else 1


def score(run_dir: Path, window: int) -> tuple[float, int, int]:
    """(the mean return of the games that ended in the last `window` steps, how many, the run's last step)."""
    scalars = read_scalars(run_dir)
    last = max(step for points in scalars.values() for step, _ in points)
    games = [value for step, value in scalars.get("charts/episodic_return", []) if step > last - window]
    return (float(np.mean(games)) if games else float("nan")), len(games), last


def display(side: str) -> str:
    """ "cleanrl:ppo_atari" -> "CleanRL's ppo_atari.py", "ppo_atari" -> "ppo_atari.py"."""
    return side.replace("cleanrl:", "CleanRL's ") + ".py"


def sides(ours: Path, cleanrl: Path) -> dict[str, list[Path]]:
    """{"ppo_atari": [run folders], "cleanrl:ppo_atari": [...], ...} from both folders."""
    found = {}
    for label, root in (("", ours), ("cleanrl:", cleanrl)):
        if root.is_dir():
            for (_, exp_name), runs in group_runs(root).items():
                found.setdefault(label + exp_name, []).extend(run_dir for run_dir, _ in runs)
    return found


def verdict(a: list[float], b: list[float]) -> str:
    if len(a) < 2 or len(b) < 2:
        return "too few seeds"
    gap, spread = np.mean(a) - np.mean(b), max(np.std(a), np.std(b))
    if abs(gap) <= spread:
        return "at parity"
    return "ours higher" if gap > 0 else "ours lower: follow it to its cause"


def counted(runs: list[Path], window: int, steps: int) -> tuple[dict[int, tuple], dict[int, int]]:
    """({seed: (run folder, (score, games, last step))} of the finished runs, {seed: last step} of the unfinished
    ones): a seed's furthest run stands for it, so a rerun supersedes a stopped one."""
    furthest = {}
    for run_dir in runs:
        seed, result = int(run_dir.name.split("__")[2]), score(run_dir, window)
        if seed not in furthest or result[2] > furthest[seed][1][2]:
            furthest[seed] = (run_dir, result)
    done = {seed: run for seed, run in sorted(furthest.items()) if finished(run[1][2], steps)}
    return done, {seed: run[1][2] for seed, run in sorted(furthest.items()) if seed not in done}


def table(ours: Path, cleanrl: Path, window: int, steps: int) -> str:
    """Per pair, every seed of both sides; an unfinished run is listed but left out of the means and the verdict."""
    found = sides(ours, cleanrl)
    lines = [
        "| ours | beside | per seed, ours | per seed, beside | ours mean ± std | beside mean ± std | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for mine, other in PAIRS:
        cells, scores = [], []
        for side in (mine, other):
            done, running = counted(found.get(side, []), window, steps)
            listed = {seed: f"{mean:.2f} (seed {seed}, {games} games, {last:,} steps)"
                      for seed, (_, (mean, games, last)) in done.items()}  # fmt: skip
            listed |= {seed: f"unfinished (seed {seed}, {last:,} steps)" for seed, last in running.items()}
            cells.append(", ".join(listed[seed] for seed in sorted(listed)) or "not run")
            scores.append([mean for _, (mean, _, _) in done.values()])
        summaries = [f"{np.mean(s):.2f} ± {np.std(s):.2f}" if len(s) > 1 else "" for s in scores]
        lines.append(
            f"| {mine}.py | {display(other)} | {cells[0]} | {cells[1]} | {summaries[0]} | {summaries[1]} "
            f"| {verdict(*scores)} |"
        )
    return "\n".join(lines)


def plots(ours: Path, cleanrl: Path, out_dir: Path, steps: int, window: int = 20) -> list[Path]:
    """One PNG per pair whose two sides have a finished run each: each side's mean curve over the seeds the table
    counts (smoothed over `window` games) and their min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found, written = sides(ours, cleanrl), []
    out_dir.mkdir(parents=True, exist_ok=True)
    for mine, other in PAIRS:
        runs = {side: [run_dir for run_dir, _ in counted(found.get(side, []), 0, steps)[0].values()]  # (no score)
                for side in (mine, other)}  # fmt: skip
        if not all(runs.values()):
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for side, run_dirs in runs.items():
            curve = curves(run_dirs, "step", window)
            if curve is not None:
                grid, values = curve
                ax.plot(grid, values.mean(0), label=f"{display(side)} ({len(values)} seeds)")
                ax.fill_between(grid, values.min(0), values.max(0), alpha=0.2)
        ax.set(title=f"{mine}.py beside {display(other)}", xlabel="global step", ylabel="game score")
        ax.legend(loc="best", fontsize="small")
        written.append(save_figure(fig, out_dir / f"{mine}.png"))
    return written


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmark.cleanrl_parity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("what", choices=["build", "run", "table"])
    parser.add_argument("--venv", type=Path, default=VENV, help="CleanRL's virtualenv (%(default)s)")
    parser.add_argument("--python", help="build: the Python 3.10 that makes it (default: python3.10 or pyenv's)")
    parser.add_argument("--runs-dir", type=Path, help="run: CleanRL's runs and logs go here")
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--scripts", nargs="+", choices=list(CLEANRL), default=list(CLEANRL), help="run: which")
    parser.add_argument("--ours", type=Path, help="table: the folder of our runs")
    parser.add_argument("--cleanrl", type=Path, help="table: the folder given to `run`")
    parser.add_argument("--window", type=int, default=50_000, help="table: the last steps whose games count")
    parser.add_argument("--out", type=Path, help="table: write the markdown here (else print it)")
    parser.add_argument("--plots", type=Path, help="table: a PNG per pair into this folder")
    args = parser.parse_args(argv)
    if args.what == "build":
        build(args.venv, args.python or find_python310())
    elif args.what == "run":
        if args.runs_dir is None:
            fail("run needs --runs-dir")
        signal.signal(signal.SIGTERM, interrupt)  # SIGTERM, as Ctrl-C: the running jobs are stopped first
        try:
            code = run(args.venv, args.runs_dir.resolve(), args.steps, args.seeds, args.workers, args.scripts)
        except KeyboardInterrupt:
            die_interrupted("interrupted: CleanRL's running jobs killed")
        sys.exit(code)
    else:
        if args.ours is None or args.cleanrl is None:
            fail("table needs --ours and --cleanrl")
        text = "\n".join(
            [
                "# Atari early learning beside CleanRL",
                "",
                (
                    f"Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `python -m benchmark.cleanrl_parity "
                    f"{' '.join(argv if argv is not None else sys.argv[1:])}` on {machine()}, no GPU. "
                    "Runs: `bash benchmark/ppo.sh parity`, every seed the table lists (both sides, at their defaults, "
                    "one run at a time with `OMP_NUM_THREADS=1`). CleanRL's side runs CleanRL "
                    f"{VERSION} in its own virtualenv ({', '.join(PACKAGES)}; Python 3.10), made once by "
                    "`python -m benchmark.cleanrl_parity build`, which downloads them.\n\n"
                    f"Score: the mean game score of the games that end in the last {args.window:,} steps of each run "
                    "(all lives, unclipped), per seed; the verdict compares the means with the larger of the two "
                    f"standard deviations over seeds (ddof 0, as benchmark.scores). A run counts once it reached "
                    f"{FINISHED:.0%} of {args.steps:,} steps (runs end on whole iterations)."
                ),
                "",
                table(args.ours, args.cleanrl / "runs", args.window, args.steps),
            ]
        )
        if args.plots:
            for path in plots(args.ours, args.cleanrl / "runs", args.plots, args.steps):
                print(f"wrote {path}")
        if args.out:
            args.out.write_text(text + "\n")
            print(f"wrote {args.out}")
        else:
            print(text)


if __name__ == "__main__":
    main()
