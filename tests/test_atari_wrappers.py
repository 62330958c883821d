"""ppo_atari.py's Atari preprocessing, on the fake ALE game of atari_fakes.py whose frames, rewards and
lives are known: no-op reset, max-and-skip, episodic life, fire on reset, reward clipping against the
logged unclipped game score, the observation pipeline, and the whole-game statistics through the
same-step vector environment. Plus the real ids: every id of a game is made the same way."""

import math

import cv2
import gymnasium as gym
import numpy as np
import pytest

import ppo_atari as script
from atari_fakes import GAME_OVER_FRAME, LIFE_LOSS_FRAMES, frame_image, frame_reward, game_score

LEFT, FIRE, ACTION_2 = 3, 1, 2  # the tests' agent always moves LEFT, so its NOOPs and FIREs are the wrappers'


def make(env_id="FakeAtari-v0"):
    env = script.make_env(env_id, 1, False, "")()
    return env, env.unwrapped


def processed(t: int) -> np.ndarray:
    """The frame the agent sees after an agent step that ended at raw frame t."""
    return cv2.resize(np.maximum(frame_image(t - 1), frame_image(t)), (84, 84), interpolation=cv2.INTER_AREA)


def noops_of(seed: int) -> int:
    """The no-op count NoopReset draws after a reset with this seed: the env's first random draw."""
    return int(gym.utils.seeding.np_random(seed)[0].integers(1, 31))


def test_noop_reset_takes_1_to_30_noops_drawn_from_the_env_seed():
    counts = []
    for seed in range(40):
        env = script.NoopReset(gym.make("FakeAtari-v0"))
        env.reset(seed=seed)
        fake = env.unwrapped
        assert fake.actions == [0] * fake.frame
        assert fake.frame == noops_of(seed)
        counts.append(fake.frame)
    assert 1 <= min(counts) and max(counts) <= 30
    assert len(set(counts)) > 10  # not a constant


