"""PPO for continuous (Box) actions on MuJoCo, with sampler processes on any number of machines feeding
one learner through a Redis server (DPPO style: Heess et al., 2017).

Run:
    python ppo_continuous_action_redis.py --env-id Hopper-v4
    tensorboard --logdir runs

Across machines, with a Redis server the lab runs (docs/ppo_continuous_action_redis.md: two lines), start the
learner on the GPU box
    python ppo_continuous_action_redis.py --env-id Hopper-v4 --redis-url redis://:PASSWORD@HOST:6379/0 --num-samplers 0
and on every other machine the command it prints:
    python ppo_continuous_action_redis.py --role sampler --redis-url redis://:PASSWORD@HOST:6379/0 --run-id ID

What this file shows: ppo_continuous_action.py's PPO (its agent, details and defaults: Gaussian policy, observation
normalisation, reward scaling, truncation bootstrap) with the environments stepped by sampler processes,
synchronous and on-policy: the samplers' rollout (`Sampler.collect`), the learner (`train`) and the exchange
through Redis that joins them come before the banner; after it, this script's input checks, its evaluation and
the entry point. The rest of a run (the run folder, checkpoints and resuming, logging, a redis-server of the
run's own) is the package ppolab's.

- Roles. The learner (the default) trains; without `--redis-url` it starts its own `redis-server` (127.0.0.1, no
  persistence) and `--num-samplers` local samplers, each the command a remote machine runs. A sampler needs only
  `--redis-url` and `--run-id`; samplers may join and leave at any time.
- Versions and tickets (`publish_policy`, `Sampler.collect`, `receive_chunks`): before each update the learner
  publishes a version (the weights and observation statistics) and `--num-chunks` tickets; a sampler acts with
  exactly that version for `--num-steps` steps and pushes the chunk; the learner trains on exactly `--num-chunks`
  chunks of the current version, the batch's columns, and drops (counts) older ones: ratio 1 at the first minibatch.
- Liveness, expiry and the wire format (`Heartbeat`, `requeue_lost_tickets`, `decode_message`): heartbeats with TTLs,
  a lost sampler's tickets requeued, every key of a run expiring, nothing from the network unpickled.
- Named differences from ppo_continuous_action.py: the learner merges the statistics of the trained chunks after
  each update (not at every step); each sampler steps one environment; same seed, same numbers only with one
  sampler. The protocol in full: docs/ppo_continuous_action_redis.md.
"""

import contextlib
import json
import math
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import uuid
import zlib
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal, NamedTuple

import gymnasium as gym
import numpy as np
import redis
import torch
import torch.nn as nn
from torch.distributions.beta import Beta
from torch.distributions.normal import Normal

import ppolab
import ppolab.redis_server
import ppolab.stops


@dataclass
class Args(ppolab.RunSettings):  # and every run's settings: --seed, --cuda, --track, --resume, ...
    # PPO's hyperparameters (the defaults are the published ones)
    env_id: str = "Hopper-v4"
    """the id of the environment"""
    total_timesteps: int = 1_000_000
    """total timesteps of the experiment"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_chunks: int = 8
    """chunks per update: the batch is num_chunks x num_steps (2048 at the defaults)"""
    num_steps: int = 256
    """the number of steps of one sampler's environment in a chunk"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 32
    """the number of mini-batches"""
    update_epochs: int = 10
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold (stops the epochs of an update early)"""
    policy_objective: Literal["clip", "adaptive-kl", "fixed-kl"] = "clip"
    """the policy's surrogate: PPO-Clip's clipped ratio, or PPO-Penalty's KL penalty with an adaptive or fixed beta"""
    kl_target: float = 0.01
    """adaptive-kl: the KL per update that beta is adapted towards (the PPO paper's d_targ)"""
    kl_beta: float = 1.0
    """the KL penalty's coefficient beta: fixed-kl's, and adaptive-kl's first"""
    bootstrap_truncation: bool = True
    """bootstrap the value of the final observation at a time-limit truncation (off: treat it as termination)"""
    obs_clip: float = 10.0
    """normalised observations are clipped to [-obs_clip, obs_clip]"""
    reward_clip: float = 10.0
    """scaled rewards are clipped to [-reward_clip, reward_clip]"""
    distribution: Literal["normal", "beta"] = "normal"
    """the policy's distribution: a Gaussian whose actions are clipped to the bounds, or a Beta scaled to them"""

    # The distribution: the learner, its samplers and the Redis server between them (this file)
    role: Literal["learner", "sampler"] = "learner"
    """learner (trains, publishes the policy) or sampler (steps an environment for a learner's run)"""
    redis_url: str | None = None
    """the Redis server, e.g. redis://:PASSWORD@HOST:6379/0; none: the learner starts its own on 127.0.0.1"""
    allow_open_redis: bool = False
    """accept a --redis-url on another machine without a password (anyone who can reach it can push data into the run)"""
    run_id: str | None = None
    """the run's namespace on the server (a sampler needs it; a learner picks a fresh one when not given)"""
    num_samplers: int = 2
    """sampler processes the learner starts on this machine (0: only samplers started elsewhere)"""
    sampler_timeout: float = 60.0
    """the learner gives up (exit 1) after this many seconds without a chunk; a sampler waits this long for its run"""
    max_restarts: int = 3
    """local samplers that die are started again this many times in all; the next one that dies ends the run"""
    changeable_on_resume = (
        "redis_url",
        "allow_open_redis",
        "run_id",
        "num_samplers",
        "sampler_timeout",
        "max_restarts",
    )

    @property
    def batch_size(self) -> int:
        """transitions per update: num_chunks * num_steps"""
        return self.num_chunks * self.num_steps

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
            os.environ.setdefault("MUJOCO_GL", "egl")  # off-screen rendering, no display needed
            env = gym.make(env_id, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, f"{run_dir}/videos", disable_logger=True)
        else:
            env = gym.make(env_id)
        return ppolab.policy_actions(flat_observations(env, env_id))  # Box of integers: actions sent rounded

    return thunk


def flat_observations(env: gym.Env, env_id: str) -> gym.Env:
    """DeepMind Control's tasks (`dm_control/<domain>-<task>-v0`) observe a dict of named arrays: one vector of them."""
    return gym.wrappers.FlattenObservation(env) if env_id.startswith("dm_control/") else env


