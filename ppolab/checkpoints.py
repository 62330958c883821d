"""Checkpoints: what a run saves and how it is read back, as data only, and the rules of --resume.

A checkpoint is a dict of tensors, numbers, strings, lists and dicts: the `state_dict()` of each object the
script saves (`model`, `optimizer`, and a script's own, such as `obs_rms`), `iteration`, `global_step`,
`args`, `script` (the file that wrote it), `format` and `rng` (the random states, CUDA's too where it is used).
`torch.load(..., weights_only=True)` reads it, so opening one never runs code from it.
"""

import dataclasses
import io
import math
import os
import pickle
import random
import zipfile
import zlib
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from ppolab.checks import fail, flag
from ppolab.settings import script_of

# the layout of the dict checkpoint_data makes; read_checkpoint refuses others (1: before checkpoints named
# their script and format; 2: NumPy arrays in the RNG state and statistics, read as data and converted by
# as_data)
CHECKPOINT_FORMAT = 3
# Flags a script no longer has, with the value at which they changed nothing: a checkpoint written before one went
# is read as if it never had it when it holds that value, and refused in one line otherwise
RETIRED_FLAGS = {"ppo_atari_multigpu.py": {"straggler_delay": 0.0}}  # a test aid, now injected by the tests


def device_of(saved: dict) -> torch.device:
    return next(saved["model"].parameters()).device


def checkpoint_data(saved: dict, args, iteration: int, global_step: int, **extras) -> dict:
    """Everything needed to continue or to evaluate, as data: the state_dict() of every object in `saved`
    (name -> object: `model`, `optimizer`, and the script's own; a tensor as it is), progress, args, the script, the format and
    the RNG states, plus `extras`. The tensors are the objects' own (a state_dict does not copy them): write
    the dict or read it before the objects change."""
    checkpoint = {name: obj if isinstance(obj, torch.Tensor) else obj.state_dict() for name, obj in saved.items()}
    checkpoint.update(
        iteration=iteration,
        global_step=global_step,
        args=asdict(args),
        script=script_of(args),
        format=CHECKPOINT_FORMAT,
        rng=rng_state(device_of(saved)),
        **extras,
    )
    return checkpoint


def non_finite(value, name: str = "") -> str | None:
    """Where `value` (a checkpoint, or any part of one: dicts, lists, tensors, numbers) holds a NaN or an infinity:
    the first such entry's name (`model.critic.0.weight`), or None when every number is finite."""
    if isinstance(value, torch.Tensor):
        return name if value.is_floating_point() and not bool(torch.isfinite(value).all()) else None
    if isinstance(value, float):
        return None if math.isfinite(value) else name
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        found = non_finite(item, f"{name}.{key}" if name else str(key))
        if found is not None:
            return found
    return None


def write_checkpoint_file(checkpoint: dict, path: str):
    """Writes `checkpoint` so that a kill or a power loss at any moment leaves the previous file or the new
    one, whole: written to `path.tmp` (replacing one a killed run left), flushed to the disk, renamed over
    `path`, the rename flushed too (the folder's entry); then any other stale `*.pt.tmp` of the folder goes.
    A write the file system refuses (disk full, file too large, read-only) removes `path.tmp` and raises
    the OSError, naming `path`; the previous checkpoint stays as it was."""
    data = io.BytesIO()
    torch.save(checkpoint, data)  # in memory first: a failed write is then the file system's OSError
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, path) from None
    folder = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    for stale in Path(path).parent.glob("*.pt.tmp"):
        stale.unlink(missing_ok=True)


