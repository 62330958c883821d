"""Bad input ends in one line: the checks every script makes before any long work, and `fail`."""

import json
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ppolab.program import program  # (the name a line starts with; every module takes it from here)


def fail(message: str):
    """Bad input: one line on stderr naming the problem, exit code 2, before any long work. Under torchrun
    the line also goes to torchrun's summary of the failed ranks (see tell_torchrun)."""
    line = f"{program()}: error: {message}"
    print(line, file=sys.stderr)
    tell_torchrun(line)
    raise SystemExit(2)


def tell_torchrun(line: str):
    """Under torchrun: writes `line` to this rank's error file (TORCHELASTIC_ERROR_FILE), which torchrun
    reads when the rank fails: its ChildFailedError summary then shows the line as the rank's
    `traceback :` instead of a link to its documentation. Without torchrun: nothing."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        with open(path, "w") as f:
            # the layout of torch.distributed.elastic's own error files (its @record decorator writes them)
            json.dump(
                {"message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))}}},
                f,
            )


def flag(name: str) -> str:
    """`num_envs` -> `--num-envs`"""
    return f"--{name.replace('_', '-')}"


def listed(names) -> str:
    """`--a`, `--a and --b`, `--a, --b and --c`"""
    flags = [flag(name) for name in names]
    return flags[0] if len(flags) == 1 else f"{', '.join(flags[:-1])} and {flags[-1]}"


def check_numbers(args):
    """Every number within its meaning, named with its range in the error: a gamma of 1.5, a negative clip
    coefficient or a NaN learning rate trains without an error, on nonsense."""
    for name, value in asdict(args).items():
        if isinstance(value, float) and not math.isfinite(value):
            fail(f"{flag(name)} must be a finite number, got {value}")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > LARGEST:
            fail(f"{flag(name)} {value} is too large: at most {LARGEST} (what a run's step and time counts can hold)")
        if isinstance(value, str) and not encodable(value):
            fail(
                f"{flag(name)} {ascii(value)} holds bytes that are not UTF-8 (the run's files and logs name it in UTF-8)"
            )
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if getattr(args, "torch_threads", 0) > 4 * threads:
        fail(
            f"--torch-threads {args.torch_threads} is more than 4 x the {threads} CPUs this process may use: pass at "
            f"most {4 * threads} (more threads than CPUs only slow PyTorch down)"
        )
    for name, valid, meaning in (
        (
            "seed",
            0 <= args.seed <= 1_000_000_000,
            "from 0 to 1000000000 (NumPy seeds and the per-environment offsets added to it must stay below 2**31)",
        ),
        ("learning_rate", args.learning_rate > 0, "positive"),
        ("gamma", 0 <= args.gamma <= 1, "in [0, 1] (a discount factor)"),
        ("gae_lambda", 0 <= args.gae_lambda <= 1, "in [0, 1]"),
        ("clip_coef", args.clip_coef > 0, "positive (the ratio is clipped to [1 - clip_coef, 1 + clip_coef])"),
        ("ent_coef", args.ent_coef >= 0, "zero or positive"),
        ("vf_coef", args.vf_coef >= 0, "zero or positive"),
        ("max_grad_norm", args.max_grad_norm > 0, "positive"),
        ("target_kl", args.target_kl is None or args.target_kl > 0, "positive (or not given)"),
        ("kl_target", args.kl_target > 0, "positive (adaptive-kl's target KL per update)"),
        ("kl_beta", args.kl_beta >= 0, "zero or positive (the KL penalty's coefficient)"),
        (
            "kl_beta",
            args.kl_beta > 0 or args.policy_objective != "adaptive-kl",
            "positive with --policy-objective adaptive-kl (halved or doubled, a beta of 0 would stay 0)",
        ),
    ):
        if not valid:
            fail(f"{flag(name)} must be {meaning}, got {getattr(args, name)}")


# The largest whole number a flag may hold: a trillion steps, far beyond any run, and what the bookkeeping (step
# counts in 64-bit integers, the time left in days) holds with room to spare
LARGEST = 10**12


def encodable(text: str) -> bool:
    """`text` is valid Unicode (a command-line argument with a byte that is not UTF-8 holds a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# What the renderers' variables may hold on this platform: MuJoCo reads MUJOCO_GL when its first environment is made
# (with or without rendering), PyOpenGL reads PYOPENGL_PLATFORM; another value ends the run in their traceback
MUJOCO_GL = {"linux": ("egl", "osmesa", "glx"), "darwin": ("cgl",), "win32": ("wgl",)}.get(sys.platform, ())
MUJOCO_GL += ("glfw", "disable", "disabled", "off", "false", "0", "enable", "enabled", "on", "true", "1", "")
PYOPENGL_PLATFORM = ("egl", "osmesa", "glx", "x11", "linux", "posix", "wayland", "xwayland", "nt", "darwin", "")


def check_environment_variables():
    """MUJOCO_GL and PYOPENGL_PLATFORM, where set, hold values that MuJoCo and PyOpenGL can use here, and agree (MuJoCo's
    egl and osmesa need PyOpenGL's same platform); else one line naming the variable and what would work."""
    mujoco_gl = os.environ.get("MUJOCO_GL", "").lower().strip()
    platform = os.environ.get("PYOPENGL_PLATFORM", "").lower().strip()
    if mujoco_gl not in MUJOCO_GL:
        fail(
            f"the environment variable MUJOCO_GL={ascii(os.environ['MUJOCO_GL'])[1:-1]} is not a renderer MuJoCo has "
            f"here: set it to one of {', '.join(MUJOCO_GL[:4])} (egl needs no display), or unset it"
        )
    if platform not in PYOPENGL_PLATFORM:
        fail(
            f"the environment variable PYOPENGL_PLATFORM={ascii(os.environ['PYOPENGL_PLATFORM'])[1:-1]} is not a "
            "platform PyOpenGL has: set it to egl, osmesa or glx, or unset it"
        )
    if mujoco_gl in ("egl", "osmesa") and platform not in ("", mujoco_gl):
        fail(f"MUJOCO_GL={mujoco_gl} needs PYOPENGL_PLATFORM={mujoco_gl} (or unset), not {platform}")


# the counts every script has that must be positive (the scripts name their own besides)
POSITIVE = (
    "total_timesteps",
    "num_envs",
    "num_steps",
    "num_minibatches",
    "update_epochs",
    "eval_episodes",
    "eval_max_steps",
)


def check_args(
    args,
    *,
    positive: tuple = (),
    non_negative: tuple = (),
    world_size: int = 1,
    batch: str | None = None,
    whole_sequences: bool = False,
    files_here: bool = True,
):
    """The checks every script makes, in this order: the numbers (check_numbers), the counts that must be
    positive (POSITIVE, those of them the script has, then `positive`), those that must not be negative
    (--checkpoint-every, --torch-threads, then `non_negative`), that the `world_size` of a job of processes that
    share --num-envs (torchrun's) divides it, that --num-minibatches divides the batch (`batch` says what the
    batch is made of; by default "--num-envs 4 x --num-steps 128" where the script has --num-envs; None
    otherwise: the script checks that itself), or with `whole_sequences` (a minibatch is a set of whole
    environment sequences) that it divides --num-envs, into minibatches of at least 2, --cudagraphs with CUDA, a
    first iteration, --eval-every, --track's login, --runs-dir, and that --resume and --evaluate name files
    (where they are read: `files_here`; under torchrun only rank 0 reads them)."""
    check_numbers(args)
    check_environment_variables()
    for name in [name for name in POSITIVE if hasattr(args, name)] + list(positive):
        if getattr(args, name) <= 0:
            fail(f"{flag(name)} must be positive, got {getattr(args, name)}")
    non_negative = ("checkpoint_every", "torch_threads", *non_negative)
    if any(getattr(args, name) < 0 for name in non_negative):
        fail(f"{listed(non_negative)} must not be negative")
    if world_size > 1 and args.num_envs % world_size != 0:
        fail(
            f"the world size {world_size} does not divide --num-envs {args.num_envs} (the global number of "
            f"environments); pass a multiple of {world_size}"
        )
    if batch is None and hasattr(args, "num_envs") and not whole_sequences:
        batch = f"--num-envs {args.num_envs} x --num-steps {args.num_steps}"
    if batch is not None and args.batch_size % args.num_minibatches != 0:
        fail(f"--num-minibatches {args.num_minibatches} does not divide the batch size {args.batch_size} ({batch})")
    if whole_sequences and args.num_envs % args.num_minibatches != 0:
        fail(
            f"--num-minibatches {args.num_minibatches} does not divide --num-envs {args.num_envs} "
            "(a minibatch is a set of whole environment sequences)"
        )
    if args.batch_size // args.num_minibatches < 2:
        fail(
            f"--num-minibatches {args.num_minibatches} leaves minibatches of one sample (batch size "
            f"{args.batch_size}); at least 2 are needed (advantages are normalised by their std)"
        )
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs CUDA (no CUDA device here, or --no-cuda); --compile works on the CPU")
    if args.num_iterations == 0 and args.resume is None:  # a resume: resume_args checks the total
        fail(f"--total-timesteps {args.total_timesteps} is less than one batch ({args.batch_size} steps)")
    if args.eval_every < 0:
        fail(f"--eval-every must not be negative, got {args.eval_every}")
    check_tracking(args)
    if args.resume is None and args.evaluate is None:
        check_runs_dir(args.runs_dir)
    for name in ("resume", "evaluate") if files_here else ():
        path = getattr(args, name)
        if path is not None and not Path(path).is_file():
            fail(f"{flag(name)}: no such file: {path}")


def check_tracking(args):
    """`--track` needs a Weights & Biases login (or offline mode): checked before any work, without the network."""
    if not args.track or os.environ.get("WANDB_MODE") in ("offline", "disabled"):
        return
    import wandb  # imported only when used

    if not wandb.login(prompt=False, verify=False):
        fail(
            "--track: not logged in to Weights & Biases; run `wandb login` (or set WANDB_API_KEY), or track "
            "offline with WANDB_MODE=offline (then `wandb sync` the run folder's wandb/ later)"
        )


def check_runs_dir(runs_dir: str):
    """--runs-dir must be a folder that exists or can be created (checked before any work; make_run_dir
    reports what the OS says if creating it fails all the same)."""
    path = Path(runs_dir).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        fail(f"--runs-dir {runs_dir} cannot be created: {path} is {'a file' if path.is_file() else 'not writable'}")
