"""Beside CleanRL on this machine, with CleanRL 1.2.0 on its own pinned stack in one virtualenv (results/speed_cpu.md,
results/parity.md):

    python -m benchmark.studies.cleanrl build    # once: downloads CleanRL 1.2.0 and its stack (a Python 3.10 makes it)
    python -m benchmark.studies.cleanrl speed     # CartPole-v1 500k, Hopper-v4 1M, Breakout-v5 10M steps, 3 rounds
    python -m benchmark.studies.cleanrl speed --pairs cartpole,hopper --steps cartpole=50000,hopper=20480 --rounds 1
    python -m benchmark.studies.cleanrl speed --pairs cartpole,hopper --baseline ../before   # and another checkout's
    python -m benchmark.studies.cleanrl parity run --runs-dir runs/benchmark/parity-cleanrl --steps 300000 --seeds 1 2
    python -m benchmark.studies.cleanrl parity table --ours runs/benchmark/parity --cleanrl runs/benchmark/parity-cleanrl

`build`: CleanRL 1.2.0's scripts (`pip install --no-deps`, as every tool installs it) in a virtualenv (`--venv`,
default $PPO_LAB_CLEANRL_DIR or ~/.cache/ppo-lab/cleanrl-1.2.0) with the packages of their time (PACKAGES: gym 0.23.1,
gymnasium 0.29.1, mujoco 2.3.7, envpool 0.8.4, ale-py 0.7.4, numpy<2) and our torch, made by a Python 3.10 (ale-py
0.7.4 has no wheel for 3.11); the Breakout ROM is copied from our ale-py (AutoROM's download is not made). CleanRL's
code runs from the virtualenv, never copied here.

`speed`: the whole-process time (interpreter start to exit, each side at its own thread default) of our scripts and
CleanRL's, same steps, our default hyperparameters given to both as flags (every flag of CleanRL's script is checked
to be passed or to change nothing); pairs cartpole (ppo.py, 500k), hopper (ppo_continuous_action.py, 1M), breakout
(ppo_atari_envpool.py, 10M). `--busy`: also beside a process busy on one core; `--torch-threads 1,2`: ours at those
thread counts; where ours has `--compile`, both modes and their split (`--no-split`: the default only;
`--cold-compile`: an empty compile cache a run); `--baseline DIR`: another checkout's scripts too. Rounds alternate the
order; the table gives each round, the median, the range and CleanRL time / ours. Each run is appended to `--log` at
once and not measured again: the same command resumes; `--table` prints the table from the log alone.

`parity`: early learning on Atari. `run`: CleanRL's Atari scripts at their defaults on Breakout, one thread a job, in
RUNS_DIR. `table`: per pair every seed of both sides, the mean game score (all lives, unclipped) of the games that
end in the last `--window` steps, mean ± std, and "at parity" when the means differ by no more than the larger
standard deviation. `bash benchmark/ppo.sh parity` runs both sides and writes results/parity.md.
"""

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmark.events import read_scalars
from benchmark.run_seeds import die_interrupted, interrupt, make_jobs, run_jobs, summary
from benchmark.scores import FINISHED, curves, finished, group_runs, save_figure
from benchmark.scripts import CLEANRL_VERSION, ROOT, busy_core, import_script, machine, our_commit, pip_cleanrl
from benchmark.scripts import pyplot, table_head, utc_now, versions

PROG = "benchmark.studies.cleanrl"
BUILD = f"python -m {PROG} build"


def fail(message: str):
    """One line on stderr and exit 2, as the training scripts do for bad input."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(2)


# build: CleanRL 1.2.0 in a virtualenv of its own ----------------------------------------------------------------------
VENV = Path(os.environ.get("PPO_LAB_CLEANRL_DIR") or Path.home() / ".cache" / "ppo-lab" / f"cleanrl-{CLEANRL_VERSION}")
# gym 0.23's CartPole imports pygame, whose pin in CleanRL (2.1.0) has no recent wheel; gymnasium 0.29's MuJoCo
# environments import imageio; mujoco 2.3.7 is the last 2.x (CleanRL pins mujoco<=2.3.3)
PACKAGES = ["torch==2.13.0", "numpy<2", "gym==0.23.1", "gymnasium==0.29.1", "envpool==0.8.4", "mujoco==2.3.7"]
PACKAGES += ["imageio", "pygame==2.6.1", "ale-py==0.7.4", "stable-baselines3==1.2.0", "opencv-python==4.8.1.78"]
PACKAGES += ["tensorboard", "protobuf<5"]
VERSIONS_OF = ["cleanrl", "torch", "numpy", "gym", "gymnasium", "envpool", "mujoco", "ale-py"]
ROMS = ["breakout"]  # the games the parity runs play


def built_versions(venv: Path) -> dict[str, str]:
    """The virtualenv's package versions, written by `build` as its last step ({} where it is not built)."""
    ready = venv / "versions.json"
    return json.loads(ready.read_text()) if ready.is_file() else {}


