"""Side by side with CleanRL: the whole-process time of our scripts and of CleanRL 1.2.0's, same steps
and hyperparameters, measured in one run.

    python -m benchmark.speed_vs_cleanrl --build   # once: CleanRL 1.2.0 and its packages, in a virtualenv outside git
    python -m benchmark.speed_vs_cleanrl             # CartPole-v1 500k, Hopper-v4 1M, Breakout-v5 10M steps, 3 rounds
                                         # (on 2 cores a 10M Breakout run takes most of a day: give --steps)
    python -m benchmark.speed_vs_cleanrl --pairs cartpole,hopper --steps cartpole=50000,hopper=20480 --rounds 1 --busy
    python -m benchmark.speed_vs_cleanrl --pairs cartpole,hopper --baseline /tmp/before  # and an older commit's
    python -m benchmark.speed_vs_cleanrl --pairs breakout --steps breakout=102400 --busy --torch-threads 1 \\
        --log benchmark/results/speed_cpu_runs.jsonl --out /tmp/speed_breakout.md

The pairs (ours against CleanRL's script of the same name):
- cartpole: ppo.py against cleanrl/ppo.py on CartPole-v1 (default budget 500k steps),
- hopper: ppo_continuous_action.py against cleanrl/ppo_continuous_action.py on Hopper-v4 (1M),
- breakout: ppo_atari_envpool.py against cleanrl/ppo_atari_envpool.py on Breakout-v5 (10M).

CleanRL runs from the virtualenv's site-packages at its own package versions (gym 0.23.1, gymnasium
0.29.1, envpool 0.8.4, numpy<2, mujoco 2.3.7), with the same torch as ours; its code is never copied
into this repository. Both sides get the same hyperparameters as explicit flags, our script's
defaults (learning rate, envs, steps per rollout, minibatches, epochs, clipping, coefficients, seed,
...), and before the first run every flag of CleanRL's script is checked to be either one we pass or
one that does not change the training (run name, W&B names); its tracking, video and CUDA are off.

What is timed: the whole process, from the interpreter's start (torch's import included) to its exit,
each side at its own thread default (OMP_NUM_THREADS unset: CleanRL at PyTorch's default, one thread
per core; ours at its `--torch-threads` default). `--busy` also times every run while another process
keeps one core busy, as when runs share a machine; `--torch-threads 1,2` adds our scripts at these
thread counts. Where our script has `--compile`, it is timed in both modes (its default and the other;
`--no-split` leaves the other out) and a second table shows the eager/compiled split. The compile time
there is the script's own `perf/compile_time` where it logs one, else the extra time of the first
iteration (the script's own rollout and update timers), compiled runs less eager ones. torch.compile's
cache is the user's (warm after the first compile of the same code) or, with `--cold-compile`, empty
for every run.
In each round every run is measured once, the order reversed every other round so that ours and
CleanRL's take turns going first; the table shows each round, the median and the range, and the
ratio CleanRL time / our time (median over rounds, and its range over the rounds' own ratios).

Every finished run is appended at once to the `--log` file (JSON lines: command, seconds, the script's
last SPS, the 1-minute load average just before it), and a run already there (same pair, steps,
setting, run, round and compile cache) is not measured again: an interrupted benchmark resumes where
it stopped when given the same command. `--table` prints the table from the log only.
"""

import argparse
import dataclasses
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from benchmark.scripts import ROOT, import_script

