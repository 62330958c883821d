"""Throughput: each script's training speed beside its environment's own speed, measured in one run.

    python -m benchmark.throughput                       # every script, its default settings
    python -m benchmark.throughput --scripts ppo --busy  # also with another core kept busy

For each script, in fresh processes with OMP_NUM_THREADS=1:
- env-only SPS: random actions stepped through the script's own `make_envs` (same environments,
  same wrappers, same number of envs), the upper bound for any training loop on this machine;
- training SPS: the script's own `charts/SPS` at the end of a run of `--steps` steps at its default
  hyperparameters, and the split of that time between rollout and update (`perf/` scalars);
- their ratio, training / env-only.
`--straightforward` also measures each script with its speed levers undone, side by side: actions
sampled through the distribution objects (`get_action_and_value` under no_grad instead of `act`),
PyTorch's argument validation of distributions left on, Adam's per-parameter loop instead of the fused
kernel, and NumPy's mean/var in the running statistics; the algorithm and its numbers are the same.
`--baseline REV` also measures each script as it was at git revision REV (for example the first,
straightforward version), side by side, and reports the speedup of the current one.
`--busy` repeats the training measurement while a busy-loop process occupies one core (as when
several runs share a machine), once with the script's thread default and once with PyTorch's own
default thread count (`--torch-threads 0`), to show why the scripts choose their thread count.
"""

import argparse
import importlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmark.events import read_scalars

ROOT = Path(__file__).resolve().parent.parent
# script -> (environment, default number of steps to measure over)
SCRIPTS = {
    "ppo": ("CartPole-v1", 100_000),
    "ppo_continuous_action": ("Hopper-v4", 30_720),
}


def env_only_sps(script: str, env_id: str, steps: int) -> float:
    """Steps per second of the script's vector environment under pre-drawn random actions."""
    sys.path.insert(0, str(ROOT))
    module = importlib.import_module(script)
    with tempfile.TemporaryDirectory() as tmp:
        args = module.Args(env_id=env_id, runs_dir=tmp)
        envs = module.make_envs(args, tmp)
        envs.action_space.seed(0)
        actions = [envs.action_space.sample() for _ in range(steps // args.num_envs)]
        envs.reset(seed=0)
        start = time.perf_counter()
        for action in actions:
            envs.step(action)
        elapsed = time.perf_counter() - start
        envs.close()
    return len(actions) * args.num_envs / elapsed


def training_sps(script: str, env_id: str, steps: int, extra: list[str], revision: str | None = None,
                 straightforward: bool = False) -> dict[str, float]:
    """Runs the script (as it is, as it was at git `revision`, or with its speed levers undone) for
    `steps` steps and reads its SPS and time split from its event file."""
    with tempfile.TemporaryDirectory() as tmp:
        path = ROOT / f"{script}.py"
        if revision is not None:
            path = Path(tmp) / f"{script}.py"
            path.write_text(subprocess.run(["git", "show", f"{revision}:{script}.py"], cwd=ROOT, check=True,
                                           capture_output=True, text=True).stdout)
        command = [sys.executable, str(path), "--env-id", env_id, "--total-timesteps", str(steps),
                   "--runs-dir", f"{tmp}/runs", *extra]
        if straightforward:
            command = [sys.executable, "-m", "benchmark.throughput", "--run-straightforward", script, env_id,
                       str(steps), f"{tmp}/runs"]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=child_env(), cwd=ROOT)
        (run_dir,) = Path(f"{tmp}/runs").iterdir()
        scalars = read_scalars(run_dir)
    rollout = sum(v for _, v in scalars["perf/rollout_time"])
    update = sum(v for _, v in scalars["perf/update_time"])
    return {"sps": scalars["charts/SPS"][-1][1], "rollout": rollout / (rollout + update)}


def run_straightforward(script: str, env_id: str, steps: int, runs_dir: str):
    """Trains with the script's speed levers undone (see the module docstring), in this process."""
    import torch

    sys.path.insert(0, str(ROOT))
    module = importlib.import_module(script)

    @torch.no_grad()
    def act(agent, x):
        action, logprob, _, value = agent.get_action_and_value(x)
        return action, logprob, value

    adam = torch.optim.Adam

    def plain_adam(params, **kwargs):
        kwargs.pop("fused", None)
        return adam(params, **kwargs)

    def update(rms, x):
        batch_mean, batch_var, n = np.mean(x, axis=0), np.var(x, axis=0), x.shape[0]
        delta, total = batch_mean - rms.mean, rms.count + n
        rms.mean = rms.mean + delta * n / total
        rms.var = (rms.var * rms.count + batch_var * n + delta**2 * rms.count * n / total) / total
        rms.count = total

    # this process runs nothing else: patch PyTorch itself
    module.Agent.act = act
    torch.optim.Adam = plain_adam
    torch.distributions.Distribution.set_default_validate_args = staticmethod(lambda value: None)
    if hasattr(module, "RunningMeanStd"):
        module.RunningMeanStd.update = update
    module.main(module.Args(env_id=env_id, total_timesteps=steps, runs_dir=runs_dir))


def child_env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))


