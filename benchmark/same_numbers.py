"""Whether two versions of the scripts compute the same numbers: every script runs a few iterations on its
real environment with the same seed (training with checkpoints, evaluations and the saved model, then a resume
that trains further, then --evaluate of the saved model), and everything it logs that is not a clock reading is
recorded: every TensorBoard scalar, the printed evaluation lines, a hash of the saved weights.

    python -m benchmark.same_numbers record --repo . --out new.json            # this checkout
    python -m benchmark.same_numbers record --repo /tmp/main --out old.json    # e.g. a worktree of main
    python -m benchmark.same_numbers compare old.json new.json

`record` runs the scripts of `--repo` (all, or `--scripts ...`) with this Python, one at a time, one thread
each; `compare` prints, per script, whether every recorded number is equal, and the first differences. A
refactoring that must not change what is computed shows "same" for every script.
"""

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmark.events import read_scalars
from benchmark.scripts import SCRIPTS

# wall-clock readings: they differ between any two runs
CLOCK_TAGS = re.compile(r"^(charts/.*SPS|perf/.*)$")

# per script: the flags of a short run on its real environment (several iterations, two evaluations)
SMALL = ["--num-minibatches", "2", "--update-epochs", "2"]
RUNS = {
    "ppo": "--env-id CartPole-v1 --num-envs 4",
    "ppo_continuous_action": "--env-id Hopper-v4 --num-envs 2",
    "ppo_atari": "--env-id Breakout --num-envs 2",
    "ppo_atari_lstm": "--env-id Breakout --num-envs 2",
    "ppo_atari_envpool": "--env-id Breakout-v5 --num-envs 2",
    "ppo_procgen": "--env-id starpilot --num-envs 2",
    "ppo_atari_multigpu": "--env-id Breakout --num-envs 2",
    "ppo_shared_memory_lstm": "--env-id CartPole-v1 --num-workers 2 --num-envs-per-worker 1 --seq-len 8",
    "ppo_continuous_action_redis": "--env-id Hopper-v4 --num-samplers 1 --num-chunks 2",
}
RUNS = {name: [*flags.split(), "--num-steps", "32", *SMALL] for name, flags in RUNS.items()}
BATCH = {"ppo": 128, "ppo_shared_memory_lstm": 64}  # steps per iteration; 64 for the others
ITERATIONS, MORE = 4, 2  # iterations of the first run, and of the resume


def command(repo: Path, name: str) -> list[str]:
    script = str(repo / f"{name}.py")
    if name == "ppo_atari_multigpu":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", script]
    return [sys.executable, script]


def run(repo: Path, name: str, argv: list[str], cwd: Path) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(repo))
    command_line = [*command(repo, name), *argv, "--no-cuda"]
    result = subprocess.run(command_line, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"{name} {' '.join(argv)}: exit {result.returncode}\n{result.stderr[-3000:]}")
    return result.stdout


def weights_hash(path: Path) -> str:
    model = torch.load(path, map_location="cpu", weights_only=True)["model"]
    digest = hashlib.sha256()
    for key in sorted(model):
        digest.update(key.encode())
        digest.update(model[key].cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def without_clock(line: str) -> str:
    """A printed line without what differs between any two runs: the time in the run folder's name and the
    seconds an evaluation took."""
    return re.sub(r"; [\d.]+s\)", ")", re.sub(r"__\d+/", "__T/", re.sub(r"\S*/runs/", "runs/", line)))


def record_script(repo: Path, name: str) -> dict:
    """One script's numbers: its scalars after a run and a resume, the printed evaluations, the weights."""
    with tempfile.TemporaryDirectory() as folder:
        cwd = Path(folder)
        batch = BATCH.get(name, 64)
        flags = ["--seed", "3", "--total-timesteps", str(ITERATIONS * batch), "--checkpoint-every", "1"]
        stdout = run(
            repo, name, [*RUNS[name], *flags, "--eval-every", "2", "--eval-episodes", "2", "--save-model"], cwd
        )
        (run_dir,) = [p for p in (cwd / "runs").iterdir() if p.is_dir()]
        first_weights = weights_hash(run_dir / "model.pt")
        resume = ["--resume", str(run_dir / "checkpoint.pt"), "--total-timesteps", str((ITERATIONS + MORE) * batch)]
        stdout += run(repo, name, resume, cwd)
        evaluated = run(repo, name, ["--evaluate", str(run_dir / "model.pt"), "--eval-episodes", "2"], cwd)
        scalars = {tag: points for tag, points in read_scalars(run_dir).items() if not CLOCK_TAGS.match(tag)}
        lines = [line for line in (stdout + evaluated).splitlines() if line.startswith(("evaluation", "final weights"))]
        return {
            "scalars": scalars,
            "lines": [re.sub(r"\S*/runs/", "runs/", line) for line in lines],
            "weights": [first_weights, weights_hash(run_dir / "model.pt")],
        }


def compare(old: dict, new: dict) -> list[str]:
    """The differences between two scripts' records, in words (none: the same numbers)."""
    problems = []
    for tag in sorted(set(old["scalars"]) | set(new["scalars"])):
        a, b = old["scalars"].get(tag), new["scalars"].get(tag)
        if a != b and not CLOCK_TAGS.match(tag):
            first = next((i for i, (x, y) in enumerate(zip(a or [], b or [])) if x != y), None)
            where = (
                f"first at {a[first]} vs {b[first]}"
                if first is not None
                else f"{len(a or [])} vs {len(b or [])} points"
            )
            problems.append(f"{tag}: {where}")
    if list(map(without_clock, old["lines"])) != list(map(without_clock, new["lines"])):
        problems.append(f"printed lines: {old['lines']} vs {new['lines']}")
    if old["weights"] != new["weights"]:
        problems.append(f"weights: {old['weights']} vs {new['weights']}")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--repo", type=Path, default=Path("."))
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--scripts", nargs="+", default=SCRIPTS, choices=SCRIPTS)
    cmp = sub.add_parser("compare")
    cmp.add_argument("old", type=Path)
    cmp.add_argument("new", type=Path)
    args = parser.parse_args()
    if args.verb == "record":
        records = json.loads(args.out.read_text()) if args.out.exists() else {}
        for name in args.scripts:
            records[name] = record_script(args.repo.resolve(), name)
            args.out.write_text(json.dumps(records))
            print(f"{name}: {sum(len(p) for p in records[name]['scalars'].values())} numbers recorded", flush=True)
        return
    old, new = json.loads(args.old.read_text()), json.loads(args.new.read_text())
    different = 0
    for name in [s for s in SCRIPTS if s in old or s in new]:
        if name not in old or name not in new:
            print(f"{name}: recorded on one side only")
            continue
        problems = compare(old[name], new[name])
        different += bool(problems)
        print(f"{name}: {'same' if not problems else 'DIFFERENT'}")
        for problem in problems[:8]:
            print(f"    {problem}")
    sys.exit(1 if different else 0)


if __name__ == "__main__":
    main()
