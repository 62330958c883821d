"""A stand-in for LeanRL's ppo_atari_envpool_torchcompile.py in the tests of benchmark.side_by_side, written for
them: it holds the lines the tool changes as LeanRL's file holds them, and around them a loop that steps envpool's
Breakout-v5 with random actions and sends its speed to wandb every 10 iterations, as LeanRL's file does. As it is,
it fails on today's envpool and gymnasium; as the tool changes it, it runs."""

import time
from dataclasses import dataclass

import envpool
import gym
import numpy as np
import tyro
import wandb


@dataclass
class Args:
    env_id: str = "Breakout-v5"
    total_timesteps: int = 10000000
    seed: int = 1
    num_envs: int = 8
    num_steps: int = 128
    num_minibatches: int = 4
    update_epochs: int = 4
    cuda: bool = True
    compile: bool = False
    cudagraphs: bool = False


class RecordEpisodeStatistics(gym.Wrapper):
    def __init__(self, env):
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


class Parameters:
    """Stands for LeanRL's detached copy of the agent's parameters: to_module must be asked for plain tensors."""

    def to_module(self, module, preserve_module_state=True):
        if preserve_module_state:
            raise RuntimeError("the inference copy would hold parameters that require gradients")


if __name__ == "__main__":
    args = tyro.cli(Args)
    wandb.init(project="ppo_atari")
    envs = envpool.make(
        args.env_id, env_type="gym", num_envs=args.num_envs, episodic_life=True, reward_clip=True, seed=args.seed
    )
    envs.num_envs = args.num_envs
    envs.single_action_space = envs.action_space
    envs.single_observation_space = envs.observation_space
    envs = RecordEpisodeStatistics(envs)
    assert isinstance(envs.action_space, gym.spaces.Discrete), "only discrete action space is supported"
    agent_inference_p, agent_inference = Parameters(), None
    agent_inference_p.to_module(agent_inference)

    observations = envs.reset()
    assert observations.shape == (args.num_envs, *envs.single_observation_space.shape)
    rng = np.random.default_rng(args.seed)
    global_step, burnin_step, start_time = 0, None, None
    for iteration in range(1, args.total_timesteps // (args.num_envs * args.num_steps) + 1):
        if iteration == 3:
            burnin_step, start_time = global_step, time.time()
        for step in range(args.num_steps):
            actions = rng.integers(envs.single_action_space.n, size=args.num_envs)
            observations, rewards, dones, infos = envs.step(actions)
            global_step += args.num_envs
        if burnin_step is not None and iteration % 10 == 0:
            wandb.log({"speed": (global_step - burnin_step) / (time.time() - start_time)}, step=global_step)
    envs.close()
