"""Same-step autoreset and per-episode logging, on the fixed-length fake environment."""

import gymnasium as gym
import numpy as np

from helpers import FIXED_ENV, FIXED_LENGTH, read_scalars, tiny_args


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
    args = tiny_args(script, tmp_path, env_id=FIXED_ENV[script.__name__], num_envs=N, num_steps=T,
                     total_timesteps=N * T * iterations)
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


# each script's real environment and the fake one whose episodes end by termination, truncation and both
EQUAL_ENVS = {"ppo": ["CartPole-v1", "MixedEnds-v0"], "ppo_continuous_action": ["Hopper-v4", "MixedEndsBox-v0"]}


def test_the_vector_env_gives_what_gymnasiums_gives(script, tmp_path):
    """SameStepVectorEnv against gymnasium's SyncVectorEnv (same-step autoreset) under its vector
    RecordEpisodeStatistics: same seeds and actions, the same numbers at every step, the info the loop
    reads included."""
    for env_id in EQUAL_ENVS[script.__name__]:
        args = tiny_args(script, tmp_path, env_id=env_id, num_envs=3)
        ours = script.make_envs(args, str(tmp_path))
        theirs = gym.wrappers.vector.RecordEpisodeStatistics(gym.vector.SyncVectorEnv(
            [lambda: gym.make(env_id)] * 3, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP))
        assert ours.action_space == theirs.action_space and ours.observation_space == theirs.observation_space
        np.testing.assert_array_equal(ours.reset(seed=5)[0], theirs.reset(seed=5)[0])
        theirs.action_space.seed(0)
        ends = 0
        for _ in range(300):
            actions = theirs.action_space.sample()
            *mine, my_info = ours.step(actions)
            *gyms, gym_info = theirs.step(actions)
            for a, b in zip(mine, gyms):  # observations, rewards, terminated, truncated
                assert a.dtype == b.dtype
                np.testing.assert_array_equal(a, b)
            ended = gyms[2] | gyms[3]
            ends += ended.sum()
            assert bool(my_info) == ended.any()
            if ended.any():
                np.testing.assert_array_equal(my_info["_final_obs"], gym_info["_final_obs"])
                np.testing.assert_array_equal(my_info["_episode"], gym_info["_episode"])
                np.testing.assert_array_equal(np.stack(my_info["final_obs"][ended]), np.stack(gym_info["final_obs"][ended]))
                for key in ("r", "l"):
                    np.testing.assert_array_equal(my_info["episode"][key][ended], gym_info["episode"][key][ended])
        assert ends >= 10  # episodes ended, by each kind of end the environment has
        ours.close()
        theirs.close()
