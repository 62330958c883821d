"""The GPU benchmark: on any machine with CUDA, the training speed of each script in its three modes beside its
environments' own speed, and the tests marked `gpu`; written with the host to runs/benchmark/gpu.md (--out names
another file; the published measurements are benchmark/results/gpu.md, which the tool writes only when --out says so).

    python -m benchmark.gpu                                   # every script below (about 20 min on an H200, est.)
    python -m benchmark.gpu --scripts ppo_atari_envpool ppo --out runs/benchmark/gpu-two.md
    python -m benchmark.gpu --dry-run                         # the same plan shortened, on the CPU: measures nothing

Per script, on its standard environment (ppo_continuous_action.py on HalfCheetah-v4, as LeanRL's figures), at its
defaults: the training SPS of three fresh runs, eager (`--cuda`), `--compile` and `--compile --cudagraphs`, counted
after the first --warmup iterations (compilation, CUDA-graph recording) from the run's `charts/SPS` event times, with
the seconds to the end of its first iteration; the env-only SPS of its own `make_envs` (the ceiling of any training
loop here); then `pytest -m gpu`. The file names the host (GPU, driver, CUDA, CPU, versions, date, command).
--dry-run proves the tool on the CPU: 2 environments x 16 steps, `--compile` with torch.compile off and no number,
`--compile --cudagraphs` skipped. Beside CleanRL's and LeanRL's scripts on the same host: python -m benchmark.side_by_side.
"""

import argparse
import dataclasses
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmark.scripts import ENV_ID, ROOT, env_only_in_child, import_script, machine, utc_now, versions

OUT = ROOT / "runs" / "benchmark" / "gpu.md"
DRY_RUN_OUT = ROOT / "runs" / "benchmark" / "gpu-dry-run.md"
# script -> iterations per run at its defaults (batch: envpool Atari 1,024 steps, ALE Atari 1,024, Procgen 16,384,
# CartPole 512, HalfCheetah 2,048): 5-50 s a run at the speeds of results/gpu.md (an H200), compilation aside
ITERATIONS = {"ppo_atari_envpool": 60, "ppo_atari": 30, "ppo_atari_lstm": 30, "ppo_procgen": 15, "ppo": 40}
ITERATIONS["ppo_continuous_action"] = 15
SPS_ENV = {**ENV_ID, "ppo_continuous_action": "HalfCheetah-v4"}
MODES = {"eager": [], "compile": ["--compile"], "cudagraphs": ["--compile", "--cudagraphs"]}  # name -> flags
WARMUP = 5
ENV_ONLY_STEPS = 16_384
TINY = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1"]
DRY_ITERATIONS, DRY_WARMUP, DRY_ENV_ONLY_STEPS = 4, 2, 256
PACKAGES = ["torch", "numpy", "gymnasium", "envpool", "ale-py", "mujoco", "tensordict"]


def fail(message: str):
    print(f"benchmark.gpu: error: {message}", file=sys.stderr)
    sys.exit(2)


# The host -------------------------------------------------------------------------------------------------------------
def host(command: str) -> dict:
    """What the results depend on: the GPU and its driver, CUDA, the CPU, the versions, the date, the command."""
    import torch

    info = {"date": utc_now(), "command": command, "cpu": machine(), "python": platform.python_version()}
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(k) for k in range(torch.cuda.device_count())]
        info["gpu"] = ", ".join(f"{names.count(n)} x {n}" if names.count(n) > 1 else n for n in dict.fromkeys(names))
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        try:
            driver = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            driver = []
        info["driver"] = driver[0] if driver else "unknown (no nvidia-smi)"
        info["cuda"] = f"{torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
    else:
        info["gpu"] = "none (no CUDA device seen by torch)"
    info["packages"] = {name: version for name, version in versions(PACKAGES).items() if name != "python"}
    return info


def host_lines(info: dict) -> list[str]:
    """The markdown lines that name the host."""
    gpu = info["gpu"] + (f" (driver {info['driver']}, CUDA {info['cuda']})" if "driver" in info else "")
    versions = ", ".join(f"{name} {version}" for name, version in info["packages"].items())
    return [
        f"Written {info['date']} by `{info['command']}`.",
        "",
        f"- GPU: {gpu}",
        f"- CPU: {info['cpu']}",
        f"- Python {info['python']}; {versions}",
    ]


# One training run -----------------------------------------------------------------------------------------------------
def steady_sps(points: list[tuple[int, float, float]], warmup: int) -> float | None:
    """Steps per second from the end of iteration `warmup` to the end of the last one, from a run's per-iteration
    `charts/SPS` events (step, wall time, value); None when the run logged too few iterations."""
    if len(points) <= warmup or warmup < 1:
        return None
    (step0, wall0, _), (step1, wall1, _) = points[warmup - 1], points[-1]
    return (step1 - step0) / (wall1 - wall0) if wall1 > wall0 else None


