"""Tune a script's hyperparameters with Optuna, on one machine or on many sharing one study.

    python -m benchmark.tune ppo --env-id CartPole-v1 --trials 30 -- --total-timesteps 100000
    python -m benchmark.tune ppo_continuous_action --env-id HalfCheetah-v4 --trials 40 --study cheetah \\
        --storage redis://:PASSWORD@HOST:6379/0               # the same command on every machine joins the study
    python -m benchmark.tune report --study cheetah --storage URL --out cheetah.md
    python -m benchmark.tune verdict --study cheetah --storage URL --seeds 11 12 13 --out cheetah.md
    python -m benchmark.tune ppo --env-id CartPole-v1 --trials 30 --storage benchmark/results/tune_cartpole.db \\
        -- --total-timesteps 100000                           # the study's database kept beside its results file

A trial samples the script's search space (benchmark/tune_space.py, changed by --space FILE), runs the script once per
env id and seed (a process each, OMP_NUM_THREADS=1) with the flags after --, and scores it: the mean over the runs of
(score - low) / (high - low), a run's score the mean return of its last --last episodes. While the runs train, the
score so far is reported at --reports points and Optuna's pruner (median by default) stops a trial that does worse
than the others did at the same step (its runs get SIGTERM). The study runs until it holds --trials finished trials.

--storage: an SQLite file (default RUNS_DIR/STUDY/optuna.db; a path without `://`, e.g. benchmark/results/tune_NAME.db
to commit) or an Optuna storage URL; a shared one (PostgreSQL, MySQL, Redis as a journal) takes the same command from
every machine. A worker that dies leaves its trial failed after --heartbeat x 3 seconds, and it is sampled again;
Ctrl-C ends the trial's runs and the same command continues the study. RUNS_DIR/STUDY/trial-NNNN/ holds a trial's
runs, logs and trial.json; RUNS_DIR/STUDY/report.md the trials table, the best command and (from 10 complete trials)
the parameter importances. `report` writes it again; `verdict` runs the best setting and the defaults on fresh seeds
and judges them by Welch's t-test. docs/tuning.md explains the spaces, the normalisation and the storages.
"""

import argparse
import contextlib
import inspect
import io
import json
import math
import os
import re
import shlex
import signal
import socket
import sys
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from benchmark.events import ScalarTail
from benchmark.run_seeds import Job, die_interrupted, interrupt, kill, last_line, make_jobs, run_jobs, start
from benchmark.scores import curves, save_figure, summarize_run
from benchmark.scripts import ROOT, SCRIPTS, import_script, pyplot, table_head
from benchmark.tune_space import SPACES, SpaceError, as_flags, min_max, read_space, sample, score_range

RETURN = "charts/episodic_return"
PROG = "tune"
# flags the tuner gives each run itself
OWN_FLAGS = ("--env-id", "--seed", "--runs-dir", "--resume", "--evaluate")
# what a joining worker's command must share with the study's first one
SHARED = {
    "script": "script",
    "env_ids": "env ids",
    "seeds": "seeds",
    "flags": "flags after --",
    "space": "search space",
    "last": "--last",
    "score_ranges": "score ranges",
}


def fail(message: str):
    """Bad input: one line on stderr, exit code 2."""
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def redact(url: str) -> str:
    """The URL with its password hidden (everything the tuner prints or writes)."""
    return re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", url)


def one_line(error: BaseException) -> str:
    """An exception's message on one line, without SQLAlchemy's pointer to its documentation."""
    text = " ".join(str(error).split()) or type(error).__name__
    return re.sub(r"\s*\(Background on this error at:.*$", "", text)


# THE SCRIPT: its flags, checked by its own parser ----------------------------------------------------------------


def script_name(given: str) -> str:
    """`ppo`, `ppo.py` or a path to one of the scripts -> `ppo`; anything else is bad input."""
    name = Path(given).name.removesuffix(".py")
    if name not in SCRIPTS or (given.endswith(".py") and Path(given).resolve() != ROOT / f"{name}.py"):
        fail(f"unknown script {given!r}: one of {', '.join(SCRIPTS)} (the files of {ROOT})")
    return name


def script_check(module, args) -> str | None:
    """The script's own input checks (its `check_args`: numbers, counts, the batch, the environment id, ...) on `args`,
    in this process: None, or the line they refuse `args` with."""
    extra = (0, 1) if len(inspect.signature(module.check_args).parameters) == 3 else ()  # (rank, world size)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            module.check_args(args, *extra)
    except SystemExit:
        lines = captured.getvalue().strip().splitlines()
        return re.sub(r"^\S+: error: ", "", lines[-1]) if lines else "refused by the script's checks"
    return None


def check_setting(module, argv: list[str], env_ids: list[str]):
    """(the arguments of the first env id, None) if the script takes `argv` with each of `env_ids` (its parser, then
    its checks), else (None, the line it refuses them with)."""
    found = None
    for env_id in env_ids:
        args, problem = parse_flags(module.Args, [*argv, "--env-id", env_id])
        problem = problem or script_check(module, args)
        if problem:
            return None, problem
        found = found or args
    return found, None


def parse_flags(Args, argv: list[str]):
    """(args, None) as the script reads `argv` (its parser, ppolab.command_line), or (None, its error in one line)."""
    from ppolab.command_line import UnreadableCommandLine, read_command_line

    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            return read_command_line(Args, args=argv), None
    except UnreadableCommandLine as problem:
        return None, str(problem)
    except SystemExit:  # (a kind of error the package does not put in words, or --help)
        return None, "refused by the script's parser (its --help lists the flags)"


