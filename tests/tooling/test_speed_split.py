"""The speed study's split of a pixel script's rollout into acting and stepping the environments: the loops carry no
timers, so the study times the environments' `step` from outside the script (benchmark.studies.speed's
timed_env_steps), and those seconds are a part of the rollout time the script logs."""

import os
import subprocess
import sys

from benchmark.events import read_scalars
from scripts import REPO


def test_a_timed_run_times_the_environments_steps_inside_the_rollout(tmp_path):
    seconds = tmp_path / "env_seconds"
    argv = ["--num-envs", "2", "--num-steps", "16", "--total-timesteps", "64", "--runs-dir", str(tmp_path / "runs")]
    command = [sys.executable, "-m", "benchmark.studies.speed", "timed-run", "ppo_atari", str(seconds), *argv]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    rollout = sum(value for _, value in read_scalars(run_dir)["perf/rollout_time"])
    assert 0 < float(seconds.read_text()) < rollout
