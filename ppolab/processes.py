"""The plumbing of ppo_shared_memory_lstm.py's worker processes that is not its lesson (imported by it alone): tensors
moved into shared memory with a refused write reported as one (ppolab.stops), messages that do not wait forever for
a process that died or stopped answering, the terminal's signals left to the parent, and processes ended within a
grace period. What the processes exchange, and when, is the script's."""

import os
import re
import signal
import time
from multiprocessing.connection import wait
from pathlib import Path
from typing import Iterator

import torch

from ppolab.stops import WRITE_ERRORS

# seconds a child process may take to start at least (a fresh interpreter that imports PyTorch and makes its
# environments, slower on a busy machine), whatever shorter time it is given for its work
START_TIMEOUT = 120.0


def mib(tensors) -> float:
    """The size of `tensors` in MiB."""
    return sum(x.numel() * x.element_size() for x in tensors) / 2**20


def share_memory(tensors: dict[str, torch.Tensor], what: str) -> dict[str, torch.Tensor]:
    """The tensors moved into shared memory. Each becomes a file in /dev/shm (PyTorch's file_descriptor
    strategy removes its name at once, so nothing is left there), which a file-size limit (`ulimit -f`)
    refuses as it refuses a checkpoint: then the file PyTorch left is removed, and an OSError naming `what`
    ends the run in one line as a refused checkpoint does (exit_on_write_error), not PyTorch's RuntimeError."""
    try:
        return {name: x.share_memory_() for name, x in tensors.items()}
    except RuntimeError as e:  # "unable to resize file </torch_...> to the right size: File too large (27)"
        code, file = re.search(r"\((\d+)\)$", str(e)), re.search(r"<(/torch_[\w-]+)>", str(e))
        if code is None or int(code[1]) not in WRITE_ERRORS:
            raise
        if file is not None:
            Path(f"/dev/shm{file[1]}").unlink(missing_ok=True)
        raise OSError(
            int(code[1]), os.strerror(int(code[1])), f"{what} in /dev/shm ({mib(tensors.values()):.2f} MiB)"
        ) from None


def receive(conn, parent_pid: int):
    """The next message from the parent process on `conn`, or None once the parent is gone (its pipe closed, or
    this process handed to another parent). Polls, so that a child whose parent died learns it within a second
    instead of waiting forever."""
    while not conn.poll(0.5):
        if os.getppid() != parent_pid:
            return None
    try:
        return conn.recv()
    except EOFError:
        return None


def send_to_all(conns: list, message):
    """`message` to every child process on its pipe; one that died (a broken pipe) is left to receive_from_each."""
    for conn in conns:
        try:
            conn.send(message)
        except OSError:  # that process is gone
            pass


def leave_signals_to_parent():
    """In a child process: Ctrl-C (SIGINT) and a closed terminal (SIGHUP), which the terminal sends to every process
    of its group, are the parent's, which stops its children itself; the child ignores them, and a scheduler's
    requeue signals (SIGUSR1, SIGUSR2), which it may send to every process of the job: the parent checkpoints the run
    and stops its children (--requeue-signal)."""
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_IGN)


def receive_from_each(processes: list, conns: list, timeout: float | None = None) -> Iterator[tuple[int, object]]:
    """One message from each child process (`conns[i]`: the parent's end of the pipe of `processes[i]`), as
    (i, message) in the order they arrive, or (i, None) for a process that ended without one or that sent none
    within `timeout` seconds (None: no limit) of the call (`how_it_ended` says which). Waits on the pipes and on the
    processes themselves (their sentinels), so a process that dies without a word (killed, crashed) is noticed at
    once, and one that stopped (SIGSTOP, a step of its environment that never returns, a deadlock) once its time
    is up."""
    pending = set(range(len(processes)))
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        left = 1.0 if deadline is None else min(1.0, max(0.0, deadline - time.monotonic()))
        wait([conns[i] for i in pending] + [processes[i].sentinel for i in pending], timeout=left)
        for i in sorted(pending):
            message = None
            if conns[i].poll():  # read before looking at the exit code: a last message may come just before the exit
                try:
                    message = conns[i].recv()
                except (EOFError, OSError):  # the process is gone (its end closed or reset): its exit code says how
                    pass
            if message is not None or processes[i].exitcode is not None:
                pending.discard(i)
                yield i, message
        if deadline is not None and time.monotonic() >= deadline:
            for i in sorted(pending):
                pending.discard(i)
                yield i, None


def how_it_ended(process, timeout: float | None = None) -> str:
    """Why `process` sent nothing (receive_from_each): `died (signal SIGKILL)`, `died (exit code 1)`, or, still
    running, that it sent nothing within `timeout` seconds."""
    code = process.exitcode
    if code is None:
        return f"sent nothing for {timeout:g} s (stopped, or stuck: in a step of its environment, a deadlock)"
    return f"died (signal {signal.Signals(-code).name})" if code < 0 else f"died (exit code {code})"


def end_processes(processes: list, grace: float):
    """Ends every process: `grace` seconds to exit by themselves (after being told to), then SIGTERM for those
    still there, SIGKILL two seconds later, and join, so no process is left."""
    deadline = time.monotonic() + grace
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + 2.0
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()
