"""PPO for discrete actions on classic control (CartPole-v1, Acrobot-v1, MountainCar-v0).

Run:
    python ppo.py --env-id CartPole-v1
    tensorboard --logdir runs

What this file shows, top to bottom: the PPO algorithm of Schulman et al. (2017) with the 13 core
implementation details of "The 37 Implementation Details of PPO" (Huang et al., ICLR blog track 2022):
vectorised environments, orthogonal initialisation, Adam with eps 1e-5, learning-rate annealing,
GAE, shuffled minibatches, advantage normalisation, the clipped surrogate objective, the clipped
value loss, the entropy bonus, global gradient clipping, approx-KL and clip-fraction diagnostics,
and separate actor and critic networks. PPO ends at the banner after `train`; below it is the
machinery a run needs (input checks, checkpoints, evaluation, logging, the CPU fast path).

What is special in this file (the places where PPO scripts usually go wrong):
- Gymnasium 1.x vector environments reset a finished episode on the *next* step by default; that step
  would be a fake transition. We use same-step autoreset instead: the step that ends an episode returns
  the first observation of the next one, and the last observation of the old one arrives in
  `info["final_obs"]`. Every stored transition is therefore real experience.
- A time-limit truncation is not a termination: the value of the final observation is bootstrapped.
  `--no-bootstrap-truncation` restores the classic "truncation = termination" behaviour.
- Checkpoints hold everything needed to resume (weights, optimizer, step, RNG states, args) and are
  data only; `--resume` continues a killed run and `--evaluate` scores a saved model.
- On the CPU the rollout's policy step and the update step run in NumPy (`NumpyPolicy`, `NumpyUpdate`):
  the same functions of the same weights, written out. They run only where they compute exactly the
  code above (this Agent, this loss, Adam); an edited network, loss or optimizer is trained as written,
  in PyTorch, and the run says so. `--no-numpy-update` uses the PyTorch code anyway.
"""

import ast
import contextlib
import copy
import errno
import hashlib
import inspect
import io
import math
import os
import pickle
import random
import signal
import sys
import textwrap
import threading
import time
import warnings
from dataclasses import asdict, dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from threadpoolctl import threadpool_limits
from torch.distributions.categorical import Categorical


@dataclass
class Args:
    # PPO's hyperparameters (the defaults are the published ones)
    env_id: str = "CartPole-v1"
    """the id of the environment"""
    total_timesteps: int = 500_000
    """total timesteps of the experiment"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 4
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
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
    """bootstrap the value of the final observation at a time-limit truncation (off: treat it as termination)"""

    # The run: where it goes, what it records, how it runs
    exp_name: str = Path(__file__).stem
    """the name of this experiment (part of the run folder's name)"""
    seed: int = 1
    """seed of the experiment (environments, PyTorch, NumPy, Python)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True` and cuDNN's TF32 off (full float32)"""
    cuda: bool = True
    """if toggled, cuda is used when available"""
    torch_threads: int = 1
    """CPU threads for PyTorch and NumPy's BLAS (0 keeps their defaults); the default is chosen in
    benchmark/results/speed_cpu.md"""
    compile: bool = False
    """torch.compile the update step (on CUDA also the policy step; on the CPU the policy step is NumpyPolicy)
    instead of running NumpyUpdate; off by default on the CPU (benchmark/results/speed_cpu.md), the way to a
    faster update on a GPU"""
    cudagraphs: bool = False
    """capture the compiled policy step and update step in CUDA graphs (CUDA only; implies --compile)"""
    numpy_update: bool = True
    """on the CPU, run the policy step and the update step in NumPy (NumpyPolicy, NumpyUpdate: the same
    computation, faster on these small networks), each only where it computes exactly this file's code;
    off: both run in PyTorch"""
    track: bool = False
    """if toggled, the run is tracked with Weights & Biases"""
    wandb_project_name: str = "ppo-lab"
    """the Weights & Biases project name"""
    wandb_entity: str | None = None
    """the entity (team) of the Weights & Biases project"""
    capture_video: bool = False
    """if toggled, videos of environment 0 are saved to `runs/<run>/videos`"""
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
    model as `runs/<run>/best_model.pt` (0: never, the default: each evaluation pauses training; its cost is
    in benchmark/results/evaluation.md)"""
    eval_episodes: int = 10
    """number of episodes of an evaluation"""
    eval_deterministic: bool = False
    """if toggled, evaluation takes the most probable action instead of sampling"""
    runs_dir: str = "runs"
    """folder under which each run writes its own folder"""

    @property
    def batch_size(self) -> int:
        """transitions per update: num_envs * num_steps"""
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_iterations(self) -> int:
        """updates in the whole run: total_timesteps // batch_size"""
        return self.total_timesteps // self.batch_size


# ENVIRONMENTS ------------------------------------------------------------------------------------


def make_env(env_id: str, idx: int, capture_video: bool, run_dir: str):
    """A thunk that builds one environment; only environment 0 records videos."""

    def thunk():
        if capture_video and idx == 0:
            # classic control draws its frames with pygame: SDL's dummy drivers need no display and no sound
            # card (without them SDL prints "XDG_RUNTIME_DIR is invalid" on a machine without a desktop session)
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
            os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
            env = gym.make(env_id, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, f"{run_dir}/videos", disable_logger=True)
        else:
            env = gym.make(env_id)
        return env

    return thunk


def make_envs(args: Args, run_dir: str) -> gym.vector.VectorEnv:
    """The vector environment, with same-step autoreset (see the docstring at the top): gymnasium's
    `SyncVectorEnv(..., autoreset_mode=SAME_STEP)`, written out below the banner (`SameStepVectorEnv`), under
    gymnasium's vector `RecordEpisodeStatistics`: at the step an episode ends,
    `info["episode"]` holds its return "r" and length "l" with the mask `info["_episode"]` (see
    `finished_episodes`), so every finished episode is logged.
    """
    envs = SameStepVectorEnv([make_env(args.env_id, i, args.capture_video, run_dir) for i in range(args.num_envs)])
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    if not isinstance(envs.single_action_space, gym.spaces.Discrete):
        envs.close()
        fail(
            f"{args.env_id} has action space {envs.single_action_space}; ppo.py supports Discrete actions "
            "only (use ppo_continuous_action.py for Box actions)"
        )
    return envs


def finished_episodes(infos: dict) -> list[tuple[int, float, int]]:
    """The episodes that ended at this vector step: (env index, return, length)."""
    return (
        [
            (int(i), float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i]))
            for i in np.flatnonzero(infos["_episode"])
        ]
        if "_episode" in infos
        else []
    )  # most steps: none


