"""PPO on Procgen (Cobbe et al. 2020) through envpool's C++ vector environment, IMPALA CNN.

Run:
    python ppo_procgen.py --env-id starpilot      # or bossfight, bigfish, ... (16 games), easy distribution
    tensorboard --logdir runs

What this file shows: PPO with the Procgen settings of "The 37 Implementation Details of PPO" (Huang
et al. 2022): the easy distribution over unlimited levels, 64x64 RGB frames, the IMPALA CNN (Espeholt
et al. 2018) shared by actor and critic, rewards scaled by a running standard deviation of the
discounted return and clipped, the published hyperparameters. envpool ships the games (the `procgen`
package has no wheels for current Python). PPO ends at the banner after `train`; below it is the
machinery a run needs (checks, checkpoints, evaluation).

What is special in this file (the places where envpool scripts usually go wrong):
- envpool resets a finished episode on the *next* step, for Procgen as for Atari (checked with envpool
  1.2.5): the step after an episode end ignores the action, returns reward 0 and a new level's first
  observation. That "reset row" is not experience: it stays in the rollout (it computes the value of the
  final observation) but is masked out of the advantages, the loss and the reward statistics.
- Procgen's time-out arrives as `truncated` and bootstraps the value of the final observation
  (`--no-bootstrap-truncation`: a termination, as Procgen's own `done`); every finished episode is
  logged at its own step with its raw score (the unscaled rewards summed).
- Observations stay uint8 (192 MiB for the default rollout) in a channels-last buffer, as the CNN runs; the
  update's activations take more (benchmark/results/speed.md, Pixel scripts): more minibatches, less memory.
- Checkpoints hold the reward statistics too, as data.
- envpool's Procgen needs the system Qt 5 runtime (`libqt5gui5`); without it the script says so in one line.
"""

import contextlib
import copy
import errno
import io
import math
import os
import pickle
import random
import re
import signal
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path

# Before PyTorch loads OpenMP: idle threads of its pool sleep, not spin, so a busy core's time goes to the threads
# that work (benchmark/results/speed.md, Pixel scripts). An OMP_WAIT_POLICY of your own is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import envpool
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions.categorical import Categorical


@dataclass
class Args:
    # PPO's hyperparameters (the defaults are the published ones)
    env_id: str = "starpilot"
    """the Procgen game, easy distribution (`starpilot` is read as `StarpilotEasy-v0`; full envpool ids also work)"""
    total_timesteps: int = 25_000_000
    """total timesteps of the experiment"""
    learning_rate: float = 5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 64
    """the number of parallel game environments"""
    num_steps: int = 256
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.999
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 8
    """the number of mini-batches"""
    update_epochs: int = 3
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold (stops the epochs of an update early)"""
    bootstrap_truncation: bool = True
    """bootstrap the value of the final observation at Procgen's time-out (off: treat it as termination)"""
    reward_clip: float = 10.0
    """scaled rewards are clipped to [-reward_clip, reward_clip]"""

    # The run: where it goes, what it records, how it runs
    exp_name: str = Path(__file__).stem
    """the name of this experiment (part of the run folder's name)"""
    seed: int = 1
    """seed of the experiment (environments, PyTorch, NumPy, Python)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True` and cuDNN's TF32 off (full float32)"""
    cuda: bool = True
    """if toggled, cuda is used when available"""
    torch_threads: int = 2
    """CPU threads for PyTorch (0 keeps PyTorch's default); 2, as in the Atari scripts, where it kept up with 1
    beside a busy process (benchmark/results/speed.md, Pixel scripts; this script's busy case not measured)"""
    compile: bool = False
    """torch.compile the policy step and the update step; off by default: on a 2-core CPU neither step got
    faster and compiling takes minutes (benchmark/results/speed_cpu.md); meant for GPUs"""
    cudagraphs: bool = False
    """capture the compiled policy step and update step in CUDA graphs (CUDA only; implies --compile)"""
    envpool_threads: int = 0
    """threads envpool steps the games with (0: envpool's choice, one per env up to the core count)"""
    track: bool = False
    """if toggled, the run is tracked with Weights & Biases"""
    wandb_project_name: str = "ppo-lab"
    """the Weights & Biases project name"""
    wandb_entity: str | None = None
    """the entity (team) of the Weights & Biases project"""
    capture_video: bool = False
    """envpool cannot render the game: this saves env 0's own 64x64 RGB observations (what the agent
    sees) as videos in `runs/<run>/videos` (episodes 0, 1, 8, 27, ... of env 0)"""
    save_model: bool = False
    """if toggled, the final model is saved to `runs/<run>/model.pt` and evaluated"""
    checkpoint_every: int = 0
    """write a resumable `runs/<run>/checkpoint.pt` every this many iterations (0: never)"""
    resume: str | None = None
    """path of a checkpoint to continue from, with its arguments: only --total-timesteps and machine flags may change"""
    evaluate: str | None = None
    """path of a checkpoint or model to evaluate; evaluates and exits without training"""
    eval_every: int = 0
    """evaluate every this many iterations (--eval-episodes on a separate environment) and keep the best
    model as `runs/<run>/best_model.pt` (0: never: it pauses training, benchmark/results/evaluation.md)"""
    eval_episodes: int = 10
    """number of episodes of an evaluation"""
    eval_deterministic: bool = False
    """if toggled, evaluation takes the most probable action instead of sampling"""
    runs_dir: str = "runs"
    """folder under which each run writes its own folder"""

    @property
    def batch_size(self) -> int:
        """transitions per update: num_envs * num_steps (reset rows included, see the docstring)"""
        return self.num_envs * self.num_steps

    @property
    def num_iterations(self) -> int:
        """updates in the whole run: total_timesteps // batch_size"""
        return self.total_timesteps // self.batch_size


# ENVIRONMENTS ------------------------------------------------------------------------------------


def make_envs(args: Args, num_envs: int, seed: int):
    """envpool's Procgen vector environment: the easy distribution (the id from procgen_id), unlimited levels,
    64x64 RGB frames as height x width x channel uint8, env i seeded with seed + i. Episodes end `truncated` at
    the game's fixed time-out (1000 steps; 500 in maze and leaper, 4000 in bossfight and plunder, 6000 in bigfish)."""
    return envpool.make(
        procgen_id(args.env_id),
        env_type="gymnasium",
        num_envs=num_envs,
        seed=seed,
        num_threads=args.envpool_threads,
        num_levels=0,
        start_level=0,
        channel_first=False,
    )


def as_images(frames: np.ndarray) -> torch.Tensor:
    """envpool's (B, 64, 64, 3) uint8 frames as the CNN's (B, 3, 64, 64) input: a channels-last view, no copy."""
    return torch.from_numpy(frames).permute(0, 3, 1, 2)


