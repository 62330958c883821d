"""ppo_atari_envpool.py: game scores over all lives, truncated games, reset rows kept out of the loss,
and a short run from the command line."""

import copy

import numpy as np
import pytest
import torch

import ppo_atari_envpool as script
from helpers import (
    finished_run,
    LINE,
    METRICS,
    assert_evaluate_flag_matches_training,
    assert_evaluation_videos,
    assert_progress_lines,
    load,
    run_script,
)

MAX_STEPS = 40  # a short time limit, so that games are truncated within the test


def infos(reward, terminated, elapsed):
    return {
        "reward": np.array(reward, dtype=float),
        "terminated": np.array(terminated),
        "elapsed_step": np.array(elapsed),
    }


def test_game_score_sums_unclipped_rewards_over_lives():
    games = script.EpisodeStatistics(2)
    # env 0 loses a life (terminated for learning, not in info), scores 7 + 3, then game over with 1 more;
    # env 1 is truncated at the time limit with 4 points, then starts a new game
    steps = [
        (infos([7.0, 4.0], [0, 0], [1, 1]), [False, False]),
        (infos([0.0, 0.0], [0, 0], [2, 2]), [False, True]),
        (infos([3.0, 2.0], [0, 0], [3, 1]), [False, False]),
        (infos([1.0, 0.0], [1, 0], [4, 2]), [False, False]),
    ]
    finished = [games.step(np.array(truncated), info) for info, truncated in steps]
    assert finished == [[], [(1, 4.0, 2)], [], [(0, 11.0, 4)]]
    assert games.returns.tolist() == [0.0, 2.0]  # env 1's new game counts from zero


def test_envpool_truncates_games_and_every_game_is_reported():
    args = script.Args(max_episode_steps=MAX_STEPS)
    envs = script.make_envs(args, 2, seed=3)
    envs.reset()
    games, finished, rewards = script.EpisodeStatistics(2), [], [[], []]
    rng = np.random.default_rng(0)
    for _ in range(3 * MAX_STEPS):
        _, _, terminated, truncated, info = envs.step(rng.integers(0, envs.action_space.n, 2))
        for i in range(2):
            rewards[i].append(info["reward"][i])
        finished += games.step(truncated, info)
    envs.close()
    # random Breakout play cannot lose five lives in 40 steps: every game ends at the time limit
    assert len(finished) >= 4
    assert all(length == MAX_STEPS for _, _, length in finished)
    assert {i for i, _, _ in finished} == {0, 1}


@pytest.mark.parametrize("seed", [0, 1])
def test_minibatches_have_one_shape_and_share_the_real_rows_evenly(seed):
    torch.manual_seed(seed)
    valid = torch.rand(16, 4) > 0.2
    minibatches = script.minibatch_indices(valid, 4)
    assert minibatches.shape == (4, 16)  # fixed shapes, reset rows included (masked by update_step)
    assert sorted(minibatches.reshape(-1).tolist()) == list(range(64))  # every row once
    real = [int(valid.reshape(-1)[m].sum()) for m in minibatches]
    assert sum(real) == int(valid.sum()) and max(real) - min(real) <= 1


def test_agent_is_the_same_network_in_both_memory_layouts():
    torch.manual_seed(0)
    agent = script.Agent(4)
    frames = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    channels_last = frames.contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(agent.get_value(frames), agent.get_value(channels_last))
    # the same weights in PyTorch's default layout, fed [0, 1] floats: the same values
    reference = copy.deepcopy(agent.network).to(memory_format=torch.contiguous_format)
    assert reference[0].weight.is_contiguous() and not agent.network[0].weight.is_contiguous()
    torch.testing.assert_close(agent.critic(reference(frames.float() / 255)).squeeze(-1), agent.get_value(frames))


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    """One short run from the command line with a short time limit, shared by the tests below."""
    cwd = tmp_path_factory.mktemp("envpool")
    result = run_script(
        "ppo_atari_envpool",
        "--env-id",
        "Breakout",
        "--num-envs",
        2,
        "--num-steps",
        64,
        "--total-timesteps",
        3 * 128,
        "--max-episode-steps",
        MAX_STEPS,
        "--save-model",
        "--eval-episodes",
        2,
        "--checkpoint-every",
        1,
        "--capture-video",
        cwd=cwd,
    )
    assert result.returncode == 0, result.stderr
    return finished_run(result, cwd)


def test_run_writes_its_files_and_metrics(e2e):
    assert e2e["run_dir"].name.startswith("Breakout-v5__ppo_atari_envpool__1__")
    assert load(e2e["run_dir"] / "model.pt")["global_step"] == 3 * 128
    scalars = e2e["scalars"]
    missing = [tag for tag in METRICS + ["debug/reset_rows"] if tag not in scalars]
    assert not missing
    assert max(value for _, value in scalars["debug/first_minibatch_ratio_deviation"]) < 1e-5


def test_stdout_has_a_line_per_iteration_with_episodes(e2e):
    assert_progress_lines(e2e["result"].stdout, LINE, e2e["scalars"]["charts/episodic_return"], 3, 128)


def test_capture_video_saves_env_0s_first_games(e2e):
    # env 0 plays at least 4 games of 40 steps: games 0 and 1 are recorded (then 8, 27, ...)
    videos = sorted(path.name for path in (e2e["run_dir"] / "videos").glob("*.mp4"))
    assert videos == ["game-0.mp4", "game-1.mp4"]


def test_truncated_games_are_logged_and_reset_rows_counted(e2e):
    scalars = e2e["scalars"]
    lengths = [value for _, value in scalars["charts/episodic_length"]]
    # 2 envs x 192 steps with a 40-step limit: at least 8 games, none longer than the limit
    assert len(lengths) >= 8 and max(lengths) <= MAX_STEPS
    # every game end and every life loss is followed by a reset row, which the update leaves out
    assert sum(value for _, value in scalars["debug/reset_rows"]) >= len(lengths)


def test_evaluate_flag_plays_the_same_games_as_after_training(e2e):
    assert_evaluate_flag_matches_training("ppo_atari_envpool", e2e, episodes=2)


@pytest.mark.parametrize(
    "env_id, words",
    [("Breakoutt", ["Breakoutt-v5", "list_all_envs"]), ("CartPole-v1", ["CartPole-v1", "not an Atari game"])],
)
def test_bad_env_id_gets_one_line_and_exit_code_2(tmp_path, env_id, words):
    result = run_script("ppo_atari_envpool", "--env-id", env_id, cwd=tmp_path)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("ppo_atari_envpool.py: error: ") and all(word in line for word in words)


def test_evaluate_capture_video_records_the_first_game_from_observations(e2e, capsys):
    assert_evaluation_videos(script, e2e["run_dir"] / "model.pt", 1, 1, capsys)
