"""The environments a run is given, as Gymnasium names and makes them (ppolab/environments.py): ids of the form
`module:Name-v0` on every script that takes Gymnasium's ids, and one line (exit code 2, before any work) for a
module that cannot be imported, an observation space a script does not support, --capture-video with an environment
that cannot render, and --evaluate of a checkpoint whose environment cannot be made here. And evaluations end where
the environment never does: --eval-max-steps cuts an episode of an environment without a time limit of its own,
with a line that says so, and leaves alone one that has its own. And actions the policy does not number as the
environment does (a Discrete space with a start, a Box of integers) reach it inside its space, in every script that
takes them, or are refused in one line (an Atari game whose actions do not start at 0)."""

import importlib
import os
import subprocess
from dataclasses import asdict

import gymnasium as gym
import numpy as np
import pytest
import torch

import ppolab
from fake_envs import FIXED_LENGTH
from helpers import read_scalars, script_command
from ppolab.checkpoints import rng_state
from scripts import REPO, SCRIPTS

# the scripts that take any of Gymnasium's ids, and those that take ale-py's games through Gymnasium
GYMNASIUM = ["ppo", "ppo_continuous_action", "ppo_shared_memory_lstm", "ppo_continuous_action_redis"]
ALE = ["ppo_atari", "ppo_atari_lstm", "ppo_atari_multigpu"]
CONTINUOUS = ["ppo_continuous_action", "ppo_continuous_action_redis"]


def test_the_lists_name_every_script_of_gymnasium():
    """The scripts not listed make their environments with envpool, whose ids are not Gymnasium's."""
    assert sorted(set(SCRIPTS) - set(GYMNASIUM) - set(ALE)) == ["ppo_atari_envpool", "ppo_procgen"]


def fake(name: str, env: str) -> str:
    """The id of one of tests/fake_envs.py's environments, with the actions of script `name` (`EnvBox-v0` for the
    continuous scripts), named with its module, as the other processes of the multi-process scripts need it."""
    return f"tests.fake_envs:{env}{'Box' if name in CONTINUOUS else ''}-v0"


def refusal(name: str, capsys, tmp_path, **fields) -> str:
    """`main(Args(**fields))` of script `name` ends with exit code 2 and one line on stderr, which is returned,
    and leaves no run folder."""
    script = importlib.import_module(name)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        script.main(script.Args(runs_dir=str(tmp_path / "runs"), cuda=False, **fields))
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and ": error: " in lines[0], lines
    assert not (tmp_path / "runs").exists()
    return lines[0]


# ENVIRONMENT IDS ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ppo", "ppo_continuous_action"])
def test_a_module_id_trains(name, tmp_path):
    """`--env-id tests.fake_envs:MixedEnds-v0`: the module is imported, which registers the id, and the run trains
    on it (the multi-process scripts' own tests train on such ids)."""
    script = importlib.import_module(name)
    args = script.Args(
        env_id=fake(name, "MixedEnds"),
        runs_dir=str(tmp_path),
        cuda=False,
        num_envs=2,
        num_steps=16,
        num_minibatches=2,
        update_epochs=1,
        total_timesteps=64,
    )
    run_dir = script.main(args)
    assert "tests.fake_envs-MixedEnds" in run_dir
    assert len(read_scalars(run_dir)["charts/episodic_return"]) >= 6  # episodes of 5 steps


@pytest.mark.parametrize("name", ALE)
def test_a_module_id_names_an_atari_game(name):
    """The Atari scripts' check of the game imports the module of `module:Name-v0` too."""
    script = importlib.import_module(name)
    args = script.Args(env_id="tests.atari_fakes:MixedEndsAtari-v0", cuda=False)
    if name == "ppo_atari_multigpu":
        script.check_args(args, 0, 1)
    else:
        script.check_args(args)


@pytest.mark.parametrize("module", ["no_such_module", "tests.broken_envs"])
@pytest.mark.parametrize("name", GYMNASIUM + ALE)
def test_a_module_that_cannot_be_imported_is_named_in_one_line(name, module, capsys, tmp_path):
    """A module that does not exist, or that raises while it is imported (tests/broken_envs.py), is named."""
    line = refusal(name, capsys, tmp_path, env_id=f"{module}:Pong-v0")
    assert f"cannot import the module {module} of the environment {module}:Pong-v0: " in line
    assert ("ModuleNotFoundError" if module == "no_such_module" else "RuntimeError: this module fails") in line


@pytest.mark.parametrize("name", ["ppo", "ppo_continuous_action"])
def test_a_registered_id_that_cannot_be_made_here_is_one_line(name, capsys, tmp_path):
    """Pusher-v4 is registered, and needs mujoco<3: one line naming it, in every script, the Discrete ones too."""
    line = refusal(name, capsys, tmp_path, env_id="Pusher-v4")
    assert "cannot make Pusher-v4 here: ImportError: `Pusher-v4` is only supported on `mujoco<3`" in line