def find_python310() -> str:
    """The first Python 3.10 that runs: a pyenv shim named python3.10 is on the PATH but fails where pyenv's chosen
    version is another one."""
    for candidate in ["python3.10", str(Path.home() / ".pyenv" / "versions" / "3.10.13" / "bin" / "python")]:
        found = shutil.which(candidate)
        if found and subprocess.run([found, "-c", "import venv"], capture_output=True).returncode == 0:
            return found
    fail("no Python 3.10 found (ale-py 0.7.4, CleanRL's, has no wheel for 3.11): give one with --python")


def build(venv: Path, python: str):
    """The virtualenv, our ale-py's ROM files for the games played, a check that the pairs' environments open."""
    from importlib import resources

    (venv / "versions.json").unlink(missing_ok=True)
    pip = str((venv / "bin" / "python"))
    for command in [
        [python, "-m", "venv", "--clear", str(venv)],
        [pip, "-m", "pip", "install", "-q", "--upgrade", "pip", "setuptools<70", "wheel"],
        [pip, "-m", "pip", "install", "-q", *PACKAGES],
        pip_cleanrl(pip, "install", "-q"),
    ]:
        print("$", shlex.join(command), flush=True)
        subprocess.run(command, check=True)
    where = "import ale_py.roms, os; print(os.path.dirname(ale_py.roms.__file__))"
    roms = subprocess.run([pip, "-c", where], check=True, capture_output=True, text=True).stdout.strip()
    for game in ROMS:
        shutil.copy(resources.files("ale_py") / "roms" / f"{game}.bin", roms)
    check = (
        "import json, sys; from importlib import metadata; import gym, gymnasium, envpool, torch, cleanrl.ppo_atari, "
        "torch.utils.tensorboard; gym.make('CartPole-v1').reset(); gymnasium.make('Hopper-v4').reset(seed=1); "
        "gym.make('BreakoutNoFrameskip-v4').reset(); envpool.make('Breakout-v5', env_type='gym', num_envs=1).reset(); "
        f"json.dump({{p: metadata.version(p) for p in {VERSIONS_OF!r}}}, sys.stdout)"
    )
    found = subprocess.run([pip, "-c", check], check=True, capture_output=True, text=True, cwd=tempfile.gettempdir())
    (venv / "versions.json").write_text(found.stdout + "\n")
    print(f"CleanRL {CLEANRL_VERSION} ready in {venv}: {found.stdout}")


# speed: whole-process time of our scripts beside CleanRL's ------------------------------------------------------------
SPEED_LOG = ROOT / "runs" / "benchmark_peer.jsonl"  # (its name from before the tool was renamed: logs resume)


@dataclasses.dataclass(frozen=True)
class Pair:
    ours: str  # our script, a module at the repository root
    theirs: str  # CleanRL's script of the same algorithm, in the cleanrl package
    env_id: str
    steps: int  # the default budget: the scripts' own default


PAIRS = {
    "cartpole": Pair("ppo", "ppo.py", "CartPole-v1", 500_000),
    "hopper": Pair("ppo_continuous_action", "ppo_continuous_action.py", "Hopper-v4", 1_000_000),
    "breakout": Pair("ppo_atari_envpool", "ppo_atari_envpool.py", "Breakout-v5", 10_000_000),
}

# given to both sides as flags, with our script's default values (CleanRL's flags have the same names)
HYPERPARAMETERS = ("seed", "torch_deterministic", "learning_rate", "num_envs", "num_steps", "anneal_lr", "gamma")
HYPERPARAMETERS += ("gae_lambda", "num_minibatches", "update_epochs", "norm_adv", "clip_coef", "clip_vloss", "ent_coef")
HYPERPARAMETERS += ("vf_coef", "max_grad_norm", "target_kl")

# off on both sides: the benchmark times the training alone, on the CPU
OFF = ("cuda", "track", "capture_video")

# CleanRL's flags that do not change what is computed, which the benchmark leaves at their defaults
NOT_PASSED = {"help", "exp-name", "wandb-project-name", "wandb-entity"}

SETTINGS = {
    "plain": "default threads, nothing else started by the benchmark",
    "busy": "default threads, +1 process busy on one core",
}

THEIRS = "CleanRL"

BASELINE = "baseline"  # the label of the --baseline checkout's runs


def cleanrl_script(venv: Path, pair: Pair) -> Path:
    """CleanRL's script of `pair` in the virtualenv's site-packages."""
    (script,) = sorted(venv.glob(f"lib/python*/site-packages/cleanrl/{pair.theirs}"))
    return script


def home_relative(path: Path) -> str:
    """`path` as `~/...` when it is in the home folder: a results file names no machine's home."""
    path = Path(path)
    return f"~/{path.relative_to(Path.home())}" if path.is_relative_to(Path.home()) else str(path)


# The command lines ----------------------------------------------------------------------------------------------------
def our_defaults(pair: Pair) -> dict:
    """Our script's `Args` defaults (the script imported, not run)."""
    return {field.name: field.default for field in dataclasses.fields(import_script(pair.ours).Args)}


