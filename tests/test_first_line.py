"""What a user sees first: every script, on its default task, prints its run folder before anything else (stdout and
stderr together, in the order they were written), a library's warning included: Gymnasium's warning that a v4 task is
out of date becomes one plain line after the folder. The same runs, started with Python's import timing on, show
what the program imports: not PyTorch's compiler (torch._dynamo), which a run that does not compile has no use for
(ppolab.compiler)."""

import os
import re
import subprocess

import pytest

from helpers import RUNS, batch_size, script_command
from scripts import SCRIPTS


def flags(config: dict) -> list[str]:
    """A run's Args (tests/helpers.RUNS, its env id left out: the script's default task) as command-line flags."""
    argv = []
    for name, value in config.items():
        if name == "env_id":
            continue
        flag = "--" + name.replace("_", "-")
        argv += ([flag] if value else [f"--no-{name.replace('_', '-')}"]) if isinstance(value, bool) else [flag, value]
    return argv


def output_lines(name: str, folder, *argv, **environment) -> list[str]:
    """The lines a successful run of script `name` writes (stdout and stderr together, in the order written), run in
    `folder` on one thread, with `environment` added to the process's environment variables."""
    result = subprocess.run(
        script_command(name, *argv),
        cwd=folder,
        env=dict(os.environ, OMP_NUM_THREADS="1", **environment),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    return result.stdout.splitlines()


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_first_line_of_a_default_run_is_its_run_folder_and_nothing_compiles(name, tmp_path):
    config = RUNS[name]
    argv = [*flags(config), "--total-timesteps", batch_size(config), "--runs-dir", tmp_path / "runs"]
    output = output_lines(name, tmp_path, *argv, PYTHONPROFILEIMPORTTIME="1")
    imports = [line.rsplit("|", 1)[-1].strip() for line in output if line.startswith("import time:")]
    assert "torch" in imports  # (the import timing is on)
    assert "torch._dynamo" not in imports, "PyTorch's compiler was imported"  # (by a process the script started too)
    lines = [line for line in output if not line.startswith("import time:")]
    assert re.fullmatch(rf"run folder: {re.escape(str(tmp_path / 'runs'))}/\S+", lines[0]), lines[:3]
    assert not any("\x1b[" in line for line in output)  # no terminal colour codes from a library's warning
    if "Hopper-v4" in lines[0]:
        assert "note: Gymnasium has a newer version of Hopper-v4, Hopper-v5; this run trains Hopper-v4" in lines


def test_mujocos_own_warning_comes_once_after_the_run_folder_and_in_an_evaluation(tmp_path):
    """MuJoCo prints its warnings from C: HalfCheetah's model (a deprecated compiler attribute) printed one before the
    run folder each time it was made; now each distinct warning is one line after the run's first lines. An
    evaluation, which prints no run folder, holds none back."""

    def run(*argv) -> list[str]:
        lines = output_lines("ppo_continuous_action", tmp_path, "--env-id", "HalfCheetah-v4", *argv)
        warned = [line for line in lines if "settotalmass" in line]
        assert len(warned) == 1 and warned[0].startswith("MuJoCo warning: compiler attribute 'settotalmass'"), warned
        return lines

    lines = run("--total-timesteps", "2048", "--save-model", "--runs-dir", tmp_path / "runs")
    assert lines[0].startswith(f"run folder: {tmp_path / 'runs'}/HalfCheetah-v4__"), lines[:3]
    (model,) = (tmp_path / "runs").glob("*/model.pt")
    run("--evaluate", model, "--eval-episodes", "1")


def test_the_redis_learner_and_its_sampler_print_mujocos_warning_once_after_their_first_line(tmp_path):
    """The Redis learner checks its environment before the run folder and makes it again to train; a sampler makes its
    own: MuJoCo's warning is one plain line after the learner's first lines, and one after the sampler's "joined"
    line, never MuJoCo's own print before them."""
    argv = ["--env-id", "HalfCheetah-v4", "--num-samplers", "1", "--num-chunks", "2", "--num-steps", "64"]
    argv += ["--num-minibatches", "2", "--update-epochs", "1", "--total-timesteps", "128", "--runs-dir", tmp_path]
    lines = output_lines("ppo_continuous_action_redis", tmp_path, *argv)
    assert lines[0].startswith(f"run folder: {tmp_path}/HalfCheetah-v4__"), lines[:3]
    warned = [i for i, line in enumerate(lines) if "settotalmass" in line]
    assert all(lines[i].startswith("MuJoCo warning: compiler attribute 'settotalmass'") for i in warned), lines
    after = [lines[i - 1].split()[0] if lines[i - 1].startswith("sampler") else "learner" for i in warned]
    assert after == ["learner", "sampler"], lines  # (the one sampler must join: the run needs its chunks)
    assert lines[warned[0] - 1].startswith("note: Gymnasium has a newer version of HalfCheetah-v4"), lines
