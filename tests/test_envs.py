"""Same-step autoreset and per-episode logging, on the fixed-length fake environment."""

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
