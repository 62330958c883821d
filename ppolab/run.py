"""The run folder and `Run`: a new run's folder and its lock (`new_run_dir`, `lock_run_dir`), and `Run`, what a
training run writes there (TensorBoard, the per-iteration line, checkpoints and evaluations on their schedule).

A script's `main` makes a `Run` and its `train` calls it at a few points: `run.start(saved)` before the loop,
then in the loop `run.episode(...)`, `run.iteration(...)`, `run.evaluate_if_due(...)`,
`run.checkpoint_if_due(...)`, and `run.finish(...)` after it. None of it changes what PPO computes.
"""

import contextlib
import fcntl
import itertools
import os
import re
import shutil
import sys
import time
import traceback
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ppolab.checkpoints import (
    checkpoint_data,
    load_checkpoint,
    non_finite,
    read_checkpoint,
    restore,
    resume_args,
    write_checkpoint_file,
)
from ppolab.checks import fail, flag, program
from ppolab.environments import environment_failure, newer_version, print_held_mujoco_warnings
from ppolab.evaluation import evaluate_saved
from ppolab.program import uncatch
from ppolab.settings import script_of
from ppolab.stops import REQUEUE_EXIT, REQUEUE_SIGNALS, exit_on_ctrl_c, exit_on_write_error, resume_hint
from ppolab.tracking import finish_tracking, start_tracking, tensorboard_writer


def explained_variance(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    """1 - Var[y_true - y_pred] / Var[y_true]: 1 is a perfect critic, 0 no better than a constant."""
    var_y = np.var(y_true)
    return float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y)


class ProgressLine:
    """When to print the per-iteration line: at the first and the last iteration, and in between at most
    once every `every` seconds, so that a fast run (CartPole) does not scroll faster than one can read
    and a slow one (Procgen, Atari) still says where it is, with or without finished episodes. A line
    counts the episodes that ended since the previous line and gives their mean return (nan if none)."""

    def __init__(self, every: float = 5.0):
        self.every = every
        self.printed_at = None  # time.monotonic() of the last line
        self.returns = []  # the returns of the episodes that ended since the last line

    def due(self, episode_returns, last: bool) -> str | None:
        """Adds an iteration's episode returns; returns "episodes=K mean_return=M" when a line is due."""
        self.returns.extend(episode_returns)
        now = time.monotonic()
        if not last and self.printed_at is not None and now - self.printed_at < self.every:
            return None
        self.printed_at = now
        mean = np.mean(self.returns) if self.returns else float("nan")
        line, self.returns = f"episodes={len(self.returns)} mean_return={mean:.2f}", []
        return line


def new_run_dir(args, env_name: Callable[[str], str] = str) -> tuple[str, str | None]:
    """Makes a new run's folder, `<--runs-dir>/<env>__<--exp-name>__<--seed>__<the time in seconds>`, and returns
    it with the problem in words (None: none)."""
    return claim_run_dir(args.runs_dir, f"{env_name(args.env_id)}__{args.exp_name}__{args.seed}__{int(time.time())}")


def claim_run_dir(runs_dir: str, name: str) -> tuple[str, str | None]:
    """Makes the folder `<runs_dir>/<name>` and returns it with the problem in words (None: none). The folder is
    claimed by creating it, which only one process can: a run that started in the same second with the same name
    gets the next free `-2`, `-3`, ... instead of sharing it."""
    base = f"{runs_dir}/{name.replace('/', '-').replace(':', '-')}"
    try:
        Path(runs_dir).mkdir(parents=True, exist_ok=True)
        for k in itertools.count(1):
            run_dir = base if k == 1 else f"{base}-{k}"
            with contextlib.suppress(FileExistsError):
                os.mkdir(run_dir)
                return run_dir, None
    except OSError as e:
        return base, f"cannot create the run folder {base}: {e.strerror or e} (pass another --runs-dir)"