PEER_VERSION = "1.2.0"
PEER_DIR = Path(os.environ.get("PPO_LAB_PEER_DIR") or Path.home() / ".cache" / "ppo-lab" / f"cleanrl-{PEER_VERSION}")
# CleanRL 1.2.0's scripts with the packages of their time: ppo.py and the envpool script are written for
# gym 0.23's API (4-tuple step, env.seed), ppo_continuous_action.py for gymnasium 0.28/0.29; mujoco
# 2.3.7, the last 2.x version (CleanRL pins mujoco<=2.3.3, 2.3.3 in its requirements files; imageio: gymnasium
# 0.29's MuJoCo envs import it); gym 0.23's CartPole imports pygame, whose pin in CleanRL (2.1.0) has no Python 3.11 wheel;
# torch is ours, so that the networks' kernels are the same on both sides.
PEER_PACKAGES = [
    "torch==2.13.0",
    "numpy<2",
    "gym==0.23.1",
    "gymnasium==0.29.1",
    "envpool==0.8.4",
    "mujoco==2.3.7",
    "imageio",
    "pygame==2.6.1",
    "tensorboard",
]
VERSIONS_OF = ["cleanrl", "torch", "numpy", "gym", "gymnasium", "envpool", "mujoco"]
DEFAULT_LOG = ROOT / "runs" / "benchmark_peer.jsonl"


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
HYPERPARAMETERS = (
    "seed",
    "torch_deterministic",
    "learning_rate",
    "num_envs",
    "num_steps",
    "anneal_lr",
    "gamma",
    "gae_lambda",
    "num_minibatches",
    "update_epochs",
    "norm_adv",
    "clip_coef",
    "clip_vloss",
    "ent_coef",
    "vf_coef",
    "max_grad_norm",
    "target_kl",
)
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


def fail(message: str):
    """One line on stderr and exit 2, as the training scripts do for bad input."""
    print(f"benchmark.speed_vs_cleanrl: error: {message}", file=sys.stderr)
    sys.exit(2)


# ----------------------------------------------------------------------------------------------------------
# The peer: CleanRL 1.2.0 in a virtualenv of its own
# ----------------------------------------------------------------------------------------------------------
def peer_python(peer_dir: Path) -> Path:
    return peer_dir / "bin" / "python"


def peer_script(peer_dir: Path, pair: Pair) -> Path:
    """CleanRL's script of `pair` in the virtualenv's site-packages."""
    (script,) = sorted(peer_dir.glob(f"lib/python*/site-packages/cleanrl/{pair.theirs}"))
    return script


def home_relative(path: Path) -> str:
    """`path` as `~/...` when it is in the home folder: a results file names no machine's home."""
    path = Path(path)
    return f"~/{path.relative_to(Path.home())}" if path.is_relative_to(Path.home()) else str(path)


def peer_versions(peer_dir: Path) -> dict[str, str]:
    """The peer's package versions, written by --build as its last step ({} where it is not built)."""
    ready = peer_dir / "versions.json"
    return json.loads(ready.read_text()) if ready.is_file() else {}


def check_peer(peer_dir: Path):
    """A one-line error when the peer is not built."""
    if not peer_versions(peer_dir):
        fail(
            f"CleanRL {PEER_VERSION}'s virtualenv is missing ({peer_dir}): build it first with "
            "`python -m benchmark.speed_vs_cleanrl --build`"
        )


def build(peer_dir: Path):
    """Creates the virtualenv and installs CleanRL 1.2.0 (its scripts only: its pinned requirements are of
    2023 and it declares Python < 3.11) and the packages its PPO scripts import; checks that they import
    and that the environments of the pairs open; writes versions.json last, which marks the build done."""
    (peer_dir / "versions.json").unlink(missing_ok=True)
    python = str(peer_python(peer_dir))
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(peer_dir)],
        [python, "-m", "pip", "install", "--upgrade", "pip", "setuptools", "wheel"],
        [python, "-m", "pip", "install", *PEER_PACKAGES],
        [python, "-m", "pip", "install", "--no-deps", "--ignore-requires-python", f"cleanrl=={PEER_VERSION}"],
    ]
    for command in steps:
        print("$", shlex.join(command), flush=True)
        subprocess.run(command, check=True)
    check = (
        "import json, sys; from importlib import metadata; import gym, gymnasium, envpool, torch, "
        "torch.utils.tensorboard; gym.make('CartPole-v1').reset(); gymnasium.make('Hopper-v4').reset(seed=1); "
        "envpool.make('Breakout-v5', env_type='gym', num_envs=1).reset(); "
        f"json.dump({{p: metadata.version(p) for p in {VERSIONS_OF!r}}}, sys.stdout)"
    )
    versions = subprocess.run([python, "-c", check], check=True, capture_output=True, text=True).stdout
    (peer_dir / "versions.json").write_text(versions + "\n")
    print(f"CleanRL {PEER_VERSION} ready in {peer_dir}: {versions}")


