"""Environments that go wrong after a while, as a researcher's environment can: observations that turn NaN, or a
reward too large for float32 sums. They make a run diverge at a known point, for the tests of what a run does
then (tests/test_failures.py). Importing this module registers them (also as `tests.diverging_envs:<id>`)."""

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.envs.classic_control.pendulum import PendulumEnv

GOES_WRONG_AFTER = 200  # steps of one environment


class GoesWrong(gym.Wrapper):
    """After GOES_WRONG_AFTER steps of this environment, every observation is NaN (`what="obs"`) or every
    reward is 1e38 (`what="reward"`, whose discounted sums overflow float32)."""

    def __init__(self, env: gym.Env, what: str):
        super().__init__(env)
        self.what, self.steps = what, 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if self.steps > GOES_WRONG_AFTER:
            if self.what == "obs":
                obs = np.full_like(obs, np.nan)
            else:
                reward = 1e38
        return obs, reward, terminated, truncated, info


def nan_cartpole(what: str = "obs"):
    return GoesWrong(CartPoleEnv(), what)


def nan_pendulum(what: str = "obs"):
    return GoesWrong(PendulumEnv(), what)


gym.register("NanAfterCartPole-v0", entry_point=nan_cartpole, max_episode_steps=500)
gym.register("HugeRewardCartPole-v0", entry_point=nan_cartpole, kwargs={"what": "reward"}, max_episode_steps=500)
gym.register("NanAfterPendulum-v0", entry_point=nan_pendulum, max_episode_steps=200)