def make_envs(args: Args, run_dir: str, idx: int) -> gym.vector.SyncVectorEnv:
    """A sampler's one environment as a vector environment with same-step autoreset: the step that ends an episode
    returns the next episode's first observation and the last one arrives in `info["final_obs"]`, so every stored
    transition is real experience. `idx`: the sampler's index from 0 (only sampler 0 records videos).

    RecordEpisodeStatistics adds `info["episode"]` (return "r", length "l") with the mask `info["_episode"]` at the
    step an episode ends (see `finished_episodes`), so every finished episode is logged. An unknown environment, one
    that cannot be made here, or one this file cannot train (not a one-dimensional Box of actions and observations)
    is refused in one line."""
    ppolab.env_spec(args.env_id)  # an unknown id, `module:Name-v0` included, in one line; MuJoCo's own warnings held
    try:
        envs = gym.vector.SyncVectorEnv(
            [make_env(args.env_id, idx, args.capture_video, run_dir)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )
    except (ImportError, gym.error.DependencyNotInstalled) as e:  # Pusher-v4, for one, needs mujoco<3
        ppolab.fail(f"cannot make {args.env_id} here: {str(e).splitlines()[0]}")
    except gym.error.Error as e:
        ppolab.fail(
            f"unknown environment id '{args.env_id}' ({type(e).__name__}; gymnasium.pprint_registry() lists the ids)"
        )
    action_space, observation_space = envs.single_action_space, envs.single_observation_space
    if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
        envs.close()
        ppolab.fail(
            f"{args.env_id} has action space {action_space}; {Path(__file__).name} supports one-dimensional Box "
            "actions only (use ppo.py for Discrete actions)"
        )
    ppolab.check_observations(args.env_id, observation_space, envs)
    if args.distribution == "beta":
        ppolab.check_finite_bounds(args.env_id, action_space, envs)
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def env_spaces(args: Args) -> tuple[tuple, int]:
    """The observation shape and the action dimension of the samplers' environment, from one made and closed
    here (make_envs refuses in one line one that cannot be made here or trained by this file)."""
    envs = make_envs(args, "", -1)  # index -1: no video
    spaces = envs.single_observation_space.shape, envs.single_action_space.shape[0]
    envs.close()
    return spaces


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


class ObsNormalizer:
    """Observation normalisation and clipping (detail 5 of the continuous-control ones).

    `update=True` adds the observations to the statistics first (what the agent sees during training);
    `update=False` uses frozen statistics (final observations, evaluation)."""

    def __init__(self, shape: tuple, clip: float):
        self.rms, self.clip = ppolab.RunningMeanStd(shape), clip

    def __call__(self, obs: np.ndarray, update: bool) -> np.ndarray:
        if update:
            self.rms.update(obs)
        return ((obs - self.rms.mean) / np.sqrt(self.rms.var + 1e-8)).clip(-self.clip, self.clip).astype(np.float32)


class RewardScaler:
    """Reward scaling and clipping (details 7 and 8): rewards are divided by the running standard
    deviation of the discounted return, which restarts at every episode end.

    Split between the processes: a sampler keeps its environment's discounted return (`track`) and
    sends it with every chunk; the learner scales a version's rewards with that version's frozen
    statistics (`__call__`) and merges the chunks' returns into `rms` after the update."""

    def __init__(self, num_envs: int, gamma: float, clip: float):
        self.rms, self.gamma, self.clip = ppolab.RunningMeanStd(), gamma, clip
        self.returns = np.zeros(num_envs)

    def track(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        """The discounted return including this step's reward (what the statistics are made of)."""
        self.returns = self.returns * self.gamma + reward
        tracked = self.returns.copy()
        self.returns[done] = 0.0
        return tracked

    def __call__(self, reward: np.ndarray) -> np.ndarray:
        return (reward / np.sqrt(self.rms.var + 1e-8)).clip(-self.clip, self.clip)


# THE NETWORK -------------------------------------------------------------------------------------


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    """Orthogonal weights with gain `std` and constant biases (detail 2 of the 37)."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Separate actor and critic MLPs (64-64, tanh); action dimensions are independent. The policy is a Gaussian
    whose log standard deviation is a learned parameter independent of the state, or with `distribution` "beta" a
    Beta(alpha, beta) on [0, 1] per dimension, alpha, beta = softplus(actor_alpha_beta(x)) + 1 (both above 1: one
    mode, a finite density at the bounds), which `env_actions` scales to the action bounds (Chou et al. 2017)."""

    def __init__(self, obs_dim: int, act_dim: int, distribution: str = "normal"):
        super().__init__()

        def mlp(out_dim: int, std: float) -> nn.Sequential:
            hidden = [layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh()]
            return nn.Sequential(*hidden, layer_init(nn.Linear(64, out_dim), std=std))

        self.critic = mlp(1, std=1.0)
        self.distribution = distribution
        if distribution == "normal":
            self.actor_mean = mlp(act_dim, std=0.01)
            self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))
        else:
            self.actor_alpha_beta = mlp(2 * act_dim, std=0.01)

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x).squeeze(-1)

    def beta(self, x: torch.Tensor) -> Beta:
        alpha, beta = (nn.functional.softplus(self.actor_alpha_beta(x)) + 1).chunk(2, dim=-1)
        return Beta(alpha, beta)

    def mean_action(self, x: torch.Tensor) -> torch.Tensor:
        """The deterministic evaluation's action: the distribution's mean."""
        return self.actor_mean(x) if self.distribution == "normal" else self.beta(x).mean

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        """Samples an action (or scores the given one): returns action, log-prob, entropy, value.
        The log-probability and entropy of independent dimensions are sums over the dimensions. A Beta's are `Beta`'s.

        The Gaussian's formulas are written out, per dimension with std = exp(logstd):
            log N(a; mean, std) = -((a - mean) / std)^2 / 2 - logstd - log(2 pi) / 2
            entropy             = 1/2 + log(2 pi) / 2 + logstd      (the same for every state)
        They are those of `Normal`, whose object costs more than the arithmetic on a 64-sample minibatch
        (tests/test_agent.py checks them against `Normal`)."""
        if self.distribution == "beta":
            dist = self.beta(x)
            action = dist.sample().clamp(BETA_EDGE, 1 - BETA_EDGE) if action is None else action
            return action, dist.log_prob(action).sum(-1), dist.entropy().sum(-1), self.get_value(x)
        action_mean = self.actor_mean(x)
        logstd = self.actor_logstd.expand_as(action_mean)
        if action is None:
            action = Normal(action_mean, logstd.exp()).sample()
        logprob = -0.5 * ((action - action_mean) / logstd.exp()).square() - logstd - 0.5 * math.log(2 * math.pi)
        entropy = 0.5 + 0.5 * math.log(2 * math.pi) + logstd
        return action, logprob.sum(-1), entropy.sum(-1), self.get_value(x)

    @torch.no_grad()
    def act(self, x: torch.Tensor):
        """The rollout's policy step: action, log-prob and value, without the entropy and the autograd
        bookkeeping that only the update needs (on these tiny batches that overhead is most of the time).

        action = mean + std * eps with eps ~ N(0, 1), so (action - mean) / std is eps itself and the Gaussian
        log-density needs no division: sum over dimensions of -eps^2/2 - log std - log(2 pi)/2."""
        if self.distribution == "beta":
            dist = self.beta(x)
            action = dist.sample().clamp(BETA_EDGE, 1 - BETA_EDGE)
            return action, dist.log_prob(action).sum(-1), self.get_value(x)
        action_mean = self.actor_mean(x)
        eps = torch.randn_like(action_mean)
        action = action_mean + self.actor_logstd.exp() * eps
        logprob = (-0.5 * eps.square() - self.actor_logstd - 0.5 * math.log(2 * math.pi)).sum(-1)
        return action, logprob, self.get_value(x)


BETA_EDGE = 1e-6  # a Beta's samples are kept in [BETA_EDGE, 1 - BETA_EDGE]