class EpisodeStatistics:
    """The raw score per environment: Procgen's unscaled reward summed over the episode, reported when
    the episode ends, terminated or truncated (time-out). The reset row's reward is 0 and adds nothing."""

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs)

    def step(self, reward: np.ndarray, done: np.ndarray, info: dict) -> list[tuple[int, float, int]]:
        """Adds one step; returns (env index, return, length in agent steps) per finished episode."""
        self.returns += reward
        finished = [(int(i), float(self.returns[i]), int(info["elapsed_step"][i])) for i in np.flatnonzero(done)]
        self.returns[done] = 0.0
        return finished


class RewardScaler:
    """Reward scaling and clipping, as the published Procgen PPO does: rewards are divided by the running
    standard deviation of each environment's discounted return, which restarts at every episode end.
    Reset rows (`valid` False) are not experience and stay out of the statistics."""

    def __init__(self, num_envs: int, gamma: float, clip: float):
        self.rms, self.gamma, self.clip = RunningMeanStd(), gamma, clip
        self.returns = np.zeros(num_envs)

    def __call__(self, reward: np.ndarray, done: np.ndarray, valid: np.ndarray) -> np.ndarray:
        self.returns = self.returns * self.gamma + reward
        if valid.any():
            self.rms.update(self.returns[valid])
        self.returns[done] = 0.0
        return (reward / np.sqrt(self.rms.var + 1e-8)).clip(-self.clip, self.clip)


class VideoRecorder:
    """`--capture-video` for envpool, which has no renderer: env 0's 64x64 RGB observations, saved as an
    mp4 per recorded episode (episodes 0, 1, 8, 27, ... as Gymnasium records)."""

    def __init__(self, folder: str, name: str = "episode"):
        self.folder, self.name, self.episode, self.frames = folder, name, 0, []
        os.makedirs(folder, exist_ok=True)

    def add(self, frame: np.ndarray, episode_over: bool):
        if round(self.episode ** (1 / 3)) ** 3 == self.episode:
            self.frames.append(frame.copy())
        if episode_over:
            if self.frames:
                from moviepy import ImageSequenceClip  # imported only when used

                ImageSequenceClip(self.frames, fps=15).write_videofile(
                    f"{self.folder}/{self.name}-{self.episode}.mp4", logger=None
                )
            self.episode, self.frames = self.episode + 1, []


# THE NETWORK -------------------------------------------------------------------------------------


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    """Orthogonal weights with gain `std` and constant biases (detail 2 of the 37)."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class ResidualBlock(nn.Module):
    """x + conv(relu(conv(relu(x)))), two 3x3 convolutions that keep the channels and the size."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


def conv_sequence(in_channels: int, out_channels: int) -> nn.Sequential:
    """One IMPALA stage: a 3x3 convolution, a 3x3 max-pool of stride 2 (halves the size), two residual blocks."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1),
        nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
        ResidualBlock(out_channels),
        ResidualBlock(out_channels),
    )


class Agent(nn.Module):
    """The IMPALA CNN (Espeholt et al. 2018, as used for Procgen) shared by a policy head (std 0.01) and
    a value head (std 1): stages of 16, 32, 32 channels take 64x64 to 32, 16, 8, then ReLU, Flatten,
    Linear to 256, ReLU. The body keeps PyTorch's default initialisation, as the published Procgen PPO.
    Input: uint8 frames (B, 3, 64, 64), scaled to [0, 1] here. Weights are kept channels-last: the same
    network, computed in the layout oneDNN's CPU convolutions prefer."""

    def __init__(self, n_actions: int):
        super().__init__()
        stages = [conv_sequence(3, 16), conv_sequence(16, 32), conv_sequence(32, 32)]  # 64x64 -> 32, 16, 8
        self.network = nn.Sequential(*stages, nn.ReLU(), nn.Flatten(), nn.Linear(32 * 8 * 8, 256), nn.ReLU())
        self.actor = layer_init(nn.Linear(256, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(256, 1), std=1)
        self.to(memory_format=torch.channels_last)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        # uint8 -> float32 in the input's own layout, then scaled in place (one pass, no extra copy)
        return self.network(x.float().mul_(1.0 / 255.0))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(x)).squeeze(-1)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        """Samples an action (or scores the given one): returns action, log-prob, entropy, value."""
        hidden = self.features(x)
        dist = Categorical(logits=self.actor(hidden))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(hidden).squeeze(-1)

    @torch.no_grad()
    def act(self, x: torch.Tensor):
        """The rollout's policy step: action, log-prob and value without autograd and entropy.

        Gumbel-max sampling: argmax(log p + g) with g = -log(Exponential(1)) noise is a sample of the
        categorical distribution p, as `Categorical(logits).sample()` would draw.
        """
        hidden = self.features(x)
        logprobs = self.actor(hidden).log_softmax(-1)
        action = (logprobs - torch.empty_like(logprobs).exponential_().log()).argmax(-1)
        return action, logprobs.gather(-1, action.unsqueeze(-1)).squeeze(-1), self.critic(hidden).squeeze(-1)


