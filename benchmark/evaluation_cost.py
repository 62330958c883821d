"""What `--eval-every` costs: the seconds of one evaluation (`evaluate(...)`, `--eval-episodes` episodes on a
separate environment, as the training loop calls it) per script on its default environment, with an
untrained agent, in this process, with one thread.

    python -m benchmark.evaluation_cost                 # 10 episodes, every script below
    python -m benchmark.evaluation_cost --episodes 3 --scripts ppo ppo_continuous_action

An untrained agent's episodes are short (CartPole: about 20 steps, Breakout: one game of a random
player); a trained agent's last longer, and an evaluation costs in proportion to the agent steps it
plays. On CartPole-v1 the return is the episode's length, so the seconds per 1000 steps follow.
"""

import argparse
import copy
import importlib
import inspect
import time
from dataclasses import asdict

import gymnasium as gym
import numpy as np
import torch

from benchmark.scripts import ENV_ID

# the scripts measured, each on its environment of ENV_ID
EVALUATED = ["ppo", "ppo_continuous_action", "ppo_atari", "ppo_atari_envpool", "ppo_procgen"]


def measure(name: str, episodes: int) -> dict:
    script = importlib.import_module(name)
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
    return dict(
        script=name,
        env=args.env_id,
        episodes=episodes,
        seconds=time.perf_counter() - start,
        mean_return=float(np.mean(returns)),
    )


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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=10, help="episodes of an evaluation (--eval-episodes)")
    parser.add_argument("--scripts", nargs="+", default=EVALUATED, choices=EVALUATED)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| script | env | episodes | seconds | mean return (untrained) |")
    print("|---|---|---|---|---|")
    for name in args.scripts:
        r = measure(name, args.episodes)
        print(
            f"| {r['script']}.py | {r['env']} | {r['episodes']} | {r['seconds']:.2f} | {r['mean_return']:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
