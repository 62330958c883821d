"""The plumbing of a job of processes launched by torchrun (ppo_atari_multigpu.py): choosing each rank's device
and backend, joining the job and leaving it on every path, the messages between ranks, timing the collectives,
the job's key-value store, and `DistributedRun`, the run of a data-parallel job (every rank trains, rank 0 alone
writes). What the ranks compute together (the gradient all-reduce, the global advantage statistics, the weight
broadcast, what a rank reports after its rollout) stays in the script: it is its lesson.

Every collective is called by every rank, in the same order: that is the whole protocol.
"""

import contextlib
import hashlib
import io
import os
import signal
import sys
import time
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist

from ppolab.checkpoints import device_of, read_checkpoint, restore, rng_state, set_rng_state
from ppolab.checks import fail, program
from ppolab.run import Run, new_run_dir, resume_dir
from ppolab.settings import script_of
from ppolab.stops import REQUEUE_EXIT

# JOINING THE JOB AND LEAVING IT ------------------------------------------------------------------


def select_device(args, local_rank: int) -> torch.device:
    """Local rank i uses GPU --device-ids[i % len] (default: GPU i % GPU count), or the CPU (--no-cuda, or no
    GPU)."""
    if not (args.cuda and torch.cuda.is_available()):
        return torch.device("cpu")
    ids = args.device_ids or list(range(torch.cuda.device_count()))
    return torch.device("cuda", ids[local_rank % len(ids)])


def select_backend(args, device: torch.device) -> str:
    """--backend, or by default nccl when every local rank has a GPU of its own (and PyTorch has NCCL), else
    gloo (NCCL refuses two ranks on one GPU)."""
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    shared_gpu = (
        device.type == "cuda" and len({select_device(args, i) for i in range(local_world_size)}) < local_world_size
    )
    if args.backend == "nccl" and shared_gpu:
        fail("--backend nccl cannot put several ranks on one GPU; pass --backend gloo or other --device-ids")
    if args.backend == "nccl" and not dist.is_nccl_available():
        fail("--backend nccl: this PyTorch is built without NCCL; pass --backend gloo")
    nccl = device.type == "cuda" and not shared_gpu and dist.is_nccl_available()
    return args.backend or ("nccl" if nccl else "gloo")


def job_store(name: str) -> dist.Store:
    """A client of the job's key-value store (the one torchrun's rendezvous runs, in torchrun's own process
    where it hosts it: it outlives the ranks), with its own keys under `name`: the ranks leave each other
    notes there without a collective (the finished rollouts of preemption, a rank that ended on purpose)."""
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=60)
    )
    # torchrun --max-restarts starts the ranks again in the same store: each start has keys of its own
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)
    return dist.PrefixStore(f"{Path(sys.argv[0]).stem}/{restart}/{name}", store)


@contextlib.contextmanager
def in_the_job(rank: int, world_size: int, timeout: float):
    """The block runs as one rank of the job, whose process group it leaves on every path (torchrun stops
    the other ranks of a failed job with SIGTERM: that leaves through `finally` too). A rank that ends on
    purpose (a SystemExit: bad input, Ctrl-C, a refused write, each after its own line) notes it in the
    job's store first, and a rank that it leaves waiting in a collective then ends without a line of its
    own (exit 1); a rank that loses the others otherwise (one died, or hung for more than --timeout) ends in
    one line that says so."""
    notes = job_store("ended") if world_size > 1 else None
    previous_handler = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        yield
    except SystemExit:
        if notes is not None:
            with contextlib.suppress(RuntimeError):  # no store to tell (torchrun's is gone): nobody to tell
                notes.set("on purpose", str(rank))
        raise
    except RuntimeError as e:
        if not is_connection_failure(e):
            raise
        ended_on_purpose = False
        if notes is not None:
            with contextlib.suppress(RuntimeError):
                ended_on_purpose = notes.check(["on purpose"])
        if not ended_on_purpose:
            print(
                f"{program()}: rank {rank}: lost the other ranks (one died or hung for more than "
                f"--timeout {timeout:g}s): {str(e).splitlines()[0]}",
                file=sys.stderr,
            )
        raise SystemExit(1) from None
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        dist.destroy_process_group()


