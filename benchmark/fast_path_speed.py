"""What the fast path gives one script on this CPU, at one thread: the policy step (eager `Agent.act`,
ppolab's `NumpyPolicy` where the script's training runs it, compiled `act`) on one step's observations, the
update step of one minibatch (eager and compiled `update_step`, ppolab's `NumpyUpdate` where the script's
training runs it), and the time torch.compile takes for each.

    OMP_NUM_THREADS=1 python benchmark/fast_path_speed.py ppo --rounds 5
    OMP_NUM_THREADS=1 python benchmark/fast_path_speed.py ppo_continuous_action --rounds 5

Sizes are the script's defaults (num_envs observations per policy step, minibatch_size samples per
update step). The variants alternate within each round; the medians over rounds are printed as a
markdown table. A fresh process compiles from a cold cache unless TORCHINDUCTOR_CACHE_DIR holds one
(run twice with the same folder to see the warm time).
"""

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

import torch
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ppolab.fast_path import NumpyPolicy, NumpyUpdate  # noqa: E402  (after the repository is on the path)

SIZES = {  # (observation shape, actions: an int for a discrete count, a tuple for a Box shape)
    "ppo": ((4,), 2),
    "ppo_continuous_action": ((11,), (3,)),
    "ppo_continuous_action_redis": ((11,), (3,)),
    "ppo_atari": ((4, 84, 84), 4),
}
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", choices=sorted(SIZES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0, help="per variant and round")
    options = parser.parse_args()
    torch.set_num_threads(1)
    threadpool_limits(1, user_api="blas")  # NumPy's BLAS, as the scripts set it
    torch.distributions.Distribution.set_default_validate_args(False)
    script = importlib.import_module(options.script)
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

    compile_seconds = {}
    start = time.perf_counter()
    compiled_act = torch.compile(agent.act)
    compiled_act(step_obs)
    compile_seconds["act"] = time.perf_counter() - start
    start = time.perf_counter()
    compiled_update = torch.compile(script.update_step)
    compiled_update(agent, optimizer, args, kl_beta, *batch)
    compile_seconds["update_step"] = time.perf_counter() - start

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


if __name__ == "__main__":
    main()
