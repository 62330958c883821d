"""The speed studies on the CPU, one subcommand each (results/speed.md, speed_cpu.md, evaluation.md):

    python -m benchmark.studies.speed throughput                       # every script, its default settings
    python -m benchmark.studies.speed throughput --scripts ppo --busy  # also with another core kept busy
    OMP_NUM_THREADS=1 python -m benchmark.studies.speed fast-path ppo --rounds 5
    OMP_NUM_THREADS=1 python -m benchmark.studies.speed vector-env step --rounds 5
    OMP_NUM_THREADS=1 python -m benchmark.studies.speed vector-env run --rounds 3 --baseline main
    python -m benchmark.studies.speed evaluation --episodes 3 --scripts ppo ppo_continuous_action
    python -m benchmark.studies.speed ceiling --out benchmark/results/atari_ceiling.md   # a quiet machine

`throughput`: per script, in fresh processes with OMP_NUM_THREADS=1, the env-only SPS (random actions through its own
`make_envs`: the bound of any training loop here), the training SPS (its `charts/SPS` after `--steps` steps at its
defaults) with its time split (the rollout and update times it logs; the environments' share timed from outside the
script by `timed_env_steps`), their ratio and the peak memory (PSS of the process tree). `--straightforward` also runs
it with its speed levers undone (distribution objects for actions, argument validation on, Adam's per-parameter loop,
NumPy statistics, the CNN in the default memory layout on one thread, the LSTM step by step: `run_straightforward`),
same algorithm and numbers. `--busy` sets the thread default beside another choice, idle and
beside a busy core. `--repeats R`: R rounds, medians.

`fast-path`: at one thread, the policy step (eager `act`, ppolab's `NumpyPolicy`, compiled `act`) and the update step
of one minibatch (eager and compiled `update_step`, `NumpyUpdate`), the compile times; medians of this thread's CPU
time over alternating rounds.

`vector-env`: the vector environment of ppo.py and ppo_continuous_action.py beside gymnasium's `SyncVectorEnv` (same-step
autoreset, `copy=False`, its `RecordEpisodeStatistics`), at their default environments: `step`, one vector step of
random actions (CPU and wall time); `run`, whole training runs. `--baseline REV` adds the script at a git revision.
Rounds alternate the order; medians, ranges and the ratio to gymnasium's (below 1: faster).

`ceiling`: what two cores could do for ppo_atari_envpool.py at its defaults (Breakout-v5). One iteration's pieces
(the environments' steps, the policy's, the update's minibatches through the script's own functions), each timed on
one thread as CPU time and its products' FLOPs counted by PyTorch, give two bounds on the SPS of 2 cores kept busy:
each piece at its one-thread time (the practical ceiling), and the products at one thread's matrix-multiply peak
(the FLOP ceiling); then the script's own SPS (fresh processes, its defaults) beside them.

`evaluation`: the seconds of one evaluation (`--episodes` episodes, as `--eval-every` runs it) per script with an
untrained agent, in this process, one thread; it costs in proportion to the agent steps played.
"""

import argparse
import contextlib
import copy
import importlib.util
import inspect
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from benchmark.events import read_scalars
from benchmark.scripts import ENV_ID, ROOT, busy_core, child_env, env_only_in_child, import_script, machine, our_commit
from benchmark.scripts import table_head, versions

# throughput: each script's training speed beside its environment's own ------------------------------------------------
# script -> default number of steps to measure over (on its environment, ENV_ID)
STEPS = {"ppo": 50_000, "ppo_continuous_action": 20_480, "ppo_atari_envpool": 10_240, "ppo_atari": 10_240}
STEPS |= {"ppo_atari_lstm": 10_240, "ppo_procgen": 2 * 64 * 256}


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


@contextlib.contextmanager
def timed_env_steps(module, out: str):
    """The script `module`'s environments timed from outside its loop: inside the context, the environments its
    `make_envs` makes add the seconds of each `step` to a total, written to the file `out` at the context's end."""
    make_envs, total = module.make_envs, [0.0]

    def timed_make_envs(*args, **kwargs):
        envs = make_envs(*args, **kwargs)
        step = envs.step

        def timed_step(*step_args, **step_kwargs):
            start = time.perf_counter()
            try:
                return step(*step_args, **step_kwargs)
            finally:
                total[0] += time.perf_counter() - start

        envs.step = timed_step
        return envs

    module.make_envs = timed_make_envs
    try:
        yield
    finally:
        module.make_envs = make_envs
        Path(out).write_text(f"{total[0]}\n")