@dataclasses.dataclass
class Run:
    """One training run's outcome: its SPS after warm-up, or why there is none."""

    program: str
    mode: str
    command: str = ""
    sps: float | None = None
    first_iteration_s: float | None = None  # from the run's first log to the end of its first iteration
    warmup_s: float | None = None  # ... to the end of its warm-up
    status: str = "ok"

    def cell(self, seconds: str = "first_iteration_s") -> str:
        """The table's cell: the SPS and, in brackets, the seconds to the end of the first iteration (or of `seconds`)."""
        return (
            self.status.replace("|", "/")
            if self.status != "ok"
            else f"{self.sps:,.0f} ({getattr(self, seconds):.1f} s)"
        )

    def start(self, command: list[str], timeout: float, env: dict | None, cwd) -> bool:
        """Runs `command` for this run: whether it ended well (else the status says how it ended)."""
        self.command = shlex.join(["python", *command[1:]])
        try:
            done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            self.status = f"stopped after {timeout:.0f} s"
            return False
        last = (done.stderr.strip() or done.stdout.strip() or "?").splitlines()[-1]
        self.status = "ok" if done.returncode == 0 else f"exit {done.returncode}: {last[:200]}"
        return done.returncode == 0


def train(command: list[str], runs_dir: Path, run: Run, warmup: int, timeout: float, env=None, cwd=ROOT) -> Run:
    """Runs `command` (which writes its TensorBoard folder under `runs_dir`) and reads its SPS after `warmup`
    iterations and its first iteration's end from its `charts/SPS` events into `run`."""
    from benchmark.events import read_timed_scalars

    if not run.start(command, timeout, env, cwd):
        return run
    folders = sorted({path.parent for path in runs_dir.rglob("events.out.tfevents.*")})
    if len(folders) != 1:
        run.status = f"{len(folders)} TensorBoard folders under {runs_dir}, expected 1"
        return run
    opened, scalars = read_timed_scalars(folders[0])
    points = scalars.get("charts/SPS", [])
    run.sps = steady_sps(points, warmup)
    if run.sps is None:
        run.status = f"{len(points)} iterations logged, fewer than the warm-up {warmup} + 1"
        return run
    run.first_iteration_s, run.warmup_s = points[0][1] - opened, points[warmup - 1][1] - opened
    return run


def measure(script: str, env_id: str, mode: str, cuda: bool, dry: bool, iterations: int, warmup: int, timeout: float):
    """One run of one of our scripts in one mode, at its defaults (dry: TINY), on a fresh process."""
    run = Run(f"{script}.py", mode)
    if "--cudagraphs" in MODES[mode] and not cuda:
        run.status = "skipped: needs CUDA"
        return run
    defaults = {field.name: field.default for field in dataclasses.fields(import_script(script).Args)}
    batch = 2 * 16 if dry else defaults["num_envs"] * defaults["num_steps"]
    env = dict(os.environ)
    if dry and MODES[mode]:
        env["TORCH_COMPILE_DISABLE"] = "1"
    with tempfile.TemporaryDirectory() as runs:
        command = [sys.executable, f"{script}.py", "--env-id", env_id, "--total-timesteps", str(iterations * batch)]
        command += ["--cuda" if cuda else "--no-cuda", *MODES[mode], *(TINY if dry else []), "--runs-dir", runs]
        train(command, Path(runs), run, warmup, timeout, env)
    run.command = shlex.join(["python", *command[1:-2]])  # (without its temporary --runs-dir)
    if dry and MODES[mode] and run.status == "ok":
        run.status = "ran with torch.compile off (dry run)"
    return run


# The gpu-marked tests -------------------------------------------------------------------------------------------------
def gpu_test_files() -> list[str]:
    """The test files that hold tests marked `gpu`."""
    found = (ROOT / "tests").rglob("test_*.py")
    return sorted(str(path.relative_to(ROOT)) for path in found if re.search(r"\bmark\.gpu\b", path.read_text()))


def gpu_tests(timeout: float) -> list[str]:
    """`pytest -m gpu` over those files: its summary line and each test that failed, as markdown lines."""
    files = gpu_test_files()
    command = [sys.executable, "-m", "pytest", "-q", "-rfE", "-m", "gpu", "-p", "no:cacheprovider", *files]
    shown = f"`python -m pytest -m gpu {' '.join(files)}`"
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [f"{shown}: stopped after {timeout:.0f} s"]
    lines = done.stdout.splitlines()
    summary = [line.strip("= ") for line in lines if re.search(r"\d+ (passed|failed|skipped|errors?|deselected)", line)]
    failed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
    return [f"{shown}: {summary[-1] if summary else f'exit {done.returncode}'}"] + [f"- `{line}`" for line in failed]