# THE STORAGE ------------------------------------------------------------------------------------------------------


def open_storage(url: str, heartbeat: int):
    """The Optuna storage of `url`: Redis as an Optuna journal (redis://, rediss://, unix://), any other URL a
    database (SQLAlchemy's URL: sqlite:///FILE, postgresql://..., mysql://...) with Optuna's heartbeat. A URL that
    does not open is bad input."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # the heartbeat, the journal
    try:
        if url.split(":", 1)[0].lower() in ("redis", "rediss", "unix"):
            import redis
            from optuna.storages.journal import JournalRedisBackend

            redis.Redis.from_url(url, socket_connect_timeout=5).ping()
            return optuna.storages.JournalStorage(JournalRedisBackend(url))
        return optuna.storages.RDBStorage(url, heartbeat_interval=heartbeat, grace_period=3 * heartbeat)
    except ImportError:  # SQLAlchemy's dialect without its driver
        fail(
            f"--storage {redact(url)}: the database's Python driver is not installed (PostgreSQL: pip install "
            "psycopg2-binary; MySQL: pip install PyMySQL, with a mysql+pymysql:// URL)"
        )
    except Exception as e:  # SQLAlchemy's, the database driver's, Redis's: each its own kind
        fail(f"--storage {redact(url)}: {type(e).__name__}: {one_line(e)}")


def storage_url(given: str | None, folder: Path) -> str:
    """The storage URL of --storage: without it the SQLite file FOLDER/optuna.db, a path (no `://`) that SQLite file,
    any other text an Optuna storage URL as given."""
    if given is None:
        return f"sqlite:///{folder / 'optuna.db'}"
    return given if "://" in given else f"sqlite:///{Path(given).resolve()}"


def sqlite_file(url: str) -> Path | None:
    """The file of an SQLite URL (sqlite:///FILE), else None."""
    return Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None


def shown(path: Path) -> str:
    """A path as the tuner prints and writes it: relative to the folder the command runs in (the repository's root)
    when it lies inside it, so that a report names no folder of the machine that wrote it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def shown_storage(url: str) -> str:
    """A storage URL as the tuner prints and writes it: an SQLite file by its shown path, a password hidden."""
    file = sqlite_file(url)
    return f"sqlite:///{shown(file)}" if file is not None and file.is_absolute() else redact(url)


def beat(storage, trial):
    """Tells the storage the worker of `trial` is alive: Optuna's heartbeat where the storage keeps one (a
    database), else the trial's user attribute `heartbeat` (the time), which fail_stale reads."""
    if getattr(storage, "get_heartbeat_interval", lambda: None)() is not None:
        storage.record_heartbeat(trial._trial_id)
    else:
        trial.set_user_attr("heartbeat", time.time())


def fail_stale(study, storage, grace: float):
    """The running trials whose worker stopped beating become failed (and are sampled again)."""
    import optuna
    from optuna.trial import TrialState

    if getattr(storage, "get_heartbeat_interval", lambda: None)() is not None:
        optuna.storages.fail_stale_trials(study)
        return
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        last = trial.user_attrs.get("heartbeat", trial.datetime_start.timestamp())
        if time.time() - last > grace:
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)


# A STUDY AND ITS TRIALS --------------------------------------------------------------------------------------------


@dataclass
class Setup:
    """What every trial of one worker runs."""

    script: str
    env_ids: list[str]
    seeds: list[int]
    flags: list[str]  # after --, given to every run
    space: dict
    last: int
    score_ranges: dict  # env id -> [low, high]
    total_timesteps: int
    folder: Path  # the study's folder on this machine
    launcher: list[str]
    workers: int
    reports: int
    poll: float
    heartbeat: int
    module: object = None  # the script, imported: its parser and its checks
    grid: list[int] = field(default_factory=list)  # the steps at which a trial reports its score so far
    fixed: list[str] = field(default_factory=list)  # flags of the script's space that the flags after -- fix

    def shared(self) -> dict:
        return {name: getattr(self, name) for name in SHARED}


class Stopped(Exception):
    """A trial ends before its score: pruned (`pruned` True) or refused/failed by the script (the line says)."""

    def __init__(self, reason: str, pruned: bool = False):
        super().__init__(reason)
        self.reason, self.pruned = reason, pruned


def paste(setup: Setup, flags: list[str]) -> str:
    """The command of a setting, ready to paste (run from the repository root), for the study's first env id."""
    launcher = "python" if setup.launcher == [sys.executable] else shlex.join(setup.launcher)
    return f"{launcher} {setup.script}.py {shlex.join([*flags, *setup.flags, '--env-id', setup.env_ids[0]])}"


def run_folder(job: Job) -> Path | None:
    """The run folder a job's log names (`run folder: DIR`, as every script prints it)."""
    if not job.log.is_file():
        return None
    found = re.findall(r"^run folder: (.+)$", job.log.read_text(errors="replace"), re.M)
    return Path(found[-1]) if found else None


def progress(job: Job, tails: dict) -> tuple[int, list[tuple[int, float]]]:
    """(the last global step that a run's events reached, its episodes' (step, return)) so far; `tails` keeps each
    run's reader (ScalarTail), which reads only what was written since its last look."""
    if job.log not in tails:
        run_dir = run_folder(job)
        if run_dir is None:
            return 0, []
        tails[job.log] = ScalarTail(run_dir)
    scalars = tails[job.log].read()
    last = max((step for points in scalars.values() for step, _ in points[-1:]), default=0)
    return last, sorted(scalars.get(RETURN, []))


