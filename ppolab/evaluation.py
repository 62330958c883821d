"""Evaluation of a saved policy: `evaluate_saved` plays a checkpoint's policy on the run's evaluation seed (during
training, at its end, and later), and `evaluate_file` is --evaluate PATH, which scores a saved file."""

import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ppolab.checkpoints import load_checkpoint, non_finite
from ppolab.checks import fail, program
from ppolab.environments import print_held_mujoco_warnings
from ppolab.settings import script_of
from ppolab.stops import is_write_error

# An evaluation plays the episodes of the seed `args.seed + EVAL_SEED_OFFSET`, its own seeded stream: the same
# episodes for every evaluation of a run, whether during training, at its end or later from the saved file
EVAL_SEED_OFFSET = 100_000


def evaluate_saved(
    checkpoint: dict, evaluate: Callable, episodes: int, deterministic: bool, video_prefix: str | None = None
) -> list[float]:
    """The returns of `episodes` episodes played by the policy of `checkpoint` (a saved file, or a snapshot of
    the training), through the script's `evaluate(checkpoint, episodes, deterministic, seed, *, video_prefix)`,
    on the run's evaluation seed. PyTorch's generator is left as it was: the training's random streams do not
    see the evaluation."""
    seed = checkpoint["args"]["seed"] + EVAL_SEED_OFFSET
    with torch.random.fork_rng(devices=[]):
        return evaluate(checkpoint, episodes, deterministic, seed, video_prefix=video_prefix)


def evaluate_file(args, evaluate: Callable, env_name: Callable[[str], str] = str) -> list[float]:
    """`--evaluate PATH`: scores a saved model or checkpoint on the environment it was trained on, with the
    run's evaluation episodes (those of the evaluation reported right after training), and returns the returns.
    With --capture-video every episode is recorded into `videos/` beside the file."""
    path = args.evaluate
    print_held_mujoco_warnings()  # an evaluation has no run folder to print first: MuJoCo's warnings print as they come
    checkpoint = load_checkpoint(path, script_of(args), type(args))
    # what the policy plays with: its weights and its statistics (observation normalisation, ...), not the optimizer
    played = {name: value for name, value in checkpoint.items() if name not in ("optimizer", "rng", "args")}
    problem = non_finite(played)
    if problem is not None:
        what = "weights" if problem.startswith("model.") else "statistics"
        fail(f"{path} holds {what} that are not finite ({problem}): its run diverged; evaluate an earlier one")
    video_prefix = str(Path(path).parent / "videos" / f"{Path(path).stem}-eval") if args.capture_video else None
    try:
        returns = evaluate_saved(
            checkpoint,
            evaluate,
            episodes=args.eval_episodes,
            deterministic=args.eval_deterministic,
            video_prefix=video_prefix,
        )
    except RuntimeError as e:  # the script's model.load_state_dict, which checks every name and shape first
        if not str(e).startswith("Error(s) in loading state_dict"):
            raise
        detail = str(e).splitlines()[1].strip().rstrip(".") if len(str(e).splitlines()) > 1 else str(e)
        fail(f"{path} does not fit this script's model: {detail} (was the script changed?)")
    except OSError as e:
        if video_prefix is None or not is_write_error(e, str(Path(video_prefix).parent)):
            raise
        print(
            f"{program()}: error: cannot write the videos into {Path(video_prefix).parent}: {e.strerror}",
            file=sys.stderr,
        )
        raise SystemExit(1) from None
    print(
        f"evaluation of {path} on {env_name(checkpoint['args']['env_id'])}: {len(returns)} episodes, "
        f"mean return {np.mean(returns):.2f} +- {np.std(returns):.2f}"
    )
    if video_prefix is not None:
        videos = sorted(Path(video_prefix).parent.glob(f"{Path(video_prefix).name}-*.mp4"))
        print(f"videos of the evaluation in {Path(video_prefix).parent}: {', '.join(v.name for v in videos)}")
    return returns
