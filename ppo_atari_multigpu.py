"""Data-parallel PPO on Atari over processes (DD-PPO style), launched by torchrun, on one machine or many.

Run:
    torchrun --standalone --nproc_per_node=2 ppo_atari_multigpu.py --env-id Breakout
    torchrun --nnodes=2 --node_rank=R --nproc_per_node=G --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT \
        ppo_atari_multigpu.py --env-id Breakout        # the same script on two machines
    python ppo_atari_multigpu.py --env-id Breakout     # a world of one process, no launcher needed

What this file shows: ppo_atari.py's PPO, Atari preprocessing and Nature CNN, trained by W processes
that run identical code (decentralized and synchronous, as in DD-PPO, Wijmans et al. 2020): no
parameter server and no stale data. Each process ("rank") steps its own share of the environments
with the current weights, computes the gradient of its share of every minibatch, and one all-reduce
per minibatch sums the gradients, weighted by sample counts, into the gradient of the whole
minibatch. Every rank then takes the same optimizer step and keeps the same weights. With the same
global batch (`--num-envs` is the global count) the update is the single-process update: W processes
buy speed, not a different algorithm (tests/test_ppo_atari_multigpu.py checks the gradient).

To learn data-parallel PPO, read `train` (its distributed steps are marked DISTRIBUTED, and every call that all
ranks must reach `collective`), `update_step`, `all_reduce_gradients`, `global_advantage_stats`, and after `train`
the process layout: `broadcast_weights`, `RolloutReport`, `Preemption`. Below the banner: the input checks, the
evaluation and `main`; the rest of a run, the job's plumbing included (ppolab/distributed.py), is the package
ppolab's.

What is special in this file (the places where distributed RL usually goes wrong):
- torchrun gives each process RANK (global, it identifies the process everywhere: seeds, logging,
  checkpoints), LOCAL_RANK (only for choosing the GPU) and WORLD_SIZE. gloo on CPU, nccl on CUDA.
- Every rank starts from rank 0's weights (broadcast), not from the hope that seeding made them equal,
  and the environment seeds of all ranks are distinct: global env k gets seed + k, as in ppo_atari.py.
- Every decision that changes which collectives run is made from all-reduced numbers, so the ranks
  always agree: early stopping at `--target-kl` (a rank deciding alone would skip all-reduces its peers
  wait for: a hang), the advantage normalisation statistics of each minibatch (over the global
  minibatch, as one process would compute them) and the end of training (the global step count).
- Rank 0 alone writes logs and checkpoints, but of everyone's data: the episodes of all ranks, and
  per iteration the time split into rollout (`perf/rollout_time`, `perf/rollout_time_max` of the
  slowest rank), update (`perf/update_time`, its collectives included) and the part of it spent in
  collectives (`perf/comm_time`, waits for slower ranks included); a checkpoint holds every rank's
  random streams, which a resume with the same world size gives back to each rank.
- `--torch-deterministic` (the default) makes cuDNN deterministic and also turns TF32 off, so
  convolutions on a GPU run in full float32 (same seed, same numbers; ratio 1 at the first minibatch).
- Failures end the job: if a rank dies, torchrun stops the others and exits non-zero; if a rank hangs,
  the others' next collective fails after `--timeout` seconds, they exit 1 with one line, and torchrun
  stops the rest. A checkpoint or log that cannot be written (disk full) ends the run in rank 0's one
  line; the other ranks end without a line of their own.
- Stragglers: `--preempt-fraction 0.6` ends a rank's rollout early once 60% of the ranks finished
  theirs (and it has collected `--preempt-min-steps` of its steps), DD-PPO's preemption threshold; the
  update weights each rank by the samples it brought.

Speed and scaling: benchmark/results/speed.md, section Distributed scaling.
"""

import math
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Literal, NamedTuple

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributions.categorical import Categorical

import ppolab
import ppolab.distributed

gym.register_envs(ale_py)  # registers BreakoutNoFrameskip-v4, ALE/Breakout-v5, ...
ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no ALE banner on stderr from every process