@pytest.mark.parametrize("env_id", ["cartpole-v1", "CartPol-v1"])
@pytest.mark.parametrize("name", ["ppo", "ppo_continuous_action"])
def test_a_typo_keeps_gymnasiums_suggestion(name, env_id, capsys, tmp_path):
    line = refusal(name, capsys, tmp_path, env_id=env_id)
    assert f"'{env_id}'" in line and "did you mean CartPole?" in line


@pytest.mark.parametrize("name", CONTINUOUS)
def test_a_box_of_bools_as_actions_is_refused_in_one_line(name, capsys, tmp_path):
    """A policy's numbers are floats (rounded for a Box of integers); a Box of bools has no such mapping."""
    line = refusal(name, capsys, tmp_path, env_id="tests.crashing_envs:BoolActions-v0")
    assert "BoolActions-v0 has a Box of bool actions" in line


@pytest.mark.parametrize(
    "name, env_id, words",
    [
        ("ppo", "RaisingCartPole-v0", "raised ValueError in step() at global step 120"),
        ("ppo", "WrongShapeCartPole-v0", "raised ValueError in step() at global step 4"),
        ("ppo_continuous_action", "RaisingPendulum-v0", "raised ValueError in reset() at global step 12"),
    ],
)
def test_an_environment_that_raises_shows_its_frames_then_one_line_with_the_step_and_the_resume(
    name, env_id, words, tmp_path
):
    """An environment's exception in step() or reset(), or what it returned that the vector environment cannot take
    (an observation of another shape): its own frames (the bug is in its code), then one line naming the environment,
    the global step, the last checkpoint and the command that resumes from it (or that nothing was written)."""
    env_id = f"tests.crashing_envs:{env_id}"
    command = script_command(name, "--env-id", env_id, "--num-steps", "64", "--total-timesteps", "4096",
                             "--checkpoint-every", "1", "--runs-dir", tmp_path / "runs")  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith(f"{name}.py: error: the environment {env_id} {words[: words.index(' at ')]}"), last
    assert "Traceback" in result.stderr and ("crashing_envs.py" in result.stderr or "vector_env.py" in result.stderr)
    runs = list((tmp_path / "runs").glob("*"))
    if "WrongShape" in env_id:  # at the first step: nothing written, no folder left
        assert runs == [] and "the run had written nothing" in last
    else:
        assert words.split(" at ")[0] in last and " at global step " in last
        (run_dir,) = runs
        assert f"last checkpoint {run_dir}/checkpoint.pt; continue with: " in last and "--resume" in last


# OBSERVATION SPACES ------------------------------------------------------------------------------


@pytest.mark.parametrize("space", ["Dict", "Tuple", "Discrete", "Image"])
@pytest.mark.parametrize("name", GYMNASIUM)
def test_an_observation_space_the_script_cannot_train_is_refused_in_one_line(name, space, capsys, tmp_path):
    """The MLP scripts (and the shared-memory script where the environment is not a game) take vectors; another
    space would end in a traceback of the network (a TypeError, a matmul of the wrong shapes)."""
    env_id = fake(name, f"{space}Obs")
    line = refusal(name, capsys, tmp_path, env_id=env_id)
    assert f"{env_id} has observation space " in line and "supports one-dimensional Box observations only" in line


# --CAPTURE-VIDEO ---------------------------------------------------------------------------------


@pytest.mark.parametrize("env", ["FixedLength", "NoDisplay"])
@pytest.mark.parametrize("name", GYMNASIUM)
def test_capture_video_of_an_environment_that_cannot_render_is_refused_before_any_work(name, env, capsys, tmp_path):
    """An environment without an `rgb_array` render mode (FixedLength), or whose rendering fails here (NoDisplay,
    as MuJoCo without EGL): one line before the run starts, not a traceback of gymnasium or of a worker once it
    runs; and the same for `--evaluate --capture-video` of a model of such an environment."""
    env_id = fake(name, env)
    line = refusal(name, capsys, tmp_path, env_id=env_id, capture_video=True)
    if env == "FixedLength":
        assert line.endswith(
            f": error: --capture-video: {env_id} cannot render frames to record (its render modes: none)"
        )
    else:
        assert f": error: --capture-video: {env_id} cannot render here: RuntimeError: cannot open a display" in line
    script = importlib.import_module(name)
    with pytest.raises(SystemExit) as exit_info:
        script.evaluate(fresh_checkpoint(name, env), 1, False, 0, video_prefix=str(tmp_path / "videos" / "model-eval"))
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"--capture-video: the checkpoint's environment {env_id} cannot render" in line