def env_actions(actions: np.ndarray, low: np.ndarray, high: np.ndarray, distribution: str) -> np.ndarray:
    """The actions the environment gets: a Gaussian's clipped to the bounds (the stored action, whose log-prob the
    update uses, stays unclipped), a Beta's scaled from [0, 1] to them."""
    return actions.clip(low, high) if distribution == "normal" else low + (high - low) * actions


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
) -> dict[str, torch.Tensor]:
    """One gradient step on one minibatch: forward, advantage normalisation, the PPO loss, backward,
    global gradient clipping, the optimizer step. Returns the detached statistics of `ppo_loss` and
    `ratio_deviation`, max |ratio - 1| before the step (1e-7 at the first minibatch of an update). The whole
    step is one function so that `--compile` can hand it to torch.compile as it stands."""
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
    if args.norm_adv:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    loss, stats = ppo_loss(newlogprob, entropy, newvalue, logprobs, advantages, returns, values, args, kl_beta)
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    stats["ratio_deviation"] = (newlogprob.detach() - logprobs).exp().sub(1).abs().max()
    return stats


# COLLECTING EXPERIENCE: A SAMPLER ----------------------------------------------------------------


class Sampler:
    """One environment stepped with the published versions of the policy, a chunk at a time: the rollout of
    PPO, in a process of its own. `run_sampler` (after `train`) runs it: it takes a ticket, loads the
    ticket's version (`load_policy`), collects a chunk (`collect`) and pushes it to the learner."""

    def __init__(self, args: Args, sampler_id: int, run_dir: str):
        self.args, self.sampler_id = args, sampler_id
        self.envs = make_envs(args, run_dir, sampler_id - 1)
        self.obs_dim = int(np.prod(self.envs.single_observation_space.shape))
        self.act_dim = self.envs.single_action_space.shape[0]
        self.low, self.high = self.envs.single_action_space.low, self.envs.single_action_space.high
        self.agent = Agent(self.obs_dim, self.act_dim, args.distribution)
        self.obs_normalizer = ObsNormalizer((self.obs_dim,), args.obs_clip)
        self.reward_scaler = RewardScaler(1, args.gamma, args.reward_clip)  # only its discounted return
        self.version, self.next_obs = 0, None

    def load_policy(self, message: bytes | None, run_id: str, version: int) -> bool:
        """Acts with the published version from now on; False if `message` is not that version (None: no
        version is published, the learner ended the run)."""
        if message is None:
            return False
        num_params = sum(p.numel() for p in self.agent.parameters())
        try:
            header, policy = decode_message(message, run_id, policy_schema(num_params, self.obs_dim))
        except BadMessage as e:
            print(f"sampler {self.sampler_id}: unusable policy of version {version} ({e})", file=sys.stderr)
            return False
        if header["version"] != version:
            return False
        nn.utils.vector_to_parameters(torch.from_numpy(policy["weights"].copy()), self.agent.parameters())
        self.obs_normalizer.rms.mean, self.obs_normalizer.rms.var = policy["obs_mean"].copy(), policy["obs_var"].copy()
        if self.next_obs is None:  # the first version: seeded by sampler and version, so a resumed run differs
            seed = self.args.seed + 1000 * self.sampler_id + version
            torch.manual_seed(seed)
            self.next_obs = self.envs.reset(seed=seed)[0].astype(np.float32)
        self.version = version
        return True

    def collect(self, beat) -> dict[str, np.ndarray]:
        """`num_steps` steps with the current version; the arrays of chunk_schema. `beat` runs every step."""
        T, normalize = self.args.num_steps, self.obs_normalizer
        chunk = {
            name: np.zeros(shape, dtype)
            for name, (dtype, shape) in chunk_schema(T, self.obs_dim, self.act_dim).items()
            if name != "episodes"
        }
        episodes = []
        for step in range(T):
            beat()
            chunk["obs"][step] = self.next_obs[0]
            x = torch.as_tensor(normalize(self.next_obs, update=False))
            action, logprob, value = (y.numpy() for y in self.agent.act(x))
            chunk["actions"][step], chunk["logprobs"][step], chunk["values"][step] = action[0], logprob[0], value[0]
            # the environment gets the action within its bounds (env_actions); the chunk keeps the sample
            actions = env_actions(chunk["actions"][step : step + 1], self.low, self.high, self.args.distribution)
            next_obs, reward, terminated, truncated, infos = self.envs.step(actions)
            done = terminated | truncated
            chunk["rewards"][step], chunk["dones"][step], chunk["terminated"][step] = reward[0], done[0], terminated[0]
            chunk["returns"][step] = self.reward_scaler.track(reward, done)[0]
            # Gymnasium's TimeLimit sets truncated on the last allowed step even when the episode also
            # terminated there: such a step is a termination (value 0), so only truncated-and-not-terminated
            # steps bootstrap, with V(final observation) normalised with this version's statistics
            if self.args.bootstrap_truncation and truncated[0] and not terminated[0]:
                final_obs = normalize(infos["final_obs"][0][None].astype(np.float32), update=False)
                with torch.no_grad():
                    chunk["final_values"][step] = self.agent.get_value(torch.as_tensor(final_obs))[0]
            episodes += [(step, episodic_return, length) for _, episodic_return, length in finished_episodes(infos)]
            self.next_obs = next_obs.astype(np.float32)
        with torch.no_grad():
            chunk["last_value"][0] = self.agent.get_value(torch.as_tensor(normalize(self.next_obs, update=False)))[0]
        chunk["episodes"] = np.array(episodes, np.float64).reshape(-1, 3)
        return chunk


# TRAINING: THE LEARNER ---------------------------------------------------------------------------