def score_at(episodes: list[tuple[int, float]], step: int, last: int) -> float:
    """The mean return of the last `last` episodes that ended by `step` (nan if none did)."""
    returns = [value for s, value in episodes if s <= step][-last:]
    return float(np.mean(returns)) if returns else float("nan")


def write_record(folder: Path, record: dict):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trial.json").write_text(json.dumps(record, indent=2) + "\n")


def run_trial(trial, setup: Setup, storage, record: dict) -> float:
    """Runs one trial's runs and returns its value; raises Stopped (pruned, refused, failed) and lets
    KeyboardInterrupt through; the runs it started have ended when it returns or raises."""
    if not (ROOT / f"{setup.script}.py").is_file():  # moved or deleted while the study went on: no trial can run
        fail(f"{ROOT / setup.script}.py is gone; the same command run where it is continues the study")
    params = sample(trial, setup.space)
    flags = as_flags(params)
    record.update(params=params, command=paste(setup, flags))
    write_record(Path(record["dir"]), record)  # what the trial runs, while it runs
    trial.set_user_attr("command", record["command"])
    _, problem = check_setting(setup.module, flags + setup.flags, setup.env_ids)
    if problem:
        raise Stopped(f"refused by {setup.script}.py: {problem}")
    argv = [*setup.launcher, str(ROOT / f"{setup.script}.py"), *flags, *setup.flags, "--runs-dir", str(record["dir"])]
    jobs = make_jobs(shlex.join(argv), setup.env_ids, setup.seeds, Path(record["dir"]) / "logs")
    for job in jobs:
        job.die_with_parent = True
    pending, running, tails = list(jobs), [], {}
    record["runs"], record["tails"] = jobs, tails
    grid = list(setup.grid)
    looked = beaten = time.monotonic()
    beat(storage, trial)
    try:
        while pending or running:
            while pending and len(running) < setup.workers:
                job = pending.pop(0)
                start(job)
                if job.process is None:
                    raise Stopped(f"cannot start {job.name}: {last_line(job.log)}")
                running.append(job)
            for job in [job for job in running if job.process.poll() is not None]:
                running.remove(job)
                job.returncode, job.elapsed = job.process.returncode, time.monotonic() - job.started
                if job.returncode != 0:
                    how = "refused" if job.returncode == 2 else f"failed (exit {job.returncode})"
                    raise Stopped(f"{how}: {job.name}: {last_line(job.log)}")
            now = time.monotonic()
            if now - beaten >= setup.heartbeat:
                beat(storage, trial)
                beaten = now
            if now - looked >= setup.poll:
                looked = now
                grid = report(trial, setup, jobs, grid, tails)
            time.sleep(0.1)
    finally:  # pruned, refused, interrupted, or any error: no run outlives its trial
        for job in running:
            kill(job)
    scores = [summarize_run(run_folder(job), setup.last)["return"] for job in jobs]
    record["scores"] = {job.name: score for job, score in zip(jobs, scores)}
    if not all(math.isfinite(score) for score in scores):
        raise Stopped("a run ended without a finished episode: no score")
    trial.set_user_attr("scores", record["scores"])
    return float(np.mean([min_max(s, setup.score_ranges[job.env_id]) for job, s in zip(jobs, scores)]))


def report(trial, setup: Setup, jobs: list[Job], grid: list[int], tails: dict) -> list[int]:
    """Reports the trial's score at each step of `grid` that every run's events passed (the mean normalised score of
    the episodes ended by then), asks the pruner after each, and returns the steps still to come. Raises Stopped
    when the pruner says stop."""
    looks = [progress(job, tails) for job in jobs]
    while grid and all(step >= grid[0] for step, _ in looks):
        step = grid.pop(0)
        scores = [score_at(episodes, step, setup.last) for _, episodes in looks]
        if not all(math.isfinite(s) for s in scores):
            continue  # a run without a finished episode yet: nothing to compare at this step
        value = float(np.mean([min_max(s, setup.score_ranges[job.env_id]) for job, s in zip(jobs, scores)]))
        trial.report(value, step)
        raw = ", ".join(f"{job.name}: {s:.1f}" for job, s in zip(jobs, scores))
        print(f"trial {trial.number}: step {step:,}: {value:.4f} ({raw})", flush=True)
        if trial.should_prune():
            raise Stopped(
                f"stopped by the pruner at step {step:,} of {setup.total_timesteps:,}: {value:.4f}", pruned=True
            )
    return grid