# --EVALUATE OF A CHECKPOINT WHOSE ENVIRONMENT CANNOT BE MADE HERE ---------------------------------


@pytest.mark.parametrize("env_id", ["NoSuchEnv-v9", "no_such_module:Foo-v0"])
@pytest.mark.parametrize("name", GYMNASIUM + ALE)
def test_evaluate_of_a_checkpoint_whose_environment_cannot_be_made_here_is_one_line(name, env_id, capsys, tmp_path):
    """A model trained elsewhere, on an environment this machine does not have: one line naming it, not gymnasium's
    traceback. The environment is made before the weights are read: a checkpoint without weights does."""
    script, path = importlib.import_module(name), tmp_path / "model.pt"
    checkpoint = {"model": {}, "args": asdict(script.Args(env_id=env_id)), "script": f"{name}.py", "format": 3}
    checkpoint.update(
        optimizer={"state": {}, "param_groups": []}, iteration=1, global_step=8, rng=rng_state(torch.device("cpu"))
    )
    torch.save(checkpoint, path)
    line = refusal(name, capsys, tmp_path, evaluate=str(path))
    if ":" in env_id:
        assert f"cannot import the module no_such_module of the checkpoint's environment {env_id}: " in line
    else:
        assert f"cannot make the checkpoint's environment {env_id} here: NameNotFound" in line


# EVALUATIONS END ---------------------------------------------------------------------------------

CUT = "evaluation: an episode cut after {} steps (--eval-max-steps): {} has no time limit of its own"


def fresh_checkpoint(name: str, env: str, **fields) -> dict:
    """What script `name`'s evaluate reads of a checkpoint: an untrained policy for one of the fake environments
    (2-d observations, 2 actions), its arguments (`fields` among them) and, in the continuous scripts, observation
    statistics."""
    script = importlib.import_module(name)
    args = script.Args(env_id=fake(name, env), **fields)
    agent = script.Agent((2,), 2) if name == "ppo_shared_memory_lstm" else script.Agent(2, 2)
    checkpoint = {"args": asdict(args), "model": agent.state_dict()}
    if name in CONTINUOUS:
        checkpoint["obs_rms"] = script.ObsNormalizer((2,), args.obs_clip).rms.state_dict()
    return checkpoint


@pytest.mark.parametrize("name", GYMNASIUM)
def test_an_episode_that_never_ends_is_cut_where_the_environment_has_no_time_limit(name, capsys):
    """Endless never ends an episode (reward 1 per step): its evaluation episodes are cut after the checkpoint's
    --eval-max-steps, or the `max_steps` given (--evaluate's command line), one line each; Constant, the same
    environment with a time limit of 10 steps, ends its own episodes there, whatever the cap, without a line."""
    script = importlib.import_module(name)
    capsys.readouterr()
    assert script.evaluate(fresh_checkpoint(name, "Endless", eval_max_steps=12), 2, False, 5) == [12.0, 12.0]
    assert capsys.readouterr().out.splitlines() == [CUT.format(12, fake(name, "Endless"))] * 2
    assert script.evaluate(fresh_checkpoint(name, "Endless", eval_max_steps=12), 1, True, 5, max_steps=4) == [4.0]
    assert capsys.readouterr().out.splitlines() == [CUT.format(4, fake(name, "Endless"))]
    assert script.evaluate(fresh_checkpoint(name, "Constant", eval_max_steps=3), 2, False, 5) == [10.0, 10.0]
    assert "cut" not in capsys.readouterr().out


@pytest.mark.parametrize("name", ["ppo", "ppo_continuous_action"])
def test_a_run_on_an_environment_that_never_ends_ends_with_the_line(name, tmp_path, capsys):
    """A run whose environment never ends an episode: its evaluations (--eval-every, the final one of --save-model)
    end, each of their episodes cut with a line; --evaluate of the model cuts them at its own --eval-max-steps."""
    script = importlib.import_module(name)
    fields = dict(env_id=fake(name, "Endless"), cuda=False, num_envs=2, num_steps=16, num_minibatches=2)
    fields.update(update_epochs=1, total_timesteps=64, eval_episodes=2, eval_max_steps=25)
    run_dir = script.main(script.Args(**fields, runs_dir=str(tmp_path), eval_every=1, save_model=True))
    out = capsys.readouterr().out
    assert out.count(CUT.format(25, fields["env_id"])) == 2 * 3  # 2 episodes in each of 3 evaluations
    assert f"model saved to {run_dir}/model.pt\n{CUT.format(25, fields['env_id'])}\n" in out
    assert [value for _, value in read_scalars(run_dir)["eval/episodic_return"]] == [25.0] * 6
    returns = script.main(script.Args(evaluate=f"{run_dir}/model.pt", eval_episodes=2, eval_max_steps=7, cuda=False))
    assert returns == [7.0, 7.0] and capsys.readouterr().out.count(CUT.format(7, fields["env_id"])) == 2