def measure_in_child(script: str, env_id: str, steps: int) -> float:
    """env_only_sps in a fresh process, like the training runs it is compared with."""
    out = subprocess.run([sys.executable, "-m", "benchmark.throughput", "--env-only", script, env_id, str(steps)],
                         check=True, capture_output=True, text=True, env=child_env(), cwd=ROOT)
    return float(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scripts", nargs="+", default=list(SCRIPTS), choices=list(SCRIPTS))
    parser.add_argument("--steps", type=int, default=None, help="steps per measurement (default: per script)")
    parser.add_argument("--repeats", type=int, default=1, help="measurements per row; the table shows the median")
    parser.add_argument("--busy", action="store_true", help="also measure with a busy process on another core")
    parser.add_argument("--straightforward", action="store_true",
                        help="also measure the scripts with their speed levers undone")
    parser.add_argument("--baseline", type=str, default=None, metavar="REV",
                        help="also measure the scripts as they were at this git revision")
    parser.add_argument("--out", type=str, default=None, help="also write the markdown table to this file")
    parser.add_argument("--env-only", nargs=3, metavar=("SCRIPT", "ENV_ID", "STEPS"), help=argparse.SUPPRESS)
    parser.add_argument("--run-straightforward", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.env_only:
        print(env_only_sps(args.env_only[0], args.env_only[1], int(args.env_only[2])))
        return
    if args.run_straightforward:
        script, env_id, steps, runs_dir = args.run_straightforward
        run_straightforward(script, env_id, int(steps), runs_dir)
        return

    rows = ["| script | env | steps | env-only SPS | training SPS | training / env-only | rollout share | setting |",
            "|---|---|---|---|---|---|---|---|"]

    def add_row(script, env_id, steps, env_sps, setting, extra, revision=None, straightforward=False):
        runs = [training_sps(script, env_id, steps, extra, revision, straightforward) for _ in range(args.repeats)]
        sps = float(np.median([r["sps"] for r in runs]))
        rollout = float(np.median([r["rollout"] for r in runs]))
        rows.append(f"| {script}.py | {env_id} | {steps} | {env_sps:,.0f} | {sps:,.0f} | {sps / env_sps:.2f} "
                    f"| {rollout:.0%} | {setting} |")
        print(rows[-1], flush=True)
        return sps

    speedups = []
    for script in args.scripts:
        env_id, default_steps = SCRIPTS[script]
        steps = args.steps or default_steps
        env_sps = float(np.median([measure_in_child(script, env_id, steps) for _ in range(args.repeats)]))
        sps = add_row(script, env_id, steps, env_sps, "default", [])
        if args.straightforward:
            baseline = add_row(script, env_id, steps, env_sps, "speed levers undone", [], straightforward=True)
            speedups.append(f"{script}.py: {sps / baseline:.2f}x the training SPS with its speed levers undone")
        if args.baseline:
            baseline = add_row(script, env_id, steps, env_sps, f"as at {args.baseline}", [], args.baseline)
            speedups.append(f"{script}.py: {sps / baseline:.2f}x the training SPS of {args.baseline}")
        if args.busy:
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            try:
                add_row(script, env_id, steps, env_sps, "default, +1 busy process", [])
                add_row(script, env_id, steps, env_sps, "--torch-threads 0 (PyTorch default), +1 busy process",
                        ["--torch-threads", "0"])
            finally:
                busy.kill()
                busy.wait()

    table = "\n".join(rows + [""] + speedups)
    print(f"\n{table}")
    if args.out:
        Path(args.out).write_text(table + "\n")


if __name__ == "__main__":
    main()