def one_trial(study, setup: Setup, storage):
    """Asks the study for a trial, runs it, tells the study its end; prints a line. KeyboardInterrupt: the trial is
    told failed (sampled again), its folder says it was interrupted, and the interrupt goes on."""
    from optuna.trial import TrialState

    trial = study.ask()
    folder = setup.folder / f"trial-{trial.number:04d}"
    record = {"number": trial.number, "state": "RUNNING", "dir": str(folder), "host": socket.gethostname()}
    record["started"] = now().isoformat(timespec="seconds")
    trial.set_user_attr("folder", f"{record['host']}:{shown(folder)}")
    write_record(folder, record)
    began = time.monotonic()
    state, value, why = TrialState.FAIL, None, None
    try:
        value = run_trial(trial, setup, storage, record)
        state = TrialState.COMPLETE
    except Stopped as stop:
        state, why = TrialState.PRUNED, stop.reason
        trial.set_user_attr("pruned_by_pruner", stop.pruned)
    except KeyboardInterrupt:
        why = "interrupted (Ctrl-C or SIGTERM): its runs were stopped; the same command continues the study"
        raise
    except SystemExit as e:  # fail(): its line is on the worker's stderr
        why = f"the worker ended (exit {e.code}), its line in its output"
        raise
    except Exception as e:
        why = f"the tuner failed: {type(e).__name__}: {one_line(e)}"
        raise
    finally:
        jobs, tails = record.pop("runs", []), record.pop("tails", {})
        steps = sum(progress(job, tails)[0] for job in jobs)
        budget = setup.total_timesteps * len(setup.env_ids) * len(setup.seeds)
        record.update(state=state.name, value=value, stopped=why, wall_time=round(time.monotonic() - began, 1))
        record.update(steps=steps, budget=budget, run_folders=[str(run_folder(job)) for job in jobs])
        record["pids"] = [job.process.pid for job in jobs if job.process is not None]
        write_record(folder, record)
        for name in ("stopped", "steps", "budget", "wall_time"):
            if record[name] is not None:
                trial.set_user_attr(name, record[name])
        study.tell(trial, value if state == TrialState.COMPLETE else None, state=state)
        line = f"trial {trial.number} {state.name}"
        if value is not None:
            line += f" value {value:.4f} ({', '.join(f'{k}: {v:.1f}' for k, v in record['scores'].items())})"
        print(f"{line} in {record['wall_time']:.0f} s" + (f": {why}" if why else ""), flush=True)


def finished(study) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def make_pruner(text: str, warmup_steps: int):
    """--pruner: `median` (Optuna's MedianPruner after 5 complete trials), `none`, or `threshold:LOW` (stops a trial
    whose score so far is below LOW)."""
    import optuna

    if text == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=warmup_steps)
    if text == "none":
        return optuna.pruners.NopPruner()
    if text.startswith("threshold:"):
        try:
            return optuna.pruners.ThresholdPruner(lower=float(text.split(":", 1)[1]), n_warmup_steps=warmup_steps)
        except ValueError:
            pass
    fail(f"--pruner {text}: median, none or threshold:LOW (a number)")


def tune_parser() -> argparse.ArgumentParser:
    usage = "%(prog)s SCRIPT --env-id ID [--env-id ID ...] --trials N [options] [-- SCRIPT_FLAGS]\n"
    usage += "       %(prog)s report --study NAME [--storage FILE|URL] [--out FILE]\n"
    usage += "       %(prog)s verdict --study NAME [--storage FILE|URL] --seeds S [S ...] --out FILE"
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="python -m benchmark.tune", description=__doc__, formatter_class=raw, usage=usage
    )
    add = parser.add_argument
    add("script", help="the script to tune: ppo, ppo_continuous_action, ... (or ppo.py, ...)")
    add("--env-id", action="append", required=True, help="an environment (repeat for several)")
    add("--trials", type=int, required=True, help="the finished (complete or pruned) trials the study ends with")
    add("--study", help="the study's name (default: SCRIPT-ENV_IDS)")
    add("--storage", help="an SQLite file's path (e.g. benchmark/results/tune_NAME.db) or an Optuna storage URL "
        "(default: RUNS_DIR/STUDY/optuna.db)")  # fmt: skip
    add("--seeds", type=int, nargs="+", default=[1], help="the seeds each trial runs (default: 1)")
    add("--space", type=Path, help="a TOML or JSON file that changes the search space (docs/tuning.md)")
    add("--last", type=int, default=100, help="a run's score: the mean return of its last N episodes (100)")
    add("--score-range", nargs=3, action="append", default=[], metavar=("ENV", "LOW", "HIGH"),
        help="the normalisation's range for an environment (default: benchmark/tune_space.py's)")  # fmt: skip
    add("--pruner", default="median", help="median (the default), none, or threshold:LOW")
    add("--warmup", type=float, default=0.25, help="the share of the steps before any pruning (0.25)")
    add("--reports", type=int, default=10, help="scores a trial reports, at equal shares of the steps (10)")
    add("--workers", type=int, help="runs of a trial at once (default: all of them)")
    add("--runs-dir", type=Path, default=Path("runs/tune"), help="the studies' folders (runs/tune)")
    add("--launcher", help='the command that runs the script (default: this Python; "torchrun --standalone ...")')
    add("--heartbeat", type=int, default=60, help="seconds between a worker's heartbeats (60)")
    add("--poll", type=float, default=10.0, help="seconds between looks at the runs' events (10)")
    return parser


