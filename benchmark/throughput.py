"""Throughput: each script's training speed beside its environment's own speed, measured in one run.

    python -m benchmark.throughput                       # every script, its default settings
    python -m benchmark.throughput --scripts ppo --busy  # also with another core kept busy

For each script, in fresh processes with OMP_NUM_THREADS=1:
- env-only SPS: random actions stepped through the script's own `make_envs` (same environments,
  same wrappers, same number of envs), the upper bound for any training loop on this machine;
- training SPS: the script's own `charts/SPS` at the end of a run of `--steps` steps at its default
  hyperparameters, and the split of that time between rollout and update (`perf/` scalars);
- their ratio, training / env-only;
- the peak memory of the training process and its children (PSS, sampled twice a second).
`--straightforward` also measures each script with its speed levers undone, side by side: actions
sampled through the distribution objects (`get_action_and_value` under no_grad instead of `act`),
PyTorch's argument validation of distributions left on, Adam's per-parameter loop instead of the fused
kernel, NumPy's mean/var in the running statistics, and for the pixel scripts the CNN in PyTorch's
default memory layout fed `frames.float() / 255` on one thread (the usual eager script under
OMP_NUM_THREADS=1), and for the recurrent scripts the LSTM stepped one time step
at a time (`lstm_step_by_step` of tests/lstm_reference.py, the reference the tests hold `run_lstm`
to); the algorithm and its numbers are the same.
`--busy` compares the script's thread default with another choice, on the idle machine and again
while a busy-loop process occupies one core (as when several runs share a machine), to show why the
scripts choose their thread count: the one-thread scripts against PyTorch's own default thread count
(`--torch-threads 0` and OMP_NUM_THREADS unset), the CNN scripts (2 threads) against one thread.
With `--repeats R` the variants are measured in turn, R rounds, and the table shows medians, so that
a slow spell of the machine does not fall on one variant alone.
"""

import argparse
import inspect
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmark.events import read_scalars
from benchmark.scripts import ENV_ID, ROOT, child_env, import_script
from tests.lstm_reference import lstm_step_by_step

# script -> default number of steps to measure over (on its environment, ENV_ID)
STEPS = {
    "ppo": 50_000,
    "ppo_continuous_action": 20_480,
    "ppo_atari_envpool": 10_240,
    "ppo_atari": 10_240,
    "ppo_atari_lstm": 10_240,
    "ppo_procgen": 2 * 64 * 256,
}


def env_only_sps(script: str, env_id: str, steps: int) -> float:
    """Steps per second of the script's vector environment under pre-drawn random actions."""
    module = import_script(script)
    with tempfile.TemporaryDirectory() as tmp:
        args = module.Args(env_id=env_id, runs_dir=tmp)
        # the scripts' make_envs take some of: the number of envs, the run folder, the seed (envpool)
        wanted = inspect.signature(module.make_envs).parameters
        given = {"num_envs": args.num_envs, "run_dir": tmp, "seed": 0}
        envs = module.make_envs(args, **{name: value for name, value in given.items() if name in wanted})
        if "seed" in wanted:
            envs.reset()
        else:
            envs.reset(seed=0)
        space = getattr(envs, "single_action_space", envs.action_space)
        space.seed(0)
        actions = [np.array([space.sample() for _ in range(args.num_envs)]) for _ in range(steps // args.num_envs)]
        start = time.perf_counter()
        for action in actions:
            envs.step(action)
        elapsed = time.perf_counter() - start
        envs.close()
    return len(actions) * args.num_envs / elapsed


def process_tree_pss_mib(root: int) -> float:
    """Memory of a process and all its descendants (environment workers too): the sum of their
    proportional set sizes (PSS), which counts a page shared by k processes as 1/k in each, so that
    libraries shared after a fork are not counted once per process as RSS would."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):  # a process that just ended
            continue
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier += children
    total_kb = 0
    for pid in tree:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kb += int(line.split()[1])
        except OSError:
            continue
    return total_kb / 1024


def training_sps(script: str, env_id: str, steps: int, variant: str) -> dict[str, float]:
    """Runs the script in a fresh process for `steps` steps, as VARIANTS[variant] says, and reads its
    SPS and time split from its event file; its peak memory is sampled twice a second meanwhile."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            str(ROOT / f"{script}.py"),
            "--env-id",
            env_id,
            "--total-timesteps",
            str(steps),
            "--runs-dir",
            f"{tmp}/runs",
        ]
        if variant == "straightforward":
            command = [
                sys.executable,
                "-m",
                "benchmark.throughput",
                "--run-straightforward",
                script,
                env_id,
                str(steps),
                f"{tmp}/runs",
            ]
        env = child_env()
        if variant.startswith("pytorch threads"):
            command += ["--torch-threads", "0"]
            del env["OMP_NUM_THREADS"]
        if variant.startswith("one thread"):
            command += ["--torch-threads", "1"]
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if "busy" in variant else None
        peak_mib = 0.0
        try:
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, env=env, cwd=ROOT)
            while proc.poll() is None:
                peak_mib = max(peak_mib, process_tree_pss_mib(proc.pid))
                time.sleep(0.5)
            if proc.returncode != 0:
                raise subprocess.CalledProcessError(proc.returncode, command)
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
        (run_dir,) = Path(f"{tmp}/runs").iterdir()
        scalars = read_scalars(run_dir)
    rollout = sum(v for _, v in scalars["perf/rollout_time"])
    update = sum(v for _, v in scalars["perf/update_time"])
    split = {"rollout": rollout / (rollout + update)}
    for part in ("act", "env"):  # the pixel scripts split the rollout into acting and env stepping
        if f"perf/{part}_time" in scalars:
            split[part] = sum(v for _, v in scalars[f"perf/{part}_time"]) / (rollout + update)
    return {"sps": scalars["charts/SPS"][-1][1], "peak_mib": peak_mib, **split}


