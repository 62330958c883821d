"""Same-step autoreset and per-episode logging, on the fake environments; SameStepVectorEnv against
gymnasium's same-step SyncVectorEnv, its info and gymnasium's vector wrappers."""

import gymnasium as gym
import numpy as np
import pytest

import ppolab
from fake_envs import MIXED_LIMIT
from helpers import FIXED_ENV, FIXED_LENGTH, REAL_ENV, read_scalars, tiny_args


def test_same_step_autoreset_never_yields_a_dummy_step(script, tmp_path):
    args = tiny_args(script, tmp_path, env_id=FIXED_ENV[script.__name__], num_envs=2)
    envs = script.make_envs(args, str(tmp_path))
    obs, _ = envs.reset(seed=0)
    assert (obs[:, 0] == 0).all()
    ends = 0
    for step in range(1, 3 * FIXED_LENGTH + 2):
        t = step % FIXED_LENGTH  # the step count of the episode now running, 0 right after an end
        previous = obs.copy()  # the scripts' vector envs reuse their observation buffer (copy=False)
        obs, reward, terminated, truncated, info = envs.step(envs.action_space.sample())
        # every step is a real transition: reward 1, the step counter advanced (a dummy step would
        # give reward 0, no flag and the unchanged observation)
        assert (reward == 1.0).all()
        assert not (obs == previous).all()
        assert not truncated.any()
        if t == 0:  # an episode ended: the next one's first observation comes back at once
            ends += 1
            assert terminated.all()
            assert (obs[:, 0] == 0).all()
            final_obs = np.stack(info["final_obs"])
            assert (final_obs[:, 0] == FIXED_LENGTH).all()
            assert info["_episode"].all()
            assert (info["episode"]["r"] == FIXED_LENGTH).all() and (info["episode"]["l"] == FIXED_LENGTH).all()
        else:
            assert not terminated.any()
            assert (obs[:, 0] == t).all()
    envs.close()
    assert ends == 3


def test_every_episode_logged_once_at_its_own_step(script, tmp_path):
    N, T, iterations = 2, 12, 2
    args = tiny_args(
        script, tmp_path, env_id=FIXED_ENV[script.__name__], num_envs=N, num_steps=T, total_timesteps=N * T * iterations
    )
    run_dir = script.main(args)
    scalars = read_scalars(run_dir)
    returns, lengths = scalars["charts/episodic_return"], scalars["charts/episodic_length"]
    per_env = T * iterations // FIXED_LENGTH  # with next-step autoreset: T * iterations // (FIXED_LENGTH + 1)
    assert per_env != T * iterations // (FIXED_LENGTH + 1)
    # environment i's j-th episode ends at its step j * K; global steps count N per vector step
    expected_steps = sorted((j * FIXED_LENGTH - 1) * N + i + 1 for i in range(N) for j in range(1, per_env + 1))
    assert sorted(step for step, _ in returns) == expected_steps
    assert sorted(step for step, _ in lengths) == expected_steps
    assert all(value == FIXED_LENGTH for _, value in returns + lengths)


# each script's real environment (Hopper-v4's info carries keys of its own) and the fake one whose
# episodes end by termination, truncation and both
EQUAL_ENVS = {"ppo": ["CartPole-v1", "MixedEnds-v0"], "ppo_continuous_action": ["Hopper-v4", "MixedEndsBox-v0"]}