def is_connection_failure(error: RuntimeError) -> bool:
    """A collective that failed because another rank died, hung or closed its connection."""
    text = str(error)
    return isinstance(error, dist.DistError) or any(
        word in text for word in ("gloo", "NCCL", "Connection closed", "Timed out", "timed out")
    )


# THE MESSAGES BETWEEN RANKS ----------------------------------------------------------------------
# The Python objects that ranks send each other (the arguments, checkpoint and run folder from rank 0, the
# rollout reports, the random states for a checkpoint, the weights' checksums) travel pickled, through
# torch.distributed's object collectives, and unpickling can run code. Here that is safe by construction:
# every pickle was made by a rank of this same job (the same script, started by the same launch and joined
# through its rendezvous), never read from a file or taken from outside the job; a checkpoint file is read as
# data only (read_checkpoint) before rank 0 sends what it read. They are pickled by torch.save, not by pickle
# itself: pickle's own path for tensors cannot rebuild a uint32 tensor (the key of NumPy's random state).


def to_bytes(value) -> bytes:
    """`value` pickled by torch.save, every tensor with its dtype."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def from_bytes(data: bytes):
    """The inverse of `to_bytes`, for the pickles of the ranks of this job only (see above)."""
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def from_rank0(value):
    """Rank 0's `value` on every rank (pickled; for small objects and checkpoints)."""
    box = [to_bytes(value) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return from_bytes(box[0])


def all_gather(value) -> list:
    """Every rank's `value` on every rank, in rank order (pickled; for small objects)."""
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, to_bytes(value))
    return [from_bytes(data) for data in values]


# TIMING THE COLLECTIVES --------------------------------------------------------------------------


class CommTimer:
    """`with comm: <collective>` adds the time this rank spends in the collective to `comm.seconds`
    (perf/comm_time), the wait for slower ranks included.

    What that time is: with gloo on the CPU a collective returns when it is done, so the wall time of
    the call is the communication and the wait. On CUDA the GPU runs behind the host, and an nccl
    collective returns to the host as soon as it is queued: the wall time of the call would be the
    launch. There CUDA events recorded on entry and exit time the collective on the GPU's own clock,
    without a sync; `seconds` reads them, once per iteration (one sync, at logging). With `sync`
    (--sync-timing) the GPU is instead synchronized on entry and exit, two syncs per call, and the
    wall time is the collective's alone."""

    def __init__(self, device: torch.device, sync: bool):
        self.device, self.sync = device, sync and device.type == "cuda"
        self.events = device.type == "cuda" and not sync and torch.cuda.is_available()
        self.wall_seconds, self.timed = 0.0, []  # wall time; (start, end) CUDA events

    def __enter__(self):
        if self.sync:
            torch.cuda.synchronize(self.device)
        if self.events:
            self.timed.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            self.timed[-1][0].record()
        self.start = time.perf_counter()

    def __exit__(self, *exception):
        if self.sync:
            torch.cuda.synchronize(self.device)
        if self.events:
            self.timed[-1][1].record()
        self.wall_seconds += time.perf_counter() - self.start

    @torch._disable_dynamo  # torch.compiler.disable that imports the compiler at its first call, not here
    def __call__(self, collective, *args):
        """`collective(*args)`, timed; eager also under --compile (the compiled graphs end before it)."""
        with self:
            return collective(*args)

    @property
    def seconds(self) -> float:
        if not self.events:
            return self.wall_seconds
        if self.timed:
            self.timed[-1][1].synchronize()
        return sum(start.elapsed_time(end) for start, end in self.timed) / 1000.0


# THE RUN OF A DATA-PARALLEL JOB ------------------------------------------------------------------


class ValueSums(NamedTuple):
    """Sums over one rank's samples (float64) from which the explained variance of the values follows:
    added up over the ranks they give the numbers of one process on all samples (see
    `explained_variance_of`). y are the returns, e = y - values the errors."""

    count: int
    y: float
    y_squared: float
    e: float
    e_squared: float

    @classmethod
    def of(cls, values: torch.Tensor, returns: torch.Tensor) -> "ValueSums":
        y, e = returns.double().numpy().ravel(), (returns - values).double().numpy().ravel()
        return cls(y.size, y.sum(), (y**2).sum(), e.sum(), (e**2).sum())


