"""The command line: `parse` (with --resume, the checkpoint's saved arguments are the defaults; a command line tyro
cannot read ends in one line, `read_command_line`), `run_program` (a script's entry point: its main, run as the
program, ppolab.program) and `use_threads` (--torch-threads, the thread limits of PyTorch and NumPy)."""

import dataclasses
import difflib
import glob
import sys
import typing
import warnings
from pathlib import Path

import torch
import tyro
import tyro._errors  # tyro's parse-error events: not its public API, so requirements.txt pins tyro's version

from ppolab import compiler, program
from ppolab.checkpoints import missing_arguments, read_checkpoint
from ppolab.checks import fail, flag
from ppolab.settings import script_of


def parse(Args, *, from_command_line: tuple = ()):
    """The command line as `Args`. With --resume the command line is read again with the checkpoint's
    arguments as the defaults: a flag not given keeps the run's value, and one given means what it says, even
    when it is the script's default (resume_args then refuses the flags that cannot change). The flags named in
    `from_command_line` are the exception: their defaults stay the script's, whatever the checkpoint saved (where
    this process finds the machines it works with, e.g. the Redis script's server, whose saved URL has its
    password redacted). A file that is not a readable checkpoint is left to the run's checks, which say what is
    wrong with it in one line. A command line that cannot be read ends in one line naming the flag."""
    try:
        return parse_resumed(Args, from_command_line)
    except UnreadableCommandLine as problem:
        fail(f"{problem}; {program.program()} --help lists the flags")


def parse_resumed(Args, from_command_line: tuple):
    """`parse`: the command line, then with --resume the command line again over the checkpoint's arguments."""
    args = read_command_line(Args)
    auto = args.resume == "auto"
    if auto:
        args.resume = latest_checkpoint(args)
    if args.resume is None or not Path(args.resume).is_file():
        return args
    checkpoint = read_checkpoint(args.resume, script_of(args), Args)
    if isinstance(checkpoint, str):
        return args
    missing = [name for name in missing_arguments(checkpoint, Args) if name != "resume"]
    if missing:
        print(
            f"note: {args.resume} holds no {', '.join(flag(name) for name in missing)} (a checkpoint of an earlier "
            "version of the script): the script's defaults are used",
            flush=True,
        )
    given = {name: getattr(args, name) for name in from_command_line}  # or the script's default
    resumed = read_command_line(Args, default=Args(**{**checkpoint["args"], **given, "resume": args.resume}))
    if auto:  # (the command line says auto again)
        resumed.resume = args.resume
    return resumed


class UnreadableCommandLine(Exception):
    """A command line tyro cannot read: what is wrong with it, in words (`parse_error`)."""


def read_command_line(Args, **options):
    """`tyro.cli(Args, **options)`, where a command line it cannot read raises UnreadableCommandLine naming the flag
    instead of printing tyro's box of many lines (a kind of error not named in `parse_error` still gets the box)."""

    def in_words(event):
        problem = parse_error(event, Args)
        if problem is not None:
            raise UnreadableCommandLine(problem)

    with tyro._errors.on_parse_error(in_words):
        return tyro.cli(Args, **options)


def parse_error(event, Args) -> str | None:
    """What is wrong with the command line, for tyro's parse-error `event`: a flag mistyped, given no value or one
    it cannot read. None for another kind of event."""
    events = tyro._errors
    if isinstance(event, events.UnrecognizedArgs):
        return unrecognized(event.tokens, Args)
    argument = getattr(event, "argument", None)
    name = "/".join(argument.lowered.name_or_flags) if argument is not None else "a flag"
    if isinstance(event, events.InstantiationFailure):
        return f"{name}: {event.message}"
    if isinstance(event, events.BadValue):
        value = event.offending_value
        return f"{name} needs a value" if value is None else f"{name} takes no value, got {value!r}"
    if isinstance(event, events.InvalidChoice):
        return f"{name}: {event.value!r} is not one of {', '.join(event.choices)}"
    return None


def unrecognized(tokens: list[str], Args) -> str:
    """`--learnign-rate 3e-4` -> "unknown flag --learnign-rate (did you mean --learning-rate?)", the value after
    it not named again; a value where no flag takes one (`--cuda false`) -> "unexpected value 'false'", with how
    a true/false flag is set."""
    fields, hints = dataclasses.fields(Args), typing.get_type_hints(Args)
    known = [flag(field.name) for field in fields]
    known += [f"--no-{field.name.replace('_', '-')}" for field in fields if hints[field.name] is bool]
    said, after_unknown_flag = [], False
    for token in tokens:
        if token.startswith("-"):
            guess = difflib.get_close_matches(token.split("=")[0], known, n=1, cutoff=0.8)
            said.append(f"unknown flag {token}" + (f" (did you mean {guess[0]}?)" if guess else ""))
        elif not after_unknown_flag:
            said.append(f"unexpected value {token!r} (a true/false flag takes none: --name or --no-name)")
        after_unknown_flag = token.startswith("-")
    return "; ".join(said)


def latest_checkpoint(args) -> str | None:
    """--resume auto: the checkpoint.pt of the newest run under --runs-dir of the same script, environment,
    experiment name and seed (the run folders named `<env>__<exp_name>__<seed>__...`, branches included, newest
    checkpoint first, the first that says it is of this script and --env-id); None where there is none, and the run
    starts anew. So the same command, started again (a requeued job), continues its run."""
    pattern = f"*__{glob.escape(args.exp_name)}__{args.seed}__*/checkpoint.pt"
    paths = [path for path in Path(args.runs_dir).glob(pattern) if path.is_file()]
    for path in sorted(paths, key=lambda path: path.stat().st_mtime, reverse=True):
        checkpoint = read_checkpoint(str(path), script_of(args))
        same = ("env_id", "exp_name", "seed")
        if not isinstance(checkpoint, str) and all(checkpoint["args"].get(n) == getattr(args, n) for n in same):
            print(f"--resume auto: continuing from {path}", flush=True)
            return str(path)
    return None


def run_program(main, Args, **options):
    """A script's entry point (`ppolab.run_program(main, Args)`, its last line): the command line read as `Args`
    (`parse`, with its `options`), then `main(args)`, then the program's exit (ppolab.program.run): a signal at any
    moment ends it with the right exit code and one line at most, never a traceback."""
    # the script's own process, when its top level calls this (not a tool that runs it with runpy)
    owner = sys._getframe(1).f_back is None
    for stream in (sys.stdout, sys.stderr):  # a character the terminal's encoding lacks: written as "?", not lost
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    # Gymnasium warns, with terminal colours and before the run folder, that a task is out of date (the v4 MuJoCo
    # tasks, those of the published benchmarks); the run says it in one plain line after its folder instead (ppolab.run)
    warnings.filterwarnings(
        "ignore", message=".*is out of date. You should consider upgrading", category=DeprecationWarning
    )
    compiler.defer()  # PyTorch's compiler imported only if something compiles (ppolab.compiler)
    program.run(lambda: main(parse(Args, **options)), owner=owner)


def use_threads(torch_threads: int):
    """--torch-threads N (0 keeps the defaults): N threads for PyTorch and for NumPy's BLAS. Left to itself
    each splits a small product over all cores, which is slower, much slower when another process keeps a
    core busy (benchmark/results/speed_cpu.md)."""
    if torch_threads > 0:
        from threadpoolctl import threadpool_limits

        torch.set_num_threads(torch_threads)
        threadpool_limits(torch_threads, user_api="blas")