def run_timed(script: str, env_seconds: str, argv: list[str]):
    """The script run with the command line `argv` in this process, its environments' steps timed into
    `env_seconds` (timed_env_steps)."""
    module = import_script(script)
    sys.argv = [f"{script}.py", *argv]
    with timed_env_steps(module, env_seconds):
        module.ppolab.run_program(module.main, module.Args)


def training_sps(script: str, env_id: str, steps: int, variant: str) -> dict[str, float]:
    """Runs the script in a fresh process for `steps` steps, as VARIANTS[variant] says, and reads its
    SPS and time split from its event file and the seconds its environments stepped (timed_env_steps); its peak
    memory is sampled twice a second meanwhile."""
    with tempfile.TemporaryDirectory() as tmp:
        env_seconds = f"{tmp}/env_seconds"
        command = [sys.executable, "-m", "benchmark.studies.speed", "timed-run", script, env_seconds]
        command += ["--env-id", env_id, "--total-timesteps", str(steps), "--runs-dir", f"{tmp}/runs"]
        if variant == "straightforward":
            command = [sys.executable, "-m", "benchmark.studies.speed", "straightforward-run", script, env_id]
            command += [str(steps), f"{tmp}/runs", env_seconds]
        env = child_env()
        if variant.startswith("pytorch threads"):
            command += ["--torch-threads", "0"]
            del env["OMP_NUM_THREADS"]
        if variant.startswith("one thread"):
            command += ["--torch-threads", "1"]
        peak_mib = 0.0
        with busy_core("busy" in variant):
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, env=env, cwd=ROOT)
            while proc.poll() is None:
                peak_mib = max(peak_mib, process_tree_pss_mib(proc.pid))
                time.sleep(0.5)
        if proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, command)
        (run_dir,) = Path(f"{tmp}/runs").iterdir()
        scalars = read_scalars(run_dir)
        env_time = float(Path(env_seconds).read_text())
    rollouts, updates = scalars["perf/rollout_time"], scalars["perf/update_time"]
    rollout, update = sum(v for _, v in rollouts), sum(v for _, v in updates)
    split = {"rollout": rollout / (rollout + update)}
    if len(rollouts) > 2:  # the loop's own pace: steps per iteration over its rollout and update, the first left out
        loop = statistics.median(r + u for (_, r), (_, u) in zip(rollouts[1:], updates[1:]))
        split["loop_sps"] = (rollouts[1][0] - rollouts[0][0]) / loop
        split["loop_rollout"] = statistics.median(v for _, v in rollouts[1:])
        split["loop_update"] = statistics.median(v for _, v in updates[1:])
    if script not in NUMPY:  # the pixel scripts: the rollout split into acting (the rest of it) and env stepping
        split |= {"act": (rollout - env_time) / (rollout + update), "env": env_time / (rollout + update)}
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


def run_straightforward(script: str, env_id: str, steps: int, runs_dir: str, env_seconds: str):
    """Trains with the script's speed levers undone (see the module docstring), in this process, its environments'
    steps timed into `env_seconds` (timed_env_steps)."""
    from tests.lstm_reference import lstm_step_by_step

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
    with timed_env_steps(module, env_seconds):
        module.main(module.Args(env_id=env_id, total_timesteps=steps, runs_dir=runs_dir, **overrides))


def throughput(args):
    """Each script's training SPS beside its env-only SPS, with the variants asked for."""
    rows = table_head("script", "env", "steps", "env-only SPS", "training SPS", "training / env-only",
                      "time: act / env / update", "peak memory (MiB)", "setting")  # fmt: skip
    speedups = []
    for script in args.scripts:
        env_id, steps = ENV_ID[script], args.steps or STEPS[script]
        variants = ["default"] + ["straightforward"] * args.straightforward + thread_variants(script) * args.busy
        env_sps, runs = [], {variant: [] for variant in variants}
        for _ in range(args.repeats):
            env_sps.append(env_only_in_child(script, env_id, steps))
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
            ratio = sps["default"] / sps["straightforward"]
            speedups.append(f"{script}.py: {ratio:.2f}x the training SPS with its speed levers undone")

    table = "\n".join(rows + [""] + speedups)
    print(f"\n{table}")
    if args.out:
        Path(args.out).write_text(table + "\n")


