"""ppo_procgen.py: envpool Procgen's reset rows and time-outs as the script relies on them, reset rows kept
out of the loss and the reward statistics, the IMPALA CNN, a short run from the command line, bad game
names and the missing-Qt message."""

import copy
import re
import shutil
import sys

import numpy as np
import pytest
import torch

import ppo_procgen as script
import ppolab
from helpers import (
    finished_run,
    LINE,
    METRICS,
    assert_evaluation_videos,
    assert_progress_lines,
    load,
    read_scalars,
    resume_args,
    run_script,
)

GAME = "bossfight"  # random play ends an episode every 40 steps or so, so episodes end within a short run
NUM_ENVS, NUM_STEPS, ITERATIONS = 4, 32, 2
BATCH = NUM_ENVS * NUM_STEPS


def test_envpool_procgen_resets_on_the_next_step_and_ignores_that_step_action():
    # two copies of the same seeded envs, given the same actions except on the reset rows
    envs, twin = (script.make_envs(script.Args(env_id=GAME), 2, seed=3) for _ in range(2))
    obs, twin_obs = envs.reset()[0], twin.reset()[0]
    assert obs.shape == (2, 64, 64, 3) and obs.dtype == np.uint8  # height x width x RGB, as the buffer stores it
    rng = np.random.default_rng(0)
    previous_done, reset_rows = np.zeros(2, bool), 0
    for _ in range(200):
        actions = rng.integers(0, envs.action_space.n, 2)
        obs, reward, terminated, truncated, info = envs.step(actions)
        twin_obs, twin_reward, *_ = twin.step(np.where(previous_done, (actions + 1) % envs.action_space.n, actions))
        np.testing.assert_array_equal(obs, twin_obs)
        np.testing.assert_array_equal(reward, twin_reward)
        # the step after an episode end: reward 0, a new episode at step 0, no episode end
        rows = np.flatnonzero(previous_done)
        assert (reward[rows] == 0).all() and (info["elapsed_step"][rows] == 0).all()
        assert not (terminated | truncated)[rows].any()
        reset_rows += len(rows)
        previous_done = terminated | truncated
    assert reset_rows >= 3


def test_procgen_time_out_is_a_truncation():
    # random play rarely finds the cheese in maze, whose episodes time out after 500 steps
    envs = script.make_envs(script.Args(env_id="maze"), 4, seed=1)
    envs.reset()
    rng = np.random.default_rng(0)
    ends = []
    for _ in range(501):
        _, _, terminated, truncated, info = envs.step(rng.integers(0, envs.action_space.n, 4))
        ends += [
            (bool(terminated[i]), bool(truncated[i]), int(info["elapsed_step"][i]))
            for i in np.flatnonzero(terminated | truncated)
        ]
    assert (False, True, 500) in ends
    assert all(truncated == (length == 500) and terminated != truncated for terminated, truncated, length in ends)


def test_episode_statistics_report_raw_scores_at_every_episode_end():
    episodes = script.EpisodeStatistics(2)
    steps = [  # (reward, done, elapsed_step): env 0 ends at its 3rd step; env 1 at its 2nd, then a reset row
        ([1.0, 2.0], [False, False], [1, 1]),
        ([0.0, 5.0], [False, True], [2, 2]),
        ([4.0, 0.0], [True, False], [3, 0]),
    ]
    finished = [episodes.step(np.array(r), np.array(d), {"elapsed_step": np.array(e)}) for r, d, e in steps]
    assert finished == [[], [(1, 7.0, 2)], [(0, 5.0, 3)]]
    assert episodes.returns.tolist() == [0.0, 0.0]