def train(args: Args, run: ppolab.Run, lab: "Lab") -> str:
    """The learner: PPO on args.env_id, from scratch or on from --resume's checkpoint, trained on the chunks of
    the samplers of `lab` (the server, and the local processes it stops when the run ends, see `redis_lab`);
    `run` (the package's) writes everything the run reports into its folder, which train returns."""
    ppolab.seed_everything(args.seed, args.torch_deterministic)  # one sampler, same seed, same threads: same numbers
    torch.distributions.Distribution.set_default_validate_args(False)  # no argument checks: costlier than the math
    device = ppolab.pick_device(args.cuda)

    obs_shape, act_dim = env_spaces(args)  # of the samplers' environment, made here once to read them
    obs_dim = int(np.prod(obs_shape))
    agent = Agent(obs_dim, act_dim, args.distribution).to(device)
    obs_normalizer = ObsNormalizer(obs_shape, args.obs_clip)
    reward_scaler = RewardScaler(0, args.gamma, args.reward_clip)  # the learner only scales and merges
    # fused: one kernel for all parameters. The learning rate is a tensor, annealed in place without a recompile
    learning_rate = torch.tensor(args.learning_rate, device=device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=learning_rate, eps=1e-5, fused=True)
    # what a checkpoint holds besides progress, RNG and args: the statistics too, as every checkpoint has them
    saved = {"model": agent, "optimizer": optimizer, "obs_rms": obs_normalizer.rms, "reward_rms": reward_scaler.rms}
    saved["kl_beta"] = kl_beta = torch.tensor(args.kl_beta, device=device)  # PPO-Penalty's beta, changed in place
    start_iteration, global_step = run.start(saved)  # --resume's checkpoint restored; 1, 0 for a new run

    # The run on the server: its Args for the samplers, the learner's heartbeat, the first version (the
    # weights and observation statistics the samplers act with, and a ticket per chunk); then the local
    # samplers, started with the very command another machine runs
    client, run_id = lab.client, args.run_id
    beat = Heartbeat(client, key(run_id, "heartbeat"), refresh=tuple(key(run_id, name) for name in RUN_KEYS))
    beat()
    client.set(key(run_id, "info"), json.dumps({"args": asdict(args), "run_dir": run.dir}), ex=RUN_TTL)
    policy_bytes, publish_time = publish_policy(client, run_id, start_iteration, agent, obs_normalizer, args.num_chunks)
    hint = lab.start_samplers(args.num_samplers)
    # a local sampler that dies is restarted, --max-restarts times; the next one ends the run
    beat = ppolab.redis_server.watching(
        lab.samplers, beat=beat, client=client, run=run, restart=lab.restart_sampler, max_restarts=args.max_restarts
    )
    schema = chunk_schema(args.num_steps, obs_dim, act_dim)

    # --compile runs the same update step through torch.compile; --cudagraphs also records its kernels in a
    # CUDA graph and replays it (one launch per call; its outputs are reused, so the loop clones them). A
    # thread keeps the heartbeat while a compiled step runs (its first call compiles: see `beating`)
    update = partial(update_step, agent, optimizer, args, kl_beta)
    if args.compile or args.cudagraphs:
        compiled = torch.compile(update_step, mode="reduce-overhead" if args.cudagraphs else None)
        update = partial(beating, beat, compiled, agent, optimizer, args, kl_beta)

    T, K = args.num_steps, args.num_chunks
    for iteration in range(start_iteration, args.num_iterations + 1):
        lr = args.learning_rate * (1.0 - (iteration - 1.0) / args.num_iterations if args.anneal_lr else 1.0)
        learning_rate.fill_(lr)  # annealed linearly to 0 over the run (detail 4)

        # COLLECT TRAJECTORIES: the samplers act with version `iteration` (Sampler.collect); the learner
        # receives exactly K chunks of it, the K columns of the batch: arrays (T, K, ...) -------------
        rollout_start = time.perf_counter()
        received = receive_chunks(client, run_id, iteration, args, schema, beat, hint)
        rollout_time = time.perf_counter() - rollout_start - received.transfer_time

        def columns(name: str) -> np.ndarray:
            return np.stack([chunk[name] for chunk in received.chunks], axis=1)

        # observations are normalised and rewards scaled with exactly the statistics of the version the
        # samplers acted with
        raw_obs = columns("obs").reshape(T * K, obs_dim)
        raw_returns = columns("returns")
        obs = torch.from_numpy(obs_normalizer(raw_obs, update=False))
        actions = torch.from_numpy(columns("actions").reshape(T * K, act_dim))
        rewards = torch.from_numpy(reward_scaler(columns("rewards")).astype(np.float32))  # logged returns stay raw
        logprobs, values, dones, final_values = (
            torch.from_numpy(columns(name).astype(np.float32))
            for name in ("logprobs", "values", "dones", "final_values")
        )
        last_value = torch.from_numpy(columns("last_value")[0])
        base_step, global_step = global_step, global_step + args.batch_size
        for k, chunk in enumerate(received.chunks):  # chunk k covers the steps base_step + k * T + 1 ...
            for step, episodic_return, episodic_length in chunk["episodes"]:
                run.episode(base_step + k * T + int(step) + 1, episodic_return, episodic_length)  # at its end step

        # CALCULATE ADVANTAGES ------------------------------------------------------------------
        advantages, returns = compute_gae(
            rewards=rewards,
            values=values,
            dones=dones,
            last_value=last_value,
            gamma=args.gamma,
            gae_lambda=args.gae_lambda,
            final_values=final_values,
        )

        # UPDATE THE NETWORK --------------------------------------------------------------------
        update_start = time.perf_counter()
        b_obs = obs.to(device)
        b_actions = actions.to(device)
        b_logprobs = logprobs.reshape(-1).to(device)
        b_advantages = advantages.reshape(-1).to(device)
        b_returns = returns.reshape(-1).to(device)
        b_values = values.reshape(-1).to(device)

        clipfracs, kls = [], []  # one per minibatch: losses/clipfrac is their mean, as CleanRL logs it
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(args.batch_size, device=device)
            for start in range(0, args.batch_size, args.minibatch_size):
                beat()  # the samplers wait for the next version meanwhile: they must not think us gone
                mb_inds = b_inds[start : start + args.minibatch_size]
                if args.cudagraphs:
                    torch.compiler.cudagraph_mark_step_begin()
                stats = update(
                    obs=b_obs[mb_inds],
                    actions=b_actions[mb_inds],
                    logprobs=b_logprobs[mb_inds],
                    advantages=b_advantages[mb_inds],
                    returns=b_returns[mb_inds],
                    values=b_values[mb_inds],
                )
                stats = {k: v.clone() for k, v in stats.items()} if args.cudagraphs else stats
                if epoch == 0 and start == 0:
                    # Nothing has been updated yet, so the ratio must be 1 to float precision; a larger
                    # deviation means the stored log-probs do not belong to the stored observations
                    first_ratio_deviation = stats["ratio_deviation"]
                clipfracs.append(stats["clipfrac"])
                kls.append(stats["approx_kl"])
            if args.target_kl is not None and stats["approx_kl"] > args.target_kl:  # a sync, only if asked
                break
        # the trained chunks' statistics join the running ones only now (a named difference from
        # ppo_continuous_action.py, which adds every step's): the next version carries them
        obs_normalizer.rms.update(raw_obs.astype(np.float64))
        reward_scaler.rms.update(raw_returns.reshape(-1).astype(np.float64))
        update_time = time.perf_counter() - update_start

        # the losses and KLs of the last minibatch, the clip fraction over the whole update; and the exchange's
        # figures: the samplers' steps per second while the learner waited and the learner's in its update, the
        # bytes through Redis per step (the chunks popped, and the version each contributing sampler fetched)
        stats.update(clipfrac=torch.stack(clipfracs).mean(), ratio_deviation=first_ratio_deviation)
        adapt_kl_beta(kl_beta, kls, args, stats)  # PPO-Penalty: beta logged, then adapted (adaptive-kl)
        exchange = {
            "charts/experience_SPS": args.batch_size / max(rollout_time + received.transfer_time, 1e-9),
            "charts/learner_SPS": args.batch_size / update_time,
            "charts/bytes_per_step": (received.nbytes + policy_bytes * received.samplers) / args.batch_size,
            "charts/samplers_per_update": received.samplers,
            "debug/stale_chunks": received.stale,
            "debug/malformed_chunks": received.malformed,
            "perf/transfer_time": received.transfer_time,
            "perf/publish_time": publish_time,
        }
        line = f", transfer {received.transfer_time:.2f}s, publish {publish_time:.2f}s, samplers {received.samplers}"
        run.iteration(
            iteration=iteration,
            global_step=global_step,
            stats=stats,
            learning_rate=lr,
            rollout_time=rollout_time,
            update_time=update_time,
            values=values,
            returns=returns,
            scalars=exchange,
            line_extra=line,
        )
        run.evaluate_if_due(iteration, global_step, saved)
        run.checkpoint_if_due(iteration, global_step, saved)
        if iteration < args.num_iterations:  # the next version, which the samplers act with
            policy_bytes, publish_time = publish_policy(
                client, run_id, iteration + 1, agent, obs_normalizer, args.num_chunks
            )

    end_run(client, run_id)  # the samplers go while the final model is evaluated
    run.finish(global_step, saved)  # --save-model: model.pt, evaluated
    return run.dir


# THE EXCHANGE THROUGH REDIS: KEYS AND HEARTBEATS -------------------------------------------------


