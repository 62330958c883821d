"""ppo_atari.py as a user runs it (Breakout for a few iterations: files, metrics, stdout, the
first-minibatch ratio, video, evaluation of the saved model), its command-line errors, and in-process
runs on the fake game of atari_fakes.py: truncated games bootstrap (or not, with the flag). Same seed,
same run, and resume: tests/test_contract.py, on every script."""

import cv2
import numpy as np
import pytest

import atari_fakes  # noqa: F401  (registers FakeAtari-v0)
import ppo_atari as script
from helpers import (
    finished_run,
    LINE,
    METRICS,
    assert_evaluate_flag_matches_training,
    assert_evaluation_videos,
    assert_progress_lines,
    fake_atari_args,
    load,
    run_script,
)

ITERATIONS, NUM_ENVS, NUM_STEPS, MAX_STEPS = 4, 2, 64, 60
BATCH = NUM_ENVS * NUM_STEPS


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    """One short Breakout run from the command line, shared by the tests of this file. The games are
    cut at MAX_STEPS agent steps, so every environment finishes games within the run."""
    cwd = tmp_path_factory.mktemp("ppo_atari")
    result = run_script(
        "ppo_atari",
        "--env-id",
        "Breakout",
        "--total-timesteps",
        ITERATIONS * BATCH + BATCH // 2,
        "--num-envs",
        NUM_ENVS,
        "--num-steps",
        NUM_STEPS,
        "--max-episode-steps",
        MAX_STEPS,
        "--save-model",
        "--eval-episodes",
        1,
        "--checkpoint-every",
        1,
        "--capture-video",
        "--torch-threads",
        1,
        cwd=cwd,
    )
    return finished_run(result, cwd)


def test_run_exits_cleanly_and_writes_its_files(e2e):
    assert e2e["result"].returncode == 0, e2e["result"].stderr
    assert e2e["result"].stderr == ""  # no tracebacks, warnings or ALE banners
    run_dir = e2e["run_dir"]
    assert run_dir.name.startswith("BreakoutNoFrameskip-v4__ppo_atari__1__")
    assert list(run_dir.glob("events.out.tfevents.*"))
    checkpoint, model = load(run_dir / "checkpoint.pt"), load(run_dir / "model.pt")
    assert checkpoint["iteration"] == model["iteration"] == ITERATIONS
    assert checkpoint["global_step"] == model["global_step"] == ITERATIONS * BATCH


def test_all_metrics_are_logged_once_per_iteration(e2e):
    scalars = e2e["scalars"]
    for tag in METRICS:
        assert tag in scalars, tag
        if not tag.startswith("charts/episodic"):
            assert [step for step, _ in scalars[tag]] == [BATCH * k for k in range(1, ITERATIONS + 1)], tag
    assert len(scalars["eval/episodic_return"]) == 1


def test_games_are_logged_with_their_scores(e2e):
    returns, lengths = e2e["scalars"]["charts/episodic_return"], e2e["scalars"]["charts/episodic_length"]
    # each env plays ITERATIONS * NUM_STEPS steps, and no game lasts longer than MAX_STEPS
    assert len(returns) == len(lengths) >= NUM_ENVS * (ITERATIONS * NUM_STEPS // MAX_STEPS)
    assert [step for step, _ in returns] == [step for step, _ in lengths]
    assert all(0 < length <= MAX_STEPS for _, length in lengths)
    assert all(score >= 0 and score == int(score) for _, score in returns)  # Breakout's unclipped points


def test_stdout_has_a_line_per_iteration_with_episodes(e2e):
    assert_progress_lines(e2e["result"].stdout, LINE, e2e["scalars"]["charts/episodic_return"], ITERATIONS, BATCH)


def test_ratio_is_one_at_the_first_minibatch(e2e):
    deviations = [value for _, value in e2e["scalars"]["debug/first_minibatch_ratio_deviation"]]
    assert len(deviations) == ITERATIONS
    assert max(deviations) < 1e-5


def test_video_records_the_unpreprocessed_rgb_game(e2e):
    videos = sorted((e2e["run_dir"] / "videos").glob("*.mp4"))
    assert videos
    ok, frame = cv2.VideoCapture(str(videos[0])).read()
    assert ok and frame.shape == (210, 160, 3)  # the Atari screen, not the 84x84 observation
    assert np.abs(frame[:, :, 0].astype(int) - frame[:, :, 2]).max() > 50  # in colour


def test_saved_model_evaluates_as_after_training(e2e):
    logged = [value for _, value in e2e["scalars"]["eval/episodic_return"]]
    returns = script.main(script.Args(evaluate=str(e2e["run_dir"] / "model.pt"), eval_episodes=1, cuda=False))
    assert returns == logged


def test_evaluate_flag_prints_the_training_evaluation(e2e):
    assert_evaluate_flag_matches_training("ppo_atari", e2e, episodes=1)


@pytest.mark.parametrize(
    "env_id, words",
    [
        ("Breakoutt", ["unknown Atari game", "Breakoutt", "pprint_registry"]),
        ("CartPole-v1", ["CartPole-v1", "not an Atari game"]),
    ],
)
def test_bad_env_id_gets_one_line_and_exit_code_2(env_id, words, tmp_path):
    result = run_script("ppo_atari", "--env-id", env_id, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ppo_atari.py: error: ")
    assert all(word in lines[0] for word in words)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("bootstrap", [True, False])
def test_truncated_games_bootstrap_the_value_of_their_final_observation(bootstrap, tmp_path, monkeypatch):
    rollouts, real_gae = [], script.compute_gae

    def spy(**kwargs):
        rollouts.append((kwargs["dones"].clone(), kwargs["final_values"].clone()))
        return real_gae(**kwargs)

    monkeypatch.setattr(script, "compute_gae", spy)
    # ALE's frame limit (4 x 12 frames) cuts every fake game long before its first lost life
    script.main(
        fake_atari_args(script, tmp_path, max_episode_steps=12, bootstrap_truncation=bootstrap, total_timesteps=64)
    )
    dones, final_values = rollouts[0]
    assert dones.sum() >= 4
    assert (final_values[~dones.bool()] == 0).all()
    if bootstrap:  # V(final observation) where a game was cut
        assert (final_values[dones.bool()] != 0).all()
    else:
        assert (final_values == 0).all()


def test_evaluate_capture_video_records_the_first_game(e2e, capsys):
    assert_evaluation_videos(script, e2e["run_dir"] / "model.pt", 2, 1, capsys)