def as_data(value):
    """`value` with NumPy arrays and numbers as tensors, inside dicts, lists and tuples: what a checkpoint may
    hold (read_checkpoint reads nothing else)."""
    if isinstance(value, (np.ndarray, np.generic)):
        return torch.tensor(value)  # a copy, with the same dtype
    if isinstance(value, dict):
        return {key: as_data(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(as_data(item) for item in value)
    return value


def rng_state(device: torch.device) -> dict:
    """The random states a resumed run continues from, as data (NumPy's key as int64: uint32 tensors do not
    pickle); CUDA's too when the run uses it."""
    kind, key, *rest = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(key.astype(np.int64)), *rest),
        "python": random.getstate(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device):
    torch.set_rng_state(state["torch"])
    kind, key, *rest = state["numpy"]
    np.random.set_state((kind, key.numpy().astype(np.uint32), *rest))
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


# What a checkpoint of format 2 holds besides data: NumPy arrays and numbers (its NumPy RNG state, its
# statistics). Reading one allows these NumPy types and nothing else; as_data then converts them
FORMAT_2_NUMPY = [
    np.ndarray,
    np.dtype,
    np._core.multiarray._reconstruct,
    np._core.multiarray.scalar,
    np.dtypes.UInt32DType,
    np.dtypes.Float64DType,
]


def damaged(path: str) -> str | None:
    """What is wrong with the torch archive (a zip file) at `path`, in words, if its bytes are not those that were
    written: an entry whose CRC-32 (which the archive holds for each entry) does not match its bytes, or a broken
    archive structure. None where every entry checks. torch.load itself does not check them: a tensor's bytes
    changed on the disk would be read as they are."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()  # reads every entry, checking its CRC-32
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as e:
        return f"its archive is broken ({e})"
    return None if bad is None else f"the CRC-32 of its entry {bad} does not match its bytes"


def read_checkpoint(path: str, script: str, Args=None, *, unchecked: bool = False) -> dict | str:
    """Reads a checkpoint written by `script` (`ppo.py`), as data only: its bytes checked first (the CRC-32 of each
    entry of a torch archive, `damaged`), then torch.load with weights_only=True, which rebuilds tensors, numbers,
    strings, lists and dicts and refuses anything else, so opening a file never runs code from it; then its layout
    (`layout_problem`, with its arguments against `Args` where given). Returns the problem, in words,
    if the file is not a checkpoint (empty or truncated, damaged, holding code or other objects, of another
    script, of another format, of another layout) or has no checksums to check (a legacy torch.save file, read only
    when `unchecked`: `python -m ppolab.rewrite_checkpoint`)."""
    head = b""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            complete = zipfile.is_zipfile(f)  # a zip archive ends with the record of its directory: not a truncated one
        if head == b"PK\x03\x04" and complete:
            problem = damaged(path)
            if problem is not None:
                return (
                    f"{path} is damaged: {problem} (its bytes changed after it was written, on the disk or in a "
                    "copy); nothing in it was used: use another checkpoint, or a copy of this one that is whole"
                )
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:  # format 2 holds NumPy arrays: allowed for this read, nothing else
            with torch.serialization.safe_globals(FORMAT_2_NUMPY):
                checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        if head.startswith((b"PK", b"\x80")):  # a torch file or a pickle, holding more than data
            return (
                f"{path} holds code or objects that a checkpoint does not hold (a checkpoint is tensors, "
                "numbers, strings, lists and dicts): refused, nothing in it was run"
            )
        return f"{path} is not a checkpoint (torch.load: UnpicklingError)"
    except Exception as e:
        if head == b"PK\x03\x04" or not head:  # torch.save writes a zip archive: this one has no end
            return f"{path} is empty or truncated: not a complete checkpoint (was its run killed while writing it?)"
        return f"{path} is not a checkpoint (torch.load: {type(e).__name__})"
    if not isinstance(checkpoint, dict) or "model" not in checkpoint or "args" not in checkpoint:
        return f"{path} is not a checkpoint (a file saved by torch, without model and args)"
    writer = checkpoint.get("script")
    if writer is None:
        return (
            f"{path} is a checkpoint from before format 2 (older checkpoints do not say which script wrote "
            "them); retrain, or read it with the version of the scripts that wrote it"
        )
    if writer != script:
        return f"{path} was written by {writer}, not {script}: pass it to {writer}"
    if checkpoint.get("format") == 2:
        checkpoint = {**as_data(checkpoint), "format": CHECKPOINT_FORMAT}
    if checkpoint.get("format") != CHECKPOINT_FORMAT:
        return (
            f"{path} has checkpoint format {checkpoint.get('format')}; this {script} reads formats 2 and "
            f"{CHECKPOINT_FORMAT}"
        )
    retired = RETIRED_FLAGS.get(script, {}) if isinstance(checkpoint["args"], dict) else {}
    for name, neutral in retired.items():
        if name in checkpoint["args"] and checkpoint["args"][name] != neutral:
            return (
                f"{path} was trained with {flag(name)} {checkpoint['args'][name]}, which this {script} no longer "
                "has: read it with the version of the script that wrote it"
            )
        checkpoint["args"] = {key: value for key, value in checkpoint["args"].items() if key != name}
    problem = layout_problem(checkpoint, Args)
    if problem is not None:
        return f"{path} is not a checkpoint of this {script}: {problem}"
    if head != b"PK\x03\x04" and not unchecked:  # torch.save's legacy format: no checksum of any entry
        return (
            f"{path} is a legacy torch.save file, without the per-entry checksums that show its bytes are those "
            f"written: refused; if you trust it, python -m ppolab.rewrite_checkpoint {path} NEW.pt writes a "
            "checked copy"
        )
    return checkpoint


# What every checkpoint holds besides the script's objects, and the type of each
REQUIRED = {"model": dict, "optimizer": dict, "iteration": int, "global_step": int, "args": dict, "rng": dict}


def layout_problem(checkpoint: dict, Args=None) -> str | None:
    """What in `checkpoint` is not laid out as checkpoint_data lays it out, in words (None: nothing): the entries
    every checkpoint holds, of their types; the model's entries tensors; the optimizer's `state` and
    `param_groups`; the random states (`rng_problem`, and each rank's in `rank_rng`); with `Args` (the reading
    script's), its arguments: one that `Args` does not have (one it has that the checkpoint lacks is taken at its
    default: missing_arguments)."""
    for name, kind in REQUIRED.items():
        if name not in checkpoint:
            return f"it has no {name}"
        if not isinstance(checkpoint[name], kind) or isinstance(checkpoint[name], bool):
            return f"its {name} is a {type(checkpoint[name]).__name__}, not a {kind.__name__}"
    if checkpoint["iteration"] < 0 or checkpoint["global_step"] < 0:
        return "its iteration or global step is negative"
    bad = [key for key, value in checkpoint["model"].items() if not isinstance(value, torch.Tensor)]
    if bad:
        return f"its model entry {bad[0]} is not a tensor"
    optimizer = checkpoint["optimizer"]
    if not isinstance(optimizer.get("state"), dict) or not isinstance(optimizer.get("param_groups"), list):
        return "its optimizer has no state and param_groups (an optimizer's state_dict)"
    for states in [checkpoint["rng"], *checkpoint.get("rank_rng", [])]:
        problem = rng_problem(states)
        if problem is not None:
            return f"its random states: {problem}"
    if Args is not None:
        fields = {field.name for field in dataclasses.fields(Args)}
        unknown = [name for name in checkpoint["args"] if name not in fields]
        if unknown:
            return f"its arguments hold {flag(unknown[0])}, which this script does not have (another version of it?)"
    return None


def missing_arguments(checkpoint: dict, Args) -> list[str]:
    """The arguments of `Args` that a checkpoint does not hold (one written before they existed): a resume takes
    the script's defaults for them, and says so in one line (ppolab.parse)."""
    return [field.name for field in dataclasses.fields(Args) if field.name not in checkpoint["args"]]


def rng_problem(states) -> str | None:
    """What in `states` is not the random states rng_state saves (those set_rng_state sets), in words; None."""
    if not isinstance(states, dict) or not {"torch", "numpy", "python"} <= set(states):
        return "not a dict of the torch, numpy and python states"
    for name in ("torch", "cuda"):
        state = states.get(name, torch.zeros(1, dtype=torch.uint8))
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.dim() != 1:
            return f"{name}'s is not a byte tensor"
    numpy_state, python_state = states["numpy"], states["python"]
    if not (
        isinstance(numpy_state, (tuple, list))
        and len(numpy_state) == 5
        and numpy_state[0] == "MT19937"
        and isinstance(numpy_state[1], torch.Tensor)
        and numpy_state[1].shape == (624,)
        and not numpy_state[1].is_floating_point()
        and bool(((numpy_state[1].long() >= 0) & (numpy_state[1].long() < 2**32)).all())  # (uint32 has no >=)
        and all(isinstance(value, int) for value in numpy_state[2:4])
        and isinstance(numpy_state[4], float)
    ):
        return "numpy's is not an MT19937 state"
    if not (
        isinstance(python_state, (tuple, list))
        and len(python_state) == 3
        and isinstance(python_state[1], (tuple, list))
        and len(python_state[1]) == 625
        and all(isinstance(value, int) and 0 <= value < 2**32 for value in python_state[1][:624])
        and isinstance(python_state[1][624], int)
        and 0 <= python_state[1][624] <= 624
    ):
        return "python's is not a Mersenne Twister state"
    return None


def fit_problem(checkpoint: dict, saved: dict) -> str | None:
    """What in `checkpoint` does not fit the objects of `saved` (name -> object) that it is to be loaded into, in
    words (None: all fits), checked before anything is loaded: every tensor's name and shape against the object's
    state_dict (the model's, the statistics'), an optimizer's groups, parameter count and per-parameter state against
    the parameters it updates (Adam's moments: a fused kernel trusts their shapes, and other ones corrupt memory)."""
    for name, obj in saved.items():
        if name not in checkpoint:
            if isinstance(obj, torch.Tensor):
                continue  # (a tensor the script added later: PPO-Penalty's beta, left at its start value)
            return f"it has no {name}"
        held = checkpoint[name]
        if isinstance(obj, torch.Tensor):
            if not isinstance(held, torch.Tensor) or held.shape != obj.shape:
                return f"its {name} is not a tensor of shape {tuple(obj.shape)}"
        elif isinstance(obj, torch.optim.Optimizer):
            problem = optimizer_problem(held, obj)
            if problem is not None:
                return f"its {name}: {problem}"
        else:
            problem = entries_problem(held, obj.state_dict())
            if problem is not None:
                return f"its {name}: {problem}"
    return None


def entries_problem(held, expected: dict) -> str | None:
    """Where the state_dict `held` does not have the names of `expected`, and its tensors their shapes."""
    if not isinstance(held, dict):
        return "not a state_dict"
    missing, unexpected = [k for k in expected if k not in held], [k for k in held if k not in expected]
    if missing or unexpected:
        return f"{missing[0]} is missing" if missing else f"{unexpected[0]} is not in this script's"
    for key, value in expected.items():
        if isinstance(value, torch.Tensor) and (
            not isinstance(held[key], torch.Tensor) or held[key].shape != value.shape
        ):
            shape = tuple(held[key].shape) if isinstance(held[key], torch.Tensor) else type(held[key]).__name__
            return f"{key} has shape {shape}, this script's {tuple(value.shape)}"
    return None


def optimizer_problem(held: dict, optimizer: torch.optim.Optimizer) -> str | None:
    """Where the optimizer state_dict `held` does not fit `optimizer`: the number of parameter groups and of parameters
    in each, each parameter's state (every tensor of more than one number, such as Adam's moments, of the
    parameter's shape; its step count one number)."""
    groups = held["param_groups"]
    if len(groups) != len(optimizer.param_groups):
        return f"{len(groups)} parameter groups, this script's optimizer {len(optimizer.param_groups)}"
    parameters = {}
    for group, ours in zip(groups, optimizer.param_groups):
        if not isinstance(group, dict) or not isinstance(group.get("params"), list):
            return "a parameter group without its params"
        if len(group["params"]) != len(ours["params"]):
            return f"{len(group['params'])} parameters in a group, this script's optimizer {len(ours['params'])}"
        parameters.update(zip(group["params"], ours["params"]))
    for index, state in held["state"].items():
        if index not in parameters or not isinstance(state, dict):
            return f"a state for parameter {index}, which it does not update"
        shape = parameters[index].shape
        for key, value in state.items():
            if not isinstance(value, torch.Tensor):
                continue
            if key == "step" and value.numel() != 1:
                return f"the step count of parameter {index} has {value.numel()} numbers"
            if key != "step" and value.shape != shape:
                return f"its {key} of parameter {index} has shape {tuple(value.shape)}, the parameter {tuple(shape)}"
    return None


def load_checkpoint(path: str, script: str, Args=None) -> dict:
    """`read_checkpoint`, with a one-line error if the file is not a checkpoint of `script`."""
    checkpoint = read_checkpoint(path, script, Args)
    if isinstance(checkpoint, str):
        fail(checkpoint)
    return checkpoint


# The flags of every script that a --resume may change: where and how the run goes on (RunSettings' machine flags,
# --runs-dir for a branch), and --total-timesteps to train longer or stop sooner. A script's Args adds its own (`changeable_on_resume`, e.g.
# ("envpool_threads",)); every other flag keeps the checkpoint's value
CHANGEABLE_ON_RESUME = (
    "resume",
    "requeue_signal",
    "total_timesteps",
    "torch_threads",
    "cuda",
    "checkpoint_every",
    "track",
    "wandb_project_name",
    "wandb_entity",
    "capture_video",
    "save_model",
    "eval_episodes",
    "eval_every",
    "eval_deterministic",
    "compile",
    "cudagraphs",
    "runs_dir",  # where a branch goes (a resume in the folder of its file stays there)
)


def changeable_on_resume(args) -> list[str]:
    """The flags of `args`' script that a --resume may change: every script's (CHANGEABLE_ON_RESUME), then those its
    Args names as its own (`Args.changeable_on_resume`), those of them that it has."""
    names = (*CHANGEABLE_ON_RESUME, *getattr(type(args), "changeable_on_resume", ()))
    return [name for name in names if hasattr(args, name)]


def resume_args(args, checkpoint: dict):
    """`--resume`: the arguments the run goes on with. `args` are the run's arguments with the changes asked for
    (on the command line, ppolab.parse reads them with the checkpoint's arguments as the defaults, so a flag
    differs from the saved value only where it was given): a flag that may change (`changeable_on_resume`) takes
    its new value, any other flag that differs from the saved one is refused in one line, as is a --total-timesteps
    the run has reached already."""
    saved = type(args)(**checkpoint["args"])
    changeable = changeable_on_resume(saved)
    for name in asdict(saved):
        given, kept = getattr(args, name), getattr(saved, name)
        if name in changeable:
            setattr(saved, name, given)
        elif given != kept:
            fail(
                f"{flag(name)} {given}: cannot change on --resume (the run has {kept}); only "
                f"{', '.join(flag(n) for n in changeable[1:])} can; start a new run to change it"
            )
    if saved.num_iterations * saved.batch_size <= checkpoint["global_step"]:
        fail(
            f"--total-timesteps {saved.total_timesteps}: the run is at step {checkpoint['global_step']} already; "
            "pass a larger --total-timesteps to train longer"
        )
    return saved


def restore(checkpoint: dict | None, saved: dict, *, rng: bool = True) -> tuple[int, int]:
    """--resume: loads each object of `saved` (name -> object) from `checkpoint[name]` (an optimizer keeps the
    learning rate it was made with: the tensor that annealing fills in place) and, with `rng`, the random
    streams; returns the first iteration to run and the global step (1 and 0 for a new run: checkpoint None)."""
    if checkpoint is None:
        return 1, 0
    problem = fit_problem(checkpoint, saved)
    if problem is not None:
        fail(f"the checkpoint does not fit this script's model and optimizer: {problem} (was the script changed?)")
    for name, obj in saved.items():
        if isinstance(obj, torch.optim.Optimizer):
            learning_rates = [group["lr"] for group in obj.param_groups]
            obj.load_state_dict(checkpoint[name])
            for group, learning_rate in zip(obj.param_groups, learning_rates):
                group["lr"] = learning_rate  # loading put the saved float there
        elif isinstance(obj, torch.Tensor):  # a tensor the script changes in place (PPO-Penalty's beta)
            if name in checkpoint:  # (a checkpoint from before it existed: the start value)
                obj.copy_(checkpoint[name])
        else:
            obj.load_state_dict(checkpoint[name])
    if rng:
        set_rng_state(checkpoint["rng"], device_of(saved))
    return checkpoint["iteration"] + 1, checkpoint["global_step"]
