"""An environment whose every episode ends on a step that is both terminated and truncated, for the
truncation-bootstrap test of ppo_shared_memory_lstm.py. Its id, `tests.time_limit_envs:EndsAtTimeLimit-v0`,
makes Gymnasium import this module first, in the learner and in every spawned worker alike (the
repository root is on their path), so it is registered wherever it is made."""

import gymnasium as gym

from tests.fake_envs import FixedLengthEnv

LENGTH = 5  # steps of every episode, and the TimeLimit: the last step sets terminated and truncated

# FixedLengthEnv terminates after exactly LENGTH steps; Gymnasium's TimeLimit truncates at that same step
gym.register("EndsAtTimeLimit-v0", entry_point=FixedLengthEnv, kwargs=dict(length=LENGTH),
             max_episode_steps=LENGTH)
