"""A stand-in for CleanRL 1.2.0's ppo_atari_envpool.py in the tests of benchmark.side_by_side, written for them: it
holds the lines the tool changes as CleanRL's file holds them, and around them a loop that steps envpool's
Breakout-v5 with random actions and writes `charts/SPS` every iteration, as CleanRL's file does. As it is, it fails
on today's envpool and gymnasium; as the tool changes it, it runs."""

import argparse
import time
from distutils.util import strtobool

import envpool
import gym
import numpy as np
from torch.utils.tensorboard import SummaryWriter


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--env-id", type=str, default="Pong-v5")
    parser.add_argument("--total-timesteps", type=int, default=10000000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--num-minibatches", type=int, default=4)
    parser.add_argument("--update-epochs", type=int, default=4)
    for flag in ("--cuda", "--track", "--capture-video"):
        parser.add_argument(flag, type=lambda x: bool(strtobool(x)), default=True, nargs="?", const=True)
    return parser.parse_args()


class RecordEpisodeStatistics(gym.Wrapper):
    def __init__(self, env, deque_size=100):
        super().__init__(env)
        self.num_envs = getattr(env, "num_envs", 1)

    def reset(self, **kwargs):
        observations = super().reset(**kwargs)
        self.episode_returns = np.zeros(self.num_envs, dtype=np.float32)
        return observations

    def step(self, action):
        observations, rewards, dones, infos = super().step(action)
        self.episode_returns += infos["reward"]
        self.episode_returns *= 1 - dones
        return observations, rewards, dones, infos


if __name__ == "__main__":
    args = parse_args()
    assert not args.track and not args.capture_video
    writer = SummaryWriter(f"runs/{args.env_id}__cleanrl_like__{args.seed}__{int(time.time())}")
    envs = envpool.make(
        args.env_id, env_type="gym", num_envs=args.num_envs, episodic_life=True, reward_clip=True, seed=args.seed
    )
    envs.num_envs = args.num_envs
    envs.single_action_space = envs.action_space
    envs.single_observation_space = envs.observation_space
    envs = RecordEpisodeStatistics(envs)
    assert isinstance(envs.action_space, gym.spaces.Discrete), "only discrete action space is supported"

    observations = envs.reset()
    rng = np.random.default_rng(args.seed)
    global_step, start_time = 0, time.time()
    for update in range(1, args.total_timesteps // (args.num_envs * args.num_steps) + 1):
        for step in range(args.num_steps):
            actions = rng.integers(envs.single_action_space.n, size=args.num_envs)
            observations, rewards, dones, infos = envs.step(actions)
            global_step += args.num_envs
        writer.add_scalar("charts/SPS", int(global_step / (time.time() - start_time)), global_step)
    envs.close()
    writer.close()