# fast-path: the policy and update steps of one script, per call -------------------------------------------------------


# (observation shape, actions: an int for a discrete count, a tuple for a Box shape)
SIZES = {"ppo": ((4,), 2), "ppo_continuous_action": ((11,), (3,)), "ppo_continuous_action_redis": ((11,), (3,))}
SIZES["ppo_atari"] = ((4, 84, 84), 4)

# the scripts whose training runs ppolab's NumPy steps on the CPU (ppolab.numpy_fast_path)
NUMPY = ("ppo", "ppo_continuous_action")


def per_call(fn, seconds: float) -> float:
    """Median CPU seconds of one call of fn (this thread's CPU time, which the other processes of a
    shared machine disturb less than the wall time) over blocks of calls lasting about `seconds`."""
    fn()
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.thread_time()
        for _ in range(10):
            fn()
        times.append((time.thread_time() - start) / 10)
    return statistics.median(times)


def fast_path(options):
    """The policy and update steps of one script, eager, compiled and NumPy, per call."""
    from threadpoolctl import threadpool_limits

    from ppolab.fast_path import NumpyPolicy, NumpyUpdate

    torch.set_num_threads(1)
    threadpool_limits(1, user_api="blas")  # NumPy's BLAS, as the scripts set it
    torch.distributions.Distribution.set_default_validate_args(False)
    script = import_script(options.script)
    args = script.Args()
    obs_shape, actions = SIZES[options.script]
    n_obs = getattr(args, "num_envs", 1)
    if isinstance(actions, int):
        agent = script.Agent(obs_shape[0], actions) if len(obs_shape) == 1 else script.Agent(actions)
        batch_actions = torch.randint(0, actions, (args.minibatch_size,))
    else:
        agent = script.Agent(obs_shape[0], actions[0])
        batch_actions = torch.randn(args.minibatch_size, *actions)
    if len(obs_shape) == 1:
        step_obs, batch_obs = torch.randn(n_obs, *obs_shape), torch.randn(args.minibatch_size, *obs_shape)
    else:
        step_obs = torch.randint(0, 255, (n_obs, *obs_shape), dtype=torch.uint8)
        batch_obs = torch.randint(0, 255, (args.minibatch_size, *obs_shape), dtype=torch.uint8)
    optimizer = torch.optim.Adam(agent.parameters(), lr=torch.tensor(args.learning_rate), eps=1e-5, fused=True)
    kl_beta = torch.tensor(args.kl_beta)  # PPO-Penalty's beta, as the scripts make it
    with torch.no_grad():
        _, logprobs, _, values = agent.get_action_and_value(batch_obs, batch_actions)
    batch = (batch_obs, batch_actions, logprobs, torch.randn(args.minibatch_size), values + 0.1, values)
    batch_call = (agent, optimizer, args, kl_beta, *batch)

    compile_seconds, compiled = {}, {}
    for name, fn, given in (("act", agent.act, (step_obs,)), ("update_step", script.update_step, batch_call)):
        start = time.perf_counter()
        compiled[name] = torch.compile(fn)
        compiled[name](*given)
        compile_seconds[name] = time.perf_counter() - start
    compiled_act, compiled_update = compiled["act"], compiled["update_step"]

    # NumpyUpdate first: it moves the parameters into one flat tensor, which NumpyPolicy then reads
    numpy_update = NumpyUpdate(agent, optimizer, args, kl_beta) if options.script in NUMPY else None
    variants = {
        "policy step, eager act": lambda: agent.act(step_obs),
        "policy step, compiled act": lambda: compiled_act(step_obs),
    }
    if options.script in NUMPY:
        numpy_policy = NumpyPolicy(agent)
        variants["policy step, NumpyPolicy"] = lambda: numpy_policy(step_obs.numpy())
    variants["update step, eager"] = lambda: script.update_step(agent, optimizer, args, kl_beta, *batch)
    variants["update step, compiled"] = lambda: compiled_update(agent, optimizer, args, kl_beta, *batch)
    if numpy_update is not None:
        variants["update step, NumpyUpdate"] = lambda: numpy_update(*batch)
    results = {name: [] for name in variants}
    for _ in range(options.rounds):
        for name, fn in variants.items():
            results[name].append(per_call(fn, options.seconds))

    print(
        f"{options.script}: {n_obs} observations per policy step, {args.minibatch_size} samples per update "
        f"step, 1 thread, torch {torch.__version__}, median of {options.rounds} alternating rounds\n"
    )
    print("| what | CPU time per call |\n|---|---|")
    for name, times in results.items():
        print(f"| {name} | {statistics.median(times) * 1e6:.0f} us |")
    for name, seconds in compile_seconds.items():
        print(f"| torch.compile of {name} (first call) | {seconds:.1f} s |")