# THE ALGORITHM -----------------------------------------------------------------------------------


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    last_value: torch.Tensor,
    gamma: float,
    gae_lambda: float,
    *,
    terminations: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation over a rollout stored with envpool's next-step reset.

    Shapes are (T, N): T steps of N environments; `last_value` is (N,).

    | tensor          | meaning at step t                                                        |
    |-----------------|--------------------------------------------------------------------------|
    | rewards[t]      | reward of the transition taken at step t                                  |
    | values[t]       | V(obs[t]), the critic's value of the observation the action was taken in |
    | dones[t]        | 1 if the episode ended at step t, terminated or truncated                 |
    | last_value      | V(observation after the last step)                                       |
    | terminations[t] | 1 if the episode terminated at step t: the next state is worth 0          |

    With next-step reset obs[t+1] is the *final* observation where dones[t]: values[t+1] is the
    value of where the episode stopped, which a truncation bootstraps and a termination zeroes:

        delta[t] = rewards[t] + gamma * (1 - terminations[t]) * values[t+1] - values[t]
        adv[t]   = delta[t] + gamma * lambda * (1 - dones[t]) * adv[t+1]

    Step t+1 after an episode end is the reset row (action ignored, reward 0): the trace is cut
    before it, and its own advantage is meaningless; the caller masks it out of the loss.
    Returns (advantages, returns = advantages + values), both (T, N).
    """
    next_values = torch.cat([values[1:], last_value.unsqueeze(0)])
    deltas = rewards + gamma * (1.0 - terminations) * next_values - values
    # the recursion runs in NumPy on the CPU: a step of it as torch operations costs several times more
    deltas, decay = deltas.cpu().numpy(), (gamma * gae_lambda * (1.0 - dones)).cpu().numpy()
    advantages = np.zeros_like(deltas)
    lastgaelam = np.zeros_like(deltas[0])
    for t in reversed(range(len(deltas))):
        lastgaelam = deltas[t] + decay[t] * lastgaelam
        advantages[t] = lastgaelam
    advantages = torch.from_numpy(advantages).to(values.device)
    return advantages, advantages + values


def ppo_loss(
    newlogprob: torch.Tensor,
    entropy: torch.Tensor,
    newvalue: torch.Tensor,
    oldlogprob: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    oldvalues: torch.Tensor,
    args: Args,
    *,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO loss of one minibatch: clipped surrogate + vf_coef * value loss - ent_coef * entropy.

    `advantages` are used as given (normalise them before the call if wanted). Returns the loss and
    detached statistics: policy and value loss, entropy, old and new approximate KL, clip fraction.

    `mask` (0/1 per sample, optional) keeps fixed-shape minibatches exact: only the samples where it
    is 1 count, every mean is over them, so the gradient is that of the minibatch without the others.
    """

    def mean(x: torch.Tensor) -> torch.Tensor:
        return x.mean() if mask is None else (x * mask).sum() / mask.sum()

    logratio = newlogprob - oldlogprob
    ratio = logratio.exp()
    with torch.no_grad():
        # KL(old || new) estimators, http://joschu.net/blog/kl-approx.html
        old_approx_kl = mean(-logratio)
        approx_kl = mean((ratio - 1) - logratio)
        clipfrac = mean(((ratio - 1.0).abs() > args.clip_coef).float())

    # Clipped surrogate objective (as a loss to minimise: the max of the negated terms)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = mean(torch.max(pg_loss1, pg_loss2))

    # Value loss, optionally clipped around the values predicted during the rollout
    if args.clip_vloss:
        v_loss_unclipped = (newvalue - returns) ** 2
        v_clipped = oldvalues + torch.clamp(newvalue - oldvalues, -args.clip_coef, args.clip_coef)
        v_loss_clipped = (v_clipped - returns) ** 2
        v_loss = 0.5 * mean(torch.max(v_loss_unclipped, v_loss_clipped))
    else:
        v_loss = 0.5 * mean((newvalue - returns) ** 2)

    entropy_loss = mean(entropy)
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
    stats = {
        "policy_loss": pg_loss.detach(),
        "value_loss": v_loss.detach(),
        "entropy": entropy_loss.detach(),
        "old_approx_kl": old_approx_kl,
        "approx_kl": approx_kl,
        "clipfrac": clipfrac,
    }
    return loss, stats


