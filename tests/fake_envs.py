"""Small environments whose outcomes are known in advance (registered in conftest.py)."""

import gymnasium as gym
import numpy as np


def _action_space(continuous: bool) -> gym.Space:
    return gym.spaces.Box(-1.0, 1.0, (2,), np.float32) if continuous else gym.spaces.Discrete(2)


class FixedLengthEnv(gym.Env):
    """Terminates after exactly `length` steps, reward 1 per step; observation [t, 1] with t the
    number of steps taken in the current episode, so a test can tell which step it sees."""

    metadata = {"render_modes": []}

    def __init__(self, length: int = 3, continuous: bool = False):
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, np.inf, (2,), np.float32)
        self.action_space = _action_space(continuous)
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.t, 1.0], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t >= self.length, False, {}


class ConstantEnv(gym.Env):
    """Never terminates (only a TimeLimit ends it); reward 1 and the same observation at every step,
    so the critic cannot tell how far the time limit is."""

    metadata = {"render_modes": []}

    def __init__(self, continuous: bool = False):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = _action_space(continuous)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.ones(2, np.float32), {}

    def step(self, action):
        return np.ones(2, np.float32), 1.0, False, False, {}