HEARTBEAT_TTL = 5  # seconds a learner's heartbeat or a sampler's alive key lives unless refreshed
# seconds every other key of a run lives unless refreshed, longer than any pause of a live run: each key gets it as
# it is written and the learner's heartbeat renews it, so a learner killed (SIGKILL) leaves nothing for ever
RUN_TTL = 3600
RUN_KEYS = ("info", "next_sampler", "policy", "tickets", "chunks", "sent", "trained", "stale")  # besides a process's
OUT_OF_MEMORY = "refused a write: out of memory (its maxmemory is reached and it evicts nothing)"
BEAT_PERIOD = 0.5  # seconds between two refreshes (a refresh is one round trip)
POP_TIMEOUT = 0.5  # seconds one blocking pop waits, so the waiting loops beat and check often


def key(run_id: str, *parts) -> str:
    """Every key of a run lives under `ppo:{run_id}:`, so several runs can share one server."""
    return ":".join(["ppo", run_id, *map(str, parts)])


def expiring(pipe: redis.client.Pipeline, *names: str) -> list:
    """Executes `pipe`, a pipeline of writes, with the keys `names` given RUN_TTL in it: a key of a run is never
    without an expiry (`pipe` a transaction: not even for an instant)."""
    for name in names:
        pipe.expire(name, RUN_TTL)
    return pipe.execute()


class RunOver(Exception):
    """The learner ended the run or is gone: a sampler's cue to exit."""


class Heartbeat:
    """Keeps a key alive (TTL HEARTBEAT_TTL) when called at least every second; one round trip per
    BEAT_PERIOD at most, however often it is called. A sampler's (`run_id` given) reads the learner's
    heartbeat and stop key in the same round trip and raises RunOver when the run is over; the learner's
    renews the RUN_TTL of the keys `refresh` (its run's) in it."""

    def __init__(self, client: redis.Redis, name: str, run_id: str | None = None, refresh: tuple[str, ...] = ()):
        self.client, self.name, self.run_id, self.last = client, name, run_id, -math.inf
        self.value = f"{socket.gethostname()}:{os.getpid()}"  # who holds the key
        self.refresh = refresh

    def __call__(self):
        now = time.monotonic()
        if now - self.last < BEAT_PERIOD:
            return
        self.last = now
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.name, self.value, ex=HEARTBEAT_TTL)
        if self.run_id is None:  # the learner's
            expiring(pipe, *self.refresh)
            return
        pipe.exists(key(self.run_id, "heartbeat"))
        pipe.exists(key(self.run_id, "stop"))
        _, learner, stopped = pipe.execute()
        if stopped:
            raise RunOver("the learner ended the run")
        if not learner:
            raise RunOver("the learner is gone (its heartbeat expired)")


def beating(beat: Heartbeat, fn, *args, **kwargs):
    """`fn(*args, **kwargs)` while a thread keeps calling `beat`: with --compile the first call of the update step
    compiles for a minute or more, far longer than a heartbeat lives (HEARTBEAT_TTL)."""
    done = threading.Event()

    def keep_beating():  # a Redis error ends it quietly: the main thread meets it at its next beat
        with contextlib.suppress(redis.RedisError):
            while not done.wait(BEAT_PERIOD):
                beat()

    thread = threading.Thread(target=keep_beating)
    thread.start()
    try:
        return fn(*args, **kwargs)
    finally:
        done.set()
        thread.join()


# THE LEARNER'S SIDE ------------------------------------------------------------------------------


def publish_policy(
    client: redis.Redis, run_id: str, version: int, agent: Agent, obs_normalizer: ObsNormalizer, num_chunks: int
) -> tuple[int, float]:
    """Publishes `version` (weights and observation statistics) with `num_chunks` tickets for it, in one transaction
    that also drops the tickets left of the version before. Returns the message's size and the seconds it took."""
    start = time.perf_counter()
    weights = nn.utils.parameters_to_vector(agent.parameters()).detach().cpu().numpy()
    message = encode_message(
        {"run_id": run_id, "version": version},
        {"weights": weights, "obs_mean": obs_normalizer.rms.mean, "obs_var": obs_normalizer.rms.var},
    )
    pipe = client.pipeline(transaction=True)
    pipe.set(key(run_id, "policy"), message, ex=RUN_TTL)
    pipe.delete(key(run_id, "tickets"))
    pipe.rpush(key(run_id, "tickets"), *[version] * num_chunks)
    expiring(pipe, key(run_id, "tickets"))
    return len(message), time.perf_counter() - start


def requeue_lost_tickets(client: redis.Redis, run_id: str):
    """Tickets held by a sampler whose alive key expired (killed, machine gone) go back to the queue, so
    the chunks it never delivered are made by the samplers still running."""
    for pending in client.scan_iter(match=key(run_id, "pending", "*")):
        sampler_id = pending.decode().rsplit(":", 1)[1]
        if client.exists(key(run_id, "alive", sampler_id)):
            continue
        pipe = client.pipeline(transaction=True)
        pipe.lrange(pending, 0, -1)
        pipe.delete(pending)
        tickets = pipe.execute()[0]
        if tickets:
            expiring(client.pipeline().rpush(key(run_id, "tickets"), *tickets), key(run_id, "tickets"))


class Received(NamedTuple):
    """What one update's collection brought: its chunks, in (sampler, seq) order, and the counts."""

    chunks: list[dict]
    samplers: int  # distinct samplers among the chunks
    transfer_time: float  # seconds spent decoding and checking
    nbytes: int  # bytes popped, dropped messages included
    stale: int
    malformed: int


def receive_chunks(
    client: redis.Redis, run_id: str, version: int, args: Args, schema: dict, beat: Heartbeat, sampler_hint: str
) -> Received:
    """Pops chunks (each exactly once) until `args.num_chunks` of `version` are in; drops and counts the
    stale and malformed ones. Between pops it beats and gives lost samplers' tickets back; no chunk of
    this version for `args.sampler_timeout` seconds ends the run (one line, exit 1)."""
    chunks, stale, malformed, nbytes, transfer_time = {}, 0, 0, 0, 0.0
    last_chunk = time.monotonic()
    while len(chunks) < args.num_chunks:
        beat()
        popped = client.blpop([key(run_id, "chunks")], timeout=POP_TIMEOUT)
        if popped is None:
            if time.monotonic() - last_chunk > args.sampler_timeout:
                raise ppolab.redis_server.NoChunks(
                    f"no chunk from any sampler for {args.sampler_timeout:g} s (run {run_id}, version {version}, "
                    f"{len(chunks)}/{args.num_chunks} chunks); start samplers with: {sampler_hint}"
                )
            requeue_lost_tickets(client, run_id)
            continue
        decode_start, message = time.perf_counter(), popped[1]
        nbytes += len(message)
        try:
            header, chunk = decode_chunk(message, run_id, schema)
        except BadMessage:
            header = None
        transfer_time += time.perf_counter() - decode_start
        name = None if header is None else (header["sampler"], header["seq"])
        if header is None or header["version"] > version or name in chunks:
            malformed += 1  # garbage, foreign, from a version not yet published, or a replay
        elif header["version"] < version:
            stale += 1
            pipe = client.pipeline().hincrby(key(run_id, "stale"), f"{header['version']}:{header['sampler']}", 1)
            expiring(pipe, key(run_id, "stale"))
        else:
            chunks[name], last_chunk = chunk, time.monotonic()
    names = sorted(chunks)  # one order whatever the arrival order: one sampler gives the same batch every time
    pipe = client.pipeline(transaction=False)
    for sampler, _ in names:
        pipe.hincrby(key(run_id, "trained"), f"{version}:{sampler}", 1)
    expiring(pipe, key(run_id, "trained"))
    return Received([chunks[n] for n in names], len({s for s, _ in names}), transfer_time, nbytes, stale, malformed)