def test_reward_statistics_leave_out_the_reset_rows():
    scaler = script.RewardScaler(2, gamma=0.5, clip=10.0)
    scaler(np.array([2.0, 4.0]), done=np.array([False, True]), valid=np.array([True, True]))
    # env 1's next step is its reset row: only env 0's return (2 * 0.5 + 2 = 3) enters the statistics
    scaled = scaler(np.array([2.0, 0.0]), done=np.array([False, False]), valid=np.array([True, False]))
    reference = ppolab.RunningMeanStd()
    reference.update(np.array([2.0, 4.0]))
    reference.update(np.array([3.0]))
    assert scaler.rms.count == pytest.approx(reference.count)
    assert scaler.rms.mean == pytest.approx(reference.mean) and scaler.rms.var == pytest.approx(reference.var)
    np.testing.assert_allclose(scaled, np.array([2.0, 0.0]) / np.sqrt(reference.var + 1e-8))


def test_the_rows_after_episode_ends_are_masked_out_of_every_minibatch():
    # a hand-built rollout of 6 steps x 3 envs: env 0 ends at steps 1 and 4, env 2 at step 2, env 1 never;
    # the row after each end is envpool's reset row, marked as the training loop marks it
    dones = torch.zeros(6, 3, dtype=torch.bool)
    dones[1, 0] = dones[4, 0] = dones[2, 2] = True
    valid = torch.ones(6, 3, dtype=torch.bool)
    valid[1:] = ~dones[:-1]
    reset_rows = {2 * 3 + 0, 5 * 3 + 0, 3 * 3 + 2}  # flat index step * num_envs + env
    for epoch in range(5):
        minibatches = script.minibatch_indices(valid, 3)
        assert minibatches.shape == (3, 6) and sorted(minibatches.reshape(-1).tolist()) == list(range(18))
        # the reset rows ride along with mask 0 (update_step's mask is valid[minibatch]); the real rows
        # are shared out evenly, as when the reset rows were dropped
        masked = {i for m in minibatches for i in m.tolist() if not valid.reshape(-1)[i]}
        assert masked == reset_rows
        assert sorted(int(valid.reshape(-1)[m].sum()) for m in minibatches) == [5, 5, 5]


def test_impala_cnn_shapes_and_memory_layouts():
    torch.manual_seed(0)
    agent = script.Agent(15)
    frames = torch.randint(0, 256, (3, 64, 64, 3), dtype=torch.uint8)
    images = script.as_images(frames.numpy())
    assert images.shape == (3, 3, 64, 64) and images.is_contiguous(memory_format=torch.channels_last)
    assert [stage[0].out_channels for stage in agent.network[:3]] == [16, 32, 32]
    assert agent.network[5].in_features == 32 * 8 * 8 and agent.network[5].out_features == 256
    # the same weights in PyTorch's default layout, fed contiguous [0, 1] floats: the same values
    reference = copy.deepcopy(agent.network).to(memory_format=torch.contiguous_format)
    assert not agent.network[0][0].weight.is_contiguous()
    expected = agent.critic(reference(images.contiguous().float() / 255)).squeeze(-1)
    torch.testing.assert_close(agent.get_value(images), expected)


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    """One short run from the command line, shared by the tests below."""
    cwd = tmp_path_factory.mktemp("procgen")
    result = run_script(
        "ppo_procgen",
        "--env-id",
        GAME,
        "--num-envs",
        NUM_ENVS,
        "--num-steps",
        NUM_STEPS,
        "--num-minibatches",
        2,
        "--update-epochs",
        1,
        "--total-timesteps",
        ITERATIONS * BATCH,
        "--save-model",
        "--eval-episodes",
        1,
        "--checkpoint-every",
        1,
        "--torch-threads",
        1,
        "--capture-video",
        cwd=cwd,
    )
    assert result.returncode == 0, result.stderr
    return finished_run(result, cwd)


def test_run_writes_its_files_and_metrics(e2e):
    assert e2e["run_dir"].name.startswith("BossfightEasy-v0__ppo_procgen__1__")
    model = load(e2e["run_dir"] / "model.pt")
    assert model["global_step"] == ITERATIONS * BATCH and model["args"]["env_id"] == GAME
    scalars = e2e["scalars"]
    missing = [tag for tag in METRICS + ["debug/reset_rows"] if tag not in scalars]
    assert not missing
    assert [step for step, _ in scalars["charts/SPS"]] == [BATCH * k for k in range(1, ITERATIONS + 1)]
    assert max(value for _, value in scalars["debug/first_minibatch_ratio_deviation"]) < 1e-5
    assert len(scalars["eval/episodic_return"]) == 1