VARIANTS = {  # name -> the setting column of the table
    "default": "default",
    "straightforward": "speed levers undone",
    "pytorch threads": "--torch-threads 0, OMP_NUM_THREADS unset",
    "default, busy": "default, +1 busy process",
    "pytorch threads, busy": "--torch-threads 0, OMP_NUM_THREADS unset, +1 busy process",
    "one thread": "--torch-threads 1",
    "one thread, busy": "--torch-threads 1, +1 busy process",
}


def thread_variants(script: str) -> list[str]:
    """The thread settings compared with the script's default: a script that defaults to one thread
    against PyTorch's own default, a script that defaults to more (the CNN scripts) against one thread."""
    if import_script(script).Args.torch_threads == 1:
        return ["pytorch threads", "default, busy", "pytorch threads, busy"]
    return ["one thread", "default, busy", "one thread, busy"]


def run_straightforward(script: str, env_id: str, steps: int, runs_dir: str):
    """Trains with the script's speed levers undone (see the module docstring), in this process."""
    module = import_script(script)

    @torch.no_grad()
    def act(agent, x, *recurrent):
        if recurrent:  # (starts, state): one time step through the recurrent agent's sequence method
            starts, state = recurrent
            action, logprob, _, value, state = agent.get_action_and_value(x.unsqueeze(0), starts.unsqueeze(0), state)
            return action[0], logprob[0], value[0], state
        action, logprob, _, value = agent.get_action_and_value(x)
        # the small-MLP scripts take their values from one critic pass after the rollout
        return (action, logprob) if script in ("ppo", "ppo_continuous_action") else (action, logprob, value)

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
    for owner in (module, getattr(module, "ppolab", None)):  # the script's own running statistics, or ppolab's
        if hasattr(owner, "RunningMeanStd"):
            owner.RunningMeanStd.update = update
    overrides = {}
    if hasattr(module.Agent, "features"):  # the pixel scripts
        agent_init = module.Agent.__init__

        def default_layout_init(self, *args, **kwargs):
            agent_init(self, *args, **kwargs)
            self.to(memory_format=torch.contiguous_format)

        module.Agent.__init__ = default_layout_init
        module.Agent.features = lambda self, x: self.network(x.contiguous().float() / 255.0)
        overrides["torch_threads"] = 1
    if hasattr(module.Agent, "run_lstm"):  # the recurrent scripts: one LSTM call per time step
        module.Agent.run_lstm = lstm_step_by_step
    module.main(module.Args(env_id=env_id, total_timesteps=steps, runs_dir=runs_dir, **overrides))


def measure_in_child(script: str, env_id: str, steps: int) -> float:
    """env_only_sps in a fresh process, like the training runs it is compared with."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmark.throughput", "--env-only", script, env_id, str(steps)],
        check=True,
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scripts", nargs="+", default=list(STEPS), choices=list(STEPS))
    parser.add_argument("--steps", type=int, default=None, help="steps per measurement (default: per script)")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of measurements; the table shows medians")
    parser.add_argument("--busy", action="store_true", help="also measure with a busy process on another core")
    parser.add_argument(
        "--straightforward", action="store_true", help="also measure the scripts with their speed levers undone"
    )
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

    rows = [
        "| script | env | steps | env-only SPS | training SPS | training / env-only | time: act / env / update "
        "| peak memory (MiB) | setting |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    speedups = []
    for script in args.scripts:
        env_id, steps = ENV_ID[script], args.steps or STEPS[script]
        variants = ["default"] + ["straightforward"] * args.straightforward + thread_variants(script) * args.busy
        env_sps, runs = [], {variant: [] for variant in variants}
        for _ in range(args.repeats):
            env_sps.append(measure_in_child(script, env_id, steps))
            for variant in variants:
                runs[variant].append(training_sps(script, env_id, steps, variant))
        env_sps = float(np.median(env_sps))
        sps = {}
        for variant in variants:
            median = {key: float(np.median([r[key] for r in runs[variant]])) for key in runs[variant][0]}
            sps[variant] = median["sps"]
            if "act" in median:
                split = f"{median['act']:.0%} / {median['env']:.0%} / {1 - median['rollout']:.0%}"
            else:  # rollout (acting and env stepping together) / update
                split = f"{median['rollout']:.0%} rollout / {1 - median['rollout']:.0%}"
            rows.append(
                f"| {script}.py | {env_id} | {steps} | {env_sps:,.0f} | {sps[variant]:,.0f} "
                f"| {sps[variant] / env_sps:.2f} | {split} | {median['peak_mib']:,.0f} | {VARIANTS[variant]} |"
            )
            print(rows[-1], flush=True)
        if args.straightforward:
            speedups.append(
                f"{script}.py: {sps['default'] / sps['straightforward']:.2f}x the training SPS with "
                "its speed levers undone"
            )

    table = "\n".join(rows + [""] + speedups)
    print(f"\n{table}")
    if args.out:
        Path(args.out).write_text(table + "\n")


if __name__ == "__main__":
    main()