class AddsInfo(gym.Wrapper):
    """A user's wrapper, added in make_env: info keys of every kind gymnasium batches (numbers, an
    array, a string, a nested dict), on reset and on step."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.count = 0
        return obs, {**info, "phase": "start", "pair": np.array([1.5, -2.0])}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.count += 1
        return (
            obs,
            reward,
            terminated,
            truncated,
            {
                **info,
                "count": self.count,
                "half": float(reward) / 2,
                "ended": bool(terminated),
                "nested": {"count": self.count},
            },
        )


def gymnasiums_pair(script, env_id: str, n: int, wrapped: bool = True):
    """gymnasium's SyncVectorEnv (same-step autoreset) of the script's make_env, under gymnasium's
    vector RecordEpisodeStatistics where `wrapped`."""
    envs = gym.vector.SyncVectorEnv(
        [script.make_env(env_id, i, False, "") for i in range(n)],
        copy=False,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    return gym.wrappers.vector.RecordEpisodeStatistics(envs) if wrapped else envs


def assert_same_info(mine: dict, theirs: dict, where: str = "info"):
    """The same keys, masks and arrays (dtypes included), nested dicts and final observations too; the
    episodes' wall-clock durations ("t") aside."""
    assert sorted(mine) == sorted(theirs), where
    for key, value in theirs.items():
        if isinstance(value, dict):
            assert_same_info(mine[key], value, f"{where}[{key!r}]")
        elif key == "final_obs":
            assert [x is None for x in mine[key]] == [x is None for x in value], where
            for a, b in zip(mine[key], value):
                np.testing.assert_array_equal(a, b)
        elif not (key == "t" and where.endswith("['episode']")):
            assert mine[key].dtype == value.dtype, f"{where}[{key!r}]"
            np.testing.assert_array_equal(mine[key], value, err_msg=f"{where}[{key!r}]")


def assert_steps_as_gymnasiums(ours, theirs, steps: int, action_scale: float = 1.0) -> int:
    """Seeded reset, then the same actions: the same observations, rewards, flags and info at every step.
    Returns the number of episodes that ended."""
    obs, info = ours.reset(seed=5)
    gym_obs, gym_info = theirs.reset(seed=5)
    np.testing.assert_array_equal(obs, gym_obs)
    assert_same_info(info, gym_info)
    theirs.action_space.seed(0)
    ends = 0
    for _ in range(steps):
        actions = theirs.action_space.sample()
        if isinstance(theirs.action_space, gym.spaces.Box):
            actions *= action_scale  # beyond the bounds where scaled: ClipAction's work
        *mine, my_info = ours.step(actions)
        *gyms, gym_info = theirs.step(actions)
        for a, b in zip(mine, gyms):  # observations, rewards, terminated, truncated
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
        assert_same_info(my_info, gym_info)
        ends += (gyms[2] | gyms[3]).sum()
    return ends


def test_the_vector_env_gives_what_gymnasiums_gives(script, tmp_path):
    """make_envs against gymnasium's SyncVectorEnv (same-step autoreset) under its vector
    RecordEpisodeStatistics: same seeds and actions, the same numbers at every step, every info key
    included, and the same episode statistics."""
    for env_id in EQUAL_ENVS[script.__name__]:
        ours = script.make_envs(tiny_args(script, tmp_path, env_id=env_id, num_envs=3), str(tmp_path))
        theirs = gymnasiums_pair(script, env_id, 3)
        assert ours.action_space == theirs.action_space and ours.observation_space == theirs.observation_space
        assert assert_steps_as_gymnasiums(ours, theirs, 300) >= 10  # by each kind of end the env has
        assert ours.episode_count == theirs.episode_count
        assert list(ours.return_queue) == list(theirs.return_queue)
        assert list(ours.length_queue) == list(theirs.length_queue)
        ours.close()
        theirs.close()


def test_info_keys_of_a_users_wrapper_arrive_as_gymnasiums(script, tmp_path, monkeypatch):
    """A wrapper that a user adds in make_env: its info keys (with their masks, in final_info where
    an episode ended) arrive as gymnasium's pair gives them."""
    make_env = script.make_env
    monkeypatch.setattr(script, "make_env", lambda *args: lambda: AddsInfo(make_env(*args)()))
    env_id = EQUAL_ENVS[script.__name__][1]
    ours = script.make_envs(tiny_args(script, tmp_path, env_id=env_id, num_envs=3), str(tmp_path))
    theirs = gymnasiums_pair(script, env_id, 3)
    assert assert_steps_as_gymnasiums(ours, theirs, 40) >= 10
    _, info = ours.reset(seed=1)
    assert list(info["phase"]) == ["start"] * 3 and info["_phase"].all()
    *_, info = ours.step(ours.action_space.sample())
    assert list(info["count"]) == [1] * 3 and list(info["nested"]["count"]) == [1] * 3


