"""The vector environment of ppo.py and ppo_continuous_action.py: gymnasium's `SyncVectorEnv` with same-step
autoreset, written out for the per-step cost."""

import gymnasium as gym
import numpy as np


class SameStepVectorEnv(gym.vector.VectorEnv):
    """The environments stepped one after another, an ended episode reset within the same step: the
    vector environment the rollout needs (see the docstring at the top), written out.

    It is gymnasium's `SyncVectorEnv(..., autoreset_mode=SAME_STEP, copy=False)` without the branches
    for other autoreset modes and observation layouts: for the same seeds and actions the same
    observations (one buffer, rewritten at every step), rewards, `terminated`, `truncated` and info
    (made by gymnasium's `_add_info`: each key of an environment's info as an array with its mask
    `_key`; where an episode ended, its last observation in `final_obs` and its last info in
    `final_info`). It is a `gymnasium.vector.VectorEnv`, so gymnasium's vector wrappers take it
    (the scripts' `make_envs` put `RecordEpisodeStatistics` around it). It exists for the per-step cost
    (benchmark/results/speed_cpu.md); tests/test_envs.py checks it against gymnasium's.
    """

    def __init__(self, env_fns: list):
        self.envs = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        self.metadata = {**self.envs[0].metadata, "autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
        self.render_mode = self.envs[0].render_mode
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.obs = gym.vector.utils.create_empty_array(self.single_observation_space, self.num_envs, fn=np.zeros)

    def reset(self, *, seed: int | list | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Environment i starts from seed + i (or seed[i]), as gymnasium's vector environments seed them;
        `options["reset_mask"]` resets only the environments it marks."""
        seeds = [seed + i for i in range(self.num_envs)] if isinstance(seed, int) else seed or [None] * self.num_envs
        options = dict(options or {})
        mask = options.pop("reset_mask", np.ones(self.num_envs, bool))
        infos = {}
        for i in np.flatnonzero(mask):
            self.obs[i], info = self.envs[i].reset(seed=seeds[i], options=options or None)
            infos = self._add_info(infos, info, i)
        return self.obs, infos

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        reward = np.zeros(self.num_envs)
        terminated, truncated = np.zeros(self.num_envs, bool), np.zeros(self.num_envs, bool)
        infos = {}
        for i, (env, action) in enumerate(zip(self.envs, actions)):
            obs, reward[i], ended, cut, info = env.step(action)
            terminated[i], truncated[i] = ended, cut
            if ended or cut:
                infos = self._add_info(infos, {"final_obs": obs, "final_info": info}, i)
                obs, info = env.reset()
            if info:
                infos = self._add_info(infos, info, i)
            self.obs[i] = obs
        return self.obs, reward, terminated, truncated, infos

    def render(self) -> tuple:
        return tuple(env.render() for env in self.envs)

    def close_extras(self, **kwargs):
        for env in self.envs:
            env.close()
