"""Tracking: the run's TensorBoard writer (`tensorboard_writer`) and, with --track, its Weights & Biases run
(`start_tracking`, `finish_tracking`)."""

import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

from ppolab.checks import program

# how long `--track` waits for Weights & Biases to start a run before it gives up (WANDB_INIT_TIMEOUT overrides it)
TRACKING_TIMEOUT = 30.0


def tensorboard_writer(run_dir: str, hyperparameters: dict):
    """The run's TensorBoard writer, its events in `run_dir`, with the text `hyperparameters`: a table of
    `hyperparameters` (name -> value)."""
    from torch.utils.tensorboard import SummaryWriter

    # events reach the file within flush_secs, ten seconds (TensorBoard's default: two minutes), so that a reader
    # follows the run as it goes: TensorBoard itself, and benchmark.tune, which stops a bad trial from its scores so far
    writer = SummaryWriter(run_dir, flush_secs=10)
    writer.add_text(
        "hyperparameters",
        "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in hyperparameters.items()),
    )
    return writer


def start_tracking(args, run_dir: str):
    """`--track`: starts the Weights & Biases run, its files in the run folder (`wandb/`, unless WANDB_DIR says
    elsewhere), not in the working directory. Without a network it gives up after TRACKING_TIMEOUT seconds, then
    the run ends in one line (exit 1) and leaves no files behind. Started before the TensorBoard writer, whose
    scalars it syncs. The line says how long it waited: Weights & Biases adds its own checks (its login asks the
    server for the user) to the timeout."""
    import wandb  # imported only when used

    folder = os.environ.get("WANDB_DIR") or run_dir
    timeout = float(os.environ.get("WANDB_INIT_TIMEOUT", TRACKING_TIMEOUT))
    started = time.monotonic()
    try:
        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=asdict(args),
            name=Path(run_dir).name,
            save_code=True,
            dir=folder,
            settings=wandb.Settings(init_timeout=timeout),
        )
    except Exception as e:  # wandb's errors have no common class
        if folder == run_dir:
            shutil.rmtree(Path(run_dir, "wandb"), ignore_errors=True)
        reason = (str(e).splitlines() or [type(e).__name__])[0]
        waited = f"{time.monotonic() - started:.0f}s, its timeout {timeout:g}s (WANDB_INIT_TIMEOUT) and its checks"
        print(
            f"{program()}: error: --track: Weights & Biases did not start a run in {waited} ({reason}); "
            "train without --track, or offline with WANDB_MODE=offline (then `wandb sync` the run later)",
            file=sys.stderr,
        )
        raise SystemExit(1) from None


def finish_tracking(run_dir: str):
    """`--track`: ends the Weights & Biases run, with the videos that `--capture-video` recorded under
    `run_dir/videos` added to it first (shown in its media panel; the TensorBoard scalars are synced as
    they are written)."""
    import wandb  # imported only when used

    for video in sorted(Path(run_dir, "videos").glob("*.mp4")):
        wandb.log({f"videos/{video.stem}": wandb.Video(str(video), format="mp4")})
    wandb.finish()