def update_step(
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    args: Args,
    obs: torch.Tensor,
    actions: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """One gradient step on one minibatch: forward, advantage normalisation, the PPO loss, backward,
    global gradient clipping, the optimizer step. Returns the detached statistics of `ppo_loss` and
    `ratio_deviation`, max |ratio - 1| before the step (1e-7 at the first minibatch of an update).

    `mask` is 1 on real transitions and 0 on envpool's reset rows. The reset rows stay in the
    minibatch, so every minibatch has the same shape (torch.compile and CUDA graphs want fixed
    shapes), but count nowhere: the advantages are normalised with the mean and standard deviation
    of the real rows, and `ppo_loss` averages over the real rows only. The gradient is that of the
    minibatch with the reset rows dropped (tests/test_fixed_shapes.py).

    The whole step is one function so that `--compile` can hand it to torch.compile as it stands.
    """
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
    if args.norm_adv:
        count = mask.sum()
        mean = (advantages * mask).sum() / count
        std = (((advantages - mean) ** 2 * mask).sum() / (count - 1)).sqrt()  # unbiased, as Tensor.std
        advantages = (advantages - mean) / (std + 1e-8)
    loss, stats = ppo_loss(newlogprob, entropy, newvalue, logprobs, advantages, returns, values, args, mask=mask)
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    stats["ratio_deviation"] = ((newlogprob.detach() - logprobs).exp().sub(1).abs() * mask).max()
    return stats


def minibatch_indices(valid: torch.Tensor, num_minibatches: int) -> torch.Tensor:
    """One epoch's shuffled minibatches of flat batch indices, (num_minibatches, batch_size // num_minibatches).

    All minibatches have the same shape, reset rows included (`update_step` masks them out). The real
    transitions come first in a random order and are dealt out to the minibatches in turn, then the
    reset rows likewise, so every minibatch holds the same number of real transitions to within one,
    as when the reset rows were dropped. A sort, not `nonzero`: no wait for the device.
    """
    flat = valid.reshape(-1)
    keys = torch.randperm(flat.numel(), device=flat.device) + flat.numel() * (~flat).long()  # real rows sort first
    return keys.argsort().reshape(-1, num_minibatches).T


# TRAINING ----------------------------------------------------------------------------------------


def train(args: Args, run_dir: str, checkpoint: dict | None) -> str:
    """PPO on args.env_id from scratch, or on from `checkpoint` (--resume); everything the run writes goes
    to run_dir, which it returns."""
    # Seeding: same seed, same machine, same thread count -> same numbers
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_deterministic:  # cuDNN's float32 convolutions and LSTMs in full float32, not TF32
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        torch.backends.cudnn.rnn.fp32_precision = "ieee"
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    torch.distributions.Distribution.set_default_validate_args(False)  # checks cost more than tiny samples

    # A resumed run reseeds its environments differently, so it does not replay the first levels
    envs = make_envs(args, args.num_envs, args.seed + (checkpoint["global_step"] if checkpoint else 0))
    agent = Agent(envs.action_space.n).to(device)
    # fused: one kernel for all parameters. The learning rate is a tensor that annealing overwrites in place,
    # so a compiled update step does not recompile; CUDA graphs need the step count on the device (capturable)
    learning_rate = torch.tensor(args.learning_rate, device=device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=learning_rate, eps=1e-5, fused=True, capturable=args.cudagraphs)
    reward_scaler = RewardScaler(args.num_envs, args.gamma, args.reward_clip)  # its statistics are checkpointed
    start_iteration, global_step = restore(checkpoint, agent, optimizer, args, reward_scaler=reward_scaler)
    log = RunLog(args, run_dir, global_step)
    video = VideoRecorder(f"{run_dir}/videos") if args.capture_video else None

    # --compile runs the same two functions through torch.compile; --cudagraphs also records their kernels
    # in CUDA graphs and replays them (one launch per call; its outputs are reused, so the loop clones them)
    act, update = agent.act, partial(update_step, agent, optimizer, args)
    if args.compile or args.cudagraphs:
        mode = "reduce-overhead" if args.cudagraphs else None
        act, update = (
            torch.compile(agent.act, mode=mode),
            partial(torch.compile(update_step, mode=mode), agent, optimizer, args),
        )

    # Rollout storage on the CPU, shared with NumPy. Observations: uint8 (T, N, 64, 64, 3) as envpool gives them,
    # viewed channels-last as (T, N, 3, 64, 64), the CNN's layout (pinned on CUDA: copied without a wait)
    T, N = args.num_steps, args.num_envs
    obs = torch.zeros(
        (T, N) + envs.observation_space.shape, dtype=torch.uint8, pin_memory=device.type == "cuda"
    ).permute(0, 1, 4, 2, 3)
    obs_shape = obs.shape[2:]  # (3, 64, 64)
    actions = torch.zeros((T, N), dtype=torch.long)
    logprobs, rewards, terminations, dones, values = (torch.zeros((T, N)) for _ in range(5))
    valid = torch.zeros((T, N), dtype=torch.bool)  # False on envpool's reset rows
    actions_np, logprobs_np, rewards_np, terminations_np, dones_np, values_np, valid_np = (
        x.numpy() for x in (actions, logprobs, rewards, terminations, dones, values, valid)
    )

    episode_stats = EpisodeStatistics(N)
    next_obs, _ = envs.reset()
    next_done = np.zeros(N, dtype=bool)  # did the previous step end an episode (then this one is a reset row)
    for iteration in range(start_iteration, args.num_iterations + 1):
        lr = args.learning_rate * (1.0 - (iteration - 1.0) / args.num_iterations if args.anneal_lr else 1.0)
        learning_rate.fill_(lr)  # annealed linearly to 0 over the run (detail 4)

        # COLLECT TRAJECTORIES ------------------------------------------------------------------
        rollout_start = time.perf_counter()
        act_time = env_time = 0.0
        for step in range(T):
            global_step += N
            obs[step] = as_images(next_obs)
            valid_np[step] = ~next_done
            tick = time.perf_counter()
            # one copy to the device (from pinned memory on CUDA, without waiting) and one copy back:
            # action, log-prob and value stacked
            action, logprob, value = act(obs[step].to(device, non_blocking=True))
            actions_np[step], logprobs_np[step], values_np[step] = (
                torch.stack([action.float(), logprob, value]).cpu().numpy()
            )
            tock = time.perf_counter()
            next_obs, reward, terminated, truncated, info = envs.step(actions_np[step])
            env_time += time.perf_counter() - tock
            act_time += tock - tick

            next_done = terminated | truncated
            rewards_np[step] = reward_scaler(reward, next_done, valid_np[step])  # the logged scores stay raw
            dones_np[step] = next_done
            terminations_np[step] = terminated if args.bootstrap_truncation else next_done
            if video is not None:
                video.add(next_obs[0], bool(next_done[0]))
            for i, episodic_return, episodic_length in episode_stats.step(reward, next_done, info):
                log.episode(global_step - N + i + 1, episodic_return, episodic_length)  # at the step it ended

        # CALCULATE ADVANTAGES ------------------------------------------------------------------
        with torch.no_grad():
            last_value = agent.get_value(as_images(next_obs).to(device)).cpu()
        advantages, returns = compute_gae(
            rewards=rewards,
            values=values,
            dones=dones,
            last_value=last_value,
            gamma=args.gamma,
            gae_lambda=args.gae_lambda,
            terminations=terminations,
        )
        rollout_time = time.perf_counter() - rollout_start

        # UPDATE THE NETWORK --------------------------------------------------------------------
        update_start = time.perf_counter()
        b_valid = valid.reshape(-1).to(device)
        b_mask = b_valid.float()
        b_obs = obs.reshape((-1,) + obs_shape).to(device)  # a view: still channels-last
        b_actions = actions.reshape(-1).to(device)
        b_logprobs = logprobs.reshape(-1).to(device)
        b_advantages = advantages.reshape(-1).to(device)
        b_returns = returns.reshape(-1).to(device)
        b_values = values.reshape(-1).to(device)

        clipfracs = []  # one per minibatch: losses/clipfrac is their mean, as CleanRL logs it
        for epoch in range(args.update_epochs):
            for minibatch, mb_inds in enumerate(minibatch_indices(b_valid, args.num_minibatches)):
                if args.cudagraphs:
                    torch.compiler.cudagraph_mark_step_begin()  # a new replay: the last one's outputs are done
                stats = update(
                    b_obs[mb_inds],
                    b_actions[mb_inds],
                    b_logprobs[mb_inds],
                    b_advantages[mb_inds],
                    b_returns[mb_inds],
                    b_values[mb_inds],
                    b_mask[mb_inds],
                )
                stats = {k: v.clone() for k, v in stats.items()} if args.cudagraphs else stats
                if epoch == 0 and minibatch == 0:
                    # Nothing has been updated yet, so the ratio must be 1 to float precision; a larger
                    # deviation means the stored log-probs do not belong to the stored observations
                    first_ratio_deviation = stats["ratio_deviation"]
                clipfracs.append(stats["clipfrac"])
            if args.target_kl is not None and stats["approx_kl"] > args.target_kl:  # the one wait per epoch
                break
        update_time = time.perf_counter() - update_start

        # the losses and KLs of the last minibatch, the clip fraction over the whole update; the critic's
        # explained variance and the reset rows from `valid`
        stats.update(clipfrac=torch.stack(clipfracs).mean(), ratio_deviation=first_ratio_deviation)
        log.iteration(
            iteration,
            global_step,
            stats,
            lr,
            values,
            returns,
            rollout_time,
            update_time,
            valid=valid,
            act_time=act_time,
            env_time=env_time,
        )
        evaluate_if_due(args, iteration, global_step, agent, optimizer, run_dir, log, reward_scaler=reward_scaler)
        checkpoint_if_due(args, iteration, global_step, agent, optimizer, run_dir, reward_scaler=reward_scaler)

    finish(args, envs, agent, optimizer, run_dir, global_step, log, reward_scaler=reward_scaler)
    return run_dir


# ==================================================================================================
# PPO ENDS HERE. What follows is the machinery a run needs around the algorithm: input checks, the
# run folder, checkpoints and resuming, evaluation, logging, Ctrl-C and full disks, and the entry
# point. None of it changes what PPO computes.
# ==================================================================================================


# INPUT CHECKS ------------------------------------------------------------------------------------


def fail(message: str):
    """Bad input: one line on stderr naming the problem, exit code 2, before any long work."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def check_numbers(args: Args):
    """Every number within its meaning, named with its range in the error: a gamma of 1.5, a negative clip
    coefficient or a NaN learning rate trains without an error, on nonsense."""
    for name, value in asdict(args).items():
        if isinstance(value, float) and not math.isfinite(value):
            fail(f"--{name.replace('_', '-')} must be a finite number, got {value}")
    for name, valid, meaning in (
        (
            "seed",
            0 <= args.seed <= 1_000_000_000,
            "from 0 to 1000000000 (NumPy seeds and the per-environment offsets added to it must stay below 2**31)",
        ),
        ("learning_rate", args.learning_rate > 0, "positive"),
        ("gamma", 0 <= args.gamma <= 1, "in [0, 1] (a discount factor)"),
        ("gae_lambda", 0 <= args.gae_lambda <= 1, "in [0, 1]"),
        ("clip_coef", args.clip_coef > 0, "positive (the ratio is clipped to [1 - clip_coef, 1 + clip_coef])"),
        ("ent_coef", args.ent_coef >= 0, "zero or positive"),
        ("vf_coef", args.vf_coef >= 0, "zero or positive"),
        ("max_grad_norm", args.max_grad_norm > 0, "positive"),
        ("target_kl", args.target_kl is None or args.target_kl > 0, "positive (or not given)"),
    ):
        if not valid:
            fail(f"--{name.replace('_', '-')} must be {meaning}, got {getattr(args, name)}")


def check_tracking(args: Args):
    """`--track` needs a Weights & Biases login (or offline mode): checked before any work, without the network."""
    if not args.track or os.environ.get("WANDB_MODE") in ("offline", "disabled"):
        return
    import wandb  # imported only when used

    if not wandb.login(prompt=False, verify=False):
        fail(
            "--track: not logged in to Weights & Biases; run `wandb login` (or set WANDB_API_KEY), or track "
            "offline with WANDB_MODE=offline (then `wandb sync` the run folder's wandb/ later)"
        )


def check_runs_dir(runs_dir: str):
    """--runs-dir must be a folder that exists or can be created (checked before any work; make_run_dir
    reports what the OS says if creating it fails all the same)."""
    path = Path(runs_dir).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        fail(f"--runs-dir {runs_dir} cannot be created: {path} is {'a file' if path.is_file() else 'not writable'}")


GAMES = (
    "bigfish",
    "bossfight",
    "caveflyer",
    "chaser",
    "climber",
    "coinrun",
    "dodgeball",
    "fruitbot",
    "heist",
    "jumper",
    "leaper",
    "maze",
    "miner",
    "ninja",
    "plunder",
    "starpilot",
)
# envpool's Procgen ids: game and distribution, e.g. StarpilotEasy-v0, MazeMemory-v0
PROCGEN_ID = re.compile(rf"({'|'.join(g.capitalize() for g in GAMES)})(Easy|Hard|Extreme|Memory|Exploration)-v0")


def procgen_id(env_id: str) -> str:
    """`starpilot` -> `StarpilotEasy-v0`; envpool Procgen ids as given; anything else is a one-line error."""
    if env_id.lower() in GAMES:
        return f"{env_id.lower().capitalize()}Easy-v0"
    if PROCGEN_ID.fullmatch(env_id) and env_id in envpool.list_all_envs():
        return env_id
    fail(
        f"unknown Procgen game '{env_id}': valid names are {', '.join(GAMES)} "
        "(or an envpool Procgen id such as StarpilotEasy-v0)"
    )


QT_MISSING = (
    "envpool's Procgen needs the Qt 5 runtime: install the Debian/Ubuntu package libqt5gui5 "
    "(sudo apt-get install libqt5gui5)"
)


def check_args(args: Args):
    """Reject arguments that would crash or silently misbehave later."""
    check_numbers(args)
    for name in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "eval_episodes"):
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.reward_clip <= 0:
        fail("--reward-clip must be positive")
    if min(args.checkpoint_every, args.torch_threads, args.envpool_threads) < 0:
        fail("--checkpoint-every, --torch-threads and --envpool-threads must not be negative")
    if args.batch_size % args.num_minibatches != 0:
        fail(
            f"--num-minibatches {args.num_minibatches} does not divide the batch size {args.batch_size} "
            f"(--num-envs {args.num_envs} x --num-steps {args.num_steps})"
        )
    if args.batch_size // args.num_minibatches < 2:
        fail(
            f"--num-minibatches {args.num_minibatches} leaves minibatches of one sample (batch size "
            f"{args.batch_size}); at least 2 are needed (advantages are normalised by their std)"
        )
    if args.cudagraphs and not (args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs needs CUDA (no CUDA device here, or --no-cuda); --compile works on the CPU")
    if args.num_iterations == 0 and args.resume is None:  # a resume: resume_args checks the total
        fail(f"--total-timesteps {args.total_timesteps} is less than one batch ({args.batch_size} steps)")
    if args.eval_every < 0:
        fail(f"--eval-every must not be negative, got {args.eval_every}")
    check_tracking(args)
    if args.resume is None and args.evaluate is None:
        check_runs_dir(args.runs_dir)
    for name in ("resume", "evaluate"):
        path = getattr(args, name)
        if path is not None and not Path(path).is_file():
            fail(f"--{name}: no such file: {path}")
    try:
        # loads envpool's Procgen extension, which links the system Qt 5 libraries
        envpool.make_spec(procgen_id(args.env_id))
    except ImportError as e:
        # envpool raises "EnvPool Procgen requires the system Qt 5 runtime ..." from the loader's
        # "libQt5Gui.so.5: cannot open shared object file"; other import errors are not ours to explain
        if "qt" not in f"{e} {e.__cause__}".lower():
            raise
        fail(QT_MISSING)


# THE RUN FOLDER, CHECKPOINTS AND RESUMING ---------------------------------------------------------


def prepare_run(args: Args) -> tuple[Args, str, dict | None]:
    """The run's arguments, folder and checkpoint: a new folder for a new run; for --resume the checkpoint's
    folder, arguments (with the flags that may change) and the checkpoint itself."""
    if args.resume is not None:
        checkpoint = load_checkpoint(args.resume)
        return resume_args(args, checkpoint), str(Path(args.resume).parent), checkpoint
    run_dir = f"{args.runs_dir}/{procgen_id(args.env_id)}__{args.exp_name}__{args.seed}__{int(time.time())}"
    if os.path.exists(run_dir):
        fail(
            f"run folder {run_dir} exists already (same env, name and seed started in the same second); "
            "pass another --exp-name"
        )
    return args, run_dir, None


def make_run_dir(run_dir: str):
    """Creates the run folder, or ends in one line saying why it cannot."""
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as e:
        fail(f"cannot create the run folder {run_dir}: {e.strerror or e} (pass another --runs-dir)")


# the layout of the dict save_checkpoint writes; read_checkpoint refuses others (1: before checkpoints
# named their script and format; 2: NumPy arrays in the RNG state and statistics, read as data and
# converted by as_data)
CHECKPOINT_FORMAT = 3


def save_checkpoint(
    path: str,
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    args: Args,
    iteration: int,
    global_step: int,
    *,
    reward_scaler: RewardScaler,
):
    """Everything needed to continue or evaluate: weights, optimizer, reward-scaling statistics,
    progress, RNG states, args.

    Written by `write_checkpoint_file`, so a run killed while saving keeps its last checkpoint.
    """
    checkpoint = {
        "model": agent.state_dict(),
        "optimizer": optimizer.state_dict(),
        "reward_rms": reward_scaler.rms.state_dict(),
        "iteration": iteration,
        "global_step": global_step,
        "args": asdict(args),
        "script": Path(__file__).name,  # read_checkpoint refuses the checkpoints of other scripts
        "format": CHECKPOINT_FORMAT,
        "rng": rng_state(next(agent.parameters()).device),
    }
    write_checkpoint_file(checkpoint, path)


def checkpoint_if_due(
    args: Args,
    iteration: int,
    global_step: int,
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    run_dir: str,
    *,
    reward_scaler: RewardScaler,
):
    """--checkpoint-every N: `run_dir/checkpoint.pt` after every N-th iteration, with the reward statistics."""
    if args.checkpoint_every and iteration % args.checkpoint_every == 0:
        save_checkpoint(
            f"{run_dir}/checkpoint.pt", agent, optimizer, args, iteration, global_step, reward_scaler=reward_scaler
        )


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


def read_checkpoint(path: str) -> dict | str:
    """Reads a checkpoint written by this script's `save_checkpoint`, as data only: torch.load with
    weights_only=True rebuilds tensors, numbers, strings, lists and dicts and refuses anything else, so
    opening a file never runs code from it. Returns the problem, in words, if the file is not a checkpoint
    (empty or truncated, holding code or other objects, of another script, of another format)."""
    head = b""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
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
    script = checkpoint.get("script")
    if script is None:
        return (
            f"{path} is a checkpoint from before format 2 (older checkpoints do not say which script wrote "
            "them); retrain, or read it with the version of the scripts that wrote it"
        )
    if script != Path(__file__).name:
        return f"{path} was written by {script}, not {Path(__file__).name}: pass it to {script}"
    if checkpoint.get("format") == 2:
        checkpoint = {**as_data(checkpoint), "format": CHECKPOINT_FORMAT}
    if checkpoint.get("format") != CHECKPOINT_FORMAT:
        return (
            f"{path} has checkpoint format {checkpoint.get('format')}; this {script} reads formats 2 and "
            f"{CHECKPOINT_FORMAT}"
        )
    return checkpoint


def load_checkpoint(path: str) -> dict:
    """`read_checkpoint`, with a one-line error if the file is not a checkpoint of this script."""
    checkpoint = read_checkpoint(path)
    if isinstance(checkpoint, str):
        fail(checkpoint)
    return checkpoint


# the flags a --resume may change (where and how the run goes on); every other flag keeps the
# checkpoint's value
CHANGEABLE_ON_RESUME = (
    "resume",
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
    "envpool_threads",
)


def resume_args(args: Args, checkpoint: dict) -> Args:
    """`--resume`: the checkpoint's arguments, with the flags of this command line that may change
    (CHANGEABLE_ON_RESUME: where and how the run goes on, and --total-timesteps to train longer or stop
    sooner); a flag that differs from its default and from the saved value and cannot change is refused
    in one line. (A flag given with its default value cannot be told from one not given.)"""
    saved, defaults = Args(**checkpoint["args"]), Args()
    for name in asdict(saved):
        given, default = getattr(args, name), getattr(defaults, name)
        if name in CHANGEABLE_ON_RESUME:
            if given != default:
                setattr(saved, name, given)
        elif given != default and given != getattr(saved, name):
            changeable = ", ".join(f"--{n.replace('_', '-')}" for n in CHANGEABLE_ON_RESUME[1:])
            fail(
                f"--{name.replace('_', '-')} {given}: cannot change on --resume (the run has {getattr(saved, name)}); "
                f"only {changeable} can; start a new run to change it"
            )
    if saved.num_iterations * saved.batch_size <= checkpoint["global_step"]:
        fail(
            f"--total-timesteps {saved.total_timesteps}: the run is at step {checkpoint['global_step']} already; "
            "pass a larger --total-timesteps to train longer"
        )
    return saved


def restore(
    checkpoint: dict | None, agent: Agent, optimizer: torch.optim.Optimizer, args: Args, *, reward_scaler: RewardScaler
) -> tuple[int, int]:
    """--resume: the weights, the optimizer's state, the reward statistics and the random streams of
    `checkpoint`; returns the first iteration to run and the global step (1 and 0 for a new run)."""
    if checkpoint is None:
        return 1, 0
    learning_rate = optimizer.param_groups[0]["lr"]  # the tensor that annealing fills
    agent.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    optimizer.param_groups[0]["lr"] = learning_rate  # loading put the saved float there
    reward_scaler.rms.load_state_dict(checkpoint["reward_rms"])
    set_rng_state(checkpoint["rng"], next(agent.parameters()).device)
    print(f"resumed from {args.resume} at iteration {checkpoint['iteration']}, global step {checkpoint['global_step']}")
    return checkpoint["iteration"] + 1, checkpoint["global_step"]


# EVALUATION --------------------------------------------------------------------------------------


def evaluate(
    agent: Agent,
    args: Args,
    episodes: int,
    deterministic: bool,
    seed: int,
    device: torch.device,
    *,
    video_prefix: str | None = None,
) -> list[float]:
    """Plays `episodes` whole episodes, one per environment, on the training distribution (easy, all
    levels) and returns their raw scores. The action sampling uses its own seeded RNG stream, so the
    same model and seed score the same right after training and later from the saved file.
    `video_prefix` (`--evaluate --capture-video`): records the episode of environment 0 (the first) as
    `<video_prefix>-episode-0.mp4`, from the observed 64x64 frames (envpool cannot render)."""
    envs = make_envs(args, episodes, seed)
    episode_stats = EpisodeStatistics(episodes)
    scores = np.full(episodes, np.nan)
    obs, _ = envs.reset()
    video = (
        None
        if video_prefix is None
        else VideoRecorder(str(Path(video_prefix).parent), name=f"{Path(video_prefix).name}-episode")
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        while np.isnan(scores).any():
            with torch.no_grad():
                logits = agent.actor(agent.features(as_images(obs).to(device)))
                action = logits.argmax(-1) if deterministic else Categorical(logits=logits).sample()
            obs, reward, terminated, truncated, info = envs.step(action.cpu().numpy())
            if video is not None and np.isnan(scores[0]):  # environment 0's first episode
                video.add(obs[0], bool(terminated[0] or truncated[0]))
            for i, score, _ in episode_stats.step(reward, terminated | truncated, info):
                if np.isnan(scores[i]):
                    scores[i] = score
    envs.close()
    return scores.tolist()


def evaluate_if_due(
    args: Args,
    iteration: int,
    global_step: int,
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    run_dir: str,
    log: "RunLog",
    *,
    reward_scaler: RewardScaler,
):
    """--eval-every N: after every N-th iteration the policy as it is now plays --eval-episodes on a separate
    environment with its own seeded RNG stream (the same episodes every time, those of the final evaluation);
    the best evaluation's model is kept as `run_dir/best_model.pt`."""
    if not args.eval_every or iteration % args.eval_every:
        return
    eval_start = time.perf_counter()
    # a CPU copy: evaluate() forks the CPU generator only, so the training's random streams stay untouched
    returns = evaluate(
        copy.deepcopy(agent).cpu(),
        args,
        args.eval_episodes,
        args.eval_deterministic,
        args.seed + 100_000,
        torch.device("cpu"),
    )
    log.evaluation(returns, global_step)
    if np.mean(returns) > log.best_return:
        log.best_return = float(np.mean(returns))
        save_checkpoint(
            f"{run_dir}/best_model.pt", agent, optimizer, args, iteration, global_step, reward_scaler=reward_scaler
        )
    print(
        f"evaluation at global_step={global_step}: mean return {np.mean(returns):.2f} (best, in "
        f"best_model.pt: {log.best_return:.2f}; {time.perf_counter() - eval_start:.1f}s)",
        flush=True,
    )


def run_evaluation(path: str, args: Args) -> list[float]:
    """`--evaluate PATH`: scores a saved model or checkpoint on the game it was trained on."""
    checkpoint = load_checkpoint(path)
    saved = Args(**checkpoint["args"])
    agent = Agent(envpool.make_spec(procgen_id(saved.env_id)).action_space.n)
    agent.load_state_dict(checkpoint["model"])
    # the trained run's seed: the same levels as the evaluation reported right after training
    video_prefix = str(Path(path).parent / "videos" / f"{Path(path).stem}-eval") if args.capture_video else None
    returns = evaluate(
        agent,
        saved,
        args.eval_episodes,
        args.eval_deterministic,
        saved.seed + 100_000,
        torch.device("cpu"),
        video_prefix=video_prefix,
    )
    print(
        f"evaluation of {path} on {procgen_id(saved.env_id)}: {len(returns)} episodes, "
        f"mean return {np.mean(returns):.2f} +- {np.std(returns):.2f}"
    )
    if video_prefix is not None:
        videos = sorted(Path(video_prefix).parent.glob(f"{Path(video_prefix).name}-*.mp4"))
        print(f"videos of the evaluation in {Path(video_prefix).parent}: {', '.join(v.name for v in videos)}")
    return returns


# LOGGING AND THE END OF A RUN --------------------------------------------------------------------


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


class RunLog:
    """What a run reports: the run folder and its TensorBoard scalars (charts/, losses/, debug/, perf/,
    eval/), the per-iteration line, and Weights & Biases with --track. Creating it creates the run folder."""

    def __init__(self, args: Args, run_dir: str, global_step: int):
        make_run_dir(run_dir)
        print(f"run folder: {run_dir}\nwatch it with: tensorboard --logdir {Path(run_dir).parent}", flush=True)
        if args.track:
            import wandb  # imported only when used

            wandb.init(
                project=args.wandb_project_name,
                entity=args.wandb_entity,
                sync_tensorboard=True,
                config=asdict(args),
                name=Path(run_dir).name,
                save_code=True,
            )
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(run_dir)
        self.writer.add_text(
            "hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items())
        )
        self.args, self.run_dir, self.progress = args, run_dir, ProgressLine()
        self.start_time, self.start_step = time.time(), global_step
        self.episode_returns = []  # of the episodes that ended in this iteration
        self.best_return = float("-inf")  # the best evaluation's mean (--eval-every)

    def episode(self, step: int, episodic_return: float, episodic_length: int):
        self.writer.add_scalar("charts/episodic_return", episodic_return, step)
        self.writer.add_scalar("charts/episodic_length", episodic_length, step)
        self.episode_returns.append(episodic_return)

    def iteration(
        self,
        iteration: int,
        global_step: int,
        stats: dict[str, torch.Tensor],
        learning_rate: float,
        values: torch.Tensor,
        returns: torch.Tensor,
        rollout_time: float,
        update_time: float,
        *,
        valid: torch.Tensor,
        act_time: float,
        env_time: float,
    ):
        """The iteration's scalars (the statistics copied from the device at once) and, when due, its line.
        The critic's explained variance is over the real transitions (`valid`), without envpool's reset rows,
        whose number is `debug/reset_rows`; the rollout's time splits into the policy's and envpool's."""
        stats = dict(zip(stats, torch.stack(list(stats.values())).tolist()))
        first_ratio_deviation = stats.pop("ratio_deviation")
        sps = int((global_step - self.start_step) / (time.time() - self.start_time))
        eta = timedelta(seconds=int((self.args.num_iterations * self.args.batch_size - global_step) / max(sps, 1)))
        self.writer.add_scalar("charts/learning_rate", learning_rate, global_step)
        for name, value in stats.items():
            self.writer.add_scalar(f"losses/{name}", value, global_step)
        self.writer.add_scalar(
            "losses/explained_variance", explained_variance(values[valid].numpy(), returns[valid].numpy()), global_step
        )
        self.writer.add_scalar("charts/SPS", sps, global_step)
        self.writer.add_scalar("debug/first_minibatch_ratio_deviation", first_ratio_deviation, global_step)
        self.writer.add_scalar("debug/reset_rows", valid.numel() - int(valid.sum()), global_step)
        self.writer.add_scalar("perf/rollout_time", rollout_time, global_step)
        self.writer.add_scalar("perf/act_time", act_time, global_step)
        self.writer.add_scalar("perf/env_time", env_time, global_step)
        self.writer.add_scalar("perf/update_time", update_time, global_step)
        line = self.progress.due(self.episode_returns, last=iteration == self.args.num_iterations)
        self.episode_returns = []
        if line:
            print(
                f"iteration {iteration}/{self.args.num_iterations} global_step={global_step} {line} SPS={sps} "
                f"ETA={eta} (rollout {rollout_time:.2f}s, update {update_time:.2f}s)",
                flush=True,
            )

    def evaluation(self, returns: list[float], global_step: int):
        """An evaluation's scalars at the global step it was made: every episode's return as
        `eval/episodic_return` and their mean as `eval/mean_return`."""
        for episodic_return in returns:
            self.writer.add_scalar("eval/episodic_return", episodic_return, global_step)
        self.writer.add_scalar("eval/mean_return", float(np.mean(returns)), global_step)

    def close(self):
        self.writer.close()
        if self.args.track:
            finish_tracking(self.run_dir)


def finish_tracking(run_dir: str):
    """`--track`: ends the Weights & Biases run, with the videos that `--capture-video` recorded under
    `run_dir/videos` added to it first (shown in its media panel; the TensorBoard scalars are synced as
    they are written)."""
    import wandb  # imported only when used

    for video in sorted(Path(run_dir, "videos").glob("*.mp4")):
        wandb.log({f"videos/{video.stem}": wandb.Video(str(video), format="mp4")})
    wandb.finish()


def finish(
    args: Args,
    envs,
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    run_dir: str,
    global_step: int,
    log: RunLog,
    *,
    reward_scaler: RewardScaler,
):
    """The end of a run: the environments closed; with --save-model the final model saved (with the reward
    statistics) and evaluated; the logs closed."""
    envs.close()
    if args.save_model:
        model_path = f"{run_dir}/model.pt"
        save_checkpoint(
            model_path, agent, optimizer, args, args.num_iterations, global_step, reward_scaler=reward_scaler
        )
        print(f"model saved to {model_path}")
        agent.cpu()
        returns = evaluate(
            agent, args, args.eval_episodes, args.eval_deterministic, args.seed + 100_000, torch.device("cpu")
        )
        log.evaluation(returns, global_step)
        print(f"evaluation: {len(returns)} episodes, mean return {np.mean(returns):.2f} +- {np.std(returns):.2f}")
    log.close()


# CTRL-C AND FULL DISKS ---------------------------------------------------------------------------


def resume_hint(run_dir: str) -> str:
    """Where a stopped run can go on from: its last checkpoint and the command that resumes it."""
    checkpoint = Path(run_dir) / "checkpoint.pt"
    if checkpoint.is_file():
        return f"last checkpoint {checkpoint}; continue with: python {sys.argv[0]} --resume {checkpoint}"
    return f"no checkpoint in {run_dir} (--checkpoint-every N writes one every N iterations)"


def exit_on_ctrl_c(run_dir: str):
    """From here on, Ctrl-C (SIGINT) ends the run with one line on stderr, where its last checkpoint is and
    how to resume from it, and exit code 130 (128 + SIGINT), instead of a KeyboardInterrupt traceback.
    It raises SystemExit, so `finally` blocks still run (closing environments, stopping processes)."""

    def handler(signum, frame):
        print(f"{Path(sys.argv[0]).name}: interrupted: {resume_hint(run_dir)}", file=sys.stderr, flush=True)
        # the video being recorded stays unfinished: no "Unable to save last video" warning while exiting
        warnings.filterwarnings("ignore", message=".*Unable to save last video")
        raise SystemExit(130)

    signal.signal(signal.SIGINT, handler)


# what a file system answers a write it refuses: no space left, a file larger than allowed (ulimit -f),
# a read-only file system, a quota exceeded
WRITE_ERRORS = (errno.ENOSPC, errno.EFBIG, errno.EROFS, errno.EDQUOT)


def quiet_write_errors(hook_args):
    """TensorBoard writes its events from a thread of its own; the main thread meets that thread's write
    error at its next write and reports it (exit_on_write_error), so the thread's traceback is left out."""
    if not (isinstance(hook_args.exc_value, OSError) and hook_args.exc_value.errno in WRITE_ERRORS):
        threading.__excepthook__(hook_args)


@contextlib.contextmanager
def exit_on_write_error(run_dir: str):
    """A checkpoint or the TensorBoard events that cannot be written (disk full, file too large, read-only)
    end the run as Ctrl-C does: one line on stderr naming the file, the error and the last good checkpoint
    with the command that resumes it, and exit code 1 (write_checkpoint_file leaves no partial file)."""
    threading.excepthook = quiet_write_errors
    try:
        yield
    except OSError as e:
        if e.errno not in WRITE_ERRORS:
            raise
        file = e.filename or f"the TensorBoard events in {run_dir}"
        print(
            f"{Path(sys.argv[0]).name}: error: cannot write {file}: {e.strerror}; {resume_hint(run_dir)}",
            file=sys.stderr,
            flush=True,
        )
        warnings.filterwarnings("ignore", message=".*Unable to save last video")  # as on Ctrl-C
        raise SystemExit(1) from None


# RUNNING STATISTICS (of RewardScaler) -------------------------------------------------------------


class RunningMeanStd:
    """Running mean and variance of a stream of batches (the parallel algorithm of Chan et al.)."""

    def __init__(self, shape: tuple = (), epsilon: float = 1e-4):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = epsilon

    def update(self, x: np.ndarray):
        """Adds a batch x of shape (B,) + shape. It runs at every environment step, so it avoids
        np.mean/np.var, whose Python-level overhead is most of the cost on a handful of numbers, and
        skips the batch's own spread where the batch is one sample (one environment's step)."""
        n = x.shape[0]
        batch_mean = np.add.reduce(x, axis=0) / n
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean = self.mean + delta * (n / total)
        # the summed squared deviations from the mean: the old ones, the batch's own, and the shift's
        squares = self.var * self.count + np.square(delta) * (self.count * n / total)
        if n > 1:
            squares += np.add.reduce(np.square(x - batch_mean), axis=0)
        self.var = squares / total
        self.count = total

    def state_dict(self) -> dict:
        """The statistics as data (tensors and a number), as a checkpoint holds them."""
        return {"mean": torch.tensor(self.mean), "var": torch.tensor(self.var), "count": self.count}  # copies

    def load_state_dict(self, state: dict):
        self.mean, self.var = state["mean"].numpy().copy(), state["var"].numpy().copy()
        self.count = float(state["count"])


# THE ENTRY POINT ---------------------------------------------------------------------------------


def main(args: Args) -> str | list[float]:
    """Checks the arguments, then trains (returns the run folder) or, with --evaluate, evaluates (returns the
    episodes' returns)."""
    check_args(args)
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    if args.evaluate is not None:
        return run_evaluation(args.evaluate, args)
    args, run_dir, checkpoint = prepare_run(args)
    exit_on_ctrl_c(run_dir)
    with exit_on_write_error(run_dir):
        return train(args, run_dir, checkpoint)


if __name__ == "__main__":
    main(tyro.cli(Args))