def hyperparameters(defaults: dict) -> dict:
    """The hyperparameters both sides get, at our defaults; `target_kl` only when it is set (the flag of
    CleanRL's scripts takes a float, and its default there is None as ours)."""
    return {name: defaults[name] for name in HYPERPARAMETERS if not (name == "target_kl" and defaults[name] is None)}


def flags(values: dict, ours: bool) -> list[str]:
    """`--kebab-case value` for each entry; booleans as `--x`/`--no-x` (ours, tyro) or `--x True` (CleanRL)."""
    out = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool) and ours:
            out.append(flag if value else "--no-" + flag[2:])
        else:
            out += [flag, str(value)]
    return out


def our_command(pair: Pair, steps: int, defaults: dict, runs_dir: str, extra=(), root: Path = ROOT) -> list[str]:
    """Our script in the checkout `root` (this one, or a --baseline), with the hyperparameters of `defaults`."""
    values = {"env_id": pair.env_id, "total_timesteps": steps, **hyperparameters(defaults)}
    values |= dict.fromkeys(OFF + ("save_model",), False)
    return [sys.executable, str(root / f"{pair.ours}.py"), *flags(values, ours=True), "--runs-dir", runs_dir, *extra]


def their_command(pair: Pair, steps: int, defaults: dict, venv: Path) -> list[str]:
    values = {"env_id": pair.env_id, "total_timesteps": steps, **hyperparameters(defaults), **dict.fromkeys(OFF, False)}
    return [str((venv / "bin" / "python")), str(cleanrl_script(venv, pair)), *flags(values, ours=False)]


def unmatched_flags(help_text: str, command: list[str], unset: set[str]) -> list[str]:
    """CleanRL's flags (from its --help) that the command neither passes nor may leave at their defaults:
    NOT_PASSED, and `unset`, the hyperparameters that are None in our script (as in CleanRL's)."""
    offered = set(re.findall(r"--([a-z][a-z0-9-]*)", help_text))
    passed = {arg[2:] for arg in command if arg.startswith("--")}
    return sorted(offered - passed - NOT_PASSED - unset)


def our_variants(defaults: dict, threads: list[int], split: bool = True, baseline: bool = False) -> list[tuple]:
    """(label, extra flags) of each run of our script: its defaults; where it has `--compile` (and `split`),
    the other mode too; each asked-for `--torch-threads` count; and with `baseline`, the --baseline
    checkout's script at its defaults."""
    variants = [("ours", ())] + ([(BASELINE, ())] if baseline else [])
    if "compile" in defaults and split:
        other = "--no-compile" if defaults["compile"] else "--compile"
        variants.append((f"ours {other}", (other,)))
    variants += [(f"ours --torch-threads {n}", ("--torch-threads", str(n))) for n in threads]
    return variants


def mode(defaults: dict, label: str) -> str:
    """'compiled' or 'eager': how the run of our script with this label ran."""
    compiled = label.endswith("--compile") or (bool(defaults.get("compile")) and not label.endswith("--no-compile"))
    return "compiled" if compiled else "eager"


# Timing one run -------------------------------------------------------------------------------------------------------
def child_env(ours: bool, compile_cache: str | None = None) -> dict[str, str]:
    """Each side at its own thread default: no OMP/MKL thread count from outside; CleanRL's interpreter
    sees none of our Python path. `compile_cache`: torch.compile's cache folder for this run (an empty one
    makes the compile cold), else the user's own (warm after the first compile of the same code)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if not ours:
        env.pop("PYTHONPATH", None)
    if compile_cache:
        env["TORCHINDUCTOR_CACHE_DIR"] = compile_cache
    return env


def last_sps(output: str) -> float | None:
    """The last SPS a script printed: ours `SPS=1234`, CleanRL's `SPS: 1234`."""
    found = re.findall(r"SPS(?:=|: )(\d+)", output)
    return float(found[-1]) if found else None


def own_times(runs_dir: Path) -> dict[str, float]:
    """From our run's event file: `compile_s`, the script's own `perf/compile_time` (summed) where it logs
    one, and `first_extra_s`, how much longer its first iteration took than the median of the others
    (rollout + update, the script's own timers): where torch.compile compiles, and first-time costs."""
    from benchmark.events import read_scalars  # tensorboard: only where an event file is read

    times = {}
    for run_dir in runs_dir.glob("*"):
        scalars = read_scalars(run_dir)
        if scalars.get("perf/compile_time"):
            times["compile_s"] = sum(value for _, value in scalars["perf/compile_time"])
        rollout, update = scalars.get("perf/rollout_time", []), scalars.get("perf/update_time", [])
        iterations = [r + u for (_, r), (_, u) in zip(rollout, update)]
        if len(iterations) > 1:
            times["first_extra_s"] = round(iterations[0] - statistics.median(iterations[1:]), 3)
    return times


def time_run(command: list[str], env: dict[str, str], busy: bool, cwd: str) -> tuple[float, str]:
    """Whole-process wall time of `command` (optionally beside a process busy on one core) and its output."""
    with busy_core(busy):
        start = time.perf_counter()
        done = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seconds = time.perf_counter() - start
    if done.returncode != 0:
        tail = "\n".join(done.stdout.splitlines()[-20:])
        print(tail, file=sys.stderr)
        fail(f"exit {done.returncode} from: {shlex.join(command)}")
    return seconds, done.stdout


