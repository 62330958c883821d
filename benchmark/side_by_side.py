"""Side by side on one GPU host: CleanRL's ppo_atari_envpool.py, LeanRL's ppo_atari_envpool_torchcompile.py and our
ppo_atari_envpool.py, one after another at the same setting (Breakout-v5, 8 environments x 128 steps, every other
hyperparameter at its default, which are the same on the three sides, seed 1), with the environments' own speed;
SPS after warm-up and the ratios ours / LeanRL and ours / CleanRL in one table.

    # once, on a machine with network: CleanRL 1.2.0 and LeanRL's packages (pure-Python wheels), and LeanRL's file
    python -m benchmark.side_by_side --download wheels
    git clone https://github.com/pytorch-labs/LeanRL       # only leanrl/ppo_atari_envpool_torchcompile.py is read
    # on the GPU host (ppo-lab installed: bash setup.sh, or bash setup.sh --offline wheels without network)
    python -m benchmark.side_by_side --leanrl LeanRL [--wheelhouse wheels]
    python -m benchmark.side_by_side --dry-run --leanrl LeanRL   # on the CPU: proves the tool, measures nothing

The runs, each a fresh process, on this environment's torch, envpool and gymnasium: CleanRL 1.2.0's file (from the
package index, `pip install --no-deps` into --packages, eager only); LeanRL's file as its run.sh runs it (plain,
`--compile`, `--compile --cudagraphs`; with tensordict in --packages); ours in the same three modes; the env-only SPS
of ours' make_envs and of the environments their files make. Their files were written for gym 0.23 and envpool 0.8:
each runs from a patched copy with the smallest changes today's packages require (`patches()`, each listed in the
results with its reason; a file they do not fit exactly is refused), and a stand-in `wandb` records LeanRL's speed
logs. SPS from the end of iteration 10 to the end of the last (--iterations, 60), from each program's own record of
its iterations, and the seconds to the end of iteration 10 (compilation included). --dry-run needs no GPU: 2
environments x 16 steps, 20 iterations, compiled runs reported as not measured, nothing installed. It writes
runs/benchmark/side_by_side.md (dry: side_by_side-dry-run.md) unless --out names another file (the published table:
benchmark/results/side_by_side.md).
"""

import argparse
import ast
import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from benchmark import gpu
from benchmark.scripts import CLEANRL_VERSION, ROOT

OUT = ROOT / "runs" / "benchmark" / "side_by_side.md"
DRY_RUN_OUT = ROOT / "runs" / "benchmark" / "side_by_side-dry-run.md"
PACKAGES = Path.home() / ".cache" / "ppo-lab" / "side-by-side"
# what CleanRL's and LeanRL's files need beyond ppo-lab's requirements: installed without their dependencies
# (CleanRL's pins gym 0.23 and Python < 3.11; its file is all that is run), tensordict in the version that runs
# on torch 2.13, and pyvers, tensordict's one dependency that ppo-lab's requirements lack
EXTRAS = [f"cleanrl=={CLEANRL_VERSION}", "tensordict==0.15.3", "pyvers==0.2.3"]
LEANRL_FILE = "leanrl/ppo_atari_envpool_torchcompile.py"
ENV_ID = "Breakout-v5"
ITERATIONS, WARMUP = 60, 10  # LeanRL logs every 10 iterations: the warm-up is its first 10
DRY_ITERATIONS = 20
MODES = gpu.MODES  # eager, compile, cudagraphs: their flags


# The changes that today's packages require, applied to a copy at run time ---------------------------------------------
@dataclasses.dataclass(frozen=True)
class Patch:
    why: str
    pattern: str  # a regular expression, in multi-line mode, of the text it replaces
    replacement: str
    count: int = 1  # the matches in the file as this tool knows it