def end_run(client: redis.Redis | None, run_id: str):
    """Tells the samplers the run is over and clears the server: the stop key and the accounting
    (chunks sent, trained and stale per version and sampler) stay RUN_TTL, the rest goes now. Chunks
    still queued are counted as stale. Errors are ignored: the server may be what failed; one that refuses
    writes (out of memory) still deletes, pops and expires, so each command goes on its own."""
    if client is None:
        return
    try:
        pipe = client.pipeline(transaction=False)
        pipe.set(key(run_id, "stop"), 1, ex=RUN_TTL)
        pipe.delete(key(run_id, "heartbeat"), key(run_id, "tickets"), key(run_id, "policy"))
        pipe.execute(raise_on_error=False)
        while (message := client.lpop(key(run_id, "chunks"))) is not None:
            try:
                header = read_header(message)[0]
                pipe.hincrby(key(run_id, "stale"), f"{int(header['version'])}:{int(header['sampler'])}", 1)
            except (BadMessage, KeyError, TypeError, ValueError):  # not a chunk: nothing to count
                pass
        pipe.expire(key(run_id, "stale"), RUN_TTL)
        pipe.execute(raise_on_error=False)
        for name in client.scan_iter(match=key(run_id, "*")):
            if client.ttl(name) == -1:  # a key that would stay for ever (none should)
                client.expire(name, RUN_TTL)
    except redis.RedisError:
        pass


# A SAMPLER'S PROCESS -----------------------------------------------------------------------------


def wait_for_run(client: redis.Redis, run_id: str, timeout: float) -> dict:
    """The run's published info (Args and run folder), waiting up to `timeout` seconds for its learner."""
    deadline = time.monotonic() + timeout
    while True:
        info, learner = client.get(key(run_id, "info")), client.exists(key(run_id, "heartbeat"))
        if info is not None and learner:
            return json.loads(info)
        if time.monotonic() > deadline:
            ppolab.redis_server.abort(f"no learner of run {run_id} on the server after {timeout:g} s")
        time.sleep(0.2)


def run_sampler(args: Args):
    """`--role sampler`: steps one environment for the learner of `--run-id` until the run ends.

    Loop: pop a ticket (moved atomically into this sampler's pending list, so the learner can give a
    dead sampler's tickets to others), load its version if new, collect a chunk, push it and drop the
    ticket in one transaction (with the count of chunks sent per version and sampler)."""
    client, run_id, sampler_id = ppolab.redis_server.connect(args.redis_url), args.run_id, None
    try:
        info = wait_for_run(client, run_id, args.sampler_timeout)
        run_args = Args(**info["args"])
        if run_args.torch_threads > 0:
            torch.set_num_threads(run_args.torch_threads)
        sampler_id = expiring(client.pipeline().incr(key(run_id, "next_sampler")), key(run_id, "next_sampler"))[0]
        beat, pending = Heartbeat(client, key(run_id, "alive", sampler_id), run_id), key(run_id, "pending", sampler_id)
        beat()
        sampler, seq = Sampler(run_args, sampler_id, info["run_dir"]), 0
        print(f"sampler {sampler_id} joined run {run_id} ({run_args.env_id})", flush=True)
        ppolab.environments.print_held_mujoco_warnings()  # what MuJoCo said on making the environment, after this line
        while True:
            beat()
            ticket = client.blmove(key(run_id, "tickets"), pending, POP_TIMEOUT, "LEFT", "RIGHT")
            if ticket is None:
                continue
            client.expire(pending, RUN_TTL)  # made by the move: it lives RUN_TTL too
            version = int(ticket) if ticket.isdigit() else -1
            if version != sampler.version and not sampler.load_policy(
                client.get(key(run_id, "policy")), run_id, version
            ):
                client.lrem(pending, 1, ticket)  # a ticket of a version that is gone
                continue
            chunk = sampler.collect(beat)
            seq += 1
            message = encode_message({"run_id": run_id, "version": version, "sampler": sampler_id, "seq": seq}, chunk)
            pipe = client.pipeline(transaction=True)
            pipe.rpush(key(run_id, "chunks"), message)
            pipe.lrem(pending, 1, ticket)
            pipe.hincrby(key(run_id, "sent"), f"{version}:{sampler_id}", 1)
            expiring(pipe, key(run_id, "chunks"), key(run_id, "sent"))
    except RunOver as e:
        print(f"sampler {sampler_id}: {e}; exiting", flush=True)
    except (redis.ConnectionError, redis.TimeoutError) as e:
        print(f"sampler {sampler_id}: lost the Redis server ({e}); exiting", file=sys.stderr)
        raise SystemExit(1)
    except redis.OutOfMemoryError:  # the learner meets it too and ends the run, stopping its local samplers first
        with contextlib.suppress(redis.RedisError):  # (quietly: its line says it); a sampler elsewhere waits for that
            deadline = time.monotonic() + 2 * HEARTBEAT_TTL
            while client.exists(key(run_id, "heartbeat")) and time.monotonic() < deadline:
                time.sleep(BEAT_PERIOD)
        print(f"sampler {sampler_id}: the Redis server {OUT_OF_MEMORY}; exiting", file=sys.stderr)
        raise SystemExit(1)
    except MemoryError as e:  # its environment or its chunk did not fit: one line; the learner restarts local ones
        print(f"sampler {sampler_id}: cannot allocate memory ({e or 'MemoryError'}); exiting", file=sys.stderr)
        raise SystemExit(1)
    except KeyboardInterrupt:  # a sampler started by hand (local ones have their own session: no Ctrl-C)
        print(f"sampler {sampler_id}: interrupted; the learner gives its tickets to other samplers", file=sys.stderr)
        raise SystemExit(130)
    finally:  # leaving: the learner gives this sampler's tickets to others at once
        if sampler_id is not None:
            try:
                client.delete(key(run_id, "alive", sampler_id))
            except redis.RedisError:
                pass


# HOW SAMPLERS START AND STOP: THE LEARNER'S LAB --------------------------------------------------


def sampler_command(url: str, run_id: str, python: str = "python", script: str = Path(__file__).name) -> list[str]:
    """The command that starts a sampler for this run: printed for other machines, run for local ones (with
    --allow-open-redis where the learner was given it for an open server)."""
    allow = ["--allow-open-redis"] if ppolab.redis_server.open_redis_host(url) is not None else []
    return [python, script, "--role", "sampler", "--redis-url", url, "--run-id", run_id, *allow]