def measure(pair_name, steps, setting, label, extra, defaults: dict, venv: Path, cold: bool, baseline=None) -> dict:
    """One timed run: a record for the log. `cold`: torch.compile starts from an empty cache; `baseline`: the
    checkout whose script the runs labelled BASELINE run."""
    pair = PAIRS[pair_name]
    with tempfile.TemporaryDirectory() as tmp:  # CleanRL writes runs/ in its working folder
        ours = label != THEIRS
        if ours:
            root = baseline if label == BASELINE else ROOT
            command = our_command(pair, steps, defaults, f"{tmp}/runs", extra, root)
        else:
            command = their_command(pair, steps, defaults, venv)
        env = child_env(ours, f"{tmp}/compile_cache" if cold else None)
        seconds, output = time_run(command, env, setting == "busy", tmp)
        times = own_times(Path(tmp, "runs")) if ours else {}
    record = {"pair": pair_name, "steps": steps, "setting": setting, "run": label, "cold": cold}
    return record | {"seconds": round(seconds, 3), "sps": last_sps(output), **times, "command": shlex.join(command)}


# The table ------------------------------------------------------------------------------------------------------------
def key(record: dict) -> tuple:
    """What identifies a run in the log (a run measured with a cold compile cache is another run)."""
    return record["pair"], record["steps"], record["setting"], record["run"], record["round"], record.get("cold", False)


def read_log(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def ratio_text(theirs: dict[int, float], ours: dict[int, float]) -> str:
    """CleanRL time / our time over the rounds both have ({round: seconds}): the ratio of the medians, and
    the range of the rounds' own ratios."""
    rounds = sorted(set(theirs) & set(ours))
    if not rounds:
        return ""
    ratios = [theirs[r] / ours[r] for r in rounds]
    text = f"{statistics.median(theirs[r] for r in rounds) / statistics.median(ours[r] for r in rounds):.2f}x"
    if len(ratios) > 1:
        text += f" ({min(ratios):.2f}x-{max(ratios):.2f}x)"
    return text


def table(records: list[dict], pairs: list, steps: dict, settings: list, rounds: int, modes: dict, cold=False) -> str:
    """The markdown tables: whole-process seconds of each run per round, median, range, the script's own
    last SPS (median) and the ratio CleanRL / ours; then, where our script has `--compile`, its eager and
    compiled times. `modes[pair]` maps the labels of our runs to 'eager' or 'compiled' (the table's rows:
    CleanRL, then these in order). Only the records with the compile cache `cold` (or not) count."""
    found = {key(record)[:5]: record for record in records if record.get("cold", False) == cold}
    header = " | ".join(f"round {r}" for r in range(1, rounds + 1))
    lines = [
        f"| pair | steps | setting | run | {header} | median (s) | range (s) | script's SPS | CleanRL / this |",
        "|---|---|---|---|" + "---|" * rounds + "---|---|---|---|",
    ]
    split = table_head("script", "steps", "setting", "eager (s)", "compiled (s)", "compiled / eager",
                       "compiled - eager (s)", "compile time (s)")  # fmt: skip
    baseline_lines = table_head("pair", "steps", "setting", "baseline time / our time")
    for pair in pairs:
        name = f"{pair} ({PAIRS[pair].env_id})"
        for setting in settings:
            times, own = {}, {}
            for label in [THEIRS, *modes[pair]]:
                keys = {r: (pair, steps[pair], setting, label, r) for r in range(1, rounds + 1)}
                runs = {r: found[k] for r, k in keys.items() if k in found}
                times[label] = {r: run["seconds"] for r, run in runs.items()}
                own[label] = list(runs.values())
                cells = " | ".join(f"{times[label][r]:.1f}" if r in runs else "" for r in range(1, rounds + 1))
                if not runs:
                    lines.append(f"| {name} | {steps[pair]:,} | {setting} | {label} | {cells} | not measured | | | |")
                    continue
                seconds = list(times[label].values())
                speeds = [run["sps"] for run in runs.values() if run.get("sps") is not None]
                speed = f"{statistics.median(speeds):,.0f}" if speeds else ""
                ratio = "" if label == THEIRS else ratio_text(times[THEIRS], times[label])
                lines.append(
                    f"| {name} | {steps[pair]:,} | {setting} | {label} | {cells} "
                    f"| {statistics.median(seconds):.1f} | {min(seconds):.1f}-{max(seconds):.1f} "
                    f"| {speed} | {ratio} |"
                )
            # the eager/compiled split: the runs that differ from the default in the compile mode only
            by_mode = {
                modes[pair][label]: label
                for label in modes[pair]
                if times[label] and not label.startswith("ours --torch-threads") and label != BASELINE
            }
            if times.get(BASELINE) and times["ours"]:
                baseline_lines.append(
                    f"| {name} | {steps[pair]:,} | {setting} | {ratio_text(times[BASELINE], times['ours'])} |"
                )
            if len(by_mode) == 2:
                eager = statistics.median(times[by_mode["eager"]].values())
                compiled = statistics.median(times[by_mode["compiled"]].values())
                compile_time = compile_text(own[by_mode["compiled"]], own[by_mode["eager"]])
                split.append(
                    f"| {PAIRS[pair].ours}.py | {steps[pair]:,} | {setting} | {eager:.1f} | {compiled:.1f} "
                    f"| {compiled / eager:.2f} | {compiled - eager:+.1f} | {compile_time} |"
                )
    return "\n".join(
        lines + ([""] + split if len(split) > 2 else []) + ([""] + baseline_lines if len(baseline_lines) > 2 else [])
    )


# The machine and the command ------------------------------------------------------------------------------------------
def compile_text(compiled: list[dict], eager: list[dict]) -> str:
    """The compile time: the script's own `perf/compile_time` (median) where it logs one, else the extra
    time of the first iteration, compiled runs less eager ones (medians), from the scripts' own timers."""
    logged = [run["compile_s"] for run in compiled if run.get("compile_s") is not None]
    if logged:
        return f"{statistics.median(logged):.1f}"
    extra = [
        [run["first_extra_s"] for run in runs if run.get("first_extra_s") is not None] for runs in (compiled, eager)
    ]
    if all(extra):
        return f"about {statistics.median(extra[0]) - statistics.median(extra[1]):.1f} (first iteration's extra time)"
    return "not logged"


def check_flags(command: list[str], defaults: dict):
    """Fails unless every flag of CleanRL's script (from its --help) is one the command passes or one
    that does not change the training (NOT_PASSED): then no default of theirs differs unseen from ours."""
    help_text = subprocess.run([*command[:2], "--help"], capture_output=True, text=True, env=child_env(False)).stdout
    unset = {name.replace("_", "-") for name in HYPERPARAMETERS if defaults[name] is None}
    missing = unmatched_flags(help_text, command, unset)
    if missing or "--env-id" not in help_text:
        fail(
            f"CleanRL's {Path(command[1]).name} has flags that the benchmark does not set: {missing} "
            f"(its --help: {help_text.strip()[-200:]!r})"
        )


def run_rounds(log: Path, rounds: int, pairs, steps, settings, variants, defaults, venv, cold=False, baseline=None):
    """Every run not yet in the log, round after round, each appended to the log as it finishes. In a
    round, ours go first in odd rounds and CleanRL's in even ones."""
    done = {key(record) for record in read_log(log)}
    log.parent.mkdir(parents=True, exist_ok=True)
    for r in range(1, rounds + 1):
        for pair in pairs:
            order = [(THEIRS, ())] + variants[pair]
            if r % 2:
                order.reverse()
            for setting in settings:
                for label, extra in order:
                    if (pair, steps[pair], setting, label, r, cold) in done:
                        continue
                    load = os.getloadavg()[0]  # the machine's state just before: a disturbed run shows here
                    record = measure(pair, steps[pair], setting, label, extra, defaults[pair], venv, cold, baseline)
                    record.update(round=r, time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), load=load)
                    with log.open("a") as f:
                        f.write(json.dumps(record) + "\n")
                    print(f"round {r} {pair} {setting} {label}: {record['seconds']:.1f} s", flush=True)