# The table ------------------------------------------------------------------------------------------------------------
def label(mode: str) -> str:
    """ "cudagraphs" -> "--compile --cudagraphs": a mode as its flags."""
    return " ".join(MODES[mode]) or mode


def markdown(info: dict, rows: dict[str, dict], tests: list[str], iterations: dict, warmup: int, dry: bool) -> str:
    modes = [run.mode for run in next(iter(rows.values()))["runs"]] if rows else list(MODES)
    lines = ["# ppo-lab on a GPU" + (" (dry run on the CPU: no speed measured)" if dry else ""), ""]
    lines += host_lines(info)
    lines += [
        "",
        "## Training speed",
        "",
        f"Steps per second after the first {warmup} iterations (where torch.compile compiles and CUDA graphs are "
        "recorded), from each run's own `charts/SPS` event times; in brackets the seconds from the run's first log to "
        "the end of its first iteration, compilation included. Each run is a fresh process at the script's default "
        "hyperparameters: `python SCRIPT.py --env-id ENV --total-timesteps STEPS --cuda`, then with `--compile`, "
        "then with `--compile --cudagraphs`. Env-only: random actions through the script's own environments "
        "(`benchmark.scripts.env_only_sps`), the ceiling of any training loop with them on this host.",
        "",
        f"| script | env | iterations | env-only SPS | {' | '.join(label(mode) for mode in modes)} |",
        "|---|---|---|---|" + "---|" * len(modes),
    ]
    for script, row in rows.items():
        cells = [f"{script}.py", SPS_ENV[script], str(iterations[script]), row["env_only"]]
        lines.append(f"| {' | '.join(cells + [run.cell() for run in row['runs']])} |")
    lines += ["", "Beside CleanRL's and LeanRL's scripts on the same host: `python -m benchmark.side_by_side`."]
    lines += ["", "## GPU tests", "", *tests]
    return "\n".join(lines) + "\n"


def env_only(script: str, steps: int) -> str:
    """The script's env-only SPS over `steps` steps in a fresh process, as a table cell: the number, or why none."""
    try:
        return f"{env_only_in_child(script, SPS_ENV[script], steps):,.0f}"
    except subprocess.CalledProcessError as error:
        last = (error.stderr or "").strip().splitlines()
        return f"fails: {last[-1][:200] if last else f'exit {error.returncode}'}".replace("|", "/")


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(prog="python -m benchmark.gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--scripts", nargs="+", choices=list(ITERATIONS), default=list(ITERATIONS))
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES), help="(default: all three)")
    parser.add_argument("--iterations", type=int, help="iterations per run (default: per script, see ITERATIONS)")
    parser.add_argument("--warmup", type=int, help=f"iterations left out of the SPS (default {WARMUP})")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one run may take (default %(default)s)")
    parser.add_argument("--no-tests", action="store_true", help="leave out the gpu-marked tests")
    parser.add_argument("--dry-run", action="store_true", help="the same plan shortened on the CPU, no GPU needed")
    parser.add_argument("--out", type=Path, help="the markdown (default runs/benchmark/gpu.md, dry: gpu-dry-run.md; "
                        "benchmark/results/gpu.md holds the published measurements)")  # fmt: skip
    args = parser.parse_args(argv)
    command = shlex.join(["python", "-m", "benchmark.gpu", *(argv if argv is not None else sys.argv[1:])])
    import torch

    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        fail(f"no CUDA device here (torch {torch.__version__}): run it on a machine with CUDA, or --dry-run")
    warmup = args.warmup if args.warmup is not None else DRY_WARMUP if args.dry_run else WARMUP
    iterations = {s: args.iterations or (DRY_ITERATIONS if args.dry_run else ITERATIONS[s]) for s in args.scripts}
    if warmup < 1 or any(n <= warmup for n in iterations.values()):
        fail(
            f"--warmup {warmup}, --iterations {min(iterations.values())}: the warm-up is 1 or more, the iterations more"
        )
    out = args.out or (DRY_RUN_OUT if args.dry_run else OUT)
    info = host(command)
    print("\n".join(host_lines(info)), flush=True)
    rows = {}
    for script in args.scripts:
        steps = DRY_ENV_ONLY_STEPS if args.dry_run else ENV_ONLY_STEPS
        rows[script] = {"env_only": env_only(script, steps), "runs": []}
        print(f"{script}.py, env-only: {rows[script]['env_only']}", flush=True)
        for mode in args.modes:
            run = measure(script, SPS_ENV[script], mode, cuda, args.dry_run, iterations[script], warmup, args.timeout)
            rows[script]["runs"].append(run)
            print(f"{script}.py, {label(mode)}: {run.cell()}", flush=True)
    tests = ["Not run (--no-tests)."] if args.no_tests else gpu_tests(args.timeout)
    text = markdown(info, rows, tests, iterations, warmup, args.dry_run)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"\n{text}\nwrote {out}")


if __name__ == "__main__":
    main()