@dataclass
class Args(ppolab.RunSettings):  # and every run's settings: --seed, --cuda, --track, --resume, ...
    # PPO's hyperparameters (the defaults are the published ones)
    env_id: str = "BreakoutNoFrameskip-v4"
    """the Atari game: `Breakout` (read as `BreakoutNoFrameskip-v4`), `BreakoutNoFrameskip-v4` or `ALE/Breakout-v5`"""
    total_timesteps: int = 10_000_000
    """total timesteps of the experiment, over all ranks"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments over all ranks (each rank runs num_envs / world size)"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches (each rank contributes its share of every minibatch)"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization (with the statistics of the global minibatch)"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping (of the averaged gradient)"""
    target_kl: float | None = None
    """the target KL divergence threshold (stops the epochs of an update early, on all ranks at once)"""
    policy_objective: Literal["clip", "adaptive-kl", "fixed-kl"] = "clip"
    """the policy's surrogate: PPO-Clip's clipped ratio, or PPO-Penalty's KL penalty with an adaptive or fixed beta"""
    kl_target: float = 0.01
    """adaptive-kl: the KL per update that beta is adapted towards (the PPO paper's d_targ)"""
    kl_beta: float = 1.0
    """the KL penalty's coefficient beta: fixed-kl's, and adaptive-kl's first"""
    bootstrap_truncation: bool = True
    """bootstrap the value of the final observation at a time-limit truncation (off: treat it as termination)"""
    max_episode_steps: int = 27_000
    """agent steps after which a game is truncated (ALE stops it at 4x this many frames: the usual 108,000)"""
    preempt_fraction: float | None = None
    """straggler preemption (DD-PPO): once this fraction of the ranks finished their rollouts, the others end theirs early"""
    preempt_min_steps: float = 0.25
    """with --preempt-fraction: the fraction of its --num-steps a rank collects before it may be preempted"""

    # This script's own run settings (those of every script: ppolab.RunSettings)
    device_ids: list[int] | None = None
    """the GPUs of this machine's ranks: local rank i uses device_ids[i % len] (None: GPU i; ranks sharing a GPU need gloo)"""
    backend: Literal["gloo", "nccl"] | None = None
    """torch.distributed backend; default nccl on CUDA (with a PyTorch built with NCCL), else gloo"""
    timeout: float = 300.0
    """seconds a collective waits for the other ranks before the job fails (a dead or hung rank)"""
    sync_timing: bool = False
    """if toggled, on CUDA perf/comm_time is the collectives' own time: the GPU is synchronized around each (two syncs per minibatch)"""
    changeable_on_resume = ("backend", "device_ids", "timeout")

    @property
    def batch_size(self) -> int:
        """transitions per update over all ranks: num_envs * num_steps"""
        return self.num_envs * self.num_steps

    @property
    def num_iterations(self) -> int:
        """updates in the whole run without preemption: total_timesteps // batch_size"""
        return self.total_timesteps // self.batch_size

    @property
    def max_iterations(self) -> int:
        """updates at most: num_iterations, or with --preempt-fraction as many as it would take if every
        rollout of every rank were preempted at --preempt-min-steps (the run ends at its total steps)"""
        if self.preempt_fraction is None:
            return self.num_iterations
        fewest_steps = math.ceil(self.preempt_min_steps * self.num_steps) * self.num_envs  # of one iteration
        return math.ceil(self.num_iterations * self.batch_size / fewest_steps)


# ENVIRONMENTS ------------------------------------------------------------------------------------


def atari_id(env_id: str) -> str:
    """`Breakout` -> `BreakoutNoFrameskip-v4`; full ids (`BreakoutNoFrameskip-v4`, `ALE/Breakout-v5`) as given."""
    return env_id if "-v" in env_id or "/" in env_id else f"{env_id}NoFrameskip-v4"


def make_env(
    env_id: str,
    idx: int,
    capture_video: bool,
    run_dir: str,
    *,
    max_episode_steps: int = 27_000,
    video_prefix: str = "rl-video",
    video_trigger=None,
):
    """A thunk that builds one Atari environment with the standard preprocessing, wrapper by wrapper from the bottom
    up (Gymnasium's where one does exactly the same thing, ours otherwise). Grayscale comes from ALE
    (`obs_type="grayscale"`: OpenCV's RGB2GRAY values on all 110 colours met in 11 games), so the max of two frames
    is taken in grayscale, as envpool and Gymnasium's AtariPreprocessing do. Every id gets the v4 NoFrameskip
    settings (frameskip=1, no sticky actions, minimal action set, truncation at 4 x `max_episode_steps` frames), so
    `Breakout`, `BreakoutNoFrameskip-v4` and `ALE/Breakout-v5` are the same environment."""

    def thunk():
        settings = dict(
            obs_type="grayscale",
            frameskip=1,
            repeat_action_probability=0.0,
            full_action_space=False,
            max_num_frames_per_episode=4 * max_episode_steps,
        )
        if capture_video and idx == 0:  # --capture-video: the unpreprocessed RGB frames of environment 0
            env = gym.make(env_id, render_mode="rgb_array", **settings)
            env = gym.wrappers.RecordVideo(
                env, f"{run_dir}/videos", name_prefix=video_prefix, episode_trigger=video_trigger, disable_logger=True
            )
        else:
            env = gym.make(env_id, **settings)
        env = NoopReset(env, noop_max=30)  # ours: 1 to 30 no-op frames after a reset
        env = MaxAndSkip(env, skip=4)  # ours: the action repeated 4 frames, the max of the last two frames
        # the game score (unclipped, over all lives) and length in agent steps, in info["episode"] at the game's end
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = EpisodicLife(env)  # ours: a lost life is `terminated`, the game goes on
        if "FIRE" in env.unwrapped.get_action_meanings():
            env = FireReset(env)  # ours: FIRE after every reset
        env = gym.wrappers.TransformReward(env, np.sign)  # the reward clipped to its sign, -1, 0 or 1
        env = gym.wrappers.ResizeObservation(env, (84, 84))  # cv2.resize with INTER_AREA
        # the last 4 frames, (4, 84, 84) uint8; a reset repeats its first frame
        return gym.wrappers.FrameStackObservation(env, 4)

    return thunk


def make_envs(
    args: Args,
    num_envs: int,
    run_dir: str,
    capture_video: bool = False,
    video_prefix: str = "rl-video",
    video_trigger=None,
) -> gym.vector.VectorEnv:
    """The vector environment, with same-step autoreset (see the docstring at the top).

    The games step one after the other in this process, without one more process per game
    (against AsyncVectorEnv: benchmark/results/speed.md, Pixel scripts). ale-py's C++ vector environment
    (`ale_py.vector_env.AtariVectorEnv`) is not used because its preprocessing is not this file's:
    0 to 29 no-op frames at a reset, FIRE pressed for one frame in their place, and neither a no-op
    nor FIRE after a lost life.
    """
    extras = dict(max_episode_steps=args.max_episode_steps, video_prefix=video_prefix, video_trigger=video_trigger)
    thunks = [make_env(atari_id(args.env_id), i, capture_video, run_dir, **extras) for i in range(num_envs)]
    return gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def finished_episodes(infos: dict) -> list[tuple[int, float, int]]:
    """The episodes that ended at this vector step: (env index, return, length in agent steps). RecordEpisodeStatistics
    wraps each environment (a game below EpisodicLife: whole games, unclipped scores). Same-step autoreset moves the
    info of a step that ended an episode to `info["final_info"]`; a game can also end during a reset's own steps
    (see `step_in_reset`), and then its statistics are in the top-level info."""
    episodes = []
    for source in (infos.get("final_info", {}), infos):
        for i in np.flatnonzero(source.get("_episode", [])):
            episodes.append((int(i), float(source["episode"]["r"][i]), int(source["episode"]["l"][i])))
    return episodes