GYM = Patch(
    "gym 0.23 is not installed; envpool's `gym` environments are gymnasium's now",
    r"^import gym$",
    "import gymnasium as gym",
)
RESET = Patch(
    "envpool's reset returns (observations, info) now",
    r"^(\s+)observations = super\(\)\.reset\(\*\*kwargs\)$",
    r"\1observations, _ = super().reset(**kwargs)",
)
STEP = Patch(
    "envpool's step returns terminated and truncated apart now; done was their `or`",
    r"^(\s+)observations, rewards, dones, infos = super\(\)\.step\(action\)$",
    r"\1observations, rewards, terminations, truncations, infos = super().step(action)"
    r"\n\1dones = terminations | truncations",
)
SPACES_SET = Patch(
    "envpool's environments have num_envs and the single spaces now, read-only",
    r"^\s+envs\.(num_envs|single_action_space|single_observation_space) = .*\n",
    "",
    count=3,
)
SPACES_WRAPPER = Patch(
    "gymnasium's wrappers no longer pass on the attributes they lack: the statistics wrapper takes the single spaces",
    r'^(\s+)self\.num_envs = getattr\(env, "num_envs", 1\)$',
    r"\g<0>\n\1self.single_action_space, self.single_observation_space = "
    r"env.single_action_space, env.single_observation_space",
)
DISTUTILS = Patch(
    "Python 3.12 has no distutils: its strtobool, written out",
    r"^from distutils\.util import strtobool$",
    'def strtobool(value):\n    return value.lower() in ("y", "yes", "t", "true", "on", "1")',
)
TO_MODULE = Patch(
    "tensordict 0.15's to_module keeps parameters as parameters; the inference copy needs plain tensors, as before",
    r"^(\s+)agent_inference_p\.to_module\(agent_inference\)$",
    r"\1agent_inference_p.to_module(agent_inference, preserve_module_state=False)",
)


def patches(program: str, has_distutils: bool) -> list[Patch]:
    """The changes for CleanRL's or LeanRL's file on this Python."""
    common = [GYM, RESET, STEP, SPACES_SET, SPACES_WRAPPER]
    if program == "CleanRL":
        return common + ([] if has_distutils else [DISTUTILS])
    return common + [TO_MODULE]


class PatchError(ValueError):
    pass


def apply_patches(text: str, changes: list[Patch], name: str) -> str:
    """`text` with every change made; a change that does not match exactly its count raises PatchError."""
    for change in changes:
        text, found = re.subn(change.pattern, change.replacement, text, flags=re.M)
        if found != change.count:
            raise PatchError(
                f"{name}: {found} matches of /{change.pattern}/ where {change.count} were expected ({change.why}): "
                "not the file this tool was written for"
            )
    return text


def imports(text: str) -> list[str]:
    """The top-level modules a file imports at its top level."""
    found = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.Import):
            found += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
            found.append(node.module.split(".")[0])
    return list(dict.fromkeys(found))


def missing_modules(modules: list[str], env: dict) -> list[str]:
    """Those of `modules` that the child's Python (this one, with env's PYTHONPATH) cannot find."""
    code = "import importlib.util, sys; print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
    done = subprocess.run([sys.executable, "-c", code, *modules], env=env, capture_output=True, text=True, cwd="/")
    return done.stdout.split()


# A stand-in for Weights & Biases, put first on LeanRL's path: each call is a JSON line in $PPO_LAB_CALLS
WANDB_STAND_IN = '''"""benchmark.side_by_side's stand-in for Weights & Biases: records the run's calls, sends nothing."""
import json, os, time
def _record(call, step=None, data=None):
    speed = (data or {}).get("speed")
    line = {"call": call, "time": time.time(), "step": step, "speed": None if speed is None else float(speed)}
    with open(os.environ["PPO_LAB_CALLS"], "a") as calls:
        calls.write(json.dumps(line) + "\\n")
def init(*args, **kwargs): _record("init")
def log(data, step=None, **kwargs): _record("log", step, data)
def finish(*args, **kwargs): pass
'''


# The runs -------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Setting:
    cuda: bool
    dry: bool
    iterations: int
    timeout: float
    packages: Path

    def steps(self) -> int:
        return self.iterations * (2 * 16 if self.dry else 8 * 128)