def make_setup(args, flags: list[str]) -> Setup:
    """What the trials of this worker run, from its command line: the script, its search space (without the flags
    given after --), the normalisation's ranges; bad input ends here in one line."""
    for name, least in (("trials", 1), ("last", 1), ("reports", 1), ("heartbeat", 1), ("workers", 1)):
        value = getattr(args, name)
        if value is not None and value < least:
            fail(f"--{name} must be at least {least}, got {value}")
    if not 0 <= args.warmup < 1:
        fail(f"--warmup must be in [0, 1), got {args.warmup}")
    script = script_name(args.script)
    own_flags = [f for f in flags if f.split("=", 1)[0] in OWN_FLAGS]
    if own_flags:
        fail(f"{own_flags[0]} after --: the tuner gives each run its --env-id, --seed and --runs-dir itself")

    space = dict(SPACES[script])
    if args.space is not None:
        try:
            space = read_space(args.space, space)
        except SpaceError as e:
            fail(f"--space {args.space}: {e}")
    module = import_script(script)
    unknown = [name for name in space if name.replace("-", "_") not in module.Args.__dataclass_fields__]
    if unknown:
        fail(f"the search space names --{unknown[0]}, which {script}.py does not have")
    base, problem = check_setting(module, flags, args.env_id)
    if problem:
        fail(f"{script}.py refuses the setting (the flags after --, an --env-id): {problem}")
    given = {f.split("=", 1)[0].removeprefix("--no-").removeprefix("--") for f in flags if f.startswith("--")}
    fixed = [name for name in space if name in given]
    for name in fixed:
        del space[name]
    if not space:
        fail("the flags after -- fix every flag of the search space: nothing left to tune")

    given_ranges = {}
    for env_id, low, high in args.score_range:
        try:
            given_ranges[env_id] = (float(low), float(high))
        except ValueError:
            fail(f"--score-range {env_id} {low} {high}: LOW and HIGH must be numbers")
        if not given_ranges[env_id][0] < given_ranges[env_id][1]:
            fail(f"--score-range {env_id} {low} {high}: LOW must be below HIGH")
    ranges = {env_id: score_range(env_id, given_ranges) for env_id in args.env_id}
    unknown = [env_id for env_id, bounds in ranges.items() if bounds is None]
    if unknown and len(args.env_id) > 1:
        fail(f"no score range known for {', '.join(unknown)}: give one with --score-range ENV LOW HIGH")

    study = args.study or f"{script}-{'+'.join(args.env_id)}"
    steps = base.total_timesteps
    return Setup(
        script, args.env_id, args.seeds, flags, space, args.last,
        score_ranges={env_id: list(bounds or (0.0, 1.0)) for env_id, bounds in ranges.items()},  # one env: raw
        total_timesteps=steps,
        folder=(args.runs_dir / re.sub(r"[^\w.+-]", "_", study)).resolve(),
        launcher=shlex.split(args.launcher) if args.launcher else [sys.executable],
        workers=args.workers or len(args.env_id) * len(args.seeds),
        reports=args.reports, poll=args.poll, heartbeat=args.heartbeat, module=module,
        grid=[round(steps * k / args.reports) for k in range(1, args.reports)], fixed=fixed,
    )  # fmt: skip


def open_study(setup: Setup, name: str, storage_url: str, storage, pruner, argv: list[str]):
    """The study `name` on the storage, made by the first worker (which records its setting) and joined by the
    others, whose setting must be the same."""
    import optuna

    sampler = optuna.samplers.TPESampler(n_startup_trials=10, multivariate=True, group=True, constant_liar=True)
    try:
        study = optuna.create_study(
            storage=storage, study_name=name, direction="maximize", sampler=sampler, pruner=pruner,
            load_if_exists=True,
        )  # fmt: skip
    except Exception as e:
        fail(f"--storage {redact(storage_url)}: cannot open the study {name}: {one_line(e)}")
    shared = json.loads(json.dumps(setup.shared()))  # as the storage gives it back (lists, not tuples)
    if "script" not in study.user_attrs:
        for key, value in shared.items():
            study.set_user_attr(key, value)
        study.set_user_attr("total_timesteps", setup.total_timesteps)
        study.set_user_attr("launcher", setup.launcher if setup.launcher != [sys.executable] else None)
        study.set_user_attr("command", "python -m benchmark.tune " + shlex.join(redact(a) for a in argv))
        study.set_user_attr("machine", machine())
    differ = [key for key in SHARED if study.user_attrs.get(key) != shared[key]]
    if differ:
        fail(
            f"the study {name} was started with other {SHARED[differ[0]]} "
            f"({json.dumps(study.user_attrs.get(differ[0]))}; this command: {json.dumps(shared[differ[0]])}): "
            "run its own command, or give another --study"
        )
    return study


def tune(argv: list[str]):
    own, flags = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = tune_parser().parse_args(own)
    setup = make_setup(args, flags)
    pruner = make_pruner(args.pruner, int(args.warmup * setup.total_timesteps))
    name = args.study or f"{setup.script}-{'+'.join(setup.env_ids)}"
    url = storage_url(args.storage, setup.folder)
    (sqlite_file(url) or Path(".")).parent.mkdir(parents=True, exist_ok=True)
    storage = open_storage(url, setup.heartbeat)
    study = open_study(setup, name, url, storage, pruner, argv)
    # the heartbeat is kept here (beat, fail_stale), not by Study.optimize, which cannot stop a trial's processes
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    print(f"study {name} on {shown_storage(url)}: {finished(study)} of {args.trials} trials finished; runs in "
          f"{shown(setup.folder)}/trial-NNNN\nwatch it live: optuna-dashboard {shown_storage(url)}", flush=True)  # fmt: skip
    if setup.fixed:
        print(f"fixed by the flags after --, not tuned: {', '.join('--' + n for n in setup.fixed)}", flush=True)
    report = setup.folder / "report.md"
    signal.signal(signal.SIGTERM, interrupt)
    try:
        while True:
            fail_stale(study, storage, grace=3 * setup.heartbeat)
            if finished(study) >= args.trials:
                break
            one_trial(study, setup, storage)
            write_report(study, report, url, importances=False)
    except KeyboardInterrupt:
        die_interrupted(f"{PROG}: interrupted: the trial's runs are stopped; the same command continues the study")
    print_best(study, write_report(study, report, url, importances=True))


