"""The program that a script is, from its entry point to its exit: a signal ends it at any moment with the right exit
code and one line at most, never a traceback, and output that cannot be written stops the printing, never the work.

Importing ppolab changes nothing in the process. The script's last line, `ppolab.run_program(main, Args)`, calls
`run`, which takes over the signals and guards the output (`start`), reads the command line and runs `main`, then
ends the program with `end`. The stages:

- while the command line is read and `main` runs, SIGINT is Python's KeyboardInterrupt (one line, 130) and SIGTERM
  and SIGHUP (the terminal closed, an ssh session dropped) raise SystemExit with 128 + the signal's number (143,
  129), so that `finally` blocks run (during a run, the run's own handler, ppolab.stops, says how to resume it);
- once `main` returned, `end` does the interpreter's exit work (other threads, atexit functions) with a handler that
  ends the program at once, then leaves with os._exit: no signal finds the process in the interpreter's own
  shutdown, where Python's handlers are gone (a SIGTERM there kills it silently; a handler that raises in an atexit
  function prints a traceback and the exit code stays 0).

Before `run_program`, while the script imports its libraries, a signal does what Python does by default (Ctrl-C:
Python's KeyboardInterrupt message; SIGTERM: the process ends). SIGHUP is left alone where it was ignored when the
program started (`nohup`). sys.stdout and sys.stderr become `Output`s: a write that fails (a closed pipe, as after
`| head -1`; a full disk; a terminal gone) stops that stream's output for good, one line on the other stream names
it, and the work goes on.

Imports nothing but the standard library.
"""

import atexit
import ctypes
import os
import signal
import sys
import threading
import warnings
from pathlib import Path

# the signals that end a program, and how its line says it
SIGNALS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated (SIGTERM)", signal.SIGHUP: "hung up (SIGHUP)"}
# `nohup` (or a parent) made the program ignore SIGHUP: it stays ignored
HANGUP_IGNORED = signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


def program() -> str:
    """The name a line to the user starts with: the script's file name (`ppo.py`)."""
    return Path(sys.argv[0]).name


def say(line: str):
    """`line` on stderr, if it can still be written."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def catch(handler) -> dict:
    """`handler` for SIGINT, SIGTERM and SIGHUP (not where SIGHUP was ignored when the program started); returns
    the handlers it replaced, for `uncatch`."""
    previous = {}
    for signum in SIGNALS:
        if signum != signal.SIGHUP or not HANGUP_IGNORED:
            previous[signum] = signal.signal(signum, handler)
    return previous


def uncatch(previous: dict):
    """The handlers that `catch` replaced, back."""
    for signum, handler in previous.items():
        signal.signal(signum, handler)


# where the program is: "starting" (before `run`), "main" (the command line read, main running), "exiting"
stage = "starting"
# the signal that is ending the program (None: none yet): the first decides the exit code and the one line, and the
# signals that follow it (a storm a few milliseconds apart, a scheduler's second warning) change nothing
ending = None
# main returned: the program's work was done
done = False


def first_to_end(signum: int) -> bool:
    """Whether `signum` is the first signal to end the program (then it is recorded as the one that does)."""
    global ending
    if ending is not None:
        return False
    ending = signum
    return True


def on_signal(signum, frame):
    """The program's handler, by its stage. While `main` runs, SIGINT is Python's KeyboardInterrupt (code that waits
    for it, as a Redis sampler does, still sees it; run turns it into the line), and SIGTERM and SIGHUP raise
    SystemExit, so that `finally` blocks run. After `main`, the program ends at once with exit code 128 +
    the signal's number: nothing to unwind. Only Ctrl-C, which a person at the terminal pressed, gets a line outside
    a run (a run's own handler, ppolab.stops, says how to resume it): SIGTERM is how a scheduler, or a learner its
    sampler processes, ends a program, and after SIGHUP no terminal shows one. A signal after the first that
    ends the program changes nothing."""
    if not first_to_end(signum):
        return
    if stage == "main":
        # a video being recorded stays unfinished: no "Unable to save last video" warning while unwinding
        warnings.filterwarnings("ignore", message=".*Unable to save last video")
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)
    if signum == signal.SIGINT and done:
        say(f"{program()}: {SIGNALS[signum]} while exiting; its work was done")
    flush()
    os._exit(128 + signum)


def on_request(signum, frame):
    """A requeue signal (SIGUSR1, SIGUSR2: a scheduler's warning, --requeue-signal) outside a run, which answers it
    (ppolab.stops): nothing to checkpoint, and no reason to die of it (their default)."""


def start():
    """The program's signals taken over (`on_signal`; the requeue signals, `on_request`) and its output guarded
    (`Output`)."""
    catch(on_signal)
    for signum in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, on_request)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, Output):
            setattr(sys, name, Output(stream, name))


def exit_code(exit: SystemExit) -> int:
    """The exit code of a SystemExit, as the interpreter makes it: its message on stderr where it is one."""
    if exit.code is None or isinstance(exit.code, int):
        return exit.code or 0
    say(str(exit.code))
    return 1


def run(main, *args, owner: bool = True):
    """`main(*args)`, then the program's end (`end`) with its exit code: 0, the code of a SystemExit (its message
    printed where it is one), 130 after one line for a KeyboardInterrupt that `main` let through. Any other
    exception is a bug: its traceback, as Python prints it. Where the process is not the program's own (`owner`
    False: the script run by a tool, e.g. runpy), the exit code is raised as SystemExit instead of `end`."""
    global stage, done
    stage = "main"
    start()
    try:
        main(*args)
        stage, done = "exiting", ending is None  # (the first statement after main: a signal before it is main's)
        code = 0
    except KeyboardInterrupt:
        stage = "exiting"
        say(f"{program()}: interrupted")
        code = 130
    except SystemExit as e:
        stage = "exiting"
        code = exit_code(e)
    if not owner:
        raise SystemExit(code)
    end(code)


def end(code: int):
    """The program's exit with `code` once its work is done: what the interpreter does at exit (waiting for the
    threads that are not daemons, the atexit functions), then the output flushed and os._exit. A signal meanwhile
    ends it at once with its own exit code."""
    global stage
    stage = "exiting"
    catch(on_signal)
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    flush()
    os._exit(code)


def flush():
    """Python's output, then the C library's (a library's own printf)."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


class Output:
    """sys.stdout or sys.stderr, guarded: a write or a flush that fails (the pipe closed, the disk full, the terminal
    gone) stops this stream's output for good, never the program. The stream's file descriptor then goes to
    /dev/null (what is left in its buffer, and the output of the processes started later, goes there without an
    error), and one line on the other stream names the stream and the error. Anything else is the stream's own."""

    def __init__(self, stream, name: str):
        self.stream, self.name, self.lost = stream, name, False

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                return self.stream.write(text)
            except (OSError, ValueError) as e:  # ValueError: the stream was closed
                self.lose(e)
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        if not self.lost:
            try:
                self.stream.flush()
            except (OSError, ValueError) as e:
                self.lose(e)

    def lose(self, error: Exception):
        self.lost = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # no file descriptor (a stream in memory)
            pass
        other = sys.stderr if self.name == "stdout" else sys.stdout
        if isinstance(other, Output) and not other.lost:
            reason = getattr(error, "strerror", None) or str(error)
            other.write(f"{program()}: cannot write to {self.name} ({reason}): its output stops, the work goes on\n")
            other.flush()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)