def their_run(program: str, source: Path | None, text: str | None, mode: str, setting: Setting) -> gpu.Run:
    """One run of CleanRL's or LeanRL's file: `text`, the file patched, from a copy in a temporary folder."""
    run = gpu.Run(program, mode)
    if "--cudagraphs" in MODES[mode] and not setting.cuda:
        run.status = "skipped: needs CUDA"
        return run
    if text is None:
        run.status = "skipped: " + (f"no file {source}" if source else "its file was not given")
        return run
    if setting.dry and MODES[mode]:  # (with torch.compile switched off, tensordict's compiled path fails)
        run.status = "not run in a dry run"
        return run
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "stand_in").mkdir()
        (work / "stand_in" / "wandb.py").write_text(WANDB_STAND_IN)
        copy = work / source.name
        copy.write_text(text)
        env = dict(os.environ, PPO_LAB_CALLS=str(work / "calls.jsonl"), WANDB_MODE="disabled")
        paths = [str(work / "stand_in"), str(setting.packages), env.get("PYTHONPATH")]
        env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
        absent = missing_modules(imports(text), env)
        if absent:
            run.status = f"skipped: needs {', '.join(absent)} (not installed)"
            return run
        command = [sys.executable, str(copy), "--env-id", ENV_ID, "--total-timesteps", str(setting.steps())]
        command += ["--seed", "1"]
        tiny = gpu.TINY if setting.dry else []
        if program == "CleanRL":
            command += ["--cuda", str(setting.cuda), "--track", "False", "--capture-video", "False", *tiny]
            gpu.train(command, work / "runs", run, WARMUP, setting.timeout, env, cwd=work)
        else:
            command += ([] if setting.cuda else ["--no-cuda"]) + MODES[mode] + tiny
            leanrl_train(command, work / "calls.jsonl", run, env, work, setting.timeout)
        run.command = run.command.replace(str(copy), source.name)
    return run


def leanrl_train(command: list[str], calls: Path, run: gpu.Run, env: dict, cwd: Path, timeout: float):
    """Runs LeanRL's file and reads its SPS from the log calls that the stand-in recorded."""
    if not run.start(command, timeout, env, cwd):
        return
    records = [json.loads(line) for line in calls.read_text().splitlines()] if calls.is_file() else []
    started = [record["time"] for record in records if record["call"] == "init"]
    logs = [record for record in records if record["call"] == "log"]
    if len(logs) < 2 or not started:
        run.status = f"{len(logs)} speed logs recorded, 2 needed (iterations {WARMUP} and {2 * WARMUP} at least)"
        return
    run.sps = (logs[-1]["step"] - logs[0]["step"]) / (logs[-1]["time"] - logs[0]["time"])
    run.warmup_s = logs[0]["time"] - started[0]


def our_run(mode: str, setting: Setting) -> gpu.Run:
    args = (mode, setting.cuda, setting.dry, setting.iterations, WARMUP, setting.timeout)
    run = gpu.measure("ppo_atari_envpool", ENV_ID, *args)
    run.program = "ours"
    return run


