"""An environment that fails inside one rollout worker of ppo_shared_memory_lstm.py, for the tests of
what the learner does then. Its id, `tests.crashing_envs:CrashingCartPole-v0`, makes Gymnasium import
this module first, in the learner and in every spawned worker alike (the repository root is on their
path), so it is registered wherever it is made."""

import multiprocessing

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

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