def test_max_and_skip_maxes_the_last_two_frames_sums_rewards_and_stops_at_the_end():
    env = script.MaxAndSkip(gym.make("FakeAtari-v0"), skip=4)
    env.reset(seed=0)
    fake = env.unwrapped
    rewards_seen = []
    for k in range(1, GAME_OVER_FRAME // 4 + 1):
        obs, reward, terminated, truncated, _ = env.step(LEFT)
        t = fake.frame
        assert t == 4 * k and fake.actions[-4:] == [LEFT] * 4
        np.testing.assert_array_equal(obs, np.maximum(frame_image(t - 1), frame_image(t)))
        assert reward == sum(frame_reward(f) for f in range(t - 3, t + 1))
        assert not (terminated or truncated)
        rewards_seen.append(reward)
    assert any(r != 0 for r in rewards_seen)
    # the game ends 2 frames into the next step: it stops there, with those two frames
    obs, reward, terminated, truncated, _ = env.step(LEFT)
    assert terminated and fake.frame == GAME_OVER_FRAME
    np.testing.assert_array_equal(obs, np.maximum(frame_image(GAME_OVER_FRAME - 1), frame_image(GAME_OVER_FRAME)))
    assert reward == frame_reward(GAME_OVER_FRAME - 1) + frame_reward(GAME_OVER_FRAME)


def test_observations_are_84x84_uint8_stacks_of_4_and_a_reset_repeats_its_frame():
    env, fake = make()
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert env.observation_space.shape == (4, 84, 84) and env.observation_space.dtype == np.uint8
    for i in range(4):
        np.testing.assert_array_equal(obs[i], processed(fake.frame))
    previous = obs
    obs, *_ = env.step(LEFT)
    np.testing.assert_array_equal(obs[:3], previous[1:])
    np.testing.assert_array_equal(obs[3], processed(fake.frame))


def play_one_game(env, fake, seed):
    """Plays one game with LEFT; returns the per-step records and where each life was lost."""
    env.reset(seed=seed)
    steps, loss_frames = [], []
    while True:
        obs, reward, terminated, truncated, info = env.step(LEFT)
        steps.append((reward, terminated, truncated, info))
        if fake.frame >= GAME_OVER_FRAME:
            # the last agent step, cut short by the game's end, shows the game's last two frames
            np.testing.assert_array_equal(obs[-1], processed(GAME_OVER_FRAME))
            return steps, loss_frames
        if terminated or truncated:
            loss_frames.append(fake.frame)
            resets = fake.resets
            obs, info = env.reset()
            # a lost life: reset() continues the same game (one no-op step, FIRE, action 2) ...
            assert fake.resets == resets
            assert fake.actions[loss_frames[-1] :] == [0] * 4 + [FIRE] * 4 + [ACTION_2] * 4
            # ... and the agent sees that game go on
            np.testing.assert_array_equal(obs[-1], processed(fake.frame))
            assert "episode" not in info


def test_life_loss_ends_the_learning_episode_but_the_logged_game_spans_all_lives():
    seed = 5
    assert (GAME_OVER_FRAME - noops_of(seed)) % 4 != 0  # the game ends inside an agent step
    env, fake = make()
    steps, loss_frames = play_one_game(env, fake, seed)
    # the learning episodes end at each lost life and at game over, without the game being reset
    assert [any(s[1:3]) for s in steps].count(True) == len(LIFE_LOSS_FRAMES) + 1
    assert len(loss_frames) == len(LIFE_LOSS_FRAMES) and fake.resets == 1
    assert all(0 <= f - loss < 4 for f, loss in zip(loss_frames, LIFE_LOSS_FRAMES))
    # one game record, at the game's end, with the unclipped score of all lives
    records = [s[3]["episode"] for s in steps if "episode" in s[3]]
    assert len(records) == 1 and "episode" in steps[-1][3]
    noops = noops_of(seed)
    assert records[0]["r"] == game_score()
    # its length: every agent step of the game (those inside resets too), 4 frames each, after the no-ops
    assert records[0]["l"] == math.ceil((GAME_OVER_FRAME - noops) / 4)


def test_rewards_are_clipped_to_their_sign_while_the_score_is_not():
    env, fake = make()
    steps, _ = play_one_game(env, fake, seed=5)
    rewards = [s[0] for s in steps]
    assert set(rewards) <= {-1.0, 0.0, 1.0} and {-1.0, 1.0} <= set(rewards)
    # the raw rewards of single agent steps reach 3 and -2: the clipping had something to do
    assert steps[-1][3]["episode"]["r"] == game_score() != sum(rewards)


def test_fire_after_every_reset_only_in_games_with_fire():
    env, fake = make()
    env.reset(seed=3)
    noops = noops_of(3)
    assert fake.actions == [0] * noops + [FIRE] * 4 + [ACTION_2] * 4

    env, fake = make("FakeAtariNoFire-v0")
    assert not any(isinstance(w, script.FireReset) for w in wrappers(env))
    env.reset(seed=3)
    assert fake.actions == [0] * noops
    while not env.step(1)[2]:  # until the first lost life
        pass
    lost_at = fake.frame
    env.reset()
    assert fake.actions[lost_at:] == [0] * 4 and fake.resets == 1


def wrappers(env):
    while isinstance(env, gym.Wrapper):
        yield env
        env = env.env


def test_same_step_vector_env_reports_each_whole_game_once_at_its_end():
    seed, n = 11, 2
    envs = script.make_envs(script.Args(env_id="FakeAtari-v0"), n, "")
    obs, _ = envs.reset(seed=seed)
    ends, games = [[] for _ in range(n)], []
    for step in range(1, 100):
        obs, reward, terminated, truncated, infos = envs.step(np.full(n, LEFT))
        for i in np.flatnonzero(terminated | truncated):
            if i not in [game[1] for game in games]:  # episodes of each env's first game
                ends[i].append(step)
            # same-step autoreset: the step that ends an episode already returns the next observation
            assert infos["_final_obs"][i] and infos["final_obs"][i].shape == (4, 84, 84)
        for game in script.finished_episodes(infos):
            games.append((step, *game))
            # a new game: its first frame repeated in the stack
            assert all((obs[game[0]][k] == obs[game[0]][0]).all() for k in range(4))
        if len(games) == n:
            break
    envs.close()
    # episodes end at both lost lives and at game over; the game is reported once, at game over
    assert [len(e) for e in ends] == [len(LIFE_LOSS_FRAMES) + 1] * n
    lengths = [math.ceil((GAME_OVER_FRAME - noops_of(seed + i)) / 4) for i in range(n)]
    assert sorted(games) == sorted((ends[i][-1], i, game_score(), lengths[i]) for i in range(n))
    assert noops_of(seed) != noops_of(seed + 1)  # the envs are seeded apart: different game lengths


def test_a_game_that_ends_inside_a_reset_is_still_reported():
    # the frame limit falls on the no-op that continues the game after the first lost life: the game
    # ends inside the vector env's reset, whose info is what arrives at the top level
    seed = 2
    envs = script.make_envs(script.Args(env_id="FakeAtariNoopTruncation-v0"), 1, "")
    envs.reset(seed=seed)
    for step in range(1, 30):
        _, _, terminated, truncated, infos = envs.step(np.array([LEFT]))
        if terminated[0]:
            break
    games = script.finished_episodes(infos)
    envs.close()
    assert terminated[0] and "episode" not in infos["final_info"]  # the step itself lost a life only
    noops = noops_of(seed)
    loss_step_end = noops + 4 * math.ceil((LIFE_LOSS_FRAMES[0] - noops) / 4)  # frame the losing step ended at
    # the game: everything up to the truncated no-op's single frame, length in agent steps incl. that one
    assert games == [(0, game_score(loss_step_end + 1), (loss_step_end - noops) // 4 + 1)]


@pytest.mark.parametrize("env_id", ["Breakout", "BreakoutNoFrameskip-v4", "ALE/Breakout-v5"])
def test_every_id_of_a_game_is_the_same_environment(env_id):
    full_id = script.atari_id(env_id)
    assert full_id == ("ALE/Breakout-v5" if env_id.startswith("ALE") else "BreakoutNoFrameskip-v4")
    env = script.make_env(full_id, 1, False, "")()
    atari = env.unwrapped
    # the v4 NoFrameskip settings, whatever the id registers (v5: frameskip 4, sticky actions 0.25)
    assert atari._frameskip == 1
    assert atari.ale.getFloat("repeat_action_probability") == 0.0
    assert atari.ale.getInt("max_num_frames_per_episode") == 108_000
    assert atari.get_action_meanings() == ["NOOP", "FIRE", "RIGHT", "LEFT"]
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    env.close()