def describe(
    command: str, venv: Path, pairs, settings, defaults, records: list[dict], cold: bool, baseline=None
) -> str:
    """The lines above the table: machine, load during the runs, versions, command, settings, scripts."""
    loads = [record["load"] for record in records if "load" in record and record["pair"] in pairs]
    during = f"1-minute load average before each run {min(loads):.2f}-{max(loads):.2f}" if loads else "no runs logged"
    theirs = ", ".join(f"{k} {v}" for k, v in built_versions(venv).items()) or "not built here"
    lines = [
        f"Machine: {machine()}; {during}.",
        f"Ours: commit {our_commit()}, " + ", ".join(f"{k} {v}" for k, v in versions(VERSIONS_OF[1:]).items()) + ".",
        f"CleanRL: {theirs} (virtualenv {home_relative(venv)}).",
        *([f"Baseline: {baseline}, commit {our_commit(baseline)}, with our flags."] if baseline else []),
        f"Command: `{command}`; date {utc_now()}.",
        "Settings: "
        + "; ".join(f"{name}: {SETTINGS[name]}" for name in settings)
        + "; torch.compile cache: "
        + ("empty for each run (cold)." if cold else "the user's (warm after the first compile)."),
    ]
    for pair in pairs:
        compiled = defaults[pair].get("compile")
        compile_note = "no `--compile`" if compiled is None else f"`--compile` default {compiled}"
        lines.append(
            f"{pair}: {PAIRS[pair].ours}.py (`--torch-threads` default {defaults[pair]['torch_threads']}, "
            f"{compile_note}) against cleanrl/{PAIRS[pair].theirs} (PyTorch's default threads)."
        )
    return "\n".join(lines)