# ----------------------------------------------------------------------------------------------------------
# The command lines
# ----------------------------------------------------------------------------------------------------------
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


def our_command(
    pair: Pair, steps: int, defaults: dict, runs_dir: str, extra: tuple[str, ...] = (), root: Path = ROOT
) -> list[str]:
    """Our script in the checkout `root` (this one, or a --baseline), with the hyperparameters of `defaults`."""
    values = {
        "env_id": pair.env_id,
        "total_timesteps": steps,
        **hyperparameters(defaults),
        **dict.fromkeys(OFF + ("save_model",), False),
    }
    return [sys.executable, str(root / f"{pair.ours}.py"), *flags(values, ours=True), "--runs-dir", runs_dir, *extra]


def their_command(pair: Pair, steps: int, defaults: dict, peer_dir: Path) -> list[str]:
    values = {"env_id": pair.env_id, "total_timesteps": steps, **hyperparameters(defaults), **dict.fromkeys(OFF, False)}
    return [str(peer_python(peer_dir)), str(peer_script(peer_dir, pair)), *flags(values, ours=False)]


def unmatched_flags(help_text: str, command: list[str], unset: set[str]) -> list[str]:
    """CleanRL's flags (from its --help) that the command neither passes nor may leave at their defaults:
    NOT_PASSED, and `unset`, the hyperparameters that are None in our script (as in CleanRL's)."""
    offered = set(re.findall(r"--([a-z][a-z0-9-]*)", help_text))
    passed = {arg[2:] for arg in command if arg.startswith("--")}
    return sorted(offered - passed - NOT_PASSED - unset)


def our_variants(
    defaults: dict, threads: list[int], split: bool = True, baseline: bool = False
) -> list[tuple[str, tuple[str, ...]]]:
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
    compiled = bool(defaults.get("compile"))
    if label.endswith("--compile"):
        compiled = True
    elif label.endswith("--no-compile"):
        compiled = False
    return "compiled" if compiled else "eager"


# ----------------------------------------------------------------------------------------------------------
# Timing one run
# ----------------------------------------------------------------------------------------------------------
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
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        start = time.perf_counter()
        done = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seconds = time.perf_counter() - start
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    if done.returncode != 0:
        tail = "\n".join(done.stdout.splitlines()[-20:])
        print(tail, file=sys.stderr)
        fail(f"exit {done.returncode} from: {shlex.join(command)}")
    return seconds, done.stdout


def measure(
    pair_name: str,
    steps: int,
    setting: str,
    label: str,
    extra: tuple[str, ...],
    defaults: dict,
    peer_dir: Path,
    cold: bool,
    baseline: Path | None = None,
) -> dict:
    """One timed run: a record for the log. `cold`: torch.compile starts from an empty cache; `baseline`: the
    checkout whose script the runs labelled BASELINE run."""
    pair = PAIRS[pair_name]
    with tempfile.TemporaryDirectory() as tmp:  # CleanRL writes runs/ in its working folder
        ours = label != THEIRS
        if ours:
            root = baseline if label == BASELINE else ROOT
            command = our_command(pair, steps, defaults, f"{tmp}/runs", extra, root)
        else:
            command = their_command(pair, steps, defaults, peer_dir)
        env = child_env(ours, f"{tmp}/compile_cache" if cold else None)
        seconds, output = time_run(command, env, setting == "busy", tmp)
        times = own_times(Path(tmp, "runs")) if ours else {}
    return {
        "pair": pair_name,
        "steps": steps,
        "setting": setting,
        "run": label,
        "cold": cold,
        "seconds": round(seconds, 3),
        "sps": last_sps(output),
        **times,
        "command": shlex.join(command),
    }


