"""PPO for continuous (Box) actions on MuJoCo (Hopper-v4, HalfCheetah-v4, Walker2d-v4, ...).

Run:
    python ppo_continuous_action.py --env-id Hopper-v4
    tensorboard --logdir runs

What this file shows: PPO (Schulman et al., 2017) with the 13 core implementation details of "The 37
Implementation Details of PPO" (Huang et al., ICLR blog track 2022) and the continuous-control ones:
a Gaussian policy with a state-independent log standard deviation, independent action dimensions
(log-probabilities summed), actions clipped to the valid range while the unclipped sample is
stored, observation normalisation and clipping, reward scaling and clipping. PPO ends at the banner
after `train`; below it is what is particular to this script's run (its input checks, how its policy plays
an evaluation) and the entry point. The rest of a run (the run folder, checkpoints and resuming, logging,
the CPU fast path) is the package ppolab's.

What is special in this file (the places where PPO scripts usually go wrong):
- Same-step autoreset: Gymnasium 1.x vector environments reset a finished episode on the *next* step
  by default, a fake transition; here the step that ends an episode returns the next one's first
  observation and the old one's last in `info["final_obs"]`, so every stored transition is real.
- A time-limit truncation (MuJoCo tasks stop at 1000 steps) is not a termination: the value of the
  final observation is bootstrapped. `--no-bootstrap-truncation` restores the classic behaviour.
- Observations and rewards are normalised here, not by Gymnasium wrappers: the final observation of a
  truncated episode (which no wrapper sees) is normalised before its value is taken, and the statistics
  go into every checkpoint (data only), so `--resume` continues and `--evaluate` scores as in training.
- On the CPU the policy step and the update step run as NumPy mirrors of `Agent.act` and `update_step`
  (ppolab's `NumpyPolicy`, `NumpyUpdate`): the same functions of the same weights, written out. They run
  only where they compute exactly the code here (this Agent, this loss, Adam); an edited network, loss or
  optimizer is trained as written, in PyTorch. The run's first lines say which steps run in NumPy, and why
  a mirror steps aside; `--no-numpy-update` runs the PyTorch code anyway.
"""

import math
import os
import time
from dataclasses import dataclass
from functools import partial
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch.distributions.beta import Beta
from torch.distributions.normal import Normal

import ppolab


@dataclass
class Args(ppolab.RunSettings):  # and every run's settings: --seed, --cuda, --track, --resume, ...
    # PPO's hyperparameters (the defaults are the published ones)
    env_id: str = "Hopper-v4"
    """the id of the environment"""
    total_timesteps: int = 1_000_000
    """total timesteps of the experiment"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments"""
    num_steps: int = 2048
    """the number of steps to run in each environment per policy rollout"""
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

    # This script's own run settings (those of every script: ppolab.RunSettings)
    numpy_update: bool = True
    """on the CPU, run Agent.act and update_step as NumPy mirrors (faster) where they compute exactly this file's code (off: PyTorch)"""
    changeable_on_resume = ("numpy_update",)

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


