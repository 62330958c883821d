"""An environment that fails inside one rollout worker of ppo_shared_memory_lstm.py, for the tests of
what the learner does then. Its id, `tests.crashing_envs:CrashingCartPole-v0`, makes Gymnasium import
this module first, in the learner and in every spawned worker alike (the repository root is on their
path), so it is registered wherever it is made."""

import multiprocessing

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.envs.classic_control.pendulum import PendulumEnv

CRASHING_WORKER = "rollout-worker-1"  # the process name the script gives worker 1
CRASH_AFTER = 40  # steps of one environment


class CrashingCartPole(CartPoleEnv):
    """CartPole, except that in worker 1 its step raises after CRASH_AFTER steps."""

    steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps > CRASH_AFTER and multiprocessing.current_process().name == CRASHING_WORKER:
            raise RuntimeError(f"injected failure after {CRASH_AFTER} steps")
        return super().step(action)


gym.register("CrashingCartPole-v0", entry_point=CrashingCartPole, max_episode_steps=500)


# Environments that misbehave in the learner's own process, for tests/test_environments.py: one raises in step()
# after RAISE_AFTER steps of its own, one returns observations of the wrong shape, one takes a Box of bools
RAISE_AFTER = 300


class RaisingCartPole(CartPoleEnv):
    """CartPole, except that its step raises after RAISE_AFTER steps (each environment counts its own)."""

    steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps > RAISE_AFTER:
            raise ValueError(f"injected failure after {RAISE_AFTER} steps")
        return super().step(action)


class RaisingPendulum(PendulumEnv):
    """Pendulum (Box actions), except that its reset raises after RAISE_AFTER steps of its own."""

    steps = 0

    def step(self, action):
        self.steps += 1
        return super().step(action)

    def reset(self, *, seed=None, options=None):
        if self.steps > RAISE_AFTER:
            raise ValueError(f"injected failure at a reset after {RAISE_AFTER} steps")
        return super().reset(seed=seed, options=options)


class WrongShapeCartPole(CartPoleEnv):
    """CartPole whose step returns an observation of 5 numbers where its space says 4."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return np.append(obs, 0.0).astype(np.float32), reward, terminated, truncated, info


class BoolActions(gym.Env):
    """A Box of 3 bools as actions."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(np.zeros(3, np.bool_), np.ones(3, np.bool_), dtype=np.bool_)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


gym.register("RaisingCartPole-v0", entry_point=RaisingCartPole, max_episode_steps=500)
gym.register("RaisingPendulum-v0", entry_point=RaisingPendulum, max_episode_steps=100)
gym.register("WrongShapeCartPole-v0", entry_point=WrongShapeCartPole, max_episode_steps=500)
gym.register("BoolActions-v0", entry_point=BoolActions, max_episode_steps=50)
