"""How a run ends when it is stopped: Ctrl-C, SIGTERM, SIGHUP, or a write the file system refuses. One line on
stderr that says where the last checkpoint is and how to resume from it, and an exit code; never a traceback. And how
it ends when a scheduler warns it (--requeue-signal): a checkpoint at the end of the iteration, then REQUEUE_EXIT."""

import contextlib
import errno
import os
import shlex
import signal
import sys
import threading
import warnings
from pathlib import Path

import ppolab.program
from ppolab.checks import program
from ppolab.program import SIGNALS, catch, first_to_end, say

# the exit code of a run that stopped because the scheduler asked for it (--requeue-signal), after writing its
# checkpoint: EX_TEMPFAIL of sysexits.h, "try again later"; a job script requeues the job on it (docs/cluster.md)
REQUEUE_EXIT = 75
# the signals --requeue-signal can name
REQUEUE_SIGNALS = {"USR1": signal.SIGUSR1, "USR2": signal.SIGUSR2, "TERM": signal.SIGTERM}


def launch_info() -> tuple[int, int, int]:
    """(rank, local rank, world size) from torchrun's environment variables; (0, 0, 1) without torchrun."""
    return tuple(
        int(os.environ.get(name, default)) for name, default in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1))
    )


def resume_hint(run_dir: str, checkpoint_every: int | None = None) -> str:
    """Where a stopped run can go on from: its last checkpoint and the command that resumes it, shell-quoted to be
    pasted as it is (under torchrun, where the checkpoint is on rank 0's machine, the job's own command with
    --resume). Without a checkpoint, how to get one where the run was started without --checkpoint-every
    (`checkpoint_every`, the run's: 0; None: not known here)."""
    checkpoint = Path(run_dir) / "checkpoint.pt"
    if checkpoint.is_file():
        command = f"python {shlex.quote(sys.argv[0])}" if launch_info()[2] == 1 else "the same torchrun command with"
        return f"last checkpoint {checkpoint}; continue with: {command} --resume {shlex.quote(str(checkpoint))}"
    if checkpoint_every == 0:
        return f"no checkpoint in {run_dir} (--checkpoint-every N writes one every N iterations)"
    return f"no checkpoint in {run_dir}{' yet' if checkpoint_every else ''}"


def error_line(message: str, run_dir: str, checkpoint_every: int | None = None) -> str:
    """A run's fatal error as its one line: the message, then where the run can go on from (resume_hint)."""
    return f"{program()}: error: {message}; {resume_hint(run_dir, checkpoint_every)}"


def exit_on_ctrl_c(run_dir: str, checkpoint_every: int | None = None, requeue: tuple | None = None) -> dict:
    """From here on, Ctrl-C (SIGINT) ends the run with one line on stderr, where its last checkpoint is and
    how to resume from it, and exit code 130 (128 + SIGINT), instead of a KeyboardInterrupt traceback; SIGTERM,
    what schedulers (Slurm, Kubernetes) send first, does the same with exit code 143 (128 + SIGTERM), and SIGHUP
    (the terminal closed, an ssh session dropped) with 129, its line written where it still can be (not where
    SIGHUP was ignored when the program started: `nohup`). It raises SystemExit, so `finally` blocks still run
    (closing environments, stopping processes). Under torchrun each rank gets the signal and prints its line,
    naming its rank. Returns the handlers it replaced (ppolab.program.uncatch puts them back).

    `requeue`, (signal, request): that signal (--requeue-signal) asks for a checkpoint instead, `request(name)`, which
    the run writes at its next safe point before it exits with REQUEUE_EXIT. Only the first signal counts: those
    that follow it change nothing, but for one that ends the run (Ctrl-C, SIGTERM, SIGHUP) before the checkpoint
    asked for is written: it ends the run at once, with REQUEUE_EXIT still (the last checkpoint continues it); the
    requeue signal again asks nothing new."""
    rank, _, world_size = launch_info()
    requeue_signum, request = requeue if requeue is not None else (None, None)
    unwinding = []

    def handler(signum, frame):
        if signum == requeue_signum:  # asked again: asked already
            if first_to_end(signum):
                request(signal.Signals(signum).name)
            return
        if unwinding:
            return
        who = "" if world_size == 1 else f"rank {rank}: "
        if first_to_end(signum):
            line, code = f"{who}{SIGNALS[signum]}", 128 + signum
        elif ppolab.program.ending == requeue_signum:
            name = signal.Signals(requeue_signum).name
            line, code = f"{who}{SIGNALS[signum]} before the checkpoint {name} asked for was written", REQUEUE_EXIT
        else:
            return
        unwinding.append(signum)
        say(f"{program()}: {line}: {resume_hint(run_dir, checkpoint_every)}")
        # the video being recorded stays unfinished: no "Unable to save last video" warning while exiting
        warnings.filterwarnings("ignore", message=".*Unable to save last video")
        raise SystemExit(code)

    previous = catch(handler)
    if requeue_signum is not None and requeue_signum not in previous:
        previous[requeue_signum] = signal.signal(requeue_signum, handler)
    return previous


# what a file system answers a write it refuses wherever the file is: no space left, a file larger than allowed
# (ulimit -f), a read-only file system, a quota exceeded
WRITE_ERRORS = (errno.ENOSPC, errno.EFBIG, errno.EROFS, errno.EDQUOT)
# and what it answers a write into a run folder that was deleted or made unwritable while the run went on
FOLDER_ERRORS = (errno.ENOENT, errno.EACCES, errno.EPERM)


def is_write_error(error: BaseException, run_dir: str) -> bool:
    """Whether `error` is a write the file system refused: one of WRITE_ERRORS anywhere, or one of FOLDER_ERRORS
    on a file of the run folder (or on no named file: the TensorBoard writer's thread)."""
    if not isinstance(error, OSError):
        return False
    if error.errno in WRITE_ERRORS:
        return True
    filename = error.filename and os.fsdecode(error.filename)  # TensorBoard's writer names its file in bytes
    inside = filename is None or Path(filename).absolute().is_relative_to(Path(run_dir).absolute())
    return error.errno in FOLDER_ERRORS and inside


def quiet_write_errors(run_dir: str):
    """TensorBoard writes its events from a thread of its own; the main thread meets that thread's write
    error at its next write and reports it (exit_on_write_error), so the thread's traceback is left out."""

    def hook(hook_args):
        if not is_write_error(hook_args.exc_value, run_dir):
            threading.__excepthook__(hook_args)

    return hook


@contextlib.contextmanager
def exit_on_write_error(run_dir: str, checkpoint_every: int | None = None):
    """A checkpoint, the model or the TensorBoard events that cannot be written (disk full, file too large,
    read-only, the run folder deleted or made unwritable) end the run as Ctrl-C does: one line on stderr naming
    the file, the error and the last good checkpoint with the command that resumes it, and exit code 1
    (write_checkpoint_file leaves no partial file)."""
    threading.excepthook = quiet_write_errors(run_dir)
    try:
        yield
    except OSError as e:
        if not is_write_error(e, run_dir):
            raise
        # (TensorBoard's writer names its file in bytes)
        file = os.fsdecode(e.filename) if e.filename else f"the TensorBoard events in {run_dir}"
        print(error_line(f"cannot write {file}: {e.strerror}", run_dir, checkpoint_every), file=sys.stderr, flush=True)
        warnings.filterwarnings("ignore", message=".*Unable to save last video")  # as on Ctrl-C
        raise SystemExit(1) from None