def their_env_only(steps: int) -> float:
    """SPS of random actions through the environments CleanRL's and LeanRL's files make (8 of them)."""
    import envpool
    import numpy as np

    envs = envpool.make(ENV_ID, env_type="gymnasium", num_envs=8, episodic_life=True, reward_clip=True, seed=1)
    envs.reset()
    rng = np.random.default_rng(0)
    actions = [rng.integers(envs.single_action_space.n, size=8) for _ in range(steps // 8)]
    start = time.perf_counter()
    for action in actions:
        envs.step(action)
    return len(actions) * 8 / (time.perf_counter() - start)


def env_only(steps: int) -> dict[str, str]:
    """Both env-only figures, each in a fresh process."""
    found = {"ours' make_envs": gpu.env_only("ppo_atari_envpool", steps)}
    command = [sys.executable, "-m", "benchmark.side_by_side", "--their-env-only", str(steps)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    found["CleanRL's and LeanRL's envpool.make"] = f"{float(lines[-1]):,.0f}" if done.returncode == 0 else "fails"
    return found


# Packages, files, the table -------------------------------------------------------------------------------------------
def pip(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pip", *args, "--no-deps", "--ignore-requires-python", "-q", *EXTRAS]
    print("$", " ".join(command), flush=True)
    return subprocess.run(command, capture_output=True, text=True)


def install(packages: Path, wheelhouse: Path | None):
    """EXTRAS into `packages` (pip --target), from `wheelhouse` alone when given; nothing when already there."""
    if (packages / "cleanrl" / "ppo_atari_envpool.py").is_file() and (packages / "tensordict").is_dir():
        return
    offline = ["--no-index", "--find-links", str(wheelhouse)] if wheelhouse else []
    done = pip("install", "--target", str(packages), "--upgrade", *offline)
    if done.returncode != 0:
        gpu.fail(f"pip could not install {' '.join(EXTRAS)} into {packages}: {done.stderr.strip().splitlines()[-1]}")


def leanrl_source(path: Path | None) -> Path | None:
    """--leanrl: the file itself, or a checkout of LeanRL's repository that holds it."""
    if path is None:
        return None
    if path.is_dir():
        path = path / LEANRL_FILE
    if not path.is_file():
        gpu.fail(f"--leanrl {path}: no such file (give LeanRL's {LEANRL_FILE}, or the folder of a LeanRL checkout)")
    return path


def ratio(a: gpu.Run | None, b: gpu.Run | None) -> str:
    return f"{a.sps / b.sps:.2f}" if a and b and a.status == b.status == "ok" else "—"


def cell(run: gpu.Run | None) -> str:
    return "—" if run is None else run.cell("warmup_s")


def markdown(info: dict, runs: dict, env_sps: dict, sources: dict, applied: dict, setting: Setting) -> str:
    cleanrl = runs["CleanRL"].get("eager")
    title = "# Side by side on one GPU host" + (" (dry run on the CPU: no speed measured)" if setting.dry else "")
    lines = [title, ""] + gpu.host_lines(info)
    lines += [
        "",
        f"Breakout-v5, {2 if setting.dry else 8} environments x {16 if setting.dry else 128} steps, seed 1, every "
        f"other hyperparameter at its default, {setting.iterations} iterations a run, each run a fresh process, one "
        f"after another. SPS: steps per second from the end of iteration {WARMUP} to the end of the last, from each "
        f"program's own record of its iterations; in brackets the seconds from its first log to the end of iteration "
        f"{WARMUP} (compilation and CUDA-graph recording included).",
        "",
        "| mode | CleanRL's ppo_atari_envpool.py | LeanRL's ppo_atari_envpool_torchcompile.py "
        "| ours (ppo_atari_envpool.py) | ours / LeanRL | ours / CleanRL's eager |",
        "|---|---|---|---|---|---|",
    ]
    for mode in runs["ours"]:
        ours, leanrl = runs["ours"][mode], runs["LeanRL"][mode]
        theirs = cell(cleanrl) if mode == "eager" else "(eager only)"
        ratios = f"{ratio(ours, leanrl)} | {ratio(ours, cleanrl)}"
        lines.append(f"| {gpu.label(mode)} | {theirs} | {cell(leanrl)} | {cell(ours)} | {ratios} |")
    best = {side: max((run for run in by_mode.values() if run.status == "ok"), key=lambda run: run.sps, default=None)
            for side, by_mode in runs.items()}  # fmt: skip
    lines.append(
        f"| best of each | {cell(best['CleanRL'])} | {cell(best['LeanRL'])} | {cell(best['ours'])} "
        f"| {ratio(best['ours'], best['LeanRL'])} | {ratio(best['ours'], cleanrl)} |"
    )
    measured = "; ".join(f"{name}: {value}" for name, value in env_sps.items())
    lines += ["", f"Env-only SPS, random actions through 8 environments on this host: {measured}."]
    lines += ["", "## The programs", ""]
    for program, source in sources.items():
        lines.append(f"- {program}: {source}")
        lines += [f"  - changed at run time: {change.why}" for change in applied.get(program, [])]
    lines += ["- ours: `ppo_atari_envpool.py` of this repository, as it is", "", "Commands:", ""]
    every = [run for side in runs.values() for run in side.values() if run.command]
    lines += [f"- {run.program}, {gpu.label(run.mode)}: `{run.command}`" for run in every]
    return "\n".join(lines) + "\n"


def describe_source(path: Path | None) -> str:
    if path is None or not path.is_file():
        return "not run (its file was not given)"
    return f"`{path}` (sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:16]}...)"


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(prog="python -m benchmark.side_by_side", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--leanrl", type=Path, help=f"LeanRL's {LEANRL_FILE}, or a LeanRL checkout's folder")
    parser.add_argument("--cleanrl", type=Path, help="CleanRL's ppo_atari_envpool.py (default: the one in --packages)")
    parser.add_argument("--packages", type=Path, default=PACKAGES, help="where EXTRAS go (pip --target; %(default)s)")
    parser.add_argument("--wheelhouse", type=Path, help="install EXTRAS from this folder alone (no network)")
    parser.add_argument("--download", type=Path, metavar="DIR", help="download EXTRAS' wheels into DIR, then exit")
    parser.add_argument(
        "--iterations", type=int, help=f"a run's iterations (default {ITERATIONS}, {DRY_ITERATIONS} dry)"
    )
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES), help="(default: all three)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one run may take (%(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="the same runs shortened on the CPU, no GPU needed")
    parser.add_argument("--out", type=Path, help=f"the markdown (default {os.path.relpath(OUT, ROOT)})")
    parser.add_argument("--their-env-only", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.their_env_only:
        print(their_env_only(args.their_env_only))
        return
    if args.download:
        done = pip("download", "--dest", str(args.download))
        if done.returncode != 0:
            gpu.fail(f"pip could not download {' '.join(EXTRAS)}: {done.stderr.strip().splitlines()[-1]}")
        print(f"downloaded {', '.join(EXTRAS)} into {args.download}")
        return
    import torch

    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        gpu.fail(f"no CUDA device here (torch {torch.__version__}): run it on a machine with CUDA, or --dry-run")
    setting = Setting(cuda, args.dry_run, args.iterations or (DRY_ITERATIONS if args.dry_run else ITERATIONS),
                      args.timeout, args.packages)  # fmt: skip
    if setting.iterations < 2 * WARMUP:
        gpu.fail(f"--iterations {setting.iterations}: at least {2 * WARMUP} (LeanRL logs its speed every {WARMUP})")
    if args.wheelhouse and not args.wheelhouse.is_dir():
        gpu.fail(f"--wheelhouse {args.wheelhouse}: no such folder")
    sources = {"CleanRL": args.cleanrl or args.packages / "cleanrl" / "ppo_atari_envpool.py"}
    sources["LeanRL"] = leanrl_source(args.leanrl)
    if not args.dry_run:
        if sources["LeanRL"] is None:
            gpu.fail(f"--leanrl is needed: LeanRL's {LEANRL_FILE} (git clone https://github.com/pytorch-labs/LeanRL)")
        install(args.packages, args.wheelhouse)
    if args.cleanrl is not None and not args.cleanrl.is_file():
        gpu.fail(f"--cleanrl {args.cleanrl}: no such file")
    texts, applied = {}, {}
    has_distutils = importlib.util.find_spec("distutils") is not None
    for program, path in sources.items():  # refused before any run: a file that the changes do not fit
        if path is not None and path.is_file():
            applied[program] = patches(program, has_distutils)
            try:
                texts[program] = apply_patches(path.read_text(), applied[program], f"{program}'s {path}")
            except PatchError as error:
                gpu.fail(str(error))
    command = shlex.join(["python", "-m", "benchmark.side_by_side", *(argv if argv is not None else sys.argv[1:])])
    info = gpu.host(command)
    for found in metadata.distributions(path=[str(args.packages)]):  # CleanRL's and tensordict's, where installed
        info["packages"][found.metadata["Name"]] = found.version
    print("\n".join(gpu.host_lines(info)), flush=True)
    runs = {"CleanRL": {}, "LeanRL": {}, "ours": {}}
    for mode in args.modes:  # one mode at a time, the three sides in turn
        if mode == "eager":
            runs["CleanRL"][mode] = their_run("CleanRL", sources["CleanRL"], texts.get("CleanRL"), mode, setting)
        runs["LeanRL"][mode] = their_run("LeanRL", sources["LeanRL"], texts.get("LeanRL"), mode, setting)
        runs["ours"][mode] = our_run(mode, setting)
        for side in runs.values():
            if mode in side:
                print(f"{side[mode].program}, {gpu.label(mode)}: {cell(side[mode])}", flush=True)
    env_sps = env_only(gpu.DRY_ENV_ONLY_STEPS if args.dry_run else gpu.ENV_ONLY_STEPS)
    described = {program: describe_source(path) for program, path in sources.items()}
    text = markdown(info, runs, env_sps, described, applied, setting)
    out = args.out or (DRY_RUN_OUT if args.dry_run else OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"\n{text}\nwrote {out}")


if __name__ == "__main__":
    main()