# THE NETWORK -------------------------------------------------------------------------------------


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    """Orthogonal weights with gain `std` and constant biases (detail 2 of the 37)."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Separate actor and critic MLPs (64-64, tanh). The policy head starts near uniform (std 0.01)."""

    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, n_actions), std=0.01),
        )

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x).squeeze(-1)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        """Samples an action (or scores the given one): returns action, log-prob, entropy, value.

        The log-probabilities of all actions are the log-softmax of the logits; the action's log-prob
        is its entry and the entropy is -sum(p log p). These are the formulas of `Categorical`, written
        out: on a small minibatch the distribution object's own checks and conversions cost more than
        the arithmetic (tests/test_agent.py checks them against `Categorical`).
        """
        logprobs = self.actor(x).log_softmax(-1)
        if action is None:
            action = Categorical(logits=logprobs).sample()
        logprob = logprobs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        entropy = -(logprobs.exp() * logprobs).sum(-1)
        return action, logprob, entropy, self.get_value(x)

    @torch.no_grad()
    def act(self, x: torch.Tensor):
        """The rollout's policy step: action and log-prob, without the entropy and the autograd
        bookkeeping that only the update needs (on these tiny batches that overhead is most of the time).
        The critic does not change during a rollout, so the values of its observations come from one
        batched `get_value` after it, not from one small forward pass per step.

        Gumbel-max sampling: argmax(log p + g) with g = -log(Exponential(1)) noise is a sample of the
        categorical distribution p, as `Categorical(logits).sample()` would draw, in fewer operations.
        """
        logprobs = self.actor(x).log_softmax(-1)
        action = (logprobs - torch.empty_like(logprobs).exponential_().log()).argmax(-1)
        return action, logprobs.gather(-1, action.unsqueeze(-1)).squeeze(-1)


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
    """Generalized Advantage Estimation over a rollout stored with same-step autoreset.

    Shapes are (T, N): T steps of N environments; `last_value` is (N,).

    | tensor         | meaning at step t                                                        |
    |----------------|--------------------------------------------------------------------------|
    | rewards[t]     | reward of the transition taken at step t                                  |
    | values[t]      | V(obs[t]), the critic's value of the observation the action was taken in |
    | dones[t]       | 1 if the episode ended at step t (terminated or truncated), else 0        |
    | final_values[t]| where dones[t]: the value of the state the episode ended in: 0 after a    |
    |                | termination, V(final observation) after a truncation (0 when truncation   |
    |                | is treated as termination); ignored where not done                        |
    | last_value     | V(observation after the last step), to bootstrap the unfinished episodes  |

    With same-step autoreset obs[t+1] is the *next* episode's first observation where dones[t], so
    the next state's value is final_values[t] there and values[t+1] elsewhere:

        delta[t] = rewards[t] + gamma * next_value[t] - values[t]
        adv[t]   = delta[t] + gamma * lambda * (1 - dones[t]) * adv[t+1]

    The trace is cut at every episode end; a truncated episode still sees the value of where it
    stopped through delta. Returns (advantages, returns = advantages + values), both (T, N).
    """
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
) -> dict[str, torch.Tensor]:
    """One gradient step on one minibatch: forward, advantage normalisation, the PPO loss, backward,
    global gradient clipping, the optimizer step. Returns the detached statistics of `ppo_loss` and
    `ratio_deviation`, max |ratio - 1| before the step (1e-7 at the first minibatch of an update).

    The whole step is one function so that `--compile` can hand it to torch.compile as it stands.
    """
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
    if args.norm_adv:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    loss, stats = ppo_loss(newlogprob, entropy, newvalue, logprobs, advantages, returns, values, args)
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    stats["ratio_deviation"] = (newlogprob.detach() - logprobs).exp().sub(1).abs().max()
    return stats


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

    envs = make_envs(args, run_dir)
    obs_shape = envs.single_observation_space.shape
    agent = Agent(int(np.prod(obs_shape)), int(envs.single_action_space.n)).to(device)
    # fused: one kernel for all parameters instead of a loop of small ones (same update, less overhead).
    # The learning rate is a tensor that annealing overwrites in place: a compiled optimizer step reads
    # it as data, where a Python float would be a constant of the compiled code (a recompile per update)
    learning_rate = torch.tensor(args.learning_rate, device=device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=learning_rate, eps=1e-5, fused=True)
    start_iteration, global_step = restore(checkpoint, agent, optimizer, args)  # 1, 0 for a new run
    log = RunLog(args, run_dir, global_step)

    # --compile runs the same two functions through torch.compile; --cudagraphs also records their kernels
    # in CUDA graphs and replays them (one launch per call; its outputs are reused, so the loop clones them)
    act, update = agent.act, partial(update_step, agent, optimizer, args)
    if args.compile or args.cudagraphs:
        mode = "reduce-overhead" if args.cudagraphs else None
        update = partial(torch.compile(update_step, mode=mode), agent, optimizer, args)
        if device.type != "cpu":
            act = torch.compile(agent.act, mode=mode)
    act, update = numpy_fast_path(agent, optimizer, args, act, update)  # on the CPU, where it is the same code

    # Rollout storage lives on the CPU as torch tensors whose memory NumPy shares: the environments'
    # arrays are copied in without conversions, and the batch moves to the device once per update.
    # On CUDA the observations are in pinned memory, so their copy to the device does not block.
    T, N = args.num_steps, args.num_envs
    obs = torch.zeros((T, N) + obs_shape, pin_memory=device.type == "cuda")
    actions = torch.zeros((T, N), dtype=torch.long)
    logprobs = torch.zeros((T, N))
    rewards = torch.zeros((T, N))
    dones = torch.zeros((T, N))
    final_values = torch.zeros((T, N))  # value where an episode ended (see compute_gae)
    obs_np, actions_np, logprobs_np, rewards_np, dones_np = (
        x.numpy() for x in (obs, actions, logprobs, rewards, dones)
    )

    # A resumed run reseeds its environments differently, so it does not replay the first episodes
    next_obs, _ = envs.reset(seed=args.seed + global_step)
    for iteration in range(start_iteration, args.num_iterations + 1):
        lr = args.learning_rate * (1.0 - (iteration - 1.0) / args.num_iterations if args.anneal_lr else 1.0)
        learning_rate.fill_(lr)  # annealed linearly to 0 over the run (detail 4)

        # COLLECT TRAJECTORIES ------------------------------------------------------------------
        rollout_start = time.perf_counter()
        final_values.zero_()
        final_obs, final_steps, final_envs = [], [], []  # truncated episodes' last observations, and where
        for step in range(T):
            global_step += N
            obs_np[step] = next_obs
            if isinstance(act, NumpyPolicy):  # the CPU fast path: NumPy arrays in and out
                actions_np[step], logprobs_np[step] = act(obs_np[step])
            else:  # one copy to the device, one back: action and log-prob stacked in one tensor
                action, logprob = act(obs[step].to(device, non_blocking=True))
                actions_np[step], logprobs_np[step] = torch.stack([action.float(), logprob]).cpu().numpy()

            next_obs, reward, terminated, truncated, infos = envs.step(actions_np[step])
            rewards_np[step] = reward
            dones_np[step] = terminated | truncated
            # next_obs is already the next episode's first observation where an episode ended; where a
            # truncated episode stopped is kept from info["final_obs"], its value computed after the rollout
            bootstrap = truncated & ~terminated
            if args.bootstrap_truncation and bootstrap.any():
                idx = np.flatnonzero(bootstrap)
                final_obs.extend(infos["final_obs"][idx])
                final_steps.extend([step] * len(idx))
                final_envs.extend(idx)
            for i, episodic_return, episodic_length in finished_episodes(infos):
                log.episode(global_step - N + i + 1, episodic_return, episodic_length)  # at the step it ended

        # CALCULATE ADVANTAGES ------------------------------------------------------------------
        # The critic did not change during the rollout, so one forward pass gives the values of the T x N
        # stored observations, of the observations after the last step and of where truncated episodes
        # stopped: the same numbers as a pass per step, at a fraction of the per-step overhead
        b_obs = obs.reshape((-1,) + obs_shape).to(device, non_blocking=True)
        with torch.no_grad():
            bootstrap_obs = torch.as_tensor(np.stack([*next_obs, *final_obs]), dtype=torch.float32)
            device_values = agent.get_value(torch.cat([b_obs, bootstrap_obs.to(device)]))
        all_values = device_values.cpu()  # GAE runs on the CPU; the update reads device_values
        values, last_value = all_values[: T * N].view(T, N), all_values[T * N : T * N + N]
        final_values[final_steps, final_envs] = all_values[T * N + N :]
        advantages, returns = compute_gae(
            rewards=rewards,
            values=values,
            dones=dones,
            last_value=last_value,
            gamma=args.gamma,
            gae_lambda=args.gae_lambda,
            final_values=final_values,
        )
        rollout_time = time.perf_counter() - rollout_start

        # UPDATE THE NETWORK --------------------------------------------------------------------
        update_start = time.perf_counter()
        b_actions = actions.reshape(-1).to(device)
        b_logprobs = logprobs.reshape(-1).to(device)
        b_advantages = advantages.reshape(-1).to(device)
        b_returns = returns.reshape(-1).to(device)
        b_values = device_values[: T * N]

        clipfracs = []  # one per minibatch: losses/clipfrac is their mean, as CleanRL logs it
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(args.batch_size, device=device)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb_inds = b_inds[start : start + args.minibatch_size]
                if args.cudagraphs:
                    torch.compiler.cudagraph_mark_step_begin()
                stats = update(
                    b_obs[mb_inds],
                    b_actions[mb_inds],
                    b_logprobs[mb_inds],
                    b_advantages[mb_inds],
                    b_returns[mb_inds],
                    b_values[mb_inds],
                )
                stats = {k: v.clone() for k, v in stats.items()} if args.cudagraphs else stats
                if epoch == 0 and start == 0:
                    # Nothing has been updated yet, so the ratio must be 1 to float precision; a larger
                    # deviation means the stored log-probs do not belong to the stored observations
                    first_ratio_deviation = stats["ratio_deviation"]
                clipfracs.append(stats["clipfrac"])
            if args.target_kl is not None and stats["approx_kl"] > args.target_kl:  # a sync, only if asked
                break
        update_time = time.perf_counter() - update_start

        # the losses and KLs of the last minibatch, the clip fraction over the whole update
        stats.update(clipfrac=torch.stack(clipfracs).mean(), ratio_deviation=first_ratio_deviation)
        log.iteration(iteration, global_step, stats, lr, values, returns, rollout_time, update_time)
        evaluate_if_due(args, iteration, global_step, agent, optimizer, run_dir, log)
        checkpoint_if_due(args, iteration, global_step, agent, optimizer, run_dir)

    finish(args, envs, agent, optimizer, run_dir, global_step, log)
    return run_dir