@dataclass
class Lab:
    """A learner's side of the server: the client, the URL the samplers connect to, the run's id, and the
    local samplers started for the run, which `redis_lab` stops."""

    client: redis.Redis
    url: str
    run_id: str
    samplers: list = field(default_factory=list)

    def start_samplers(self, count: int) -> str:
        """Prints the command that starts a sampler of this run on another machine, runs it `count` times on
        this one, and returns it (the learner repeats it when no chunk comes)."""
        hint = shlex.join(sampler_command(self.url, self.run_id))
        print(f"run {self.run_id} on {ppolab.redis_server.redact(self.url)}; samplers join with: {hint}", flush=True)
        for _ in range(count):  # each in the list as it starts: redis_lab stops every one, however the run ends
            self.samplers.append(None)
            self.restart_sampler(len(self.samplers) - 1)
        return hint

    def restart_sampler(self, k: int):
        """Starts local sampler `k` (again): it joins the run as a new sampler, with its own seed stream. The
        scheduler's --requeue-signal, which may reach every process, is the learner's to answer (ignored here)."""
        command = sampler_command(self.url, self.run_id, sys.executable, __file__)
        self.samplers[k] = subprocess.Popen(
            command, start_new_session=True, preexec_fn=ppolab.redis_server.ignore_requests
        )


@contextlib.contextmanager
def redis_lab(args: Args, run_dir: str):
    """The learner's server: the one of --redis-url, or a redis-server of its own; the run's id (--run-id or a
    fresh one) checked free there and a dead learner's leftovers under it cleared. However the run ends, the
    local samplers are stopped, the run is ended on the server (samplers elsewhere exit by themselves) and the
    embedded server is stopped; a server lost meanwhile, or one that refuses writes (out of memory), ends the
    run in one line (exit 1) that says how to resume it from its folder `run_dir`."""
    run_id = args.run_id or uuid.uuid4().hex[:12]
    lab, url, server = None, args.redis_url, []
    try:
        if url is None:  # ppolab.redis_server's: on 127.0.0.1, a free port, no persistence
            process, url = ppolab.redis_server.start_redis_server()
            server.append(process)
        client = ppolab.redis_server.connect(url)
        if client.exists(key(run_id, "heartbeat")):
            ppolab.fail(
                f"run id {run_id} is in use on {ppolab.redis_server.redact(url)} (its learner is alive); pass another "
                "--run-id"
            )
        lab = Lab(client, url, run_id)
        leftovers = list(client.scan_iter(match=key(run_id, "*")))  # of a dead learner with this run id
        if leftovers:
            client.delete(*leftovers)
        # what is saved, logged and published names the server without its password
        args.run_id, args.redis_url = run_id, None if args.redis_url is None else ppolab.redis_server.redact(url)
        yield lab
    except ppolab.redis_server.ServerDidNotStart as e:
        ppolab.redis_server.abort(str(e))
    except ppolab.redis_server.NoChunks as e:
        ppolab.redis_server.abort(f"{e}; {ppolab.stops.resume_hint(run_dir, args.checkpoint_every)}")
    except (redis.ConnectionError, redis.TimeoutError) as e:
        ppolab.redis_server.abort(
            f"lost the Redis server at {ppolab.redis_server.redact(url)} ({type(e).__name__}: {e}); "
            f"{ppolab.stops.resume_hint(run_dir, args.checkpoint_every)}"
        )
    except redis.OutOfMemoryError:
        ppolab.redis_server.abort(
            f"the Redis server at {ppolab.redis_server.redact(url)} {OUT_OF_MEMORY}; free memory on it or raise its "
            "maxmemory (redis-cli CONFIG SET maxmemory ...), then resume with the same --redis-url: "
            f"{ppolab.stops.resume_hint(run_dir, args.checkpoint_every)}"
        )
    finally:  # the local samplers first (quietly, SIGTERM): none writes after the run is ended on the server
        if lab is not None:
            ppolab.redis_server.stop_processes(lab.samplers)
            end_run(lab.client, run_id)
        ppolab.redis_server.stop_processes(server)


# THE WIRE FORMAT ---------------------------------------------------------------------------------


HEADER_LIMIT = 1 << 16  # bytes of JSON header a message may have


class BadMessage(ValueError):
    """A message from the network that fails a check: it is dropped and counted, never used."""


def encode_message(header: dict, arrays: dict[str, np.ndarray]) -> bytes:
    """4-byte big-endian header length, the JSON header, the arrays' raw bytes one after another.

    The header adds each array's name, dtype (with byte order, e.g. "<f4") and shape and the CRC-32
    of the payload, so the receiver checks everything before it reads a byte; nothing is pickled."""
    payload = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays.values())
    layout = [[name, a.dtype.str, list(a.shape)] for name, a in arrays.items()]
    head = json.dumps({**header, "arrays": layout, "crc32": zlib.crc32(payload)}).encode()
    return len(head).to_bytes(4, "big") + head + payload


