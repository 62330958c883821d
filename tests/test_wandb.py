"""--track with Weights & Biases in offline mode and no network: a tiny run exits 0, writes an offline run
folder, and the videos that --capture-video recorded are in that run. finish_tracking is the same function
in every script (tests/test_copies.py)."""

import os
import subprocess

from helpers import only_run_dir, script_command


def test_offline_run_with_videos(tmp_path):
    # offline, and every connection attempt would go to a closed port: no network
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        WANDB_MODE="offline",
        WANDB_DIR=str(tmp_path),
        WANDB_SILENT="true",
        HTTPS_PROXY="http://127.0.0.1:9",
        HTTP_PROXY="http://127.0.0.1:9",
        NO_PROXY="",
    )
    env.pop("WANDB_API_KEY", None)
    command = script_command(
        "ppo",
        "--env-id",
        "CartPole-v1",
        "--num-envs",
        1,
        "--num-steps",
        64,
        "--num-minibatches",
        1,
        "--update-epochs",
        1,
        "--total-timesteps",
        128,
        "--track",
        "--capture-video",
    )
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    videos = sorted(p.stem for p in (only_run_dir(tmp_path / "runs") / "videos").glob("*.mp4"))
    assert videos  # CartPole's first episodes are short: episodes 0 and 1 are recorded
    (offline_run,) = (tmp_path / "wandb").glob("offline-run-*")
    assert list(offline_run.glob("run-*.wandb"))
    uploaded = sorted((offline_run / "files" / "media" / "videos").rglob("*.mp4"))
    # wandb names a logged video <key>_<step>_<hash>.mp4
    assert sorted(p.name.rsplit("_", 2)[0] for p in uploaded) == videos
    assert all(p.stat().st_size > 1000 for p in uploaded)