# ==================================================================================================
# PPO ENDS HERE. What follows is the machinery a run needs around the algorithm: input checks, the
# run folder, checkpoints and resuming, evaluation, logging, Ctrl-C and full disks, the CPU fast path
# and the entry point. None of it changes what PPO computes.
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


def check_args(args: Args):
    """Reject arguments that would crash or silently misbehave later."""
    check_numbers(args)
    for name in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "eval_episodes"):
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.checkpoint_every < 0 or args.torch_threads < 0:
        fail("--checkpoint-every and --torch-threads must not be negative")
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
        gym.spec(args.env_id)
    except gym.error.Error:
        fail(f"unknown environment id '{args.env_id}' (gymnasium.pprint_registry() lists the valid ids)")


# THE RUN FOLDER, CHECKPOINTS AND RESUMING ---------------------------------------------------------


def prepare_run(args: Args) -> tuple[Args, str, dict | None]:
    """The run's arguments, folder and checkpoint: a new folder for a new run; for --resume the checkpoint's
    folder, arguments (with the flags that may change) and the checkpoint itself."""
    if args.resume is not None:
        checkpoint = load_checkpoint(args.resume)
        return resume_args(args, checkpoint), str(Path(args.resume).parent), checkpoint
    run_dir = f"{args.runs_dir}/{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
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
    path: str, agent: Agent, optimizer: torch.optim.Optimizer, args: Args, iteration: int, global_step: int
):
    """Everything needed to continue or evaluate: weights, optimizer, progress, RNG states, args.

    Written by `write_checkpoint_file`, so a run killed while saving keeps its last checkpoint.
    """
    checkpoint = {
        "model": agent.state_dict(),
        "optimizer": optimizer.state_dict(),
        "iteration": iteration,
        "global_step": global_step,
        "args": asdict(args),
        "script": Path(__file__).name,  # read_checkpoint refuses the checkpoints of other scripts
        "format": CHECKPOINT_FORMAT,
        "rng": rng_state(next(agent.parameters()).device),
    }
    write_checkpoint_file(checkpoint, path)