def parse_steps(text: str | None) -> dict[str, int]:
    """`--steps 50000` (every pair) or `--steps cartpole=50000,hopper=20480` (the others at their default)."""
    steps = {name: pair.steps for name, pair in PAIRS.items()}
    if not text:
        return steps
    try:
        if "=" not in text:
            return dict.fromkeys(steps, int(text))
        for item in text.split(","):
            name, value = item.split("=")
            if name not in steps:
                fail(f"--steps: unknown pair {name!r} (pairs: {', '.join(PAIRS)})")
            steps[name] = int(value)
    except ValueError:
        fail(f"--steps: expected N or PAIR=N,PAIR=N, got {text!r}")
    return steps


# parity: early learning on Atari beside CleanRL's ---------------------------------------------------------------------
# CleanRL's script -> its env id; our side's scripts and the id our scripts are given
PARITY_SCRIPTS = {
    "ppo_atari": "BreakoutNoFrameskip-v4",
    "ppo_atari_lstm": "BreakoutNoFrameskip-v4",
    "ppo_atari_envpool": "Breakout-v5",
}

# the pairs of the table: (our script, the side it is set beside: "cleanrl:<script>" or our own script)
PARITY_PAIRS = [
    ("ppo_atari", "cleanrl:ppo_atari"),
    ("ppo_atari_envpool", "cleanrl:ppo_atari_envpool"),
    ("ppo_atari_lstm", "cleanrl:ppo_atari_lstm"),
    ("ppo_atari_multigpu", "ppo_atari"),
    ("ppo_shared_memory_lstm", "ppo_atari_lstm"),
]

PARITY_OFF = ["--track", "False", "--capture-video", "False", "--cuda", "False"]


def parity_run(venv: Path, runs_dir: Path, steps: int, seeds: list[int], workers: int, scripts: list[str]) -> int:
    """CleanRL's `scripts` on Breakout, every seed; a job that finished before is not run again."""
    python = venv / "bin" / "python"
    if not python.is_file():
        fail(f"no CleanRL virtualenv in {venv}: {BUILD}")
    runs_dir.mkdir(parents=True, exist_ok=True)
    jobs = []
    for script in scripts:
        env_id = PARITY_SCRIPTS[script]
        command = f"{python} -m cleanrl.{script} --total-timesteps {steps} {' '.join(PARITY_OFF)}"
        for job in make_jobs(command, [env_id], seeds, runs_dir / "logs" / script, resume=True):
            job.cwd = runs_dir  # (CleanRL prints no run folder: an unfinished job starts anew)
            jobs.append(job)
    print(f"CleanRL {CLEANRL_VERSION}: {len(jobs)} jobs, {workers} at a time, runs in {runs_dir}/runs", flush=True)
    finished = run_jobs(jobs, workers)
    print(summary(finished, sum(job.elapsed for job in finished)), flush=True)
    return 0 if all(job.returncode == 0 for job in finished) else 1


def parity_score(run_dir: Path, window: int) -> tuple[float, int, int]:
    """(the mean return of the games that ended in the last `window` steps, how many, the run's last step)."""
    scalars = read_scalars(run_dir)
    last = max(step for points in scalars.values() for step, _ in points)
    games = [value for step, value in scalars.get("charts/episodic_return", []) if step > last - window]
    return (float(np.mean(games)) if games else float("nan")), len(games), last


def parity_display(side: str) -> str:
    """ "cleanrl:ppo_atari" -> "CleanRL's ppo_atari.py", "ppo_atari" -> "ppo_atari.py"."""
    return side.replace("cleanrl:", "CleanRL's ") + ".py"


def parity_sides(ours: Path, cleanrl: Path) -> dict[str, list[Path]]:
    """{"ppo_atari": [run folders], "cleanrl:ppo_atari": [...], ...} from both folders."""
    found = {}
    for label, root in (("", ours), ("cleanrl:", cleanrl)):
        if root.is_dir():
            for (_, exp_name), runs in group_runs(root).items():
                found.setdefault(label + exp_name, []).extend(run_dir for run_dir, _ in runs)
    return found


def parity_verdict(a: list[float], b: list[float]) -> str:
    if len(a) < 2 or len(b) < 2:
        return "too few seeds"
    gap, spread = np.mean(a) - np.mean(b), max(np.std(a), np.std(b))
    if abs(gap) <= spread:
        return "at parity"
    return "ours higher" if gap > 0 else "ours lower: follow it to its cause"


def parity_counted(runs: list[Path], window: int, steps: int) -> tuple[dict[int, tuple], dict[int, int]]:
    """({seed: (run folder, (score, games, last step))} of the finished runs, {seed: last step} of the unfinished
    ones): a seed's furthest run stands for it, so a rerun supersedes a stopped one."""
    furthest = {}
    for run_dir in runs:
        seed, result = int(run_dir.name.split("__")[2]), parity_score(run_dir, window)
        if seed not in furthest or result[2] > furthest[seed][1][2]:
            furthest[seed] = (run_dir, result)
    done = {seed: run for seed, run in sorted(furthest.items()) if finished(run[1][2], steps)}
    return done, {seed: run[1][2] for seed, run in sorted(furthest.items()) if seed not in done}