# ----------------------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------------------
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


def table(
    records: list[dict],
    pairs: list[str],
    steps: dict[str, int],
    settings: list[str],
    rounds: int,
    modes: dict[str, dict[str, str]],
    cold: bool = False,
) -> str:
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
    split = [
        "| script | steps | setting | eager (s) | compiled (s) | compiled / eager | compiled - eager (s) "
        "| compile time (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    baseline_lines = ["| pair | steps | setting | baseline time / our time |", "|---|---|---|---|"]
    for pair in pairs:
        name = f"{pair} ({PAIRS[pair].env_id})"
        for setting in settings:
            times, own = {}, {}
            for label in [THEIRS, *modes[pair]]:
                runs = {
                    r: found[pair, steps[pair], setting, label, r]
                    for r in range(1, rounds + 1)
                    if (pair, steps[pair], setting, label, r) in found
                }
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


# ----------------------------------------------------------------------------------------------------------
# The machine and the command
# ----------------------------------------------------------------------------------------------------------
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


def our_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in VERSIONS_OF[1:]:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return versions


def machine() -> str:
    """CPU model, cores and OS, for the table's header."""
    model = platform.processor() or platform.machine()
    try:
        names = re.findall(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text())
        model = names[0] if names else model
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} logical cores, {platform.platform()}"


def our_commit(root: Path = ROOT) -> str:
    def git(*args):
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + (" + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def check_flags(command: list[str], defaults: dict):
    """Fails unless every flag of CleanRL's script (from its --help) is one the command passes or one
    that does not change the training (NOT_PASSED): then no default of theirs differs unseen from ours."""
    help_text = subprocess.run(
        [*command[:2], "--help"], capture_output=True, text=True, env=child_env(ours=False)
    ).stdout
    unset = {name.replace("_", "-") for name in HYPERPARAMETERS if defaults[name] is None}
    missing = unmatched_flags(help_text, command, unset)
    if missing or "--env-id" not in help_text:
        fail(
            f"CleanRL's {Path(command[1]).name} has flags that the benchmark does not set: {missing} "
            f"(its --help: {help_text.strip()[-200:]!r})"
        )


def run_rounds(
    log: Path,
    rounds: int,
    pairs: list[str],
    steps: dict[str, int],
    settings: list[str],
    variants: dict[str, list[tuple[str, tuple[str, ...]]]],
    defaults: dict[str, dict],
    peer_dir: Path,
    cold: bool = False,
    baseline: Path | None = None,
):
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
                    record = measure(pair, steps[pair], setting, label, extra, defaults[pair], peer_dir, cold, baseline)
                    record.update(round=r, time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), load=load)
                    with log.open("a") as f:
                        f.write(json.dumps(record) + "\n")
                    print(f"round {r} {pair} {setting} {label}: {record['seconds']:.1f} s", flush=True)