def explained_variance_of(sums: list[ValueSums]) -> float:
    """1 - Var(returns - values) / Var(returns) over every rank's samples, from the ranks' ValueSums
    (nan when the returns do not vary): what one process computes on the concatenated samples."""
    n, y, y_squared, e, e_squared = (sum(column) for column in zip(*sums))
    var_y = y_squared / n - (y / n) ** 2
    return float("nan") if var_y <= 0 else float(1 - (e_squared / n - (e / n) ** 2) / var_y)


class DistributedRun(Run):
    """The `Run` of a data-parallel job, made by every rank once it joined the job: every rank trains with the
    same arguments, folder and checkpoint, those of rank 0, which reads --resume's checkpoint (only its machine
    needs the file) or names a new run's folder, and sends them with its arguments (ppolab.parse reads a
    checkpoint's saved arguments where the file is: on other machines it is not). A problem with either ends
    every rank in the same line.

    Rank 0 alone writes the logs, checkpoints, evaluations and the model, with every rank's data: the episodes,
    value sums and rollout times of the ranks' rollout reports (`report.episodes`, `.value_sums`,
    `.rollout_time`), and in a checkpoint the random streams of every rank (`rank_rng`), which a resume with the
    same world size gives back to each rank. The script calls `iteration` and `evaluate_if_due` on rank 0, the
    rest on every rank."""

    def __init__(self, args, evaluate: Callable | None = None, env_name: Callable[[str], str] = str):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        sent = None
        if self.rank == 0:
            if args.resume is not None:  # in its own folder, or a branch in a new one (resume_dir)
                checkpoint, run_dir, problem = read_checkpoint(args.resume, script_of(args), type(args)), None, None
                if not isinstance(checkpoint, str):
                    run_dir, problem = resume_dir(args, checkpoint)
            else:
                checkpoint, (run_dir, problem) = None, new_run_dir(args, env_name)
            sent = args, checkpoint, run_dir, checkpoint if isinstance(checkpoint, str) else problem
        args, checkpoint, run_dir, problem = from_rank0(sent)
        if problem:
            fail(problem)  # on every rank: each says why the job ends
        try:
            super().__init__(args, evaluate, env_name, checkpoint=checkpoint, run_dir=run_dir, writes=self.rank == 0)
        except SystemExit:  # a refused resume leaves no branch folder behind
            if self.rank == 0 and args.resume is not None and run_dir != str(Path(args.resume).parent):
                with contextlib.suppress(OSError):
                    os.rmdir(run_dir)
            raise

    def start(self, saved: dict, *, rng: bool = True) -> tuple[int, int]:
        """Every rank restores `saved` from --resume's checkpoint and, with `rng`, its own random streams where
        the job has the world size that wrote it (with another, each rank keeps its new seed's); rank 0 alone
        opens the run folder and its logs. Returns the first iteration and the global step."""
        if rng and self.checkpoint is not None and len(self.checkpoint["rank_rng"]) == self.world_size:
            set_rng_state(self.checkpoint["rank_rng"][self.rank], device_of(saved))
        if self.rank != 0:
            return restore(self.checkpoint, saved, rng=False)
        start = super().start(saved, rng=False)
        print(
            f"{self.world_size} ranks x {self.args.num_envs // self.world_size} environments, backend "
            f"{dist.get_backend()}, rank 0 on {device_of(saved)}"
        )
        return start

    def hyperparameters(self) -> dict:
        return {**asdict(self.args), "world_size": self.world_size}

    def iteration(
        self,
        iteration: int,
        global_step: int,
        stats: dict[str, torch.Tensor],
        learning_rate: float,
        rollout_time: float,
        update_time: float,
        *,
        scalars: dict[str, float] | None = None,
        reports: list,
        comm_time: float,
    ):
        """On rank 0: the episodes of every rank's report at the steps they ended, the iteration's scalars (the
        explained variance from every rank's value sums, the slowest rank's rollout time as
        perf/rollout_time_max, the time in collectives as perf/comm_time, the script's own `scalars`) and, when
        due, its line (without "/N" with --preempt-fraction, which makes the number of iterations unknown).
        The arguments are Run.iteration's, at the same positions (`rollout_time` is rank 0's), but for its `values`
        and `returns`: every rank's `reports` (their value sums) stand in for them, with `comm_time` after them."""
        for episode in (episode for report in reports for episode in report.episodes):
            self.episode(*episode)
        scalars = {
            **(scalars or {}),
            "perf/rollout_time_max": max(report.rollout_time for report in reports),
            "perf/comm_time": comm_time,  # what it measures: see CommTimer
        }
        explained = explained_variance_of([report.value_sums for report in reports])
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
        planned = "" if getattr(self.args, "preempt_fraction", None) is not None else f"/{self.args.num_iterations}"
        self.line_if_due(
            head=f"iteration {iteration}{planned}",
            global_step=global_step,
            sps=sps,
            last=global_step >= self.args.num_iterations * self.args.batch_size,
            times=f"rollout {rollout_time:.2f}s, update {update_time:.2f}s, comm {comm_time:.2f}s",
        )

    def evaluate_if_due(self, iteration: int, global_step: int, saved: dict):
        """On rank 0, as every run's (the other ranks go on to their next collective and wait there for it);
        `best_model.pt` holds rank 0's random streams as `rank_rng` too."""
        if self.args.eval_every and iteration % self.args.eval_every == 0:
            super().evaluate_if_due(iteration, global_step, saved, rank_rng=[rng_state(device_of(saved))])

    def checkpoint_if_due(self, iteration: int, global_step: int, saved: dict):
        """On every rank: --checkpoint-every N gathers every rank's random streams (one all_gather) after every
        N-th iteration, and rank 0 writes the checkpoint with them as `rank_rng`. With --requeue-signal, the ranks
        first tell each other whether the signal came to any of them (one all_gather): then every rank stops at
        this same iteration, after rank 0 wrote the checkpoint, with the same exit code (REQUEUE_EXIT)."""
        if self.args.requeue_signal != "none":  # (what the signal set, read once: it may come during the gather)
            self.requeue = next((name for name in all_gather(self.requested) if name is not None), None)
        ending = SystemExit(REQUEUE_EXIT)  # (rank 0 says it)
        if (self.args.checkpoint_every and iteration % self.args.checkpoint_every == 0) or self.requeue:
            rank_rng = all_gather(rng_state(device_of(saved)))
            if self.rank == 0:
                try:
                    super().checkpoint_if_due(iteration, global_step, saved, rank_rng=rank_rng)
                except SystemExit as e:
                    if self.requeue is None:
                        raise
                    ending = e
        if self.requeue is not None:
            all_gather(None)  # no rank exits before rank 0 wrote the checkpoint (torchrun would stop rank 0)
            raise ending

    def agree(self):
        """Decided by every rank together, in checkpoint_if_due."""

    def finish(self, global_step: int, saved: dict, *, iteration: int | None = None):
        """On every rank: the weights compared across the ranks (every rank took the same optimizer steps, so
        they must be identical: a difference ends the job in a line naming them). Then on rank 0: the weights'
        checksums printed, and the end of every run (--save-model: `model.pt`, with rank 0's random streams as
        `rank_rng`, evaluated; the logs closed)."""
        digest = hashlib.sha256()  # of the weights one after the other
        for tensor in saved["model"].state_dict().values():
            digest.update(tensor.reshape(-1).cpu().numpy().tobytes())
        digests = all_gather(digest.hexdigest()[:16])
        if len(set(digests)) > 1:
            raise SystemExit(f"{program()}: rank {self.rank}: the weights differ across ranks: {digests}")
        if self.rank == 0:
            print(f"final weights of the {len(digests)} ranks: sha256 {' '.join(digests)}")
            super().finish(global_step, saved, iteration=iteration, rank_rng=[rng_state(device_of(saved))])