def test_every_episode_is_logged_and_followed_by_a_masked_reset_row(e2e):
    scalars = e2e["scalars"]
    steps = [step for step, _ in scalars["charts/episodic_length"]]
    assert steps == [step for step, _ in scalars["charts/episodic_return"]]
    assert len(steps) >= 2 and len(set(steps)) == len(steps) and max(steps) <= ITERATIONS * BATCH
    # each episode end puts a reset row into the next step's batch row, unless it ended at the run's last step
    reset_rows = sum(value for _, value in scalars["debug/reset_rows"])
    assert reset_rows == sum(step <= ITERATIONS * BATCH - NUM_ENVS for step in steps) >= 1


def test_stdout_has_a_line_per_iteration_with_episodes(e2e):
    assert_progress_lines(e2e["result"].stdout, LINE, e2e["scalars"]["charts/episodic_return"], ITERATIONS, BATCH)


def test_capture_video_saves_env_0s_first_episodes(e2e):
    # an episode ending at step s was env (s - 1) % NUM_ENVS's; env 0's episodes 0, 1, 8, 27, ... are recorded
    ended = sum((step - 1) % NUM_ENVS == 0 for step, _ in e2e["scalars"]["charts/episodic_length"])
    assert ended >= 1
    expected = [f"episode-{k}.mp4" for k in range(ended) if round(k ** (1 / 3)) ** 3 == k]
    assert sorted(path.name for path in (e2e["run_dir"] / "videos").glob("*.mp4")) == expected


def test_checkpoint_holds_the_reward_statistics_of_the_real_steps(e2e):
    model = load(e2e["run_dir"] / "model.pt")
    reset_rows = sum(value for _, value in e2e["scalars"]["debug/reset_rows"])
    # every real env step (not the reset rows) added one discounted return to the statistics
    assert model["reward_rms"]["count"] == pytest.approx(1e-4 + ITERATIONS * BATCH - reset_rows)
    assert model["reward_rms"]["var"] != 1.0  # moved from its initial value
    assert load(e2e["run_dir"] / "checkpoint.pt")["reward_rms"]["count"] == model["reward_rms"]["count"]


def test_resume_continues_with_the_saved_reward_statistics(e2e, tmp_path):
    run_dir = tmp_path / e2e["run_dir"].name
    shutil.copytree(e2e["run_dir"], run_dir)
    checkpoint = load(run_dir / "checkpoint.pt")
    checkpoint["args"].update(total_timesteps=(ITERATIONS + 1) * BATCH, save_model=False)  # one more iteration
    torch.save(checkpoint, run_dir / "checkpoint.pt")
    script.main(resume_args(script, run_dir / "checkpoint.pt"))
    resumed = load(run_dir / "checkpoint.pt")
    assert resumed["iteration"] == ITERATIONS + 1
    new_reset_rows = dict(read_scalars(run_dir)["debug/reset_rows"])[(ITERATIONS + 1) * BATCH]
    assert resumed["reward_rms"]["count"] == pytest.approx(checkpoint["reward_rms"]["count"] + BATCH - new_reset_rows)


