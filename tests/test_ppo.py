"""ppo.py's own tests (besides the topic tests that run on every script, and test_end_to_end.py, which runs it
and ppo_continuous_action.py from the command line): a video of CartPole, a run killed by SIGKILL and resumed
from its last checkpoint, a resume that trains longer with the learning rate of the new total."""

import signal
import time

import pytest

import ppo
from helpers import REAL_ENV, load, only_run_dir, read_scalars, resume_args, run_script, start_script


def test_capture_video(tmp_path):
    result = run_script(
        "ppo", "--env-id", "CartPole-v1", "--total-timesteps", 128, "--num-steps", 32, "--capture-video", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert list((only_run_dir(tmp_path / "runs") / "videos").glob("*.mp4"))


def test_resume_after_sigkill(tmp_path):
    total, batch = 3000, 4 * 32
    proc = start_script(
        "ppo",
        "--env-id",
        REAL_ENV["ppo"],
        "--total-timesteps",
        total,
        "--num-steps",
        32,
        "--checkpoint-every",
        1,
        "--save-model",
        "--eval-episodes",
        1,
        "--runs-dir",
        tmp_path,
        cwd=tmp_path,
    )
    deadline = time.time() + 120
    while not list(tmp_path.glob("*/checkpoint.pt")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    run_dir = only_run_dir(tmp_path)
    assert not (run_dir / "model.pt").exists()
    killed_at = load(run_dir / "checkpoint.pt")["global_step"]
    assert killed_at < total // batch * batch

    result = run_script("ppo", "--resume", run_dir / "checkpoint.pt", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "resumed from" in result.stdout
    assert load(run_dir / "model.pt")["global_step"] == total // batch * batch


def test_resume_with_a_larger_total_trains_on_with_the_learning_rate_of_the_new_total(tmp_path):
    """ppo.py trained 2 iterations, resumed with --total-timesteps for 4: 2 more, annealed over 4."""
    fields = dict(env_id="CartPole-v1", num_envs=2, num_steps=16, num_minibatches=2, update_epochs=1, cuda=False)
    run_dir = ppo.main(ppo.Args(runs_dir=str(tmp_path), total_timesteps=2 * 32, checkpoint_every=1, **fields))
    ppo.main(resume_args(ppo, f"{run_dir}/checkpoint.pt", total_timesteps=4 * 32, cuda=False))
    assert load(f"{run_dir}/checkpoint.pt")["global_step"] == 4 * 32
    rates = read_scalars(run_dir)["charts/learning_rate"]
    lr = ppo.Args().learning_rate
    assert [step for step, _ in rates] == [32, 64, 96, 128]
    assert [rate for _, rate in rates] == pytest.approx([lr, lr / 2, lr / 2, lr / 4], rel=1e-6)