def parity_table(ours: Path, cleanrl: Path, window: int, steps: int) -> str:
    """Per pair, every seed of both sides; an unfinished run is listed but left out of the means and the verdict."""
    found = parity_sides(ours, cleanrl)
    lines = table_head("ours", "beside", "per seed, ours", "per seed, beside", "ours mean ± std", "beside mean ± std",
                       "verdict")  # fmt: skip
    for mine, other in PARITY_PAIRS:
        cells, scores = [], []
        for side in (mine, other):
            done, running = parity_counted(found.get(side, []), window, steps)
            listed = {seed: f"{mean:.2f} (seed {seed}, {games} games, {last:,} steps)"
                      for seed, (_, (mean, games, last)) in done.items()}  # fmt: skip
            listed |= {seed: f"unfinished (seed {seed}, {last:,} steps)" for seed, last in running.items()}
            cells.append(", ".join(listed[seed] for seed in sorted(listed)) or "not run")
            scores.append([mean for _, (mean, _, _) in done.values()])
        summaries = [f"{np.mean(s):.2f} ± {np.std(s):.2f}" if len(s) > 1 else "" for s in scores]
        lines.append(
            f"| {mine}.py | {parity_display(other)} | {cells[0]} | {cells[1]} | {summaries[0]} | {summaries[1]} "
            f"| {parity_verdict(*scores)} |"
        )
    return "\n".join(lines)


def parity_plots(ours: Path, cleanrl: Path, out_dir: Path, steps: int, window: int = 20) -> list[Path]:
    """One PNG per pair whose two sides have a finished run each: each side's mean curve over the seeds the table
    counts (smoothed over `window` games) and their min-max band."""
    plt, found, written = pyplot(), parity_sides(ours, cleanrl), []
    out_dir.mkdir(parents=True, exist_ok=True)
    for mine, other in PARITY_PAIRS:
        runs = {side: [run_dir for run_dir, _ in parity_counted(found.get(side, []), 0, steps)[0].values()]  # (no score)
                for side in (mine, other)}  # fmt: skip
        if not all(runs.values()):
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for side, run_dirs in runs.items():
            curve = curves(run_dirs, "step", window)
            if curve is not None:
                grid, values = curve
                ax.plot(grid, values.mean(0), label=f"{parity_display(side)} ({len(values)} seeds)")
                ax.fill_between(grid, values.min(0), values.max(0), alpha=0.2)
        ax.set(title=f"{mine}.py beside {parity_display(other)}", xlabel="global step", ylabel="game score")
        ax.legend(loc="best", fontsize="small")
        written.append(save_figure(fig, out_dir / f"{mine}.png"))
    return written


def speed_arguments(parser: argparse.ArgumentParser):
    add = parser.add_argument
    add("--pairs", default=",".join(PAIRS), help="comma-separated, of: %(default)s")
    add("--steps", default=None, help="N for every pair or PAIR=N,...; default: the scripts' own")
    add("--rounds", type=int, default=3, help="rounds of alternating runs (default: %(default)s)")
    add("--busy", action="store_true", help="also time every run beside a process busy on one core")
    add(
        "--torch-threads", default="", help="also time our scripts with these thread counts, comma-separated (e.g. 1,2)"
    )
    add("--no-split", action="store_true", help="our scripts in their default compile mode only (no eager/compiled)")
    add("--cold-compile", action="store_true", help="an empty torch.compile cache for every run (default: the user's)")
    add("--baseline", type=Path, help="also time the scripts of this other checkout (e.g. a git worktree of an earlier "
        "commit) in the same rounds, with the same flags, and tabulate its time against ours")  # fmt: skip
    add("--log", type=Path, default=SPEED_LOG, help="JSON lines of the finished runs, read to resume (%(default)s)")
    add("--table", action="store_true", help="print the table from --log only, run nothing")
    add("--out", type=Path, default=None, help="also write the markdown to this file")