def newer_work(path: str, checkpoint: dict, script: str) -> str | None:
    """Why a --resume of `path` (its `checkpoint`, read) cannot go on in the folder of `path` without overwriting
    newer work there, in words; None where it can: `path` is the folder's own `checkpoint.pt` (where a run writes
    its latest), and the folder's `model.pt`, if there is one, is not further on than it (a run that goes on writes
    both anew; its `best_model.pt` stays unless an evaluation beats it). A model.pt that cannot be read counts as
    further on."""
    path = Path(path)
    if path.name != "checkpoint.pt":
        latest = path.parent / "checkpoint.pt"
        newer = f" (its checkpoint.pt is)" if latest.is_file() else ""
        return f"{path.name} is not the latest checkpoint of {path.parent}{newer}"
    model = path.parent / "model.pt"
    if model.is_file():
        saved = read_checkpoint(str(model), script)
        if isinstance(saved, str) or saved["global_step"] > checkpoint["global_step"]:
            step = "" if isinstance(saved, str) else f" (global step {saved['global_step']})"
            return f"{model} is further on{step} than {path.name} (global step {checkpoint['global_step']})"
    return None


def resume_dir(args, checkpoint: dict, writes: bool = True) -> tuple[str, str | None]:
    """The folder a --resume of `args.resume` (its `checkpoint`, read) goes on in, and the problem in words (None:
    none). The folder of the file where the run continues there (`newer_work` finds nothing newer); otherwise a new
    run folder under --runs-dir, named after the folder of the file and the iteration it branches from
    (`<folder>__from-iteration-<i>`), made by the process that `writes`: the newer files stay as they were."""
    source = str(Path(args.resume).parent)
    if newer_work(args.resume, checkpoint, script_of(args)) is None:
        return source, None
    name = f"{Path(source).absolute().name}__from-iteration-{checkpoint['iteration']}"
    if not writes:
        return f"{args.runs_dir}/{name}", None
    return claim_run_dir(args.runs_dir, name)


def lock_run_dir(run_dir: str) -> tuple[int | None, str | None]:
    """Takes the run folder's lock, which the process holds while it runs (the operating system lets it go when
    the process ends, however it ends): (the lock's file descriptor, None), or (None, the problem in words) when
    another process holds it, i.e. the run is still going on."""
    try:
        fd = os.open(run_dir, os.O_RDONLY)
    except OSError as e:
        return None, f"cannot open the run folder {run_dir}: {e.strerror or e}"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None, (
            f"the run in {run_dir} is still going on (another process holds its folder): stop it first, or "
            "resume from a copy of its folder"
        )
    return fd, None


# The settings that decide what an evaluation's score measures (the seed is the run's): a best model's score is
# compared only with scores measured with the same
MEASURED_BY = ("eval_episodes", "eval_deterministic", "eval_max_steps")