# THE REPORT -----------------------------------------------------------------------------------------------------


def now() -> datetime:
    return datetime.now(timezone.utc)


def machine() -> str:
    from benchmark.scripts import machine as cpu

    return f"{socket.gethostname()}: {cpu()}"


def best_trial(study):
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return max(complete, key=lambda t: t.value) if complete else None


def code_block(trial) -> list[str]:
    return ["```bash", trial.user_attrs.get("command", ""), "```"]


def duration(seconds: float) -> str:
    hours, rest = divmod(int(round(seconds)), 3600)
    return f"{hours} h {rest // 60:02d} min" if hours else f"{rest // 60} min {rest % 60:02d} s"


def cell(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else "" if value is None else str(value)


def trials_table(study) -> str:
    """The markdown table of every trial: number, state, value, each env's mean raw score, the sampled values, the
    run-steps it trained, its wall time and why it stopped."""
    trials = study.get_trials(deepcopy=False)
    names = list(study.user_attrs.get("space", {}))
    names += sorted({name for t in trials for name in t.params} - set(names))
    env_ids = study.user_attrs.get("env_ids", [])
    header = ["trial", "state", "value", *env_ids, *names, "steps", "wall time", "note"]
    lines = table_head(*header)
    for t in trials:
        scores = t.user_attrs.get("scores", {})
        per_env = []
        for env_id in env_ids:
            values = [v for name, v in scores.items() if name.startswith(f"{env_id} seed ")]
            per_env.append(f"{np.mean(values):.1f}" if values else "")
        wall = duration((t.datetime_complete - t.datetime_start).total_seconds()) if t.datetime_complete else ""
        note = t.user_attrs.get("stopped") or ("its worker stopped (no heartbeat)" if t.state.name == "FAIL" else "")
        value = "" if t.value is None else f"{t.value:.4f}"
        cells = [str(t.number), t.state.name.lower(), value, *per_env, *(cell(t.params.get(n)) for n in names)]
        cells += [f"{t.user_attrs.get('steps', 0):,}", wall, note.replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def savings(study) -> str:
    """What pruning saved: the run-steps the pruned trials did not run, and the wall time that is at the pace of the
    complete trials."""
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    pruned = [
        t for t in study.get_trials(deepcopy=False, states=(TrialState.PRUNED,)) if t.user_attrs.get("pruned_by_pruner")
    ]
    if not pruned:
        return "The pruner stopped no trial."
    ran = sum(t.user_attrs.get("steps", 0) for t in pruned)
    budget = sum(t.user_attrs.get("budget", 0) for t in pruned)
    text = (
        f"The pruner stopped {len(pruned)} trial{'s' * (len(pruned) > 1)}: they ran {ran:,} of their {budget:,} run-steps, "
        f"saving {budget - ran:,} run-steps ({(budget - ran) / budget:.0%} of theirs)"
    )
    walls = [(t.datetime_complete - t.datetime_start).total_seconds() for t in complete]
    if walls:
        saved = sum((1 - t.user_attrs.get("steps", 0) / t.user_attrs["budget"]) * np.mean(walls) for t in pruned)
        text += f", about {duration(saved)} at the pace of the complete trials ({duration(np.mean(walls))} each)"
    return text + "."


IMPORTANCE_TRIALS = 10  # complete trials before the importances are drawn: with fewer they say nothing


def plot_importances(study, path: Path) -> Path | None:
    """A bar chart of the parameters' importances, from Optuna's default evaluator (PED-ANOVA in Optuna 5: how much
    each parameter's values in the best trials differ from its values in all trials) over the complete trials and the
    parameters they all have; None while fewer than IMPORTANCE_TRIALS trials are complete."""
    import optuna
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < IMPORTANCE_TRIALS:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a parameter value seen in few trials: the bars say how sure they are not)
        try:
            importances = optuna.importance.get_param_importances(study)
        except (RuntimeError, ValueError):
            return None
    if not importances:
        return None
    names = list(importances)[::-1]
    fig, ax = pyplot().subplots(figsize=(6, 0.35 * len(names) + 1.2))
    ax.barh(names, [importances[n] for n in names], color="tab:blue")
    ax.set(
        xlabel="importance (Optuna's PED-ANOVA, sums to 1)",
        title=f"{study.study_name}: {len(complete)} complete trials",
    )
    return save_figure(fig, path)


def write_report(study, out: Path, storage_url: str, importances: bool = True) -> Path:
    """The study's markdown report in `out` (with `<out stem>_importances.png` beside it); returns `out`."""
    from optuna.trial import TrialState

    attrs = study.user_attrs
    trials = study.get_trials(deepcopy=False)
    counts = {s: sum(t.state == s for t in trials) for s in TrialState}
    starts = [t.datetime_start for t in trials if t.datetime_start]
    ends = [t.datetime_complete for t in trials if t.datetime_complete]
    ranges = ", ".join(f"{env} [{low:g}, {high:g}]" for env, (low, high) in attrs.get("score_ranges", {}).items())
    span = ""
    if starts and ends:
        wall = duration((max(ends) - min(starts)).total_seconds())
        span = f" From {min(starts):%Y-%m-%d %H:%M} to {max(ends):%Y-%m-%d %H:%M} (UTC): {wall} of wall time."
    lines = [
        f"# Tuning {attrs.get('script')}.py on {', '.join(attrs.get('env_ids', []))}",
        "",
        f"Study `{study.study_name}` ({shown_storage(storage_url)}), written {now():%Y-%m-%d %H:%M} UTC. "
        f"Command: `{attrs.get('command')}`. Machine: {attrs.get('machine')}.",
        "",
        f"{len(trials)} trials: {counts[TrialState.COMPLETE]} complete, {counts[TrialState.PRUNED]} pruned, "
        f"{counts[TrialState.FAIL]} failed, {counts[TrialState.RUNNING]} running." + span,
        "",
        f"The value of a trial: the mean over its runs (env ids x seeds {attrs.get('seeds')}) of (score - low) / "
        f"(high - low), a run's score the mean return of its last {attrs.get('last')} episodes; ranges: {ranges}. "
        f"Each run: {attrs.get('total_timesteps', 0):,} steps. A pruned trial's value is the last it reported "
        "(its score so far when it was stopped).",
        "",
        savings(study),
        "",
    ]
    best = best_trial(study)
    if best is not None:
        lines += [f"Best: trial {best.number}, value {best.value:.4f}.", "", *code_block(best), ""]
    picture = out.with_name(f"{out.stem}_importances.png")
    if importances and plot_importances(study, picture) is not None:
        lines += [f"![parameter importances]({picture.name})", ""]
    elif importances:
        complete = counts[TrialState.COMPLETE]
        why = f"{complete} complete trials, and they are drawn from {IMPORTANCE_TRIALS}"
        why = why if complete < IMPORTANCE_TRIALS else "Optuna's evaluator found none for these trials"
        lines += [f"Parameter importances: not drawn ({why}).", ""]
    lines += [trials_table(study), ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = out.read_text().split(VERDICT, 1)[1] if out.is_file() and VERDICT in out.read_text() else None
    out.write_text("\n".join(lines) + (f"\n{VERDICT}{kept}" if kept is not None else ""))
    return out


VERDICT = "## Verdict\n"


def load_study(args):
    """The study of `report` and `verdict`: --study on --storage (default: the SQLite file in its folder)."""
    import optuna

    folder = (args.runs_dir / re.sub(r"[^\w.+-]", "_", args.study)).resolve()
    url = storage_url(args.storage, folder)
    file = sqlite_file(url)
    if file is not None and not file.is_file():  # (SQLite would make an empty one)
        fail(f"no study {args.study} in {shown(folder)} (give its --storage)" if args.storage is None else
             f"--storage {args.storage}: no such file")  # fmt: skip
    storage = open_storage(url, 60)
    try:
        return optuna.load_study(study_name=args.study, storage=storage), url, folder
    except KeyError:
        fail(f"no study {args.study} on {shown_storage(url)}")


def study_parser(verb: str, description: str) -> argparse.ArgumentParser:
    """The parser of `report` or `verdict`, with the arguments that find the study."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmark.tune {verb}", description=description)
    parser.add_argument("--study", required=True)
    parser.add_argument("--storage", help="the study's SQLite file or storage URL (default: RUNS_DIR/STUDY/optuna.db)")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/tune"))
    return parser


def print_best(study, report: Path):
    best = best_trial(study)
    if best is not None:
        print(f"best: trial {best.number}, value {best.value:.4f}:\n{best.user_attrs.get('command')}")
    print(f"report: {shown(report)}")


def report_main(argv: list[str]):
    parser = study_parser("report", "The study's report again, from its storage: the trials table, the best command, "
                          f"and the parameter importances once {IMPORTANCE_TRIALS} or more trials are complete.")  # fmt: skip
    parser.add_argument("--out", type=Path, help="the report (default: RUNS_DIR/STUDY/report.md)")
    args = parser.parse_args(argv)
    study, url, folder = load_study(args)
    print_best(study, write_report(study, args.out or folder / "report.md", url))


# THE VERDICT: the best setting against the defaults on fresh seeds -------------------------------------------------


ALPHA = 0.05
RULE = (
    "Rule: Welch's t-test of the tuned setting's per-seed scores against the defaults' (two-sided, each side's sample "
    f"standard deviation, ddof 1): the tuned setting is *better* when its mean is higher and p < {ALPHA}, *worse* when "
    f"it is lower and p < {ALPHA}, else *undecided*: these seeds do not tell the two apart. With one seed on a side "
    "there is no test and no verdict."
)


def verdict_rule(tuned: list[float], default: list[float]) -> str:
    """RULE's verdict on the per-seed scores of both settings, with its reason: `better (Welch's t-test: p = 0.012)`,
    `undecided (Welch's t-test: p = 0.27)`, ..."""
    from scipy import stats

    if min(len(tuned), len(default)) < 2:
        return "no verdict (one seed on a side: shown, not judged)"
    difference = float(np.mean(tuned) - np.mean(default))
    if np.std(tuned, ddof=1) == np.std(default, ddof=1) == 0:  # the test is undefined: every seed scored the same
        word = "better" if difference > 0 else "worse" if difference < 0 else "undecided"
        return f"{word} (every seed the same score on each side: no spread to test)"
    p = float(stats.ttest_ind(tuned, default, equal_var=False).pvalue)
    word = "undecided" if p >= ALPHA else "better" if difference > 0 else "worse"
    return f"{word} (Welch's t-test: p = {p:.2g})"


def verdict_main(argv: list[str]):
    parser = study_parser("verdict", "Runs the study's best setting and the script's defaults (the flags after -- only) "
                          "on fresh seeds, resumable, and writes the study's report with a verdict section: per env and "
                          "seed the mean return of the last episodes, mean ± std, learning curves and the verdict.")  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", required=True, help="fresh seeds, none the study used")
    parser.add_argument("--trial", type=int, help="the trial to test (default: the best)")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="runs at once (default: CPU count)")
    parser.add_argument("--out", type=Path, required=True, help="the results file (markdown)")
    args = parser.parse_args(argv)
    study, url, folder = load_study(args)
    attrs = study.user_attrs
    reused = sorted(set(args.seeds) & set(attrs["seeds"]))
    if reused:
        fail(f"seeds {reused} were used while tuning: give fresh ones")
    best = best_trial(study) if args.trial is None else next((t for t in study.trials if t.number == args.trial), None)
    if best is None or best.state.name != "COMPLETE":
        fail("no complete trial to test" if args.trial is None else f"trial {args.trial} is not a complete trial")
    settings = {"default": attrs["flags"], "tuned": as_flags(best.params) + attrs["flags"]}
    where = folder / "verdict"
    launcher = attrs.get("launcher") or [sys.executable]  # the study's first worker's
    runs, todo = {}, []  # setting -> every job (those done before too); the jobs still to run
    for name, given in settings.items():
        run = [*launcher, str(ROOT / f"{attrs['script']}.py"), *given, "--exp-name", name, "--runs-dir", str(where)]
        runs[name] = make_jobs(shlex.join(run), attrs["env_ids"], args.seeds, where / "logs" / name)
        todo += make_jobs(shlex.join(run), attrs["env_ids"], args.seeds, where / "logs" / name, resume=True)
    print(f"verdict of trial {best.number}: {len(todo)} runs to do, {args.workers} at a time, in {where}", flush=True)
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        done = run_jobs(todo, args.workers)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted: the same command continues the verdict", file=sys.stderr)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)
    failed = [job for job in done if job.returncode != 0]
    if failed:
        fail(f"{len(failed)} runs failed, e.g. {failed[0].name}: {last_line(failed[0].log)} (log {failed[0].log})")
    write_report(study, args.out, url)
    command = "python -m benchmark.tune verdict " + shlex.join(redact(a) for a in argv)
    section = verdict_section(study, best, args, where, runs, command)
    args.out.write_text(args.out.read_text().split(VERDICT, 1)[0] + VERDICT + section)
    print(f"verdict: {shown(args.out)}")


def verdict_section(study, best, args, where: Path, runs: dict, command: str) -> str:
    """The verdict's text: the command, the rule, the table (per env and setting: per seed, mean ± std, the
    verdict) and the curves (written beside the results file)."""
    attrs = study.user_attrs
    last = attrs["last"]
    lines = [
        "",
        f"Trial {best.number}'s setting against the defaults on seeds {', '.join(map(str, args.seeds))} (none used "
        f"while tuning), {attrs['total_timesteps']:,} steps, one process per run with OMP_NUM_THREADS=1, "
        f"{args.workers} at a time; runs in `{shown(where)}`. Written {now():%Y-%m-%d %H:%M} UTC, "
        f"on {machine()}.",
        "",
        f"```bash\n{command}\n```",
        "",
        f"{RULE} A run's score: the mean return of its last {last} episodes; mean ± std: over the seeds, the sample "
        "standard deviation (ddof 1).",
        "",
        *table_head("env", "setting", "per seed", "mean ± std", "verdict"),
    ]
    pictures = []
    for env_id in attrs["env_ids"]:
        folders = {name: [run_folder(job) for job in jobs if job.env_id == env_id] for name, jobs in runs.items()}
        scores = {name: [summarize_run(d, last)["return"] for d in dirs] for name, dirs in folders.items()}
        result = verdict_rule(scores["tuned"], scores["default"])
        for name, values in scores.items():
            per_seed = ", ".join(f"{v:.1f}" for v in values)
            verdict = result if name == "tuned" else ""
            spread = f" ± {np.std(values, ddof=1):.1f}" if len(values) > 1 else " (one seed)"
            lines.append(f"| {env_id} | {name} | {per_seed} | {np.mean(values):.1f}{spread} | {verdict} |")
        safe = re.sub(r"[^\w.-]", "_", env_id)
        pictures.append(plot_verdict(env_id, folders, args.out.with_name(f"{args.out.stem}_{safe}.png")))
    lines += ["", *[f"![{path.stem}]({path.name})" for path in pictures if path is not None]]
    lines += ["", "The tuned command:", "", *code_block(best), ""]
    return "\n".join(lines)


def plot_verdict(env_id: str, folders: dict, path: Path) -> Path | None:
    """The learning curves of both settings on one env: the mean over seeds, the min-max band (benchmark.scores)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = False
    for name, run_dirs in folders.items():
        curve = curves(run_dirs, "step", window=10)
        if curve is None:
            continue
        grid, values = curve
        ax.plot(grid, values.mean(0), label=f"{name}, mean of {len(values)} seeds")
        ax.fill_between(grid, values.min(0), values.max(0), alpha=0.25)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set(title=f"tuned vs default on {env_id}", xlabel="global step", ylabel="episodic return")
    ax.legend(loc="best", fontsize="small")
    return save_figure(fig, path)


def main(argv: list[str] | None = None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:
        report_main(argv[1:])
    elif argv[:1] == ["verdict"]:
        verdict_main(argv[1:])
    else:
        tune(argv)


if __name__ == "__main__":
    main()