# THE NETWORK -------------------------------------------------------------------------------------


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    """Orthogonal weights with gain `std` and constant biases (detail 2 of the 37)."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """The Nature CNN (Mnih et al. 2015) shared by a policy head (std 0.01) and a value head (std 1). Input:
    uint8 frames (B, 4, 84, 84), scaled to [0, 1] here. Weights are kept channels-last: the same network,
    computed in the layout oneDNN's CPU convolutions prefer."""

    def __init__(self, n_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)
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
        """The rollout's policy step, without autograd and entropy: action, log-prob, value. Gumbel-max sampling:
        argmax(log p - log(Exponential(1) noise)) samples p, as `Categorical(logits).sample()` would."""
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
    final_values: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation over a rollout stored with same-step autoreset. Shapes are (T, N):
    T steps of N environments; `last_value` is (N,).

    | tensor          | meaning at step t                                                                    |
    |-----------------|--------------------------------------------------------------------------------------|
    | rewards[t]      | reward of the transition taken at step t                                             |
    | values[t]       | V(obs[t]), the critic's value of the observation the action was taken in             |
    | dones[t]        | 1 if the episode ended at step t (terminated or truncated), else 0                   |
    | final_values[t] | where dones[t]: the value of the state the episode ended in: 0 after a termination,  |
    |                 | V(final observation) after a truncation (0 when truncation counts as termination)    |
    | last_value      | V(observation after the last step), to bootstrap the unfinished episodes             |

    With same-step autoreset obs[t+1] is the *next* episode's first observation where dones[t], so
    the next state's value is final_values[t] there and values[t+1] elsewhere:
        delta[t] = rewards[t] + gamma * next_value[t] - values[t]
        adv[t]   = delta[t] + gamma * lambda * (1 - dones[t]) * adv[t+1]
    The trace is cut at every episode end; a truncated episode still sees the value of where it
    stopped through delta. Returns (advantages, returns = advantages + values), both (T, N)."""
    next_values = torch.cat([values[1:], last_value.unsqueeze(0)])
    next_values = torch.where(dones.bool(), final_values, next_values)
    deltas = rewards + gamma * next_values - values
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
    kl_beta: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO loss of one minibatch: policy loss + vf_coef * value loss - ent_coef * entropy, `advantages` used as
    given (normalised before the call if wanted). The policy loss is PPO-Clip's clipped surrogate, or PPO-Penalty's
    surrogate plus kl_beta * KL(old, new) (--policy-objective; section 4 of the PPO paper). Returns the loss and
    detached statistics: policy and value loss, entropy, old and new approximate KL, clip fraction."""

    logratio = newlogprob - oldlogprob
    ratio = logratio.exp()
    # KL(old || new) estimated from the sampled actions (http://joschu.net/blog/kl-approx.html): approx_kl is
    # never negative, its mean is the KL and so is the mean of its gradient: the penalty's term
    approx_kl = ((ratio - 1) - logratio).mean()
    with torch.no_grad():
        old_approx_kl = (-logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()

    if args.policy_objective == "clip":  # clipped surrogate (as a loss to minimise: the max of the negated terms)
        pg_loss1 = -advantages * ratio
        pg_loss2 = -advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
        pg_loss = torch.max(pg_loss1, pg_loss2).mean()
    else:  # KL-penalised surrogate
        pg_loss = (-advantages * ratio).mean() + kl_beta * approx_kl

    # Value loss, optionally clipped around the values predicted during the rollout
    if args.clip_vloss:
        v_loss_unclipped = (newvalue - returns) ** 2
        v_clipped = oldvalues + torch.clamp(newvalue - oldvalues, -args.clip_coef, args.clip_coef)
        v_loss_clipped = (v_clipped - returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()

    entropy_loss = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
    stats = {
        "policy_loss": pg_loss.detach(),
        "value_loss": v_loss.detach(),
        "entropy": entropy_loss.detach(),
        "old_approx_kl": old_approx_kl,
        "approx_kl": approx_kl.detach(),
        "clipfrac": clipfrac,
    }
    return loss, stats


def adapt_kl_beta(kl_beta: torch.Tensor, kls: list[torch.Tensor], args: Args, stats: dict[str, torch.Tensor]):
    """PPO-Penalty's beta after an update (section 4 of the PPO paper): logged, then with adaptive-kl halved if the
    update's KL d (the mean approx_kl of its last epoch) < kl_target / 1.5, doubled if d > 1.5 * kl_target."""
    if args.policy_objective != "clip":
        stats["kl_beta"] = kl_beta.clone()
    if args.policy_objective == "adaptive-kl":  # in place, on the device: no sync
        d = torch.stack(kls[-args.num_minibatches :]).mean()  # an epoch's minibatches see every sample once
        kl_beta.mul_(torch.where(d < args.kl_target / 1.5, 0.5, torch.where(d > 1.5 * args.kl_target, 2.0, 1.0)))


# The data-parallel pieces of the update: each rank holds its share of every global minibatch, and these
# two make the loss and the gradient of each share those of the whole minibatch, on every rank


def global_advantage_stats(
    advantages: torch.Tensor, minibatches: list[torch.Tensor], comm_device: torch.device
) -> torch.Tensor:
    """Mean and standard deviation of each *global* minibatch's advantages, (num_minibatches, 2).

    A global minibatch is the union of every rank's piece `advantages[minibatches[k]]`; normalising
    with a rank's own statistics would give each rank a different objective. One all-reduce per
    epoch sums (count, sum, sum of squares) in float64; the std is the unbiased one that a single
    process computes with `Tensor.std()`.
    """
    adv = advantages.double()
    sums = torch.stack(
        [torch.stack((adv.new_tensor(len(mb)), adv[mb].sum(), adv[mb].square().sum())) for mb in minibatches]
    ).to(comm_device)
    dist.all_reduce(sums)
    count, total, squares = sums.to(advantages.device).unbind(1)
    mean = total / count
    std = ((squares - count * mean.square()) / (count - 1)).clamp_min(0).sqrt()
    return torch.stack((mean, std), dim=1).float()


def all_reduce_gradients(
    params: list[nn.Parameter], count: int, scalars: torch.Tensor, comm_device: torch.device
) -> torch.Tensor:
    """The one all-reduce of a minibatch. On entry each parameter's .grad is the gradient of this
    rank's mean loss over its `count` samples; on return it is the gradient of the mean loss over all
    ranks' samples, sum_r count_r * grad_r / sum_r count_r (the plain average when the counts are
    equal), the same on every rank. `scalars` (1-D, e.g. the loss statistics) are averaged the same
    way and returned. Gradients, scalars and count travel in one flat buffer: one call, not one per
    parameter."""
    grads = [p.grad for p in params]
    flat = torch.empty(sum(g.numel() for g in grads) + len(scalars) + 1, device=grads[0].device)
    offset = 0
    for g in grads:  # count * gradient, written straight into its piece of the buffer
        torch.mul(g, count, out=flat[offset : offset + g.numel()].view(g.shape))
        offset += g.numel()
    flat[offset:-1] = scalars * count
    flat[-1] = count
    if flat.device == comm_device:
        dist.all_reduce(flat)
    else:  # gloo with the gradients on a GPU: reduce a CPU copy
        reduced = flat.to(comm_device)
        dist.all_reduce(reduced)
        flat.copy_(reduced)
    total = flat[-1]  # all ranks' samples
    offset = 0
    for g in grads:  # the weighted average, written back in the gradient's own layout
        torch.div(flat[offset : offset + g.numel()].view(g.shape), total, out=g)
        offset += g.numel()
    return flat[offset:-1] / total


def update_step(
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    args: Args,
    kl_beta: torch.Tensor,
    obs: torch.Tensor,
    actions: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    adv_stats: torch.Tensor,
    comm: ppolab.distributed.CommTimer,
    comm_device: torch.device,
) -> dict[str, torch.Tensor]:
    """One gradient step on this rank's piece of one global minibatch: forward, advantage normalisation
    with the global minibatch's (mean, std) `adv_stats`, the PPO loss, backward, THE ALL-REDUCE of the
    gradients and statistics (timed by `comm`), global gradient clipping of the averaged gradient, the
    optimizer step. Returns the all-reduced statistics of `ppo_loss` and this rank's `ratio_deviation`
    (max |ratio - 1| before the step), all as tensors.

    One function so that `--compile` hands it to torch.compile as it stands; the collective runs
    eagerly between the compiled pieces (ppolab.distributed.CommTimer.__call__).
    """
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
    if args.norm_adv:
        advantages = (advantages - adv_stats[0]) / (adv_stats[1] + 1e-8)
    loss, stats = ppo_loss(newlogprob, entropy, newvalue, logprobs, advantages, returns, values, args, kl_beta)
    optimizer.zero_grad()
    loss.backward()
    # DISTRIBUTED: the gradient and the statistics of the global minibatch, on every rank
    params = list(agent.parameters())
    # collective: every rank calls this
    averaged = comm(all_reduce_gradients, params, obs.shape[0], torch.stack(list(stats.values())), comm_device)
    stats = dict(zip(stats, averaged))
    nn.utils.clip_grad_norm_(params, args.max_grad_norm)  # of the averaged gradient
    optimizer.step()
    stats["ratio_deviation"] = (newlogprob.detach() - logprobs).exp().sub(1).abs().max()
    return stats


# TRAINING ----------------------------------------------------------------------------------------


def train(
    args: Args,
    run: ppolab.distributed.DistributedRun,
    rank: int,
    world_size: int,
    device: torch.device,
    comm_device: torch.device,
) -> str:
    """One rank's PPO on args.env_id, from scratch or on from --resume's checkpoint: every rank runs this loop in
    step with the others (the steps that involve them are marked DISTRIBUTED, and every call that all ranks must
    reach `collective`); rank 0 also writes everything the run reports into its folder (`run`, the package's),
    which train returns. The collectives reduce on `comm_device`."""
    ppolab.seed_everything(args.seed + rank, args.torch_deterministic)  # seed + r: each rank samples its own actions
    torch.distributions.Distribution.set_default_validate_args(False)  # no argument checks: costlier than the math

    T, N = args.num_steps, args.num_envs // world_size  # this rank's environments
    envs = make_envs(args, N, run.dir, args.capture_video and rank == 0)
    agent = Agent(int(envs.single_action_space.n)).to(device)
    # fused: one kernel for all parameters. The learning rate is a tensor, annealed in place without a recompile
    learning_rate = torch.tensor(args.learning_rate, device=device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=learning_rate, eps=1e-5, fused=True)
    kl_beta = torch.tensor(args.kl_beta, device=device)  # PPO-Penalty's beta (adapt_kl_beta changes it in place)
    saved = {"model": agent, "optimizer": optimizer, "kl_beta": kl_beta}  # besides progress, RNG and args
    start_iteration, global_step = run.start(saved)  # --resume: on every rank, its RNG too; 1, 0 if new
    broadcast_weights(agent, comm_device)  # collective: every rank calls this; all start from rank 0's weights

    # --compile runs the same two functions through torch.compile; --cudagraphs also records their kernels
    # in CUDA graphs and replays them (one launch per call; its outputs are reused, so the loop clones them)
    act, update = agent.act, partial(update_step, agent, optimizer, args, kl_beta)
    if args.compile or args.cudagraphs:
        mode = "reduce-overhead" if args.cudagraphs else None
        act = torch.compile(agent.act, mode=mode)
        update = partial(torch.compile(update_step, mode=mode), agent, optimizer, args, kl_beta)

    # Rollout storage of this rank, on the CPU and shared with NumPy, as in ppo_atari.py: observations
    # uint8 and channels-last, allocated (T, N, 84, 84, 4) and viewed as (T, N, 4, 84, 84); on CUDA in
    # pinned memory, so the copy of a step's frames to the device does not block
    obs_shape = envs.single_observation_space.shape  # (4, 84, 84)
    obs = torch.zeros(
        (T, N) + obs_shape[1:] + obs_shape[:1], dtype=torch.uint8, pin_memory=device.type == "cuda"
    ).permute(0, 1, 4, 2, 3)
    actions = torch.zeros((T, N), dtype=torch.long)
    # final_values: the value where an episode ended (see compute_gae)
    logprobs, rewards, dones, values, final_values = (torch.zeros((T, N)) for _ in range(5))
    actions_np, logprobs_np, rewards_np, dones_np, values_np = (
        x.numpy() for x in (actions, logprobs, rewards, dones, values)
    )
    preemption = make_preemption(args, world_size)  # DISTRIBUTED: straggler preemption (None: off)

    # Global env k = rank * N + i gets seed + k, like env k of ppo_atari.py; a resumed run reseeds
    # its environments differently, so it does not replay the first games
    next_obs, _ = envs.reset(seed=args.seed + global_step + rank * N)
    total_steps = args.num_iterations * args.batch_size  # over all ranks
    for iteration in range(start_iteration, args.max_iterations + 1):  # until global_step reaches total_steps
        if args.anneal_lr:  # annealed linearly to 0 over the run's steps (detail 4)
            learning_rate.fill_((1.0 - global_step / total_steps) * args.learning_rate)

        # COLLECT TRAJECTORIES ------------------------------------------------------------------
        rollout_start = time.perf_counter()
        final_values.zero_()
        episodes = []
        final_obs, final_steps, final_envs = [], [], []  # truncated games' last observations, and where
        for step in range(T):
            obs[step] = torch.from_numpy(next_obs)
            # one copy to the device, one back: action, log-prob and value stacked in one tensor
            action, logprob, value = act(obs[step].to(device, non_blocking=True))
            policy_out = torch.stack([action.float(), logprob, value], 1).cpu().numpy()
            actions_np[step], logprobs_np[step], values_np[step] = policy_out.T
            next_obs, reward, terminated, truncated, infos = envs.step(actions_np[step])

            rewards_np[step] = reward  # clipped to the sign in make_env
            dones_np[step] = terminated | truncated
            # next_obs is already the next episode's first observation where an episode ended; where a
            # truncated episode stopped is kept from info["final_obs"], its value computed after the rollout.
            # ALE truncates at its last allowed frame even when a life (or the game) was also lost there:
            # such a step is a termination (value 0), so only truncated-and-not-terminated environments bootstrap
            bootstrap = truncated & ~terminated
            if args.bootstrap_truncation and bootstrap.any():
                idx = np.flatnonzero(bootstrap)
                final_obs.extend(infos["final_obs"][idx])
                final_steps.extend([step] * len(idx))
                final_envs.extend(idx)
            for i, episodic_return, length in finished_episodes(infos):
                # all ranks step together: global env k's step t of this rollout is number t * num_envs + k + 1
                episode_step = global_step + step * args.num_envs + rank * N + i + 1
                episodes.append(Episode(episode_step, episodic_return, length))

            if preemption is not None and preemption.preempts(iteration, step + 1):
                break  # DISTRIBUTED: enough ranks have finished: end this rollout early (preempted)
        steps = step + 1  # this rank's rollout length, T unless preempted
        if preemption is not None:
            preemption.finish_rollout(iteration)

        # CALCULATE ADVANTAGES ------------------------------------------------------------------
        # the values after the last step and where truncated games stopped, in one forward pass
        with torch.no_grad():
            bootstrap_values = agent.get_value(torch.from_numpy(np.stack([*next_obs, *final_obs])).to(device)).cpu()
        last_value = bootstrap_values[:N]
        final_values[final_steps, final_envs] = bootstrap_values[N:]
        advantages, returns = compute_gae(
            rewards=rewards[:steps],
            values=values[:steps],
            dones=dones[:steps],
            last_value=last_value,
            gamma=args.gamma,
            gae_lambda=args.gae_lambda,
            final_values=final_values[:steps],
        )
        rollout_time = time.perf_counter() - rollout_start

        # DISTRIBUTED: EXCHANGE THE REPORTS -----------------------------------------------------
        # One all_gather: everyone's sample count (for the global step), episodes and value sums (for
        # rank 0's log). It waits for the slowest rank's rollout; it starts the update's time, and
        # comm counts the time of every collective of the update, this one included
        update_start = time.perf_counter()
        comm = ppolab.distributed.CommTimer(device, args.sync_timing)
        own = RolloutReport(steps * N, episodes, rollout_time, ppolab.distributed.ValueSums.of(values[:steps], returns))
        # all_gather: every rank's report, in rank order, on every rank (pickled: a few numbers each)
        reports = comm(ppolab.distributed.all_gather, own)  # collective: every rank calls this
        global_step += sum(report.steps for report in reports)

        # UPDATE THE NETWORK --------------------------------------------------------------------
        # Each rank holds its share of every global minibatch: its own batch, shuffled, cut into
        # num_minibatches pieces. The pieces' gradients are combined by all_reduce_gradients.
        b_obs = obs[:steps].reshape((-1,) + obs_shape).to(device)  # a view: still channels-last
        b_actions = actions[:steps].reshape(-1).to(device)
        b_logprobs = logprobs[:steps].reshape(-1).to(device)
        b_advantages = advantages.reshape(-1).to(device)
        b_returns = returns.reshape(-1).to(device)
        b_values = values[:steps].reshape(-1).to(device)

        clipfracs, kls = [], []  # every minibatch's (all-reduced) clip fraction, as tensors: no sync per minibatch
        epochs = 0
        for epoch in range(args.update_epochs):
            minibatches = torch.randperm(steps * N, device=device).tensor_split(args.num_minibatches)
            adv_stats = torch.zeros((len(minibatches), 2), device=device)
            if args.norm_adv:  # DISTRIBUTED: the advantage statistics of every global minibatch of this epoch
                # collective: every rank calls this
                adv_stats = comm(global_advantage_stats, b_advantages, minibatches, comm_device)
            for k, mb_inds in enumerate(minibatches):
                if args.cudagraphs:
                    torch.compiler.cudagraph_mark_step_begin()
                stats = update(  # collective: every rank calls this; update_step all-reduces the gradients
                    obs=b_obs[mb_inds],
                    actions=b_actions[mb_inds],
                    logprobs=b_logprobs[mb_inds],
                    advantages=b_advantages[mb_inds],
                    returns=b_returns[mb_inds],
                    values=b_values[mb_inds],
                    adv_stats=adv_stats[k],
                    comm=comm,
                    comm_device=comm_device,
                )
                stats = {name: value.clone() for name, value in stats.items()} if args.cudagraphs else stats
                if epoch == 0 and k == 0:
                    # Nothing has been updated yet, so the ratio must be 1 to float precision; a larger
                    # deviation means the stored log-probs do not belong to the stored observations
                    first_ratio_deviation = stats["ratio_deviation"]
                clipfracs.append(stats["clipfrac"])
                kls.append(stats["approx_kl"])
            epochs += 1
            # decided from the all-reduced KL of the global minibatch: every rank stops after the same
            # epoch (a sync, only when --target-kl is set). A rank deciding from its own KL could stop while
            # another goes on and waits in its next all-reduce forever (a hang)
            if args.target_kl is not None and stats["approx_kl"] > args.target_kl:
                break
        update_time = time.perf_counter() - update_start

        # the losses and KLs of the last minibatch, the clip fraction over the whole update
        stats.update(clipfrac=torch.stack(clipfracs).mean(), ratio_deviation=first_ratio_deviation)
        adapt_kl_beta(kl_beta, kls, args, stats)  # PPO-Penalty: beta logged, then adapted (adaptive-kl)
        if rank == 0:  # rank 0 logs every rank's episodes and value sums (the reports); the others wait for it
            preempted_ranks = sum(report.steps < T * N for report in reports)
            scalars = {"debug/update_epochs": epochs, "debug/preempted_ranks": preempted_ranks}
            run.iteration(
                iteration=iteration,
                global_step=global_step,
                stats=stats,
                learning_rate=learning_rate.item(),
                rollout_time=rollout_time,
                update_time=update_time,
                scalars=scalars,
                reports=reports,
                comm_time=comm.seconds,
            )
            run.evaluate_if_due(iteration, global_step, saved)
        run.checkpoint_if_due(iteration, global_step, saved)  # collective: every rank calls this; with every rank's RNG
        if global_step >= total_steps:  # the same global_step on every rank: they end together
            break

    envs.close()
    run.finish(global_step, saved, iteration=iteration)  # collective: every rank calls this; weights compared first
    return run.dir


# THE PROCESS LAYOUT ------------------------------------------------------------------------------
# What the ranks exchange besides the update's collectives: rank 0's weights at the start, a report after every
# rollout, and (with --preempt-fraction) the count of finished rollouts in the job's store


def broadcast_weights(agent: Agent, comm_device: torch.device):
    """Every rank takes rank 0's weights (a broadcast per tensor, once per run)."""
    for tensor in agent.state_dict().values():
        buffer = tensor.to(comm_device)  # the tensor itself, or with gloo and the weights on a GPU a CPU copy
        dist.broadcast(buffer, src=0)
        tensor.copy_(buffer)


class Episode(NamedTuple):
    """A finished episode, as it travels from its rank to rank 0's log."""

    step: int  # the global step it ended at
    episodic_return: float  # the unclipped game score
    episodic_length: int  # in agent steps


class RolloutReport(NamedTuple):
    """What a rank tells every other after its rollout (one all_gather per iteration)."""

    steps: int  # transitions it collected: num_steps x its environments, fewer when preempted
    episodes: list[Episode]  # that ended in its rollout, for rank 0's log
    rollout_time: float  # seconds, for perf/rollout_time_max
    value_sums: ppolab.distributed.ValueSums  # for losses/explained_variance


def make_preemption(args: Args, world_size: int) -> "Preemption | None":
    """--preempt-fraction: DD-PPO's straggler preemption, counted in the job's store (None: off, or a world
    of one)."""
    if args.preempt_fraction is None or world_size == 1:
        return None
    return Preemption(
        ppolab.distributed.job_store("finished_rollouts"),
        after=math.ceil(args.preempt_fraction * world_size),
        min_steps=math.ceil(args.preempt_min_steps * args.num_steps),
        num_steps=args.num_steps,
    )


class Preemption:
    """DD-PPO's straggler preemption: a rank that has collected `min_steps` of its `num_steps` steps
    ends its rollout once `after` ranks have finished theirs. The ranks count the finished rollouts of
    each iteration in `store`, a counter per iteration."""

    def __init__(self, store: dist.Store, after: int, min_steps: int, num_steps: int):
        self.store, self.after, self.min_steps, self.num_steps = store, after, min_steps, num_steps

    def finished_rollouts(self, iteration: int) -> int:
        # A store has no plain read of a counter: get() of a key that no rank has added to yet waits
        # for it until the store's timeout; add(key, 0) adds nothing and returns the count (0 if new)
        return self.store.add(str(iteration), 0)

    def finish_rollout(self, iteration: int):
        self.store.add(str(iteration), 1)

    def preempts(self, iteration: int, steps: int) -> bool:
        """Whether a rollout that has collected `steps` steps ends now: it has its minimum, it is not at
        its last step anyway, and enough ranks have finished theirs (asked only then: a round trip)."""
        return self.min_steps <= steps < self.num_steps and self.finished_rollouts(iteration) >= self.after


# THE ATARI WRAPPERS (those of make_env, above) ---------------------------------------------------


def step_in_reset(env: gym.Env, action: int, info: dict) -> tuple[np.ndarray, dict]:
    """One step taken inside a wrapper's reset() (a no-op or FIRE). If it ends the game, the game is
    reset; the statistics of the game that ended (`info["episode"]`, from RecordEpisodeStatistics
    below) are kept in the returned info, so that game is still logged. `info`: the reset's info so far."""
    obs, _, terminated, truncated, step_info = env.step(action)
    episode = info.get("episode")
    if terminated or truncated:
        episode = step_info.get("episode", episode)
        obs, step_info = env.reset()
    return obs, step_info if episode is None else {**step_info, "episode": episode}


class NoopReset(gym.Wrapper):
    """Ours. After a reset, 1 to `noop_max` no-op frames, the number drawn from the environment's own
    seeded RNG, so the games start in different states."""

    def __init__(self, env: gym.Env, noop_max: int = 30):
        super().__init__(env)
        assert env.unwrapped.get_action_meanings()[0] == "NOOP"
        self.noop_max = noop_max

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for _ in range(self.unwrapped.np_random.integers(1, self.noop_max + 1)):
            obs, info = step_in_reset(self.env, 0, info)
        return obs, info


class MaxAndSkip(gym.Wrapper):
    """Ours. Repeats the action for `skip` frames, sums their rewards and returns the pixel-wise max of
    the last two frames (Atari sprites flicker: some are drawn on every other frame only). It stops at
    an episode end, still with the max of the last two frames (the earlier one from the step before
    when the end came at the first frame). Gymnasium's MaxAndSkipObservation does the same on full
    skips, but when the episode ends mid-skip it returns the previous step's frames instead."""

    def __init__(self, env: gym.Env, skip: int = 4):
        super().__init__(env)
        self.skip, self.frame = skip, None

    def reset(self, **kwargs):
        self.frame, info = self.env.reset(**kwargs)
        return self.frame, info

    def step(self, action):
        total_reward = 0.0
        for _ in range(self.skip):
            previous = self.frame
            self.frame, reward, terminated, truncated, info = self.env.step(action)
            total_reward += float(reward)
            if terminated or truncated:
                break
        return np.maximum(previous, self.frame), total_reward, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """Ours. A lost life ends the learning episode (`terminated`), so the agent learns that losing a
    life is bad; the game itself goes on: the reset that follows takes one no-op step and continues
    the same game. Only after a real game over (or a truncation, or a reset with a seed) does
    reset() restart the game. Lives are read from `env.unwrapped.ale.lives()`."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives, self.game_over = 0, True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.unwrapped.ale.lives()
        if 0 < lives < self.lives:  # a life lost, the game goes on (at 0 lives the game itself is over)
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.game_over or kwargs.get("seed") is not None:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, info = step_in_reset(self.env, 0, {})
        self.game_over = False
        self.lives = self.unwrapped.ale.lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Ours. Games that wait for FIRE to start (Breakout's ball) get FIRE after every reset, then
    action 2, as the usual wrapper (OpenAI Baselines' FireResetEnv) does. Placed above EpisodicLife,
    it also fires after each lost life."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.fire = env.unwrapped.get_action_meanings().index("FIRE")

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        obs, info = step_in_reset(self.env, self.fire, info)
        return step_in_reset(self.env, 2, info)


# ==================================================================================================
# PPO ENDS HERE. What follows is what is particular to this script's run: its input checks, how its policy
# plays an evaluation, and the entry point, which joins the job. The rest of a run (the run folder, checkpoints
# and resuming, logging, Ctrl-C and full disks) and the job's plumbing (the device and the backend, joining and
# leaving the job, the messages between ranks, timing the collectives, rank 0 writing for every rank) are the
# package ppolab's. None of it changes what PPO computes; what the ranks compute together is all above.
# ==================================================================================================


def check_args(args: Args, rank: int, world_size: int):
    """Bad input ends in one line on every rank before it joins the job: the checks of every script (numbers,
    counts, the world size, the batch, folders, and on rank 0, which alone reads them, the --resume and
    --evaluate files), then preemption, the backend and GPUs, and the game."""
    ppolab.check_args(
        args,
        positive=("max_episode_steps", "timeout"),
        world_size=world_size,
        batch=f"--num-envs {args.num_envs} x --num-steps {args.num_steps}",
        files_here=rank == 0,
    )
    if args.preempt_fraction is not None:
        if not 0 < args.preempt_fraction <= 1 or not 0 < args.preempt_min_steps <= 1:
            ppolab.fail("--preempt-fraction and --preempt-min-steps must be in (0, 1]")
        if math.ceil(args.preempt_min_steps * args.num_steps) * (args.num_envs // world_size) < args.num_minibatches:
            ppolab.fail("--preempt-min-steps leaves a rank fewer samples than --num-minibatches")
    if args.backend == "nccl" and not (args.cuda and torch.cuda.is_available()):
        ppolab.fail("--backend nccl needs CUDA (pass --backend gloo, or run on GPUs)")
    if args.device_ids is not None and torch.cuda.is_available():
        bad = [i for i in args.device_ids if not 0 <= i < torch.cuda.device_count()]
        if bad or not args.device_ids:
            ppolab.fail(f"--device-ids {args.device_ids}: this machine has GPUs 0 to {torch.cuda.device_count() - 1}")
    ppolab.check_atari_game(args, atari_id(args.env_id))


def evaluate(
    checkpoint: dict, episodes: int, deterministic: bool, seed: int, *, video_prefix: str | None = None
) -> list[float]:
    """Plays `episodes` whole games (all lives), one per environment, with the policy of `checkpoint` (a saved
    model, or a snapshot of the training) and the training preprocessing, on the CPU, and returns their returns
    (the unclipped game scores). The games and the action sampling come from `seed`, so the same model scores
    the same whether evaluated during training, after it or later from the saved file. `video_prefix`
    (`--evaluate --capture-video`): records the game of environment 0 (the first) with RecordVideo, the
    unpreprocessed RGB frames, as `<video_prefix>-episode-0.mp4`."""
    args = Args(**checkpoint["args"])
    # environment 0 records its first episode to <run_dir>/videos (the videos folder's parent), named by the prefix;
    # a game that cannot be made here (a checkpoint from elsewhere) ends in one line
    with ppolab.making(atari_id(args.env_id), "the checkpoint's environment "):
        envs = make_envs(
            args,
            episodes,
            str(Path(video_prefix or ".").parent.parent),
            video_prefix is not None,
            video_prefix=Path(video_prefix or "rl-video").name,
            video_trigger=lambda episode: episode == 0,
        )
    agent = Agent(int(envs.single_action_space.n))
    agent.load_state_dict(checkpoint["model"])
    torch.manual_seed(seed)
    returns = np.full(episodes, np.nan)
    obs, _ = envs.reset(seed=seed)
    while np.isnan(returns).any():
        with torch.no_grad():
            logits = agent.actor(agent.features(torch.as_tensor(obs)))
            action = logits.argmax(-1) if deterministic else Categorical(logits=logits).sample()
        obs, _, _, _, infos = envs.step(action.numpy())
        for i, episodic_return, _ in finished_episodes(infos):
            if np.isnan(returns[i]):
                returns[i] = episodic_return
    envs.close()
    return returns.tolist()


def main(args: Args) -> str | list[float] | None:
    """Checks the arguments, then trains (returns the run folder) or, with --evaluate, evaluates on rank 0
    (returns the games' scores). Training joins the job's process group and leaves it on every path."""
    # torchrun gives every process its place in the job: RANK (global: it names the process in seeds, logging and
    # checkpoints), LOCAL_RANK (its place on this machine: which GPU) and WORLD_SIZE. Started as `python
    # ppo_atari_multigpu.py`, without torchrun, the process is a world of one.
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    check_args(args, rank, world_size)
    ppolab.use_threads(args.torch_threads)
    if args.evaluate is not None:
        return ppolab.evaluate_file(args, evaluate, atari_id) if rank == 0 else None

    # local rank i on GPU i (or --device-ids[i]), else the CPU; nccl where every local rank has a GPU of its own,
    # else gloo (or --backend)
    device = ppolab.distributed.select_device(args, local_rank)
    backend = ppolab.distributed.select_backend(args, device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # Join the job's process group. Under torchrun, init_method="env://" finds the store of torchrun's rendezvous
    # through MASTER_ADDR and MASTER_PORT (with RANK and WORLD_SIZE); a world of one needs no launcher: a store in
    # memory. A collective that waits longer than --timeout raises instead of hanging.
    timeout = timedelta(seconds=args.timeout)
    if "MASTER_ADDR" in os.environ or world_size > 1:
        # collective: every rank calls this
        dist.init_process_group(backend=backend, init_method="env://", timeout=timeout)
    else:
        # collective: every rank calls this (the only one, here)
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    comm_device = device if backend == "nccl" else torch.device("cpu")  # gloo reduces CPU tensors
    # every rank trains with rank 0's arguments and folder (or --resume's checkpoint, which rank 0 reads and
    # sends); rank 0 alone writes the run. Ctrl-C and refused writes end it in one line (ppolab.stops).
    # in_the_job leaves the process group on every path, and a rank that loses the others says so in one line
    with (
        ppolab.distributed.in_the_job(rank, world_size, args.timeout),
        # collective: every rank calls this; rank 0 sends its arguments, folder and checkpoint
        ppolab.distributed.DistributedRun(args, evaluate, atari_id) as run,
    ):
        return train(args=run.args, run=run, rank=rank, world_size=world_size, device=device, comm_device=comm_device)


if __name__ == "__main__":
    ppolab.run_program(main, Args)