def test_resume_reads_the_reward_statistics_of_a_format_2_checkpoint(e2e, tmp_path):
    """Format 2 held the statistics as NumPy scalars (read as Python floats) and NumPy's RNG key as an array."""
    run_dir = tmp_path / e2e["run_dir"].name
    shutil.copytree(e2e["run_dir"], run_dir)
    checkpoint = load(run_dir / "checkpoint.pt")
    kind, key, *rest = checkpoint["rng"]["numpy"]
    old = dict(
        checkpoint,
        format=2,
        rng=dict(checkpoint["rng"], numpy=(kind, key.numpy().astype(np.uint32), *rest)),
        reward_rms={name: np.float64(value) for name, value in checkpoint["reward_rms"].items()},
    )
    old["args"].update(total_timesteps=(ITERATIONS + 1) * BATCH, save_model=False)  # one more iteration
    torch.save(old, run_dir / "checkpoint.pt")
    script.main(script.Args(**{**old["args"], "resume": str(run_dir / "checkpoint.pt")}))  # NumPy in it: not load()
    resumed = load(run_dir / "checkpoint.pt")
    assert (resumed["format"], resumed["iteration"]) == (3, ITERATIONS + 1)
    new_reset_rows = dict(read_scalars(run_dir)["debug/reset_rows"])[(ITERATIONS + 1) * BATCH]
    assert resumed["reward_rms"]["count"] == pytest.approx(checkpoint["reward_rms"]["count"] + BATCH - new_reset_rows)


def test_evaluate_flag_plays_the_same_episodes_as_after_training(e2e):
    logged = [value for _, value in e2e["scalars"]["eval/episodic_return"]]
    # another --seed: the evaluation still plays the trained run's episodes
    returns = script.main(
        script.Args(evaluate=str(e2e["run_dir"] / "model.pt"), eval_episodes=1, seed=7, torch_threads=1)
    )
    assert returns == pytest.approx(logged, rel=1e-6)
    assert re.search(rf"^evaluation: 1 episodes, mean return {logged[0]:.2f} ", e2e["result"].stdout, re.M)


def test_unknown_game_gets_one_line_listing_the_games_and_exit_code_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["ppo_procgen.py"])  # as the script names itself when run
    with pytest.raises(SystemExit) as exit_:
        script.main(script.Args(env_id="starpilott", runs_dir=str(tmp_path / "runs")))
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("ppo_procgen.py: error: unknown Procgen game 'starpilott'")
    assert all(game in line for game in script.GAMES)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("env_id", ["Breakout-v5", "StarpilotEasy-v9", "Starpilot-v0"])
def test_ids_that_are_not_envpool_procgen_ids_are_refused(env_id, capsys):
    with pytest.raises(SystemExit) as exit_:
        script.procgen_id(env_id)
    assert exit_.value.code == 2 and f"unknown Procgen game '{env_id}'" in capsys.readouterr().err


def test_full_envpool_ids_and_game_names_are_read_alike():
    assert script.procgen_id("starpilot") == script.procgen_id("StarPilot") == "StarpilotEasy-v0"
    assert script.procgen_id("BigfishHard-v0") == "BigfishHard-v0"


# A stand-in for a machine without libqt5gui5: the dynamic loader's error when envpool loads its Procgen
# extension. envpool's own code turns it into "EnvPool Procgen requires the system Qt 5 runtime ..." when the
# script asks for a Procgen spec, as on such a machine.
NO_QT = """
import sys

class NoQt:
    def find_spec(self, name, path=None, target=None):
        if name == "envpool.procgen.procgen_envpool":
            raise ImportError("libQt5Gui.so.5: cannot open shared object file: No such file or directory")
        return None

sys.meta_path.insert(0, NoQt())
"""


def test_missing_qt_runtime_gets_one_line_naming_the_package_and_exit_code_2(tmp_path, monkeypatch):
    (tmp_path / "shim").mkdir()
    (tmp_path / "shim" / "sitecustomize.py").write_text(NO_QT)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "shim"))
    result = run_script("ppo_procgen", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "ppo_procgen.py: error: envpool's Procgen needs the Qt 5 runtime: install the Debian/Ubuntu package "
        "libqt5gui5 (sudo apt-get install libqt5gui5)"
    ]
    assert not (tmp_path / "runs").exists()


def test_evaluate_capture_video_records_the_first_episode_from_observations(e2e, capsys):
    assert_evaluation_videos(script, e2e["run_dir"] / "model.pt", 1, 1, capsys)
