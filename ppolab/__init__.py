"""ppolab: the run infrastructure of the ppo-lab scripts, written once.

Every script holds its whole PPO variant (arguments, environments, network, GAE, loss, update, training
loop) and imports this package for what never changes what PPO computes and is the same in every script:

- program.py: the program a script is, from `run_program` (command_line.py, the script's last line) to its exit:
  a signal at any moment ends it in one line at most with the right exit code, and output that cannot be written
  (a closed pipe, a full disk, a terminal gone) stops the printing, never the work;
- compiler.py: PyTorch's compiler (torch._dynamo) imported only by a program that compiles, not by every
  optimizer's guards;
- settings.py: the settings every run takes besides PPO's hyperparameters (`RunSettings`, which a script's Args
  inherits: --seed, --cuda, --track, --save-model, --checkpoint-every, --resume, --evaluate, ...);
- command_line.py: the command line (`parse`: --resume reads the saved arguments as defaults; `use_threads`:
  --torch-threads' limits);
- checks.py: bad input ends in one line (`fail`, `check_args`);
- environments.py: Gymnasium's environments checked (ids, spaces, Atari games, rendering) and made, evaluation's
  with an end;
- run.py: the run folder and its lock, and `Run`: what a run reports (TensorBoard, the per-iteration line),
  checkpoints and evaluations on their schedule;
- evaluation.py: a saved policy played on the run's evaluation seed, and --evaluate of a saved file
  (`evaluate_file`);
- tracking.py: the TensorBoard writer and, with --track, the Weights & Biases run;
- checkpoints.py: checkpoints as data, written atomically, read without running code, checked against the script
  before anything is loaded, and --resume's rules (rewrite_checkpoint.py: a checked copy of a trusted legacy file);
- stops.py: Ctrl-C and refused writes end a run in one line that says how to resume it;
- seeding.py: seeds, deterministic kernels, the device;
- fast_path.py: the NumPy policy and update steps of the small-MLP scripts on the CPU, with the guard that
  runs them only where they compute exactly the script's code;
- vector_env.py, statistics.py: a same-step vector environment and running statistics;
- video.py: --capture-video where the environment cannot render (envpool's), from the observed frames;
- distributed.py (imported by the torchrun script only): the plumbing of a job of processes (device, backend,
  joining and leaving, the messages between ranks, timing the collectives) and `DistributedRun`, the run of a
  data-parallel job, which rank 0 writes for every rank;
- redis_server.py (imported by ppo_continuous_action_redis.py only): the Redis plumbing of that script that is
  not its lesson (reading and checking a server's URL, connecting, a redis-server of the run's own, stopping
  the run's local processes);
- processes.py (imported by the shared-memory script only): the plumbing of its worker processes that is not its
  lesson (tensors into shared memory, messages that do not wait forever for a process that died, ending processes).

A script copied elsewhere runs wherever this package is importable (`pip install -e .` in the repository,
which `bash setup.sh` does). Importing the package changes nothing in the process (no signal handler, no wrapped
stream, no environment variable): a test, a tool, a notebook or a REPL imports it safely; `run_program` sets up what
a run needs when the program starts.
"""

from ppolab import program
from ppolab.checks import check_args, fail
from ppolab.command_line import parse, run_program, use_threads
from ppolab.environments import (
    capped,
    check_atari_game,
    check_finite_bounds,
    check_observations,
    check_video,
    env_module,
    env_spec,
    make_eval_env,
    making,
    policy_actions,
)
from ppolab.evaluation import evaluate_file
from ppolab.fast_path import NumpyPolicy, numpy_fast_path
from ppolab.run import Run, explained_variance
from ppolab.seeding import pick_device, seed_everything
from ppolab.settings import RunSettings
from ppolab.statistics import RunningMeanStd
from ppolab.vector_env import SameStepVectorEnv
from ppolab.video import VideoRecorder

__all__ = [
    "NumpyPolicy",
    "Run",
    "RunSettings",
    "RunningMeanStd",
    "SameStepVectorEnv",
    "VideoRecorder",
    "capped",
    "check_args",
    "check_atari_game",
    "check_finite_bounds",
    "check_observations",
    "check_video",
    "env_module",
    "env_spec",
    "evaluate_file",
    "explained_variance",
    "fail",
    "make_eval_env",
    "making",
    "numpy_fast_path",
    "parse",
    "policy_actions",
    "pick_device",
    "run_program",
    "seed_everything",
    "use_threads",
]