class Run:
    """One training run: its arguments (a resumed run's are its checkpoint's, with the flags that may change),
    its folder, and everything it writes there. `evaluate` is the script's
    `evaluate(checkpoint, episodes, deterministic, seed, *, video_prefix=None) -> returns`; `env_name` turns
    --env-id into the name the run folder and the lines use (the Atari scripts' full ids).

    Used as a context manager around training: inside it Ctrl-C, and a checkpoint or the TensorBoard events
    that cannot be written, end the run in one line that says how to resume it (ppolab.stops)."""

    def __init__(
        self,
        args,
        evaluate: Callable | None = None,
        env_name: Callable[[str], str] = str,
        *,
        checkpoint: dict | None = None,
        run_dir: str | None = None,
        writes: bool = True,
    ):
        """`checkpoint` (--resume's, read) and `run_dir` (a new run's folder, made by new_run_dir, or a resumed run's,
        chosen by resume_dir) where another process read and made them (under torchrun, rank 0); by default the run
        reads and makes them itself. The process that `writes` the run's files holds the run folder's lock while it
        runs (under torchrun, rank 0): a --resume of a run that is still going on is refused in one line.

        A --resume goes on in the folder of its file where that is the folder's latest checkpoint, else in a new
        run folder, a branch that leaves the newer files as they are (resume_dir)."""
        self.script, self.evaluate = script_of(args), evaluate
        self.new, self.runs_dir_existed = args.resume is None, os.path.isdir(args.runs_dir)
        if args.resume is not None:
            self.checkpoint = (
                checkpoint if checkpoint is not None else load_checkpoint(args.resume, self.script, type(args))
            )
            self.args = resume_args(args, self.checkpoint)
            self.dir, problem = (run_dir, None) if run_dir is not None else resume_dir(self.args, self.checkpoint)
            if problem:
                fail(problem)
            self.new = self.dir != str(Path(args.resume).parent)  # a branch: a new run folder
            if writes and not self.new and not os.access(self.dir, os.W_OK | os.X_OK):
                fail(f"--resume: cannot write into the run folder {self.dir}: resume from a copy of it elsewhere")
        else:
            self.checkpoint, self.args, self.dir = None, args, run_dir
            if run_dir is None:
                self.dir, problem = new_run_dir(args, env_name)
                if problem:
                    fail(problem)
        self.lock = None  # the run folder's lock, held while the run goes on (lock_run_dir)
        if writes:
            self.lock, problem = lock_run_dir(self.dir)
            if problem:
                fail(problem)
        self.writer, self.progress, self.best_return = None, ProgressLine(), float("-inf")
        self.episode_returns = []  # of the episodes that ended in this iteration
        self.exits = contextlib.ExitStack()
        self.wrote = False  # an iteration logged or a file written: the folder holds the run's work
        self.requested = None  # the name of the signal that asked for a checkpoint and a requeue (--requeue-signal)
        self.requeue = None  # ... as the run acts on it at the end of this iteration (`agree`)
        self.stop = None  # the line of a problem that ends the run at the end of this iteration (`end_safely`)
        self.safe = None  # the last iteration's end: what a checkpoint of it needs (`checkpoint_if_due`)
        self.checkpointed = None  # the iteration of the checkpoint.pt this run wrote last

    def __enter__(self):
        signum = REQUEUE_SIGNALS.get(self.args.requeue_signal)
        requeue = None if signum is None else (signum, self.request_requeue)
        self.exits.callback(uncatch, exit_on_ctrl_c(self.dir, self.args.checkpoint_every, requeue))
        self.exits.enter_context(exit_on_write_error(self.dir, self.args.checkpoint_every))
        # no warning from NumPy at each NaN or overflow of a diverging run: the run says so itself, in one line
        self.exits.enter_context(np.errstate(all="ignore"))
        return self

    def __exit__(self, *exception):
        allocation, failure = allocation_failure(exception[1]), environment_failure(exception[1])
        if self.lock is not None:
            os.close(self.lock)  # the lock goes with it (also for a resume in this same process)
            if exception[0] is not None and self.new:
                # a new run that ended before it wrote anything leaves no folder: its own, and --runs-dir if it
                # made it and it is empty; one that could not allocate its memory, not even its first logs
                if (allocation is not None or failure is not None) and not self.wrote:
                    if self.writer is not None:
                        self.writer.close()
                    shutil.rmtree(self.dir, ignore_errors=True)
                with contextlib.suppress(OSError):
                    if os.path.exists(self.dir):
                        os.rmdir(self.dir)
                    if not self.runs_dir_existed:
                        os.rmdir(self.args.runs_dir)
        if failure is not None:  # the environment's own frames, then one line
            return self.environment_failed(exception[1], *failure)
        if allocation is None:
            return self.exits.__exit__(*exception)
        self.exits.__exit__(None, None, None)
        print(f"{program()}: error: {allocation}; {sizes(self.args)}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None

    def environment_failed(self, error: BaseException, tb, env_id: str, function: str, step: int | None):
        """An exception of the environment (`environment_failure`): its traceback from the environment's frames on (the
        bug is in its code), then one line naming it, the step and where the run can go on from; exit code 1."""
        self.exits.__exit__(None, None, None)
        traceback.print_exception(type(error), error, tb, file=sys.stderr)
        at = f" at global step {step}" if step is not None else ""
        where = self.resume_hint() if os.path.isdir(self.dir) else "the run had written nothing (no folder is left)"
        print(
            f"{program()}: error: the environment {self.args.env_id} raised {type(error).__name__} in {function}()"
            f"{at} (its traceback above; {env_id} raised it); {where}",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(1) from None

    def resume_hint(self) -> str:
        """Where this run can go on from: its last checkpoint and the command that resumes it (ppolab.stops)."""
        return resume_hint(self.dir, self.args.checkpoint_every)

    def diverged(self, iteration: int, what: str):
        """Ends the run in one line, exit code 1, when a number it computed is no longer finite: nothing
        non-finite is saved, and the last checkpoint, finite, can be resumed (after a change: the same seed
        diverges again)."""
        print(
            f"{program()}: error: iteration {iteration}: {what} is not finite: the training diverged (the usual "
            "sources: NaN or infinite observations or rewards from the environment, rewards too large for float32, "
            f"a learning rate too large); nothing non-finite was saved; {self.resume_hint()}",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(1)

    def write(self, checkpoint: dict, name: str, iteration: int):
        """Writes `checkpoint` as `name` in the run folder (write_checkpoint_file), unless a number in it is not
        finite: then the run ends (`diverged`) and the file on the disk, if any, stays as it was."""
        problem = non_finite(checkpoint)
        if problem is not None:
            self.diverged(iteration, f"{problem}, which {name} would hold,")
        write_checkpoint_file(checkpoint, f"{self.dir}/{name}")
        self.wrote = True

    def start(self, saved: dict, *, rng: bool = True) -> tuple[int, int]:
        """Before the loop: restores `saved` (name -> object with state_dict(): `model`, `optimizer`, ...: what
        every checkpoint holds) from --resume's checkpoint, the random streams too (`rng`); then opens the run
        folder and its logs. Returns the first iteration and the global step (1 and 0 for a new run)."""
        start_iteration, global_step = restore(self.checkpoint, saved, rng=rng)
        # the first safe point: where the run starts (nothing to write there: it is new, or the checkpoint it resumed)
        optimizer = next((obj for obj in saved.values() if isinstance(obj, torch.optim.Optimizer)), None)
        self.safe = (start_iteration - 1, global_step, saved, {}, optimizer_steps(optimizer))
        self.checkpointed = start_iteration - 1
        if self.checkpoint is not None:
            where = ""
            if self.new:  # (`newer_work` in the writing process, which has the files: under torchrun, rank 0)
                why = newer_work(self.args.resume, self.checkpoint, self.script)
                where = f", in a new run folder ({why}; {Path(self.args.resume).parent} stays as it is)"
            print(
                f"resumed from {self.args.resume} at iteration {self.checkpoint['iteration']}, global step "
                f"{global_step}{where}"
            )
            self.best_return = self.best_so_far()
        self.open_logs(global_step)
        return start_iteration, global_step

    def best_so_far(self) -> float:
        """The evaluation score of the run folder's `best_model.pt` (-inf without one, or in a new folder), so that a
        resumed run replaces it only with a better one: as the file says (`eval_return`) where it was measured as
        this run measures (the same MEASURED_BY), or else as evaluate_saved scores it again with this run's settings
        (the same episodes: the same score)."""
        path = Path(self.dir) / "best_model.pt"
        if self.new or not self.args.eval_every or not path.is_file():
            return float("-inf")
        best = read_checkpoint(str(path), self.script)
        if isinstance(best, str):
            return float("-inf")  # (not a best model of this script: replaced by the first evaluation)
        if "eval_return" in best and all(best["args"].get(name) == getattr(self.args, name) for name in MEASURED_BY):
            return float(best["eval_return"])
        if "eval_return" in best:  # measured another way: scored again as this run's evaluations score
            print(
                f"{path} was scored with other evaluation settings ({', '.join(map(flag, MEASURED_BY))}): scored again"
            )
        return float(
            np.mean(evaluate_saved(best, self.evaluate, self.args.eval_episodes, self.args.eval_deterministic))
        )

    def open_logs(self, global_step: int):
        """Creates the run folder (or says in one line why it cannot) and its TensorBoard writer; starts
        Weights & Biases with --track."""
        args = self.args
        try:
            os.makedirs(self.dir, exist_ok=True)
        except OSError as e:
            fail(f"cannot create the run folder {self.dir}: {e.strerror or e} (pass another --runs-dir)")
        print(f"run folder: {self.dir}\nwatch it with: tensorboard --logdir {Path(self.dir).parent}", flush=True)
        if newer := newer_version(args.env_id):
            print(f"note: Gymnasium has a newer version of {args.env_id}, {newer}; this run trains {args.env_id}")
        print_held_mujoco_warnings()
        if args.track:
            start_tracking(args, self.dir)
        self.writer = tensorboard_writer(self.dir, self.hyperparameters())
        self.start_time, self.start_step = time.time(), global_step

    def start_clock(self):
        """SPS and ETA count the time from here on, not from `start` (a script whose worker processes take a while
        to start calls it once they are ready)."""
        self.start_time = time.time()

    def hyperparameters(self) -> dict:
        """What the TensorBoard text `hyperparameters` lists: the arguments."""
        return asdict(self.args)

    def episode(self, step: int, episodic_return: float, episodic_length: int):
        """An episode that ended at global step `step`, logged there."""
        self.writer.add_scalar("charts/episodic_return", episodic_return, step)
        self.writer.add_scalar("charts/episodic_length", episodic_length, step)
        self.episode_returns.append(episodic_return)

    def iteration(
        self,
        iteration: int,
        global_step: int,
        stats: dict[str, torch.Tensor],
        learning_rate: float,
        rollout_time: float,
        update_time: float,
        *,
        values: torch.Tensor,
        returns: torch.Tensor,
        scalars: dict[str, float] | None = None,
        line_extra: str = "",
    ):
        """The iteration's scalars (the update's statistics copied from the device at once, the critic's
        explained variance of `returns` by `values`, the script's own `scalars` by tag) and, when due, its line
        (`line_extra` ends its parenthesis of times, e.g. the Redis script's transfer and publish times)."""
        explained = explained_variance(values.numpy(), returns.numpy())
        sps = self.log_iteration(
            iteration=iteration,
            global_step=global_step,
            stats=stats,
            learning_rate=learning_rate,
            explained=explained,
            rollout_time=rollout_time,
            update_time=update_time,
            scalars=scalars,
        )
        self.line_if_due(
            head=f"iteration {iteration}/{self.args.num_iterations}",
            global_step=global_step,
            sps=sps,
            last=iteration == self.args.num_iterations,
            times=f"rollout {rollout_time:.2f}s, update {update_time:.2f}s{line_extra}",
        )

    def log_iteration(
        self,
        iteration: int,
        global_step: int,
        stats: dict[str, torch.Tensor],
        learning_rate: float,
        explained: float,
        rollout_time: float,
        update_time: float,
        scalars: dict[str, float] | None = None,
    ) -> int:
        """An iteration's scalars at `global_step` (`explained`: the critic's explained variance); returns the
        run's steps per second so far. The update's statistics, copied from the device here anyway, must be finite:
        else the run ends (`diverged`) after logging them."""
        writer, self.wrote = self.writer, True
        stats = dict(zip(stats, torch.stack(list(stats.values())).tolist()))
        first_ratio_deviation = stats.pop("ratio_deviation")
        sps = int((global_step - self.start_step) / (time.time() - self.start_time))
        writer.add_scalar("charts/learning_rate", learning_rate, global_step)
        for name, value in stats.items():
            writer.add_scalar(f"losses/{name}", value, global_step)
        writer.add_scalar("losses/explained_variance", explained, global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        writer.add_scalar("debug/first_minibatch_ratio_deviation", first_ratio_deviation, global_step)
        writer.add_scalar("perf/rollout_time", rollout_time, global_step)
        writer.add_scalar("perf/update_time", update_time, global_step)
        for tag, value in (scalars or {}).items():
            writer.add_scalar(tag, value, global_step)
        problem = non_finite({f"losses/{name}": value for name, value in stats.items()})
        if problem is not None:
            self.diverged(iteration, f"{problem} ({stats[problem.removeprefix('losses/')]})")
        return sps

    def line_if_due(self, head: str, global_step: int, sps: int, last: bool, times: str):
        """The per-iteration line, when due (ProgressLine; always at the `last` iteration): `head`
        ("iteration i/N"), the episodes since the previous line, the speed, the time left and the `times`."""
        line = self.progress.due(self.episode_returns, last=last)
        self.episode_returns = []
        if line:
            eta = timedelta(seconds=int((self.args.num_iterations * self.args.batch_size - global_step) / max(sps, 1)))
            print(f"{head} global_step={global_step} {line} SPS={sps} ETA={eta} ({times})", flush=True)

    def log_evaluation(self, returns: list[float], global_step: int):
        """An evaluation's scalars at the global step it was made: every episode's return as
        `eval/episodic_return` and their mean as `eval/mean_return`."""
        for episodic_return in returns:
            self.writer.add_scalar("eval/episodic_return", episodic_return, global_step)
        self.writer.add_scalar("eval/mean_return", float(np.mean(returns)), global_step)

    def checkpoint_if_due(self, iteration: int, global_step: int, saved: dict, **extras):
        """--checkpoint-every N: `checkpoint.pt` in the run folder after every N-th iteration, holding `saved`. The
        end of an iteration is the run's safe point: where --requeue-signal asked for it, the checkpoint is written
        here and the run exits (REQUEUE_EXIT); where a problem asked to end the run (`end_safely`), likewise with
        exit code 1."""
        args = self.args
        self.agree()
        if (args.checkpoint_every and iteration % args.checkpoint_every == 0) or self.requeue or self.stop:
            self.write(checkpoint_data(saved, args, iteration, global_step, **extras), "checkpoint.pt", iteration)
            self.checkpointed = iteration
        if self.requeue is not None:
            print(
                f"{program()}: {self.requeue}: checkpoint written at iteration {iteration}, exiting with code "
                f"{REQUEUE_EXIT} to be requeued; {self.resume_hint()} (or the same command with --resume auto)",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(REQUEUE_EXIT)
        if self.stop is not None:
            print(f"{self.stop}; checkpoint written at iteration {iteration}; {self.resume_hint()}", file=sys.stderr)
            raise SystemExit(1)
        optimizer = next((obj for obj in saved.values() if isinstance(obj, torch.optim.Optimizer)), None)
        self.safe = (iteration, global_step, saved, extras, optimizer_steps(optimizer))

    def request_requeue(self, name: str):
        """--requeue-signal arrived (its `name`): the run writes its checkpoint at the end of this iteration and
        exits (`checkpoint_if_due`)."""
        self.requested = name

    def agree(self):
        """Whether the run stops for a requeue at the end of this iteration: where the signal asked for it (a job of
        several processes decides together: DistributedRun)."""
        self.requeue = self.requested

    def end_safely(self, line: str):
        """Ends the run for the problem `line` says (`<script>: error: ...`), exit code 1, with a checkpoint first:
        at once where nothing was trained since the last iteration's end (its optimizer has not stepped), with a
        checkpoint of it; else at the end of this iteration (`checkpoint_if_due`)."""
        if self.safe is None or self.safe[-1] is None or not same_steps(self.safe[-1], self.safe[2]):
            self.stop = line
            return
        iteration, global_step, saved, extras, _ = self.safe
        if self.checkpointed != iteration:
            self.write(checkpoint_data(saved, self.args, iteration, global_step, **extras), "checkpoint.pt", iteration)
            self.checkpointed = iteration
            line += f"; checkpoint written at iteration {iteration}"
        print(f"{line}; {self.resume_hint()}", file=sys.stderr, flush=True)
        raise SystemExit(1)

    def evaluate_if_due(self, iteration: int, global_step: int, saved: dict, **extras):
        """--eval-every N: after every N-th iteration the policy as it is now (`saved`, as a checkpoint would
        hold it) plays --eval-episodes on a separate environment with its own seeded RNG stream (the same
        episodes every time, those of the final evaluation); the best evaluation's model is kept as
        `best_model.pt` in the run folder."""
        args = self.args
        if not args.eval_every or iteration % args.eval_every:
            return
        eval_start = time.perf_counter()
        snapshot = checkpoint_data(saved, args, iteration, global_step, **extras)
        problem = non_finite(snapshot)
        if problem is not None:
            self.diverged(iteration, problem)
        returns = evaluate_saved(snapshot, self.evaluate, args.eval_episodes, args.eval_deterministic)
        self.log_evaluation(returns, global_step)
        if np.mean(returns) > self.best_return:
            self.best_return = float(np.mean(returns))
            self.write({**snapshot, "eval_return": self.best_return}, "best_model.pt", iteration)
        print(
            f"evaluation at global_step={global_step}: mean return {np.mean(returns):.2f} (best, in "
            f"best_model.pt: {self.best_return:.2f}; {time.perf_counter() - eval_start:.1f}s)",
            flush=True,
        )

    def finish(self, global_step: int, saved: dict, *, iteration: int | None = None, **extras):
        """The end of a run: with --save-model the final model saved as `model.pt` (at `iteration`, by default
        the last one, --total-timesteps' count) and evaluated; the logs closed (and the Weights & Biases run, with
        the videos recorded)."""
        args = self.args
        if args.save_model:
            iteration = args.num_iterations if iteration is None else iteration
            model = checkpoint_data(saved, args, iteration, global_step, **extras)
            self.write(model, "model.pt", iteration)
            print(f"model saved to {self.dir}/model.pt")
            returns = evaluate_saved(model, self.evaluate, args.eval_episodes, args.eval_deterministic)
            self.log_evaluation(returns, global_step)
            print(f"evaluation: {len(returns)} episodes, mean return {np.mean(returns):.2f} +- {np.std(returns):.2f}")
        self.writer.close()
        if args.track:
            finish_tracking(self.dir)


def optimizer_steps(optimizer) -> list | None:
    """A copy of the step counts of `optimizer`'s state (of its first parameter, with Adam's per-parameter count:
    every parameter steps together), to tell later whether it stepped since (`same_steps`); None without one."""
    if optimizer is None:
        return None
    state = next(iter(optimizer.state.values()), {})
    step = state.get("step", 0)
    return [step.clone() if isinstance(step, torch.Tensor) else step]


def same_steps(steps: list, saved: dict) -> bool:
    """Whether the optimizer of `saved` is where `steps` (optimizer_steps) found it: it has not stepped since."""
    optimizer = next(obj for obj in saved.values() if isinstance(obj, torch.optim.Optimizer))
    now = optimizer_steps(optimizer)[0]
    return bool(now == steps[0]) if isinstance(now, torch.Tensor) else now == steps[0]


def allocation_failure(error: BaseException | None) -> str | None:
    """What an error that says memory could not be allocated asked for, in words (`cannot allocate 596.05 GiB of
    memory`); None for any other error."""
    text = str(error)
    if isinstance(error, MemoryError) or isinstance(error, torch.OutOfMemoryError):
        pass
    elif not (isinstance(error, RuntimeError) and ("can't allocate memory" in text or "not enough memory" in text)):
        return None
    asked = re.search(r"allocate (\d+) bytes", text)
    size = f"{int(asked[1]) / 2**30:.2f} GiB of " if asked else ""
    where = " on the GPU" if isinstance(error, torch.OutOfMemoryError) else ""
    return f"cannot allocate {size}memory{where} for the run"


def sizes(args) -> str:
    """The flags that size a run's rollout and batch, with their values, and what to do."""
    names = [name for name in ("num_workers", "num_envs_per_worker", "num_envs", "num_chunks", "num_steps")]
    given = [f"{flag(name)} {getattr(args, name)}" for name in names if name in args.__dataclass_fields__]
    return f"its rollout is {' x '.join(given)} steps: pass smaller ones"