# ACTIONS INSIDE THE SPACE ------------------------------------------------------------------------
# StrictActionsEnv (tests/fake_envs.py) raises at an action outside its space: a Discrete(3, start=1), whose actions
# are 1 to 3 where a categorical policy numbers them 0 to 2, and a Box of integers, where a Gaussian policy gives
# floats. ppolab.policy_actions maps the policy's actions onto them exactly (shifted by the start; rounded and clipped)


def strict_env(name: str) -> str:
    return f"tests.fake_envs:{'IntegerActions' if name in CONTINUOUS else 'OffsetActions'}-v0"


def test_the_policys_actions_reach_the_environment_shifted_or_rounded_and_clipped():
    offset = ppolab.policy_actions(gym.make(strict_env("ppo")))
    assert offset.action_space == gym.spaces.Discrete(3)
    offset.reset(seed=0)
    for action in (0, 2, 1):
        offset.step(np.int64(action))
    assert offset.unwrapped.taken == [1, 3, 2]
    rounded = ppolab.policy_actions(gym.make(strict_env("ppo_continuous_action")))
    assert rounded.action_space.dtype == np.float32
    assert (rounded.action_space.low.tolist(), rounded.action_space.high.tolist()) == ([-2, 0], [2, 4])
    rounded.reset(seed=0)
    for action in ([0.4, 3.6], [-9.0, 9.0], [1.5, -0.2]):
        rounded.step(np.array(action, np.float32))
    assert [taken.tolist() for taken in rounded.unwrapped.taken] == [[0, 4], [-2, 4], [2, 0]]
    plain = gym.make("CartPole-v1")
    assert ppolab.policy_actions(plain) is plain  # nothing to map: as it is, no wrapper and no cost


@pytest.mark.parametrize("name", ["ppo", "ppo_continuous_action"])
def test_a_run_trains_and_evaluates_on_actions_it_does_not_number_as_the_environment_does(name, tmp_path):
    """A run on StrictActionsEnv trains to its end and evaluates its model without an action outside the space."""
    script = importlib.import_module(name)
    fields = dict(env_id=strict_env(name), cuda=False, num_envs=2, num_steps=16, num_minibatches=2)
    fields.update(update_epochs=1, total_timesteps=64, eval_episodes=2, save_model=True, runs_dir=str(tmp_path))
    run_dir = script.main(script.Args(**fields))
    assert len(read_scalars(run_dir)["charts/episodic_return"]) >= 64 // FIXED_LENGTH - 2
    assert len(script.main(script.Args(evaluate=f"{run_dir}/model.pt", eval_episodes=2, cuda=False))) == 2


@pytest.mark.parametrize("name", ["ppo_shared_memory_lstm", "ppo_continuous_action_redis"])
def test_the_multi_process_scripts_give_their_processes_and_evaluations_the_mapped_actions(name):
    """The workers' and the samplers' environments (each script's make_envs) and the evaluation's take the policy's
    actions: a Discrete(3) from 0, a float Box of the same bounds, stepped without an action outside the space."""
    script = importlib.import_module(name)
    args = script.Args(env_id=strict_env(name), cuda=False)
    envs = script.make_envs(args, 1, "") if name == "ppo_shared_memory_lstm" else script.make_envs(args, "", 0)
    envs.reset(seed=0)
    if name == "ppo_shared_memory_lstm":
        assert envs.single_action_space == gym.spaces.Discrete(3)
        actions, agent = np.array([2]), script.Agent((2,), 3)
    else:
        assert envs.single_action_space.dtype == np.float32
        actions, agent = np.array([[1.7, 0.2]], np.float32), script.Agent(2, 2)
    envs.step(actions)
    envs.close()
    checkpoint = {"args": asdict(args), "model": agent.state_dict()}
    if name in CONTINUOUS:
        checkpoint["obs_rms"] = script.ObsNormalizer((2,), args.obs_clip).rms.state_dict()
    assert script.evaluate(checkpoint, 2, False, 0) == pytest.approx(script.evaluate(checkpoint, 2, False, 0))


@pytest.mark.parametrize("name", ALE)
def test_an_atari_game_whose_actions_do_not_start_at_0_is_refused_in_one_line(name, capsys, tmp_path):
    """ale-py numbers a game's actions from 0, and so do the Atari scripts' wrappers; a game that does not is
    refused before any work."""
    env_id = "tests.atari_fakes:OffsetActionsAtari-v0"
    line = refusal(name, capsys, tmp_path, env_id=env_id)
    assert f"{env_id} has action space Discrete(4, start=1); {name}.py trains Discrete actions from 0" in line