def checkpoint_if_due(
    args: Args, iteration: int, global_step: int, agent: Agent, optimizer: torch.optim.Optimizer, run_dir: str
):
    """--checkpoint-every N: `run_dir/checkpoint.pt` after every N-th iteration."""
    if args.checkpoint_every and iteration % args.checkpoint_every == 0:
        save_checkpoint(f"{run_dir}/checkpoint.pt", agent, optimizer, args, iteration, global_step)


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
    "numpy_update",
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


def restore(checkpoint: dict | None, agent: Agent, optimizer: torch.optim.Optimizer, args: Args) -> tuple[int, int]:
    """--resume: the weights, the optimizer's state and the random streams of `checkpoint`; returns the first
    iteration to run and the global step (1 and 0 for a new run)."""
    if checkpoint is None:
        return 1, 0
    learning_rate = optimizer.param_groups[0]["lr"]  # the tensor that annealing fills
    agent.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    optimizer.param_groups[0]["lr"] = learning_rate  # loading put the saved float there
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
    """Plays `episodes` whole episodes of `args.env_id` with the given policy and returns their
    undiscounted returns.

    The action sampling uses its own seeded RNG stream, so the same model and seed score the same
    whether evaluated right after training or later from the saved file.
    `video_prefix` (`--evaluate --capture-video`): records every episode with RecordVideo as
    `<video_prefix>-episode-<k>.mp4`.
    """
    if video_prefix is None:
        env = gym.make(args.env_id)
    else:
        env = gym.make(args.env_id, render_mode="rgb_array")
        env = gym.wrappers.RecordVideo(
            env,
            str(Path(video_prefix).parent),
            name_prefix=Path(video_prefix).name,
            episode_trigger=lambda episode: True,
            disable_logger=True,
        )
    returns = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            done, episodic_return = False, 0.0
            while not done:
                with torch.no_grad():
                    logits = agent.actor(torch.as_tensor(obs, dtype=torch.float32, device=device))
                    action = logits.argmax() if deterministic else Categorical(logits=logits).sample()
                obs, reward, terminated, truncated, _ = env.step(action.item())
                episodic_return += float(reward)
                done = terminated or truncated
            returns.append(episodic_return)
    env.close()
    return returns


def evaluate_if_due(
    args: Args,
    iteration: int,
    global_step: int,
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    run_dir: str,
    log: "RunLog",
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
        save_checkpoint(f"{run_dir}/best_model.pt", agent, optimizer, args, iteration, global_step)
    print(
        f"evaluation at global_step={global_step}: mean return {np.mean(returns):.2f} (best, in "
        f"best_model.pt: {log.best_return:.2f}; {time.perf_counter() - eval_start:.1f}s)",
        flush=True,
    )


def run_evaluation(path: str, args: Args) -> list[float]:
    """`--evaluate PATH`: scores a saved model or checkpoint with the environment it was trained on."""
    checkpoint = load_checkpoint(path)
    saved = Args(**checkpoint["args"])
    env = gym.make(saved.env_id)
    agent = Agent(int(np.prod(env.observation_space.shape)), int(env.action_space.n))
    env.close()
    agent.load_state_dict(checkpoint["model"])
    # the trained run's seed: the same episodes as the evaluation reported right after training
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
        f"evaluation of {path} on {saved.env_id}: {len(returns)} episodes, "
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
    ):
        """The iteration's scalars (the statistics copied from the device at once) and, when due, its line."""
        stats = dict(zip(stats, torch.stack(list(stats.values())).tolist()))
        first_ratio_deviation = stats.pop("ratio_deviation")
        sps = int((global_step - self.start_step) / (time.time() - self.start_time))
        eta = timedelta(seconds=int((self.args.num_iterations * self.args.batch_size - global_step) / max(sps, 1)))
        self.writer.add_scalar("charts/learning_rate", learning_rate, global_step)
        for name, value in stats.items():
            self.writer.add_scalar(f"losses/{name}", value, global_step)
        self.writer.add_scalar(
            "losses/explained_variance", explained_variance(values.numpy(), returns.numpy()), global_step
        )
        self.writer.add_scalar("charts/SPS", sps, global_step)
        self.writer.add_scalar("debug/first_minibatch_ratio_deviation", first_ratio_deviation, global_step)
        self.writer.add_scalar("perf/rollout_time", rollout_time, global_step)
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
    args: Args, envs, agent: Agent, optimizer: torch.optim.Optimizer, run_dir: str, global_step: int, log: RunLog
):
    """The end of a run: the environments closed; with --save-model the final model saved and evaluated;
    the logs closed."""
    envs.close()
    if args.save_model:
        model_path = f"{run_dir}/model.pt"
        save_checkpoint(model_path, agent, optimizer, args, args.num_iterations, global_step)
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