# vector-env: the MLP scripts' vector environment beside gymnasium's ---------------------------------------------------
BUDGETS = {"ppo": 500_000, "ppo_continuous_action": 200_000}  # whole-run steps per script


def gymnasium_make_envs(script):
    """A `make_envs` for `script` that builds gymnasium's pair from the script's own `make_env`."""

    def make_envs(args, run_dir: str):
        envs = gym.vector.SyncVectorEnv(
            [script.make_env(args.env_id, i, args.capture_video, run_dir) for i in range(args.num_envs)],
            copy=False,
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
        return gym.wrappers.vector.RecordEpisodeStatistics(envs)

    return make_envs


def script_at(name: str, revision: str, folder: str) -> Path:
    """The file `name.py` as it is at a git revision, written into `folder`."""
    path = Path(folder) / f"{name}.py"
    shown = ["git", "-C", str(ROOT), "show", f"{revision}:{name}.py"]
    path.write_text(subprocess.run(shown, check=True, capture_output=True, text=True).stdout)
    return path


def load(path: Path, name: str):
    """The script at `path` as the module `name` (its functions and Args, without running it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and tyro look their classes up there
    spec.loader.exec_module(module)
    return module


def vector_variants(name: str, baseline: str | None, folder: str) -> dict[str, Path]:
    """Variant name -> the file of the script to run (gymnasium's pair runs the current file)."""
    found = {"script": ROOT / f"{name}.py", "gymnasium": ROOT / f"{name}.py"}
    if baseline:
        found[f"script at {baseline}"] = script_at(name, baseline, folder)
    return found


def step_times(make_envs, args, steps: int, folder: str) -> tuple[float, float]:
    """CPU and wall seconds of one vector step, over `steps` steps after a seeded reset."""
    envs = make_envs(args, folder)
    rng = np.random.default_rng(0)
    space = envs.single_action_space
    if isinstance(space, gym.spaces.Discrete):
        actions = rng.integers(space.n, size=(steps, envs.num_envs))
    else:
        actions = rng.uniform(space.low, space.high, (steps, envs.num_envs, *space.shape)).astype(np.float32)
    envs.reset(seed=args.seed)
    step = envs.step
    wall, cpu = time.perf_counter(), time.thread_time()
    for action in actions:
        step(action)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    envs.close()
    return cpu / steps, wall / steps


def child(path: str, variant: str, flags: list[str]):
    """One whole training run in this process: the script at `path` with the variant's `make_envs`."""
    import tyro

    script = load(Path(path), Path(path).stem)
    if variant == "gymnasium":
        script.make_envs = gymnasium_make_envs(script)
    script.main(tyro.cli(script.Args, args=flags))


def run_time(path: Path, variant: str, flags: list[str]) -> float:
    """Wall seconds of one whole training process."""
    start = time.perf_counter()
    command = [sys.executable, "-m", "benchmark.studies.speed", "vector-env-run", str(path), variant, *flags]
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"{variant} run of {path} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def table(unit: str, times: dict[tuple[str, str], list[float]], scale: float) -> str:
    """Markdown: per (case, variant) every round, the median, the range and the ratio to gymnasium's."""
    rounds = max(len(t) for t in times.values())
    lines = table_head("case", "variant", *(f"round {r + 1}" for r in range(rounds)), f"median ({unit})",
                       f"range ({unit})", "/ gymnasium")  # fmt: skip
    for (case, variant), values in times.items():
        median = statistics.median(values)
        ratio = median / statistics.median(times[case, "gymnasium"])
        lines.append(
            f"| {case} | {variant} | {' | '.join(f'{v * scale:.1f}' for v in values)} | "
            f"{median * scale:.1f} | {min(values) * scale:.1f}-{max(values) * scale:.1f} | {ratio:.3f} |"
        )
    return "\n".join(lines)


LOADS: list[float] = []  # 1-minute load average before each measurement


def rounds_of(cases: dict[str, dict[str, Path]], rounds: int):
    """(round, script, variant) in the measuring order: each variant once a round, the order reversed
    every other round. Records the load average before each."""
    for r in range(rounds):
        for name, files in cases.items():
            for variant in list(files) if r % 2 == 0 else list(files)[::-1]:
                LOADS.append(os.getloadavg()[0])
                yield r, name, variant


def measure_steps(cases: dict[str, dict[str, Path]], rounds: int, steps: int, folder: str) -> str:
    """The `step` command: per-step CPU and wall times as markdown tables."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")  # as the scripts set it
    modules = {
        (name, variant): import_script(name) if path.parent == ROOT else load(path, f"{name}_baseline")
        for name, files in cases.items()
        for variant, path in files.items()
    }
    cpu_times, wall_times = {}, {}
    for r, name, variant in rounds_of(cases, rounds):
        module = modules[name, variant]
        args = module.Args()
        make_envs = gymnasium_make_envs(module) if variant == "gymnasium" else module.make_envs
        cpu, wall = step_times(make_envs, args, steps, folder)
        case = f"{args.env_id} x{args.num_envs}"
        cpu_times.setdefault((case, variant), []).append(cpu)
        wall_times.setdefault((case, variant), []).append(wall)
        print(f"round {r + 1} {case} {variant}: {cpu * 1e6:.1f} us", file=sys.stderr, flush=True)
    return (
        f"One vector step, CPU time of this thread:\n\n{table('us', cpu_times, 1e6)}\n\n"
        f"One vector step, wall time:\n\n{table('us', wall_times, 1e6)}"
    )


def measure_runs(cases: dict[str, dict[str, Path]], rounds: int, total: int | None, folder: str) -> str:
    """The `run` command: whole-process wall times as a markdown table."""
    times = {}
    for r, name, variant in rounds_of(cases, rounds):
        steps = total or BUDGETS[name]
        flags = ["--total-timesteps", str(steps), "--runs-dir", f"{folder}/runs"]
        seconds = run_time(cases[name][variant], variant, flags)
        case = f"{name}.py {steps:,} steps"
        times.setdefault((case, variant), []).append(seconds)
        print(f"round {r + 1} {case} {variant}: {seconds:.1f} s", file=sys.stderr, flush=True)
    return f"Whole training process, wall time:\n\n{table('s', times, 1)}"


def vector_env(options):
    """The vector environment of the MLP scripts beside gymnasium's: per step or whole runs."""
    wanted = ("python", "numpy", "gymnasium", "mujoco")
    found = ", ".join(f"{k} {v}" for k, v in versions(wanted[1:]).items())
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(
        f"{machine()}; commit {our_commit()}; {found}; OMP_NUM_THREADS={threads}; "
        f"command: python -m benchmark.studies.speed {' '.join(sys.argv[1:])}"
    )
    with tempfile.TemporaryDirectory() as folder:
        cases = {name: vector_variants(name, options.baseline, folder) for name in options.scripts.split(",")}
        if options.what == "step":
            result = measure_steps(cases, options.rounds, options.steps, folder)
        else:
            result = measure_runs(cases, options.rounds, options.total_timesteps, folder)
    print(f"1-minute load average before each measurement: {min(LOADS):.2f}-{max(LOADS):.2f}\n\n{result}")


# evaluation: what `--eval-every` costs --------------------------------------------------------------------------------
# the scripts measured, each on its environment of ENV_ID
EVALUATED = ["ppo", "ppo_continuous_action", "ppo_atari", "ppo_atari_envpool", "ppo_procgen"]


def measure(name: str, episodes: int) -> dict:
    script = import_script(name)
    args = script.Args(env_id=ENV_ID[name], cuda=False)
    torch.manual_seed(0)
    agent, statistics = make_agent(script, args)
    seed = args.seed + 100_000
    start = time.perf_counter()
    if "checkpoint" in inspect.signature(script.evaluate).parameters:  # a script on ppolab: from checkpoint data
        checkpoint = {"model": agent.state_dict(), "args": asdict(args)}
        checkpoint.update((key, statistic.state_dict()) for key, statistic in statistics.items())
        returns = script.evaluate(checkpoint, episodes, False, seed)
    else:
        returns = script.evaluate(copy.deepcopy(agent), args, episodes, False, seed, torch.device("cpu"), **statistics)
    seconds = time.perf_counter() - start
    return dict(script=name, env=args.env_id, episodes=episodes, seconds=seconds, mean_return=float(np.mean(returns)))


def make_agent(script, args):
    """An untrained agent of the script for args.env_id, and the statistics its evaluate needs besides (by
    their checkpoint key for a script on ppolab, else by evaluate's keyword)."""
    name = script.__name__
    if name == "ppo":
        env = gym.make(args.env_id)
        return script.Agent(int(np.prod(env.observation_space.shape)), int(env.action_space.n)), {}
    if name == "ppo_continuous_action":
        env = gym.make(args.env_id)
        obs_shape = env.observation_space.shape
        agent = script.Agent(int(np.prod(obs_shape)), int(np.prod(env.action_space.shape)))
        return agent, {"obs_rms": script.ObsNormalizer(obs_shape, args.obs_clip).rms}
    if name == "ppo_atari":
        return script.Agent(int(gym.make(script.atari_id(args.env_id)).action_space.n)), {}
    return script.Agent(script.make_envs(args, 1, 0).action_space.n), {}


def evaluation(args):
    """The seconds of one evaluation per script."""
    torch.set_num_threads(1)
    print("\n".join(table_head("script", "env", "episodes", "seconds", "mean return (untrained)")))
    for name in args.scripts:
        r = measure(name, args.episodes)
        print(
            f"| {r['script']}.py | {r['env']} | {r['episodes']} | {r['seconds']:.2f} | {r['mean_return']:.1f} |",
            flush=True,
        )


# ceiling: what two cores could do for ppo_atari_envpool.py ------------------------------------------------------------
def cpu_seconds(fn, rounds: int) -> float:
    """Median CPU seconds of this whole process (envpool's worker thread included) for one call of fn, over
    `rounds` calls after one to warm up: CPU time, which other processes on a shared machine disturb less than
    the wall time."""
    fn()
    times = []
    for _ in range(rounds):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def matmul_peak(rounds: int, n: int = 1024) -> float:
    """One thread's float32 matrix-multiply rate, FLOP/s: the median of `rounds` products of two n x n matrices."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / cpu_seconds(lambda: torch.mm(a, b), rounds)


def counted_flops(fn) -> int:
    """The floating-point operations of fn's matrix products and convolutions (forward and backward), as
    PyTorch's FlopCounterMode counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def ceiling_bounds(steps: int, pieces: dict[str, tuple[float, int]], peak: float, cores: int) -> dict[str, float]:
    """Two upper bounds on the SPS of an iteration of `steps` agent steps whose pieces (name -> one thread's CPU
    seconds and FLOPs of the pieces' products) run on `cores` cores kept busy all the time, with nothing idle and
    nothing lost to splitting work: `practical`, each piece at the CPU time it takes on one thread; `flops`, the
    products at the matrix-multiply peak `peak` (FLOP/s per core) and whatever has no products (the environment)
    at its measured time."""
    cpu = sum(seconds for seconds, _ in pieces.values())
    at_peak = sum(flops / peak if flops else seconds for seconds, flops in pieces.values())
    return {"practical": steps * cores / cpu, "flops": steps * cores / at_peak}


def ceiling(options):
    """What two cores could do for ppo_atari_envpool.py at its defaults: the pieces of one iteration timed on one
    thread, the bounds they imply (ceiling_bounds), and, unless --no-run, the script's own SPS beside them."""
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(1, user_api="blas")
    torch.distributions.Distribution.set_default_validate_args(False)
    script = import_script("ppo_atari_envpool")
    args = script.Args(env_id=options.env_id, envpool_threads=1)
    T, N, K = args.num_steps, args.num_envs, args.num_minibatches
    envs = script.make_envs(args, N, seed=1)
    agent = script.Agent(envs.action_space.n)
    optimizer = torch.optim.Adam(agent.parameters(), lr=torch.tensor(args.learning_rate), eps=1e-5, fused=True)
    kl_beta = torch.tensor(args.kl_beta)
    rng = np.random.default_rng(1)
    envs.reset()

    def env_steps():  # one rollout's environment steps, random actions
        for _ in range(T):
            envs.step(rng.integers(0, envs.action_space.n, N))

    # the rollout's storage as the script keeps it: uint8, channels-last, viewed (T, N, 4, 84, 84)
    obs_shape = envs.observation_space.shape
    obs = torch.randint(0, 256, (T, N) + obs_shape[1:] + obs_shape[:1], dtype=torch.uint8).permute(0, 1, 4, 2, 3)
    b_obs = obs.reshape((-1,) + obs_shape)
    with torch.no_grad():
        b_actions, b_logprobs, b_values = agent.act(b_obs)
    b_valid = torch.ones(T * N, dtype=torch.bool)
    batch = (b_actions, b_logprobs, torch.randn(T * N), b_values + 0.1, b_values, b_valid.float())

    def policy_steps():  # one rollout's policy steps, on the stored frames
        for step in range(T):
            agent.act(obs[step])

    def update():  # one iteration's update: every epoch's minibatches through the script's update_step
        for _ in range(args.update_epochs):
            for mb_inds in script.minibatch_indices(b_valid, K):
                script.update_step(agent, optimizer, args, kl_beta, b_obs[mb_inds], *(x[mb_inds] for x in batch))

    pieces = {}  # name -> (CPU seconds, FLOPs) per iteration
    for name, fn, has_products in (
        (f"environment: {T} steps of {N} games (envpool, 1 thread, random actions)", env_steps, False),
        (f"policy: {T} calls of `Agent.act` on {N} frames", policy_steps, True),
        (f"update: {args.update_epochs} epochs of {K} `update_step` calls on {T * N // K} frames", update, True),
    ):
        pieces[name] = (cpu_seconds(fn, options.rounds), counted_flops(fn) if has_products else 0)
    envs.close()
    peak = matmul_peak(options.rounds)
    bounds = ceiling_bounds(T * N, pieces, peak, cores=2)

    cpu, flops = sum(seconds for seconds, _ in pieces.values()), sum(f for _, f in pieces.values())
    rows = [
        (
            f"ppo_atari_envpool.py on {args.env_id} at its defaults, one iteration ({T * N:,} agent steps); "
            f"{machine()}; torch {torch.__version__}; one thread, medians of {options.rounds} rounds of CPU time\n"
        ),
        *table_head("piece of one iteration", "CPU seconds (1 thread)", "GFLOP", "GFLOP/s (of the peak)"),
        *(
            f"| {name} | {seconds:.3f} | {f / 1e9:.1f} | {f / seconds / 1e9:.1f} ({f / seconds / peak:.0%}) |"
            if f
            else f"| {name} | {seconds:.3f} | - | - |"
            for name, (seconds, f) in pieces.items()
        ),
        f"| all | {cpu:.3f} | {flops / 1e9:.1f} | |",
        "",
        f"One thread's float32 matrix-multiply peak (1024 x 1024 products): {peak / 1e9:.1f} GFLOP/s.",
        "",
        f"- practical ceiling, 2 cores always busy, each piece at its one-thread time: {bounds['practical']:.0f} SPS",
        f"- FLOP ceiling, 2 cores, the products at the peak, the environment as measured: {bounds['flops']:.0f} SPS",
    ]
    if options.run:
        runs = [training_sps("ppo_atari_envpool", args.env_id, options.steps, "default") for _ in range(options.rounds)]
        for key, what in (
            ("sps", "its `charts/SPS` at the end, start-up included"),
            ("loop_sps", ("its loop alone (an iteration's steps over its logged rollout and update seconds, "
                          "median of the iterations after the first)")),
        ):  # fmt: skip
            sps = float(np.median([r[key] for r in runs]))
            rows.append(
                f"- the script at its defaults ({options.steps:,} steps, fresh processes, median of {options.rounds}), "
                f"{what}: {sps:.0f} SPS, {sps / bounds['practical']:.0%} of the practical ceiling, "
                f"{sps / bounds['flops']:.0%} of the FLOP ceiling"
            )
        (env, _), (policy, _), (update_cpu, _) = pieces.values()
        rollout, update = (float(np.median([r[key] for r in runs])) for key in ("loop_rollout", "loop_update"))
        rows.append(
            f"- where its iteration goes (medians): the rollout {rollout:.2f} s, against {(env + policy) / 2:.2f} s "
            f"for its environment and policy pieces on two cores; the update {update:.2f} s, against "
            f"{update_cpu / 2:.2f} s"
        )
    text = "\n".join(rows)
    print(text)
    if options.out:
        Path(options.out).write_text(text + "\n")


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(prog="python -m benchmark.studies.speed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    sub = commands.add_parser("throughput", help="each script's training SPS beside its environment's")
    sub.add_argument("--scripts", nargs="+", default=list(STEPS), choices=list(STEPS))
    sub.add_argument("--steps", type=int, default=None, help="steps per measurement (default: per script)")
    sub.add_argument("--repeats", type=int, default=1, help="rounds of measurements; the table shows medians")
    sub.add_argument("--busy", action="store_true", help="also measure with a busy process on another core")
    sub.add_argument("--straightforward", action="store_true", help="also with the scripts' speed levers undone")
    sub.add_argument("--out", type=str, default=None, help="also write the markdown table to this file")
    sub = commands.add_parser("fast-path", help="one script's policy and update steps, eager, compiled and NumPy")
    sub.add_argument("script", choices=sorted(SIZES))
    sub.add_argument("--rounds", type=int, default=3)
    sub.add_argument("--seconds", type=float, default=1.0, help="per variant and round")
    sub = commands.add_parser("vector-env", help="the MLP scripts' vector environment beside gymnasium's")
    sub.add_argument("what", choices=["step", "run"], help="one vector step, or whole training runs")
    sub.add_argument("--rounds", type=int, default=3)
    sub.add_argument("--scripts", default=",".join(BUDGETS), help="comma-separated")
    sub.add_argument("--baseline", help="also the script at this git revision (e.g. main)")
    sub.add_argument("--steps", type=int, default=20_000, help="step: vector steps per variant and round")
    budgets = ", ".join(f"{name} {steps:,}" for name, steps in BUDGETS.items())
    sub.add_argument("--total-timesteps", type=int, help=f"run: for every script (default: {budgets})")
    sub = commands.add_parser("evaluation", help="the seconds of one evaluation per script")
    sub.add_argument("--episodes", type=int, default=10, help="episodes of an evaluation (--eval-episodes)")
    sub.add_argument("--scripts", nargs="+", default=EVALUATED, choices=EVALUATED)
    sub = commands.add_parser("ceiling", help="the SPS two cores allow the envpool Atari script")
    sub.add_argument("--env-id", default="Breakout-v5")
    sub.add_argument("--rounds", type=int, default=3)
    sub.add_argument("--steps", type=int, default=10_240, help="steps of each run of the script itself")
    sub.add_argument("--no-run", dest="run", action="store_false", help="the bounds only, not the script's SPS")
    sub.add_argument("--out", type=str, default=None, help="also write the table to this file")
    # what the measurements start in a fresh process
    sub = commands.add_parser("straightforward-run")
    sub.add_argument("child", nargs=5)
    sub = commands.add_parser("timed-run")
    sub.add_argument("script")
    sub.add_argument("env_seconds")
    sub.add_argument("argv", nargs=argparse.REMAINDER)
    sub = commands.add_parser("vector-env-run")
    sub.add_argument("path")
    sub.add_argument("variant")
    sub.add_argument("flags", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "straightforward-run":
        script, env_id, steps, runs_dir, env_seconds = args.child
        return run_straightforward(script, env_id, int(steps), runs_dir, env_seconds)
    if args.command == "timed-run":
        return run_timed(args.script, args.env_seconds, args.argv)
    if args.command == "vector-env-run":
        return child(args.path, args.variant, args.flags)
    commands = {"throughput": throughput, "fast-path": fast_path, "vector-env": vector_env, "evaluation": evaluation}
    commands["ceiling"] = ceiling
    commands[args.command](args)


if __name__ == "__main__":
    main()