def describe(
    command: str,
    peer_dir: Path,
    pairs: list[str],
    settings: list[str],
    defaults: dict[str, dict],
    records: list[dict],
    cold: bool,
    baseline: Path | None = None,
) -> str:
    """The lines above the table: machine, load during the runs, versions, command, settings, scripts."""
    loads = [record["load"] for record in records if "load" in record and record["pair"] in pairs]
    during = f"1-minute load average before each run {min(loads):.2f}-{max(loads):.2f}" if loads else "no runs logged"
    theirs = ", ".join(f"{k} {v}" for k, v in peer_versions(peer_dir).items()) or "not built here"
    lines = [
        f"Machine: {machine()}; {during}.",
        f"Ours: commit {our_commit()}, " + ", ".join(f"{k} {v}" for k, v in our_versions().items()) + ".",
        f"CleanRL: {theirs} (virtualenv {home_relative(peer_dir)}).",
        *([f"Baseline: {baseline}, commit {our_commit(baseline)}, with our flags."] if baseline else []),
        f"Command: `{command}`; date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "Settings: "
        + "; ".join(f"{name}: {SETTINGS[name]}" for name in settings)
        + "; torch.compile cache: "
        + ("empty for each run (cold)." if cold else "the user's (warm after the first compile)."),
    ]
    for pair in pairs:
        compile_note = (
            f"`--compile` default {defaults[pair]['compile']}" if "compile" in defaults[pair] else "no `--compile`"
        )
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


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmark.speed_vs_cleanrl",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--build", action="store_true", help="create the CleanRL virtualenv (then exit)")
    parser.add_argument(
        "--peer-dir",
        type=Path,
        default=PEER_DIR,
        help="the CleanRL virtualenv (default: $PPO_LAB_PEER_DIR or %(default)s)",
    )
    parser.add_argument("--pairs", default=",".join(PAIRS), help="comma-separated, of: %(default)s")
    parser.add_argument("--steps", default=None, help="N for every pair or PAIR=N,...; default: the scripts' own")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of alternating runs (default: %(default)s)")
    parser.add_argument("--busy", action="store_true", help="also time every run beside a process busy on one core")
    parser.add_argument(
        "--torch-threads", default="", help="also time our scripts with these thread counts, comma-separated (e.g. 1,2)"
    )
    parser.add_argument(
        "--no-split",
        action="store_true",
        help="time our scripts in their default compile mode only (no eager/compiled split)",
    )
    parser.add_argument(
        "--cold-compile",
        action="store_true",
        help="give every run an empty torch.compile cache (default: the user's, warm after the first compile)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="also time the scripts of this other checkout of the repository (e.g. a git worktree "
        "of an earlier commit) in the same rounds, with the same flags, and tabulate its time "
        "against ours",
    )
    parser.add_argument(
        "--log",
        type=Path,
        default=DEFAULT_LOG,
        help="JSON lines of the finished runs, read to resume (default: %(default)s)",
    )
    parser.add_argument("--table", action="store_true", help="print the table from --log only, run nothing")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown to this file")
    args = parser.parse_args(argv)
    if args.build:
        build(args.peer_dir)
        return
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
    if not args.table:
        check_peer(args.peer_dir)
    defaults = {pair: our_defaults(PAIRS[pair]) for pair in pairs}
    for pair in pairs:
        batch = defaults[pair]["num_envs"] * defaults[pair]["num_steps"]
        if steps[pair] < batch:
            fail(f"--steps: {pair} needs at least one batch, {batch} steps, got {steps[pair]}")
    if args.baseline is not None and not all((args.baseline / f"{PAIRS[pair].ours}.py").is_file() for pair in pairs):
        fail(f"--baseline {args.baseline}: not a checkout of this repository (its scripts are missing)")
    variants = {
        pair: our_variants(defaults[pair], threads, not args.no_split, args.baseline is not None) for pair in pairs
    }
    modes = {pair: {label: mode(defaults[pair], label) for label, _ in variants[pair]} for pair in pairs}
    if not args.table:
        for pair in pairs:
            check_flags(their_command(PAIRS[pair], steps[pair], defaults[pair], args.peer_dir), defaults[pair])
        run_rounds(
            args.log,
            args.rounds,
            pairs,
            steps,
            settings,
            variants,
            defaults,
            args.peer_dir,
            args.cold_compile,
            args.baseline,
        )

    records = read_log(args.log)
    command = "python -m benchmark.speed_vs_cleanrl " + shlex.join(argv if argv is not None else sys.argv[1:])
    text = (
        describe(command, args.peer_dir, pairs, settings, defaults, records, args.cold_compile, args.baseline)
        + "\n\n"
        + table(records, pairs, steps, settings, args.rounds, modes, args.cold_compile)
    )
    print("\n" + text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