def make_envs(args: Args, run_dir: str) -> gym.vector.VectorEnv:
    """The vector environment with same-step autoreset (`ppolab.SameStepVectorEnv`: gymnasium's
    SyncVectorEnv written out) under gymnasium's vector `RecordEpisodeStatistics`, which puts every ended
    episode's return and length in `info["episode"]` (`finished_episodes`). No normalisation wrappers:
    observations and rewards are normalised in the training loop, actions clipped there too."""
    try:
        envs = ppolab.SameStepVectorEnv(
            [make_env(args.env_id, i, args.capture_video, run_dir) for i in range(args.num_envs)]
        )
    except (ImportError, gym.error.DependencyNotInstalled) as e:  # Pusher-v4, for one, needs mujoco<3
        ppolab.fail(f"cannot make {args.env_id} here: {str(e).splitlines()[0]}")
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    if not isinstance(envs.single_action_space, gym.spaces.Box) or len(envs.single_action_space.shape) != 1:
        envs.close()
        ppolab.fail(
            f"{args.env_id} has action space {envs.single_action_space}; ppo_continuous_action.py supports "
            "one-dimensional Box actions only (use ppo.py for Discrete actions)"
        )
    ppolab.check_observations(args.env_id, envs.single_observation_space, envs)
    if args.distribution == "beta":
        ppolab.check_finite_bounds(args.env_id, envs.single_action_space, envs)
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
    deviation of each environment's discounted return, which restarts at every episode end."""

    def __init__(self, num_envs: int, gamma: float, clip: float):
        self.rms, self.gamma, self.clip = ppolab.RunningMeanStd(), gamma, clip
        self.returns = np.zeros(num_envs)

    def __call__(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        self.returns = self.returns * self.gamma + reward
        self.rms.update(self.returns)
        self.returns[done] = 0.0
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
        """The rollout's policy step: action and log-prob, without the entropy and the autograd
        bookkeeping that only the update needs (on these tiny batches that overhead is most of the time).
        The critic does not change during a rollout, so the values of its observations come from one
        batched `get_value` after it, not from one small forward pass per step.

        action = mean + std * eps with eps ~ N(0, 1), so (action - mean) / std is eps itself and the
        Gaussian log-density needs no division: sum over dimensions of -eps^2/2 - log std - log(2 pi)/2.
        """
        if self.distribution == "beta":
            dist = self.beta(x)
            action = dist.sample().clamp(BETA_EDGE, 1 - BETA_EDGE)
            return action, dist.log_prob(action).sum(-1)
        action_mean = self.actor_mean(x)
        eps = torch.randn_like(action_mean)
        action = action_mean + self.actor_logstd.exp() * eps
        logprob = (-0.5 * eps.square() - self.actor_logstd - 0.5 * math.log(2 * math.pi)).sum(-1)
        return action, logprob


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


# TRAINING ----------------------------------------------------------------------------------------


def train(args: Args, run: ppolab.Run) -> str:
    """PPO on args.env_id, from scratch or on from --resume's checkpoint; `run` (the package's) writes
    everything the run reports into its folder, which train returns."""
    ppolab.seed_everything(args.seed, args.torch_deterministic)  # same seed, same thread count: same numbers
    torch.distributions.Distribution.set_default_validate_args(False)  # no argument checks: costlier than the math
    device = ppolab.pick_device(args.cuda)

    envs = make_envs(args, run.dir)
    obs_shape, act_dim = envs.single_observation_space.shape, envs.single_action_space.shape[0]
    action_low, action_high = envs.single_action_space.low, envs.single_action_space.high
    agent = Agent(int(np.prod(obs_shape)), act_dim, args.distribution).to(device)
    obs_normalizer = ObsNormalizer(obs_shape, args.obs_clip)
    reward_scaler = RewardScaler(args.num_envs, args.gamma, args.reward_clip)
    # fused: one kernel for all parameters. The learning rate is a tensor, annealed in place without a recompile
    learning_rate = torch.tensor(args.learning_rate, device=device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=learning_rate, eps=1e-5, fused=True)
    # what a checkpoint holds besides progress, RNG and args: the normalisation statistics too
    saved = {"model": agent, "optimizer": optimizer, "obs_rms": obs_normalizer.rms, "reward_rms": reward_scaler.rms}
    saved["kl_beta"] = kl_beta = torch.tensor(args.kl_beta, device=device)  # PPO-Penalty's beta, changed in place
    start_iteration, global_step = run.start(saved)  # --resume's checkpoint restored; 1, 0 for a new run

    # --compile runs the same two functions through torch.compile; --cudagraphs also records their kernels
    # in CUDA graphs and replays them (one launch per call; its outputs are reused, so the loop clones them)
    act, update = agent.act, partial(update_step, agent, optimizer, args, kl_beta)
    if args.compile or args.cudagraphs:
        mode = "reduce-overhead" if args.cudagraphs else None
        update = partial(torch.compile(update_step, mode=mode), agent, optimizer, args, kl_beta)
        if device.type != "cpu":
            act = torch.compile(agent.act, mode=mode)
    # on the CPU, the NumPy steps where they compute the same as this code
    act, update = ppolab.numpy_fast_path(agent=agent, optimizer=optimizer, args=args, act=act, update=update)

    # Rollout storage lives on the CPU as torch tensors whose memory NumPy shares: the environments'
    # arrays are copied in without conversions, and the batch moves to the device once per update.
    # On CUDA the observations are in pinned memory, so their copy to the device does not block.
    T, N = args.num_steps, args.num_envs
    obs = torch.zeros((T, N) + obs_shape, pin_memory=device.type == "cuda")
    actions = torch.zeros((T, N, act_dim))  # the unclipped samples: their log-probs are the ones stored
    logprobs = torch.zeros((T, N))
    rewards = torch.zeros((T, N))
    dones = torch.zeros((T, N))
    final_values = torch.zeros((T, N))  # value where an episode ended (see compute_gae)
    obs_np, actions_np, logprobs_np, rewards_np, dones_np = (
        x.numpy() for x in (obs, actions, logprobs, rewards, dones)
    )

    # A resumed run reseeds its environments differently, so it does not replay the first episodes
    next_obs, _ = envs.reset(seed=args.seed + global_step)
    next_obs = obs_normalizer(next_obs, update=True)
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
            if isinstance(act, ppolab.NumpyPolicy):  # the CPU fast path: NumPy arrays in and out
                actions_np[step], logprobs_np[step] = act(obs_np[step])
            else:  # one copy to the device, one back: action and log-prob in one tensor
                action, logprob = act(obs[step].to(device, non_blocking=True))
                policy_out = torch.cat([action, logprob.unsqueeze(1)], 1).cpu().numpy()
                actions_np[step], logprobs_np[step] = policy_out[:, :-1], policy_out[:, -1]

            # the environment gets the action clipped to its bounds; the buffer keeps the sample
            next_obs, reward, terminated, truncated, infos = envs.step(
                env_actions(actions_np[step], action_low, action_high, args.distribution)
            )
            done = terminated | truncated
            rewards_np[step] = reward_scaler(reward, done)  # the logged returns stay the raw ones
            dones_np[step] = done
            next_obs = obs_normalizer(next_obs, update=True)
            # next_obs is already the next episode's first observation where an episode ended; where a
            # truncated episode stopped is kept from info["final_obs"] (normalised with this step's
            # statistics), its value computed after the rollout
            bootstrap = truncated & ~terminated
            if args.bootstrap_truncation and bootstrap.any():
                idx = np.flatnonzero(bootstrap)
                final_obs.extend(obs_normalizer(np.stack(infos["final_obs"][idx]), update=False))
                final_steps.extend([step] * len(idx))
                final_envs.extend(idx)
            for i, episodic_return, episodic_length in finished_episodes(infos):
                run.episode(global_step - N + i + 1, episodic_return, episodic_length)  # at the step it ended

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
        b_actions = actions.reshape(-1, act_dim).to(device)
        b_logprobs = logprobs.reshape(-1).to(device)
        b_advantages = advantages.reshape(-1).to(device)
        b_returns = returns.reshape(-1).to(device)
        b_values = device_values[: T * N]

        clipfracs, kls = [], []  # one per minibatch: losses/clipfrac is their mean, as CleanRL logs it
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(args.batch_size, device=device)
            for start in range(0, args.batch_size, args.minibatch_size):
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
        update_time = time.perf_counter() - update_start

        # the losses and KLs of the last minibatch, the clip fraction over the whole update
        stats.update(clipfrac=torch.stack(clipfracs).mean(), ratio_deviation=first_ratio_deviation)
        adapt_kl_beta(kl_beta, kls, args, stats)  # PPO-Penalty: beta logged, then adapted (adaptive-kl)
        run.iteration(
            iteration=iteration,
            global_step=global_step,
            stats=stats,
            learning_rate=lr,
            rollout_time=rollout_time,
            update_time=update_time,
            values=values,
            returns=returns,
        )
        run.evaluate_if_due(iteration, global_step, saved)
        run.checkpoint_if_due(iteration, global_step, saved)

    envs.close()
    run.finish(global_step, saved)  # --save-model: model.pt, evaluated
    return run.dir


# ==================================================================================================
# PPO ENDS HERE. What follows is what is particular to this script's run: its input checks, how its
# policy plays an evaluation (with the training's observation statistics, frozen), and the entry point.
# The rest of a run (the run folder, checkpoints and resuming, logging, Ctrl-C and full disks, the CPU
# fast path) is the package ppolab's; none of it changes what PPO computes.
# ==================================================================================================


def check_args(args: Args):
    """Bad input ends in one line before any work: the checks of every script (numbers, counts, the batch,
    files, folders), then this script's own (the clip ranges, the environment id, `module:Name-v0` too, and with
    --capture-video its rendering). make_envs says in one line when the environment cannot be made here or its
    spaces are not one-dimensional Boxes."""
    ppolab.check_args(args, batch=f"--num-envs {args.num_envs} x --num-steps {args.num_steps}")
    if args.obs_clip <= 0 or args.reward_clip <= 0:
        ppolab.fail("--obs-clip and --reward-clip must be positive")
    ppolab.env_spec(args.env_id)
    if args.capture_video and args.evaluate is None:
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


def main(args: Args) -> str | list[float]:
    """Checks the arguments, then trains (returns the run folder) or, with --evaluate, evaluates (returns the
    episodes' returns)."""
    check_args(args)
    ppolab.use_threads(args.torch_threads)
    if args.evaluate is not None:  # with this command line's --eval-max-steps
        return ppolab.evaluate_file(args, partial(evaluate, max_steps=args.eval_max_steps))
    with ppolab.Run(args, evaluate) as run:  # the run folder (a resumed run's own), Ctrl-C, refused writes
        return train(run.args, run)


if __name__ == "__main__":
    ppolab.run_program(main, Args)