# THE CPU FAST PATH -------------------------------------------------------------------------------
# SameStepVectorEnv, NumpyPolicy and NumpyUpdate compute what the code above computes, in fewer operations
# (why each exists: benchmark/results/speed_cpu.md). The two NumPy steps run only where they provably
# compute this run's Agent, loss and optimizer (numpy_fast_path); anything else runs the PyTorch code.


class SameStepVectorEnv(gym.vector.VectorEnv):
    """The environments stepped one after another, an ended episode reset within the same step: the
    vector environment the rollout needs (see the docstring at the top), written out.

    It is gymnasium's `SyncVectorEnv(..., autoreset_mode=SAME_STEP, copy=False)` without the branches
    for other autoreset modes and observation layouts: for the same seeds and actions the same
    observations (one buffer, rewritten at every step), rewards, `terminated`, `truncated` and info
    (made by gymnasium's `_add_info`: each key of an environment's info as an array with its mask
    `_key`; where an episode ended, its last observation in `final_obs` and its last info in
    `final_info`). It is a `gymnasium.vector.VectorEnv`, so gymnasium's vector wrappers take it
    (`make_envs` puts `RecordEpisodeStatistics` around it). It exists for the per-step cost
    (benchmark/results/speed_cpu.md); tests/test_envs.py checks it against gymnasium's.
    """

    def __init__(self, env_fns: list):
        self.envs = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        self.metadata = {**self.envs[0].metadata, "autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
        self.render_mode = self.envs[0].render_mode
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.obs = gym.vector.utils.create_empty_array(self.single_observation_space, self.num_envs, fn=np.zeros)

    def reset(self, *, seed: int | list | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Environment i starts from seed + i (or seed[i]), as gymnasium's vector environments seed them;
        `options["reset_mask"]` resets only the environments it marks."""
        seeds = [seed + i for i in range(self.num_envs)] if isinstance(seed, int) else seed or [None] * self.num_envs
        options = dict(options or {})
        mask = options.pop("reset_mask", np.ones(self.num_envs, bool))
        infos = {}
        for i in np.flatnonzero(mask):
            self.obs[i], info = self.envs[i].reset(seed=seeds[i], options=options or None)
            infos = self._add_info(infos, info, i)
        return self.obs, infos

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        reward = np.zeros(self.num_envs)
        terminated, truncated = np.zeros(self.num_envs, bool), np.zeros(self.num_envs, bool)
        infos = {}
        for i, env in enumerate(self.envs):
            obs, reward[i], terminated[i], truncated[i], info = env.step(actions[i])
            if terminated[i] or truncated[i]:
                infos = self._add_info(infos, {"final_obs": obs, "final_info": info}, i)
                obs, info = env.reset()
            if info:
                infos = self._add_info(infos, info, i)
            self.obs[i] = obs
        return self.obs, reward, terminated, truncated, infos

    def render(self) -> tuple:
        return tuple(env.render() for env in self.envs)

    def close_extras(self, **kwargs):
        for env in self.envs:
            env.close()


class NumpyPolicy:
    """`Agent.act` for a run on the CPU, computed in NumPy: the same function of the same weights and
    the same random numbers, faster. Why it exists: on a handful of observations one call of the
    PyTorch `act` is nearly all PyTorch's per-operation overhead (dispatch, tensor allocation), while
    the arithmetic is a few microseconds, and NumPy's overhead is a fraction of PyTorch's; the rollout
    calls it once per environment step. tests/test_fast_path.py checks that both give the same actions
    and log-probabilities; numpy_fast_path uses it only for an agent whose `act` it computes.

    It reads the agent's parameters through NumPy views of their memory, so every optimizer step is
    seen without a copy. The Gumbel noise is drawn from PyTorch's generator, as `act` draws it, so a
    seed gives the same actions either way.
    """

    def __init__(self, agent: Agent):
        def layers(net: nn.Sequential) -> list[tuple[np.ndarray, np.ndarray]]:
            return [(m.weight.detach().numpy().T, m.bias.detach().numpy()) for m in net if isinstance(m, nn.Linear)]

        self.actor = layers(agent.actor)

    @staticmethod
    def mlp(x: np.ndarray, layers: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        for weight, bias in layers[:-1]:
            x = np.tanh(x @ weight + bias)
        weight, bias = layers[-1]
        return x @ weight + bias

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """NumPy in, NumPy out (the rollout's arrays, no tensors on the way): action, log-prob."""
        logits = self.mlp(obs, self.actor)
        logits = logits - logits.max(-1, keepdims=True)
        logprobs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        noise = torch.empty(logprobs.shape).exponential_().numpy()
        action = (logprobs - np.log(noise)).argmax(-1)
        return action, logprobs[np.arange(len(action)), action]


class NumpyUpdate:
    """`update_step` for a run on the CPU, computed in NumPy with the gradients written out: the same step
    (forward, advantage normalisation, the loss of `ppo_loss`, backward, global gradient clipping, Adam)
    on the same parameters and the same Adam moments. Why it exists: on a small minibatch the PyTorch step
    is mostly per-operation overhead of autograd and the optimizer on arrays of a few thousand numbers,
    and a run takes many thousands of them (`python benchmark/fast_path.py ppo` measures both).
    tests/test_fast_path.py checks that both give the same parameters, moments and statistics;
    numpy_fast_path uses it only where the agent, `ppo_loss`, `update_step` and the optimizer are the
    ones it computes.

    Adam works on flat vectors: the parameters and Adam's two moments are moved into one flat tensor
    each (the same values; each parameter and each moment is then a view into it), so one NumPy
    operation updates all parameters where a loop took one per parameter; backward writes into one flat
    gradient. The model, `optimizer.state` (created here in Adam's own format if the optimizer has not
    stepped yet), checkpoints and `update_step` find the parameters and moments where they were and see
    every step. NumpyPolicy reads the parameters' memory, so it is made after this class. Where autograd
    splits a gradient between equal inputs of a max (torch.maximum's backward gives each half), so does this.
    """

    def __init__(self, agent: Agent, optimizer: torch.optim.Optimizer, args: Args):
        self.args, self.group = args, optimizer.param_groups[0]
        actor = [m for m in agent.actor if isinstance(m, nn.Linear)]
        critic = [m for m in agent.critic if isinstance(m, nn.Linear)]
        # in the order of `backward`'s gradients: per network, per layer, weight then bias
        params = [param for layer in actor + critic for param in (layer.weight, layer.bias)]
        bounds = np.cumsum([0] + [p.numel() for p in params])
        flat = {name: torch.zeros(bounds[-1]) for name in ("param", "exp_avg", "exp_avg_sq")}
        steps = torch.zeros(len(params))  # Adam's step count of each parameter (a 0-d view each)
        for i, (param, start, end) in enumerate(zip(params, bounds[:-1], bounds[1:])):
            state = optimizer.state[param]
            if not state:  # what Adam's first step would create
                state.update(
                    step=torch.tensor(0.0), exp_avg=torch.zeros_like(param), exp_avg_sq=torch.zeros_like(param)
                )
            flat["param"][start:end] = param.detach().reshape(-1)
            param.data = flat["param"][start:end].view_as(param)
            for name in ("exp_avg", "exp_avg_sq"):
                flat[name][start:end] = state[name].reshape(-1)
                state[name] = flat[name][start:end].view_as(param)
            steps[i] = state["step"]
            state["step"] = steps[i]
        self.param, self.exp_avg, self.exp_avg_sq = (flat[name].numpy() for name in ("param", "exp_avg", "exp_avg_sq"))
        self.steps = steps.numpy()
        # the gradient, laid out as the parameters: backward writes each layer's gradient into its view
        self.grad = np.zeros_like(self.param)
        grads = [
            self.grad[start:end].reshape(param.shape) for param, start, end in zip(params, bounds[:-1], bounds[1:])
        ]
        # the layers as NumPy (weight, bias) views, read by forward and backward
        self.actor, self.critic = (
            [(m.weight.detach().numpy(), m.bias.detach().numpy()) for m in net] for net in (actor, critic)
        )
        layer_grads = list(zip(grads[0::2], grads[1::2]))  # (weight, bias) per layer, as the layers
        self.actor_grads, self.critic_grads = layer_grads[: len(actor)], layer_grads[len(actor) :]

    @staticmethod
    def forward(x: np.ndarray, layers: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
        """The MLP's input and every layer's output (after tanh, except the last): what backward needs."""
        outputs = [x]
        for i, (weight, bias) in enumerate(layers):
            x = x @ weight.T + bias
            if i < len(layers) - 1:
                x = np.tanh(x)
            outputs.append(x)
        return outputs

    @staticmethod
    def backward(
        outputs: list[np.ndarray],
        grad: np.ndarray,
        layers: list[tuple[np.ndarray, np.ndarray]],
        grads: list[tuple[np.ndarray, np.ndarray]],
    ):
        """Backpropagation through the MLP from the gradient of its output, written into `grads` (per layer,
        views of the flat gradient): per layer, weight grad.T @ input and bias grad summed over the samples;
        through a layer grad @ weight, through tanh times 1 - tanh^2."""
        for i in reversed(range(len(layers))):
            np.matmul(grad.T, outputs[i], out=grads[i][0])
            np.add.reduce(grad, axis=0, out=grads[i][1])
            if i > 0:
                grad = (grad @ layers[i][0]) * (1 - outputs[i] * outputs[i])

    @staticmethod
    def max_grads(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """How the gradient of max(a, b) splits between a and b: all to the larger, half each on a tie."""
        to_a = np.float32(0.5) * (np.sign(a - b) + 1)  # a - b is 0 exactly where a == b (finite floats)
        return to_a, 1 - to_a

    def __call__(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        logprobs: torch.Tensor,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        values: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        args = self.args
        x, actions, old_logprob, advantages, returns, old_values = (
            t.numpy() for t in (obs, actions, logprobs, advantages, returns, values)
        )
        n, rows, clip = len(x), np.arange(len(x)), args.clip_coef

        # forward: log-softmax of the logits, the action's entry, the entropy; the critic's value
        actor_out, critic_out = self.forward(x, self.actor), self.forward(x, self.critic)
        logits = actor_out[-1] - actor_out[-1].max(-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        probs = np.exp(logp)
        newlogprob, entropy = logp[rows, actions], -(probs * logp).sum(-1)
        newvalue = critic_out[-1][:, 0]
        if args.norm_adv:
            centred = advantages - advantages.sum() / n
            advantages = centred / (np.sqrt(np.dot(centred, centred) / (n - 1)) + 1e-8)

        # the loss of ppo_loss, and its gradient with respect to the log-prob and the value
        logratio = newlogprob - old_logprob
        ratio = np.exp(logratio)
        pg_loss1, pg_loss2 = -advantages * ratio, -advantages * ratio.clip(1 - clip, 1 + clip)
        to_1, to_2 = self.max_grads(pg_loss1, pg_loss2)
        in_clip = (ratio >= 1 - clip) & (ratio <= 1 + clip)  # where the clamp passes the gradient
        grad_logprob = (to_1 + to_2 * in_clip) * -advantages * ratio / n  # d(ratio)/d(log-prob) = ratio
        pg_loss = np.maximum(pg_loss1, pg_loss2).sum() / n
        if args.clip_vloss:
            v_loss_unclipped = (newvalue - returns) ** 2
            v_change = newvalue - old_values
            v_clipped = old_values + v_change.clip(-clip, clip)
            v_loss_clipped = (v_clipped - returns) ** 2
            to_1, to_2 = self.max_grads(v_loss_unclipped, v_loss_clipped)
            in_clip = (v_change >= -clip) & (v_change <= clip)
            grad_value = (to_1 * (newvalue - returns) + to_2 * in_clip * (v_clipped - returns)) * args.vf_coef / n
            v_loss = 0.5 * np.maximum(v_loss_unclipped, v_loss_clipped).sum() / n
        else:
            grad_value = (newvalue - returns) * args.vf_coef / n
            v_loss = 0.5 * np.square(newvalue - returns).sum() / n

        # to the logits: d log p_a / d logits = onehot(a) - p; d entropy / d logits = -p (log p + entropy)
        grad_logits = -grad_logprob[:, None] * probs
        grad_logits[rows, actions] += grad_logprob
        grad_logits += (args.ent_coef / n) * probs * (logp + entropy[:, None])
        self.backward(actor_out, grad_logits, self.actor, self.actor_grads)
        self.backward(critic_out, grad_value[:, None], self.critic, self.critic_grads)

        # global gradient clipping, then Adam as torch.optim.Adam computes it, on the flat vectors
        grad = self.grad
        norm = math.sqrt(float(np.dot(grad, grad)))
        grad *= min(1.0, args.max_grad_norm / (norm + 1e-6))
        (beta1, beta2), eps, lr = self.group["betas"], self.group["eps"], float(self.group["lr"])
        self.steps += 1
        step = float(self.steps[0])
        step_size, root_correction2 = lr / (1 - beta1**step), math.sqrt(1 - beta2**step)
        self.exp_avg += (1 - beta1) * (grad - self.exp_avg)
        self.exp_avg_sq *= beta2
        self.exp_avg_sq += (1 - beta2) * grad * grad
        self.param -= step_size * self.exp_avg / (np.sqrt(self.exp_avg_sq) / root_correction2 + eps)

        stats = np.array(
            [
                pg_loss,
                v_loss,
                entropy.sum() / n,
                -logratio.sum() / n,
                ((ratio - 1) - logratio).sum() / n,
                np.count_nonzero(np.abs(ratio - 1) > clip) / n,
                np.abs(ratio - 1).max(),
            ],
            dtype=np.float32,
        )
        return dict(
            zip(
                ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac", "ratio_deviation"),
                torch.from_numpy(stats).unbind(),
            )
        )


# The code NumpyPolicy and NumpyUpdate were written from, by fingerprint (code_fingerprint): a function whose
# code is not this (an edit, even one that computes the same) runs as PyTorch code. Whoever changes one of
# these functions and the NumPy code with it puts the new fingerprint here (tests/test_fast_path.py prints it).
NUMPY_COMPUTES = {
    "Agent.act": "930e9aefd9112da5",
    "Agent.get_action_and_value": "fd82e4b88f91ba7a",
    "Agent.get_value": "0fd1e9e6c677a71c",
    "ppo_loss": "efcfd0aedf4ec895",
    "update_step": "aa801e06889afff4",
}
# Adam's options: those NumpyUpdate follows whatever their value, and the others at the value it computes
ADAM_FOLLOWED = ("params", "lr", "betas", "eps", "foreach", "fused", "capturable")
ADAM_COMPUTED = {
    "weight_decay": 0,
    "amsgrad": False,
    "maximize": False,
    "differentiable": False,
    "decoupled_weight_decay": False,
}


def code_fingerprint(function) -> str:
    """A short hash of a function's code as Python reads it: docstring, comments and layout left out."""
    node = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.unparse(node).encode()).hexdigest()[:16]


def code_problem(functions: dict) -> str | None:
    """The first of `functions` (name -> function) whose code is not the code the NumPy path computes."""
    for name, function in functions.items():
        try:
            fingerprint = code_fingerprint(function)
        except (OSError, TypeError, SyntaxError, IndexError):
            return f"the code of {name} cannot be read"
        if fingerprint != NUMPY_COMPUTES[name]:
            return f"{name} is not the code it computes"
    return None


def mlp_problem(name: str, net: nn.Module) -> str | None:
    """What the NumPy steps compute is an nn.Sequential of Linear layers (with biases) with Tanh between them;
    the way `net` differs from that, or None."""
    if type(net) is not nn.Sequential:
        return f"{name} is a {type(net).__name__}, not an nn.Sequential of Linear and Tanh layers"
    for i, module in enumerate(net):
        expected = nn.Linear if i % 2 == 0 else nn.Tanh
        if type(module) is not expected:
            return f"{name}[{i}] is {type(module).__name__}, where it computes {expected.__name__}"
    if len(net) % 2 == 0 or any(layer.bias is None for layer in net[::2]):
        return f"{name} does not end in a Linear layer, or has one without a bias"
    return None


def agent_problem(agent: nn.Module) -> str | None:
    """The way `agent` differs from the Agent the NumPy steps compute (this file's class, an actor and a
    critic of Linear and Tanh layers, no hooks), or None."""
    if type(agent) is not Agent:
        return f"the agent is a {type(agent).__name__}, not this file's Agent"
    parts = dict(agent.named_children())
    if sorted(parts) != ["actor", "critic"] or any(True for _ in agent.named_parameters(recurse=False)):
        return f"Agent has the parts {sorted(parts)}, not only an actor and a critic"
    if any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in agent.modules()):
        return "Agent has hooks"
    return mlp_problem("Agent.actor", agent.actor) or mlp_problem("Agent.critic", agent.critic)


def optimizer_problem(agent: Agent, optimizer: torch.optim.Optimizer) -> str | None:
    """The way `optimizer` differs from the Adam that NumpyUpdate computes, or None."""
    if type(optimizer) is not torch.optim.Adam:
        return f"the optimizer is {type(optimizer).__name__}, not torch.optim.Adam"
    if len(optimizer.param_groups) != 1 or (
        [id(p) for p in optimizer.param_groups[0]["params"]] != [id(p) for p in agent.parameters()]
    ):
        return "the optimizer does not hold the agent's parameters as one group"
    for key, value in optimizer.param_groups[0].items():
        if key not in ADAM_FOLLOWED and (key not in ADAM_COMPUTED or value != ADAM_COMPUTED[key]):
            return f"Adam's {key}={value!r}, which it does not compute"
    return None


def numpy_policy_agrees(agent: Agent) -> bool:
    """A second line of defence: NumpyPolicy and `agent.act` give the same actions and log-probs on random
    observations from the same generator state (the training's generator left as it was)."""
    obs = torch.from_numpy(np.random.default_rng(0).standard_normal((8, agent.actor[0].in_features), np.float32))
    with torch.random.fork_rng(devices=[]):
        state = torch.get_rng_state()
        expected = agent.act(obs)
        torch.set_rng_state(state)
        got = [torch.from_numpy(x) for x in NumpyPolicy(agent)(obs.numpy())]
    return torch.equal(got[0], expected[0]) and torch.allclose(got[1], expected[1], rtol=1e-5, atol=1e-6)


def numpy_update_agrees(agent: Agent, optimizer: torch.optim.Optimizer, args: Args) -> bool:
    """A second line of defence: two steps of NumpyUpdate and of `update_step`, from copies of the agent and
    of the optimizer, on a random minibatch whose log-probs and values are off enough to clip, must give
    the same parameters and statistics. The training's RNG streams, its agent and its optimizer's state
    (Adam's moments after a --resume) are untouched."""
    rng = np.random.default_rng(0)
    n, obs_dim = args.minibatch_size, agent.actor[0].in_features
    obs = torch.from_numpy(rng.standard_normal((n, obs_dim), dtype=np.float32))
    actions = torch.from_numpy(rng.integers(0, agent.actor[-1].out_features, n))
    with torch.no_grad():
        _, logprobs, _, values = agent.get_action_and_value(obs, actions)
    noise = [torch.from_numpy(rng.standard_normal(n, dtype=np.float32)) for _ in range(4)]
    batch = (obs, actions, logprobs + 0.3 * noise[0], noise[1], values + noise[2], values + 0.3 * noise[3])
    results = []
    for fast in (False, True):
        copy_ = copy.deepcopy(agent)
        copy_optimizer = type(optimizer)(copy_.parameters(), **optimizer.defaults)
        # a deep copy: load_state_dict keeps the tensors it is given, and the steps below change them in place
        copy_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
        step = NumpyUpdate(copy_, copy_optimizer, args) if fast else partial(update_step, copy_, copy_optimizer, args)
        stats = [step(*batch) for _ in range(2)]
        results.append([*copy_.parameters(), *(torch.stack(list(s.values())) for s in stats)])
    return all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(*results))


def numpy_fast_path(agent: Agent, optimizer: torch.optim.Optimizer, args: Args, act, update):
    """On the CPU (unless --no-numpy-update): NumpyPolicy in place of `act`, and NumpyUpdate in place of
    `update` (not under --compile), each only where it computes this run's code: the agent, and for the
    update the optimizer, must be the ones it implements, recognised by their structure and by the
    fingerprints of their code (NUMPY_COMPUTES), and a numerical check must agree. Otherwise the step stays
    PyTorch's and the run says so in one line. Returns the policy step and the update step to use."""
    if next(agent.parameters()).device.type != "cpu" or not args.numpy_update:
        return act, update
    try:
        policy_problem = (
            agent_problem(agent)
            or code_problem({"Agent.act": type(agent).act})
            or (None if numpy_policy_agrees(agent) else "a check on random observations disagreed")
        )
        update_problem = (
            None
            if args.compile
            else (
                agent_problem(agent)
                or optimizer_problem(agent, optimizer)
                or code_problem(
                    {
                        "Agent.get_action_and_value": type(agent).get_action_and_value,
                        "Agent.get_value": type(agent).get_value,
                        "ppo_loss": ppo_loss,
                        "update_step": update_step,
                    }
                )
                or (None if numpy_update_agrees(agent, optimizer, args) else "a check on one minibatch disagreed")
            )
        )
    except Exception as e:  # the checks themselves failed on an edited agent or optimizer: not the same code
        policy_problem = update_problem = f"its check failed ({type(e).__name__}: {e})"
    if not args.compile:
        if update_problem is None:
            update = NumpyUpdate(agent, optimizer, args)
        else:
            print(
                f"NumpyUpdate steps aside, the update step runs as update_step in PyTorch: {update_problem}", flush=True
            )
    if policy_problem is None:
        act = NumpyPolicy(agent)  # after NumpyUpdate, which moves the parameters into one flat tensor
    else:
        print(f"NumpyPolicy steps aside, the policy step runs as Agent.act in PyTorch: {policy_problem}", flush=True)
    return act, update


# THE ENTRY POINT ---------------------------------------------------------------------------------


def main(args: Args) -> str | list[float]:
    """Checks the arguments, then trains (returns the run folder) or, with --evaluate, evaluates (returns the
    episodes' returns)."""
    check_args(args)
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
        # NumPy's BLAS too (NumpyPolicy, NumpyUpdate): left to itself it splits a small product over all
        # cores, which is slower, much slower when another process keeps a core busy
        threadpool_limits(args.torch_threads, user_api="blas")
    if args.evaluate is not None:
        return run_evaluation(args.evaluate, args)
    args, run_dir, checkpoint = prepare_run(args)
    exit_on_ctrl_c(run_dir)
    with exit_on_write_error(run_dir):
        return train(args, run_dir, checkpoint)


if __name__ == "__main__":
    main(tyro.cli(Args))