def speed(args, argv: list[str]):
    pairs = [name for name in args.pairs.split(",") if name]
    unknown = [name for name in pairs if name not in PAIRS]
    if unknown or not pairs:
        fail(f"--pairs: unknown {', '.join(unknown) or 'none given'} (pairs: {', '.join(PAIRS)})")
    if args.rounds < 1:
        fail(f"--rounds must be at least 1, got {args.rounds}")
    try:
        threads = [int(n) for n in args.torch_threads.split(",") if n]
    except ValueError:
        fail(f"--torch-threads: expected comma-separated integers, got {args.torch_threads!r}")
    steps = parse_steps(args.steps)
    settings = ["plain", "busy"] if args.busy else ["plain"]
    if not args.table and not built_versions(args.venv):
        fail(f"CleanRL {CLEANRL_VERSION}'s virtualenv is missing ({args.venv}): build it first with `{BUILD}`")
    defaults = {pair: our_defaults(PAIRS[pair]) for pair in pairs}
    for pair in pairs:
        batch = defaults[pair]["num_envs"] * defaults[pair]["num_steps"]
        if steps[pair] < batch:
            fail(f"--steps: {pair} needs at least one batch, {batch} steps, got {steps[pair]}")
    if args.baseline is not None and not all((args.baseline / f"{PAIRS[pair].ours}.py").is_file() for pair in pairs):
        fail(f"--baseline {args.baseline}: not a checkout of this repository (its scripts are missing)")
    variants = {pair: our_variants(defaults[pair], threads, not args.no_split, bool(args.baseline)) for pair in pairs}
    modes = {pair: {label: mode(defaults[pair], label) for label, _ in variants[pair]} for pair in pairs}
    if not args.table:
        for pair in pairs:
            check_flags(their_command(PAIRS[pair], steps[pair], defaults[pair], args.venv), defaults[pair])
        run_rounds(args.log, args.rounds, pairs, steps, settings, variants, defaults, args.venv, args.cold_compile,
                   args.baseline)  # fmt: skip

    records = read_log(args.log)
    command = f"python -m {PROG} " + shlex.join(argv)
    text = describe(command, args.venv, pairs, settings, defaults, records, args.cold_compile, args.baseline)
    text += "\n\n" + table(records, pairs, steps, settings, args.rounds, modes, args.cold_compile)
    print("\n" + text)
    if args.out:
        args.out.write_text(text + "\n")


def parity_arguments(parser: argparse.ArgumentParser):
    add = parser.add_argument
    add("what", choices=["run", "table"])
    add("--runs-dir", type=Path, help="run: CleanRL's runs and logs go here")
    add("--steps", type=int, default=300_000)
    add("--seeds", type=int, nargs="+", default=[1, 2])
    add("--workers", type=int, default=1)
    add("--scripts", nargs="+", choices=list(PARITY_SCRIPTS), default=list(PARITY_SCRIPTS), help="run: which")
    add("--ours", type=Path, help="table: the folder of our runs")
    add("--cleanrl", type=Path, help="table: the folder given to `run`")
    add("--window", type=int, default=50_000, help="table: the last steps whose games count")
    add("--out", type=Path, help="table: write the markdown here (else print it)")
    add("--plots", type=Path, help="table: a PNG per pair into this folder")


def parity(args, argv: list[str]):
    if args.what == "run":
        if args.runs_dir is None:
            fail("run needs --runs-dir")
        signal.signal(signal.SIGTERM, interrupt)  # SIGTERM, as Ctrl-C: the running jobs are stopped first
        try:
            code = parity_run(args.venv, args.runs_dir.resolve(), args.steps, args.seeds, args.workers, args.scripts)
        except KeyboardInterrupt:
            die_interrupted("interrupted: CleanRL's running jobs killed")
        sys.exit(code)
    else:
        if args.ours is None or args.cleanrl is None:
            fail("table needs --ours and --cleanrl")
        text = (
            f"# Atari early learning beside CleanRL\n\nWritten {utc_now()} by `python -m {PROG} {' '.join(argv)}` on "
            f"{machine()}, no GPU. Runs: `bash benchmark/ppo.sh parity`, every seed the table lists (both sides, at "
            "their defaults, one run at a time with `OMP_NUM_THREADS=1`). CleanRL's side runs CleanRL "
            f"{CLEANRL_VERSION} in its own virtualenv ({', '.join(PACKAGES)}; Python 3.10), made once by "
            "`python -m benchmark.studies.cleanrl build`, which downloads them.\n\n"
            f"Score: the mean game score of the games that end in the last {args.window:,} steps of each run "
            "(all lives, unclipped), per seed; the verdict compares the means with the larger of the two "
            f"standard deviations over seeds (ddof 0, as benchmark.scores). A run counts once it reached "
            f"{FINISHED:.0%} of {args.steps:,} steps (runs end on whole iterations).\n\n"
            + parity_table(args.ours, args.cleanrl / "runs", args.window, args.steps)
        )
        if args.plots:
            for path in parity_plots(args.ours, args.cleanrl / "runs", args.plots, args.steps):
                print(f"wrote {path}")
        if args.out:
            args.out.write_text(text + "\n")
            print(f"wrote {args.out}")
        else:
            print(text)


def main(argv: list[str] | None = None):
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__, formatter_class=raw)
    commands = parser.add_subparsers(dest="command", required=True)
    built = commands.add_parser("build", help="create CleanRL's virtualenv (downloads it and its stack)")
    built.add_argument("--python", help="the Python 3.10 that makes it (default: python3.10 or pyenv's)")
    speed_arguments(commands.add_parser("speed", help="whole-process time beside CleanRL's scripts"))
    parity_arguments(commands.add_parser("parity", help="early learning on Atari beside CleanRL's scripts"))
    for command in commands.choices.values():
        command.add_argument(
            "--venv", type=Path, default=VENV, help="CleanRL's virtualenv ($PPO_LAB_CLEANRL_DIR, %(default)s)"
        )
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.venv, args.python or find_python310())
    elif args.command == "speed":
        speed(args, argv)
    else:
        parity(args, argv)


if __name__ == "__main__":
    main()
