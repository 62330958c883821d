"""The run settings every script takes besides PPO's hyperparameters: where a run goes, what it records, how it
runs. A script's `Args` inherits them (`class Args(ppolab.RunSettings)`) and declares its hyperparameters; it
declares a setting again where its default or meaning is its own (e.g. `--torch-threads 2` in the pixel scripts).
"""

import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal


@dataclass
class RunSettings:
    # The run: where it goes, what it records, how it runs
    exp_name: str | None = None
    """the name of this experiment, part of the run folder's name (None: the script's name, e.g. ppo)"""
    seed: int = 1
    """seed of the experiment (environments, PyTorch, NumPy, Python)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True` and cuDNN's TF32 off (full float32)"""
    cuda: bool = True
    """if toggled, cuda is used when available"""
    torch_threads: int = 1
    """CPU threads for PyTorch and NumPy's BLAS (0 keeps their defaults)"""
    compile: bool = False
    """torch.compile the policy step and the update step (the way to a faster update on a GPU)"""
    cudagraphs: bool = False
    """capture the compiled policy step and update step in CUDA graphs (CUDA only; implies --compile)"""
    track: bool = False
    """if toggled, the run is tracked with Weights & Biases"""
    wandb_project_name: str = "ppo-lab"
    """the Weights & Biases project name"""
    wandb_entity: str | None = None
    """the entity (team) of the Weights & Biases project"""
    capture_video: bool = False
    """if toggled, videos of environment 0's episodes are saved to `runs/<run>/videos`"""
    save_model: bool = False
    """if toggled, the final model is saved to `runs/<run>/model.pt` and evaluated"""
    checkpoint_every: int = 0
    """write a resumable `runs/<run>/checkpoint.pt` every this many iterations (0: never)"""
    resume: str | None = None
    """a checkpoint to continue from, with its arguments (only --total-timesteps and how it runs may change); auto: this command's newest run, if any"""
    requeue_signal: Literal["USR1", "USR2", "TERM", "none"] = "USR1"
    """this signal makes the run write its checkpoint at the end of the iteration and exit with code 75, to be requeued"""
    evaluate: str | None = None
    """path of a checkpoint or model to evaluate; evaluates and exits without training"""
    eval_every: int = 0
    """evaluate every this many iterations on a separate environment and keep the best model as `runs/<run>/best_model.pt` (0: never)"""
    eval_episodes: int = 10
    """the number of episodes of an evaluation"""
    eval_deterministic: bool = False
    """if toggled, evaluation takes the most probable action (for continuous actions, the mean) instead of sampling"""
    eval_max_steps: int = 27_000
    """an evaluation episode is cut after this many steps where the environment has no time limit of its own"""
    runs_dir: str = "runs"
    """folder under which each run writes its own folder"""

    # the flags of the script's own Args that a --resume may change, besides every script's (those above that say
    # where and how the run goes on, and --total-timesteps: ppolab.checkpoints.CHANGEABLE_ON_RESUME)
    changeable_on_resume: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        if self.exp_name is None:  # the script's file name without .py
            self.exp_name = Path(script_of(self)).stem


def script_of(args) -> str:
    """The file name of the script whose Args `args` are (`ppo.py`): what its checkpoints say they are from."""
    return Path(inspect.getfile(sys.modules[type(args).__module__])).name