def test_it_is_a_gymnasium_vector_env(script, tmp_path):
    """What a gymnasium user reaches for: the class, metadata with the autoreset mode, render_mode,
    spec, closed, unwrapped, and the episode statistics' queues."""
    envs = script.make_envs(tiny_args(script, tmp_path, num_envs=2), str(tmp_path))
    theirs = gymnasiums_pair(script, REAL_ENV[script.__name__], 2)
    assert isinstance(envs.unwrapped, ppolab.SameStepVectorEnv)
    assert isinstance(envs.unwrapped, gym.vector.VectorEnv)
    assert isinstance(envs, gym.wrappers.vector.RecordEpisodeStatistics)
    assert envs.metadata == theirs.metadata
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    assert (envs.render_mode, envs.spec, envs.num_envs) == (theirs.render_mode, theirs.spec, theirs.num_envs)
    assert envs.return_queue.maxlen == 100 and envs.length_queue.maxlen == 100
    assert not envs.closed
    envs.close()
    theirs.close()
    assert envs.closed and envs.unwrapped.closed


VECTOR_WRAPPERS = {  # gymnasium's vector wrappers that take a same-step vector env, by action space
    "both": [
        gym.wrappers.vector.RecordEpisodeStatistics,
        gym.wrappers.vector.NormalizeReward,
        lambda env: gym.wrappers.vector.ClipReward(env, -0.5, 0.5),
    ],
    "Box": [
        gym.wrappers.vector.ClipAction,
        lambda env: gym.wrappers.vector.RescaleAction(env, np.float32(-0.5), np.float32(0.5)),
    ],
}


def test_gymnasiums_vector_wrappers_take_it(script):
    """Around SameStepVectorEnv, gymnasium's vector wrappers give what they give around gymnasium's
    same-step SyncVectorEnv; the observation wrappers refuse both alike (gymnasium's rule: a same-step
    env's final_obs would not be transformed)."""
    env_id = EQUAL_ENVS[script.__name__][0]
    kinds = ["both", "Box"] if script.__name__ == "ppo_continuous_action" else ["both"]
    for wrapper in [w for kind in kinds for w in VECTOR_WRAPPERS[kind]]:
        ours = wrapper(ppolab.SameStepVectorEnv([script.make_env(env_id, i, False, "") for i in range(2)]))
        theirs = wrapper(gymnasiums_pair(script, env_id, 2, wrapped=False))
        assert assert_steps_as_gymnasiums(ours, theirs, 100, action_scale=2.0) >= 1
        ours.close()
        theirs.close()
    ours = ppolab.SameStepVectorEnv([script.make_env(env_id, 0, False, "")])
    with pytest.raises(ValueError, match="Expected autoreset_mode to be NEXT_STEP or DISABLED"):
        gym.wrappers.vector.NormalizeObservation(gymnasiums_pair(script, env_id, 1, wrapped=False))
    with pytest.raises(ValueError, match="Expected autoreset_mode to be NEXT_STEP or DISABLED"):
        gym.wrappers.vector.NormalizeObservation(ours)


def test_reset_mask_resets_only_the_marked_environments(script):
    env_id = EQUAL_ENVS[script.__name__][1]
    ours = ppolab.SameStepVectorEnv([script.make_env(env_id, i, False, "") for i in range(3)])
    theirs = gymnasiums_pair(script, env_id, 3, wrapped=False)
    assert_steps_as_gymnasiums(ours, theirs, 3)
    mask = np.array([True, False, True])
    np.testing.assert_array_equal(
        ours.reset(options={"reset_mask": mask})[0], theirs.reset(options={"reset_mask": mask.copy()})[0]
    )
    # environment 1 kept its episode (3 steps in), the others started new ones
    np.testing.assert_array_equal(ours.obs[:, 0], np.float32([0, 3 / MIXED_LIMIT, 0]))
