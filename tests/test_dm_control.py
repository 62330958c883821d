"""The DeepMind Control Suite in the continuous scripts: `dm_control/<domain>-<task>-v0` ids (through shimmy, their
dict of observations flattened into one vector) train, save, evaluate and resume; an unknown task is one line."""

import subprocess

import pytest

from helpers import load, script_command

TASK = "dm_control/cartpole-balance-v0"  # 5 observations (position 3, velocity 2), 1 action, 1,000 steps


def run(name: str, cwd, *argv) -> subprocess.CompletedProcess:
    return subprocess.run(script_command(name, *argv), cwd=cwd, capture_output=True, text=True, timeout=300)


def test_a_dm_control_task_trains_saves_evaluates_and_resumes(tmp_path):
    small = [
        "--num-steps",
        64,
        "--num-minibatches",
        2,
        "--update-epochs",
        1,
        "--eval-episodes",
        1,
        "--checkpoint-every",
        1,
    ]
    done = run("ppo_continuous_action", tmp_path, "--env-id", TASK, *small, "--total-timesteps", 128, "--save-model")
    assert done.returncode == 0, done.stderr
    (run_dir,) = tmp_path.glob("runs/dm_control-cartpole-balance-v0__*")
    checkpoint = load(run_dir / "checkpoint.pt")
    assert checkpoint["iteration"] == 2 and checkpoint["obs_rms"]["mean"].shape == (5,)  # the flattened vector
    assert "evaluation: 1 episodes, mean return" in done.stdout  # the final evaluation: one whole episode
    resumed = run("ppo_continuous_action", tmp_path, "--resume", run_dir / "checkpoint.pt", "--total-timesteps", 192)
    assert resumed.returncode == 0 and load(run_dir / "checkpoint.pt")["iteration"] == 3, resumed.stderr
    evaluated = run("ppo_continuous_action", tmp_path, "--evaluate", run_dir / "model.pt", "--eval-episodes", 1)
    assert evaluated.returncode == 0 and f"on {TASK}: 1 episodes" in evaluated.stdout, evaluated.stderr


def test_the_redis_samplers_step_a_dm_control_task(tmp_path):
    argv = ["--env-id", TASK, "--num-steps", 64, "--num-chunks", 2, "--num-minibatches", 2, "--update-epochs", 1]
    done = run(
        "ppo_continuous_action_redis",
        tmp_path,
        *argv,
        "--total-timesteps",
        256,
        "--num-samplers",
        1,
        "--checkpoint-every",
        1,
    )
    assert done.returncode == 0, done.stderr
    assert load(next(tmp_path.glob("runs/*/checkpoint.pt")))["iteration"] == 2


@pytest.mark.parametrize("name", ["ppo_continuous_action", "ppo_continuous_action_redis"])
def test_an_unknown_dm_control_task_is_one_line(name, tmp_path):
    done = run(name, tmp_path, "--env-id", "dm_control/cartpole-nosuch-v0")
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert "error: unknown environment id 'dm_control/cartpole-nosuch-v0'" in line