def read_header(message: bytes) -> tuple[dict, int]:
    """The JSON header of a message and its length, or BadMessage."""
    if not isinstance(message, bytes) or len(message) < 4:
        raise BadMessage("shorter than a header")
    size = int.from_bytes(message[:4], "big")
    if size > HEADER_LIMIT or 4 + size > len(message):
        raise BadMessage(f"header length {size} out of bounds")
    try:
        header = json.loads(message[4 : 4 + size])
    except (ValueError, UnicodeDecodeError) as e:
        raise BadMessage(f"header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise BadMessage("header is not a JSON object")
    return header, size


def decode_message(message: bytes, run_id: str, schema: dict[str, tuple[str, tuple]]) -> tuple[dict, dict]:
    """The header and arrays of a message, after checking: header size and JSON, the run id, an integer
    version, exactly the arrays of `schema` (name -> (dtype, shape); a `range` in a shape bounds a
    variable dimension) in that order, the payload's length and checksum, finite floats. The arrays
    are read-only views of `message`. Anything else raises BadMessage."""
    header, size = read_header(message)
    if header.get("run_id") != run_id:
        raise BadMessage("not a message of this run")
    if type(header.get("version")) is not int or type(header.get("crc32")) is not int:
        raise BadMessage("version or crc32 missing or not an integer")
    layout = header.get("arrays")
    if not isinstance(layout, list) or len(layout) != len(schema):
        raise BadMessage("unexpected arrays")
    payload = message[4 + size :]
    if zlib.crc32(payload) != header["crc32"]:
        raise BadMessage("checksum mismatch")
    arrays, offset = {}, 0
    for entry, (name, (dtype, shape)) in zip(layout, schema.items()):
        if (
            not isinstance(entry, list)
            or len(entry) != 3
            or entry[:2] != [name, dtype]
            or not isinstance(entry[2], list)
            or len(entry[2]) != len(shape)
            or any(type(d) is not int for d in entry[2])
            or any(d not in s if isinstance(s, range) else d != s for d, s in zip(entry[2], shape))
        ):
            raise BadMessage(f"array {name}: expected {dtype} {shape}, got {str(entry)[:200]}")
        count, itemsize = math.prod(entry[2]), np.dtype(dtype).itemsize
        if offset + count * itemsize > len(payload):
            raise BadMessage(f"payload too short for {name}")
        arrays[name] = np.frombuffer(payload, dtype, count, offset).reshape(entry[2])
        offset += count * itemsize
        if arrays[name].dtype.kind == "f" and not np.isfinite(arrays[name]).all():
            raise BadMessage(f"array {name} is not finite")
    if offset != len(payload):
        raise BadMessage(f"payload has {len(payload) - offset} bytes too many")
    return header, arrays


F32, F64, U8 = np.dtype(np.float32).str, np.dtype(np.float64).str, np.dtype(np.uint8).str


def chunk_schema(num_steps: int, obs_dim: int, act_dim: int) -> dict[str, tuple[str, tuple]]:
    """The arrays of a chunk, (dtype, shape) by name: `num_steps` steps (T) of one sampler's environment acting with
    one version; what each holds at step t."""
    T = num_steps
    return {
        "obs": (F32, (T, obs_dim)),  # the raw observation the action was taken in
        "actions": (F32, (T, act_dim)),  # the sample as drawn, whose log-prob is stored (env_actions: what env got)
        "logprobs": (F32, (T,)),  # log-probability of the action under the version
        "values": (F32, (T,)),  # V(normalised obs[t]) under the version
        "rewards": (F32, (T,)),  # the raw reward
        "dones": (U8, (T,)),  # 1 where the episode ended (terminated or truncated)
        "terminated": (U8, (T,)),  # 1 where it terminated
        "final_values": (F32, (T,)),  # V(final observation) where truncated and not terminated, else 0
        "returns": (F32, (T,)),  # the discounted return so far (for the reward statistics)
        "last_value": (F32, (1,)),  # V(observation after the chunk), to bootstrap the open episode
        "episodes": (F64, (range(T + 1), 3)),  # the episodes that ended: step in the chunk, return, length
    }


def policy_schema(num_params: int, obs_dim: int) -> dict[str, tuple[str, tuple]]:
    """A published version: the flat float32 weights and the observation statistics."""
    return {"weights": (F32, (num_params,)), "obs_mean": (F64, (obs_dim,)), "obs_var": (F64, (obs_dim,))}


def decode_chunk(message: bytes, run_id: str, schema: dict) -> tuple[dict, dict]:
    """decode_message, then what a chunk must also be: integer sampler and sequence numbers, 0/1 flags,
    no bootstrap value on a termination, every episode ending on an end step."""
    header, chunk = decode_message(message, run_id, schema)
    if type(header.get("sampler")) is not int or type(header.get("seq")) is not int:
        raise BadMessage("sampler or seq missing or not an integer")
    dones, terminated = chunk["dones"], chunk["terminated"]
    if dones.max() > 1 or (terminated > dones).any() or (chunk["final_values"][terminated == 1] != 0).any():
        raise BadMessage("inconsistent end flags")
    steps = chunk["episodes"][:, 0]
    if ((steps != np.floor(steps)) | (steps < 0) | (steps >= len(dones))).any() or not dones[steps.astype(int)].all():
        raise BadMessage("an episode does not end on an end step")
    return header, chunk


# ==================================================================================================
# PPO ENDS HERE. What follows is what is particular to this script's run: its input checks (the Redis flags among
# them), how its policy plays an evaluation, and the entry point. The rest of a run (the run folder, checkpoints and
# resuming, logging, Ctrl-C and full disks, a redis-server of the run's own) is the package ppolab's; none of it
# changes what PPO computes.
# ==================================================================================================


RUN_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # it stands in key names and in the printed sampler command


def check_args(args: Args):
    """Bad input ends in one line before any work: the Redis flags (a sampler needs only these), then the checks
    of every script (numbers, counts, the batch, files, folders) and this file's; a learner's environment is
    made once to check that it exists, can be made here and is one this file can train."""
    ppolab.redis_server.check_redis_url(args.redis_url, args.allow_open_redis)
    if args.run_id is not None and not RUN_ID.fullmatch(args.run_id):
        ppolab.fail(f"--run-id {args.run_id!r}: use 1-64 letters, digits, '_', '.' or '-'")
    if args.role == "sampler":
        if args.redis_url is None or args.run_id is None:
            ppolab.fail("--role sampler needs --redis-url and --run-id (the learner prints the command)")
        return
    batch = f"--num-chunks {args.num_chunks} x --num-steps {args.num_steps}"
    ppolab.check_args(args, positive=("num_chunks",), non_negative=("num_samplers", "max_restarts"), batch=batch)
    if args.obs_clip <= 0 or args.reward_clip <= 0 or args.sampler_timeout <= 0:
        ppolab.fail("--obs-clip, --reward-clip and --sampler-timeout must be positive")
    if args.resume is None and args.evaluate is None:  # else the checkpoint's environment, made later
        env_spaces(args)
        if args.capture_video:
            ppolab.check_video(args.env_id)


def evaluate(
    checkpoint: dict,
    episodes: int,
    deterministic: bool,
    seed: int,
    *,
    video_prefix: str | None = None,
    max_steps: int | None = None,
):
    """Plays `episodes` whole episodes with the policy of `checkpoint` (a saved model, or a snapshot of the training)
    on the CPU and returns their undiscounted returns. Observations are normalised with the checkpoint's statistics,
    frozen; actions reach the environment as in training (env_actions). The action sampling and the episodes come
    from `seed`, so the same model scores the same whether evaluated during training, after it or later from the
    saved file. `video_prefix` (`--evaluate --capture-video`): records every episode as
    `<video_prefix>-episode-<k>.mp4`. An episode of an environment without a time limit of its own is cut after
    `max_steps` steps (by default the checkpoint's --eval-max-steps)."""
    args = Args(**checkpoint["args"])
    env = ppolab.make_eval_env(args.env_id, video_prefix, args.eval_max_steps if max_steps is None else max_steps)
    env = flat_observations(env, args.env_id)
    obs_shape, low, high = env.observation_space.shape, env.action_space.low, env.action_space.high
    agent = Agent(int(np.prod(obs_shape)), int(np.prod(env.action_space.shape)), args.distribution)
    agent.load_state_dict(checkpoint["model"])
    obs_normalizer = ObsNormalizer(obs_shape, args.obs_clip)
    obs_normalizer.rms.load_state_dict(checkpoint["obs_rms"])
    torch.manual_seed(seed)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done, episodic_return = False, 0.0
        while not done:
            x = torch.as_tensor(obs_normalizer(obs[None], update=False))
            with torch.no_grad():
                action = agent.mean_action(x) if deterministic else agent.get_action_and_value(x)[0]
            env_action = env_actions(action[0].numpy(), low, high, args.distribution)  # as in training
            obs, reward, terminated, truncated, _ = env.step(env_action)
            episodic_return += float(reward)
            done = terminated or truncated
        returns.append(episodic_return)
    env.close()
    return returns


def main(args: Args) -> str | list[float] | None:
    """Checks the arguments; then runs a sampler (--role sampler), or trains (returns the run folder), or with
    --evaluate evaluates (returns the episodes' returns)."""
    check_args(args)
    if args.role == "sampler":
        return run_sampler(args)
    ppolab.use_threads(args.torch_threads)
    if args.evaluate is not None:  # with this command line's --eval-max-steps
        return ppolab.evaluate_file(args, partial(evaluate, max_steps=args.eval_max_steps))
    # the run folder (a resumed run's own), Ctrl-C and refused writes; then the server, the run's namespace on
    # it and the local processes, stopped however the run ends
    with ppolab.Run(args, evaluate) as run, redis_lab(run.args, run.dir) as lab:
        return train(run.args, run, lab)


if __name__ == "__main__":
    # a --resume reads the run's arguments from its checkpoint, but the server and the run id from this command
    # line only: the saved URL has its password redacted, and the run id is that of the learner before
    ppolab.run_program(main, Args, from_command_line=("redis_url", "allow_open_redis", "run_id"))
