"""PPO on Procgen (Cobbe et al. 2020) through envpool's C++ vector environment, IMPALA CNN.

Run:
    python ppo_procgen.py --env-id starpilot      # or bossfight, bigfish, ... (16 games), easy distribution
    tensorboard --logdir runs

What this file shows: PPO with the Procgen settings of "The 37 Implementation Details of PPO" (Huang et al.
2022): the easy distribution over unlimited levels, 64x64 RGB frames, the IMPALA CNN (Espeholt et al. 2018) shared
by actor and critic, rewards scaled by a running standard deviation of the discounted return and clipped, the
published hyperparameters. envpool ships the games (the `procgen` package has no wheels for current Python). PPO
ends at the banner after `train`; below it: the input checks, the evaluation, the entry point (the rest is ppolab's).

What is special in this file (the places where envpool scripts usually go wrong):
- envpool resets a finished episode on the *next* step, for Procgen as for Atari (checked with envpool 1.2.5):
  the step after an episode end ignores the action, returns reward 0 and a new level's first observation. That
  "reset row" is not experience: it stays in the rollout (it computes the value of the final observation) but is
  masked out of the advantages, the loss and the reward statistics.
- Procgen's time-out arrives as `truncated` and bootstraps the value of the final observation
  (`--no-bootstrap-truncation`: a termination, as Procgen's own `done`); every finished episode is logged at its
  own step with its raw score (the unscaled rewards summed).
- Observations stay uint8 (192 MiB for the default rollout) in a channels-last buffer, as the CNN runs; the
  update's activations take more (benchmark/results/speed.md, Pixel scripts): more minibatches, less memory.
- The reward statistics are in every checkpoint (`saved` in `train`): a resumed run scales rewards as before.
- envpool's Procgen needs the system Qt 5 runtime (`libqt5gui5`); without it the script says so in one line.
"""

import os
import re
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

# Before PyTorch loads OpenMP: idle threads of its pool sleep, not spin, so a busy core's time goes to the threads
# that work (benchmark/results/speed.md, Pixel scripts). An OMP_WAIT_POLICY of your own is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import envpool
import numpy as np
import torch
import torch.nn as nn
from torch.distributions.categorical import Categorical

import ppolab


@dataclass
class Args(ppolab.RunSettings):  # and every run's settings: --seed, --cuda, --track, --resume, ...
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
    anneal_lr: bool = False
    """toggle learning rate annealing (off, as in the published Procgen setting: a constant learning rate)"""
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
    policy_objective: Literal["clip", "adaptive-kl", "fixed-kl"] = "clip"
    """the policy's surrogate: PPO-Clip's clipped ratio, or PPO-Penalty's KL penalty with an adaptive or fixed beta"""
    kl_target: float = 0.01
    """adaptive-kl: the KL per update that beta is adapted towards (the PPO paper's d_targ)"""
    kl_beta: float = 1.0
    """the KL penalty's coefficient beta: fixed-kl's, and adaptive-kl's first"""
    bootstrap_truncation: bool = True
    """bootstrap the value of the final observation at Procgen's time-out (off: treat it as termination)"""
    reward_clip: float = 10.0
    """scaled rewards are clipped to [-reward_clip, reward_clip]"""

    # This script's own run settings (those of every script: ppolab.RunSettings)
    torch_threads: int = 2
    """CPU threads for PyTorch and NumPy's BLAS (0 keeps their defaults)"""
    capture_video: bool = False
    """if toggled, env 0's 64x64 RGB observations (what the agent sees) are saved as videos to `runs/<run>/videos`"""
    envpool_threads: int = 0
    """threads envpool steps the games with (0: envpool's choice, one per env up to the core count)"""
    changeable_on_resume = ("envpool_threads",)

    @property
    def batch_size(self) -> int:
        """transitions per update: num_envs * num_steps (reset rows included, see the docstring)"""
        return self.num_envs * self.num_steps

    @property
    def num_iterations(self) -> int:
        """updates in the whole run: total_timesteps // batch_size"""
        return self.total_timesteps // self.batch_size


# ENVIRONMENTS ------------------------------------------------------------------------------------


GAMES = (
    "bigfish bossfight caveflyer chaser climber coinrun dodgeball fruitbot heist jumper leaper maze miner ninja "
    "plunder starpilot"
).split()  # the 16 games
# envpool's Procgen ids: game and distribution, e.g. StarpilotEasy-v0, MazeMemory-v0
PROCGEN_ID = re.compile(rf"({'|'.join(g.capitalize() for g in GAMES)})(Easy|Hard|Extreme|Memory|Exploration)-v0")


def procgen_id(env_id: str) -> str:
    """`starpilot` -> `StarpilotEasy-v0`; envpool Procgen ids as given; anything else is a one-line error."""
    if env_id.lower() in GAMES:
        return f"{env_id.lower().capitalize()}Easy-v0"
    if PROCGEN_ID.fullmatch(env_id) and env_id in envpool.list_all_envs():
        return env_id
    names = f"valid names are {', '.join(GAMES)} (or an envpool Procgen id such as StarpilotEasy-v0)"
    ppolab.fail(f"unknown Procgen game '{env_id}': {names}")


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
        self.rms, self.gamma, self.clip, self.returns = ppolab.RunningMeanStd(), gamma, clip, np.zeros(num_envs)

    def __call__(self, reward: np.ndarray, done: np.ndarray, valid: np.ndarray) -> np.ndarray:
        self.returns = self.returns * self.gamma + reward
        if valid.any():
            self.rms.update(self.returns[valid])
        self.returns[done] = 0.0
        return (reward / np.sqrt(self.rms.var + 1e-8)).clip(-self.clip, self.clip)


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
    kl_beta: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO loss of one minibatch: policy loss + vf_coef * value loss - ent_coef * entropy, `advantages` used as
    given (normalised before the call if wanted). The policy loss is PPO-Clip's clipped surrogate, or PPO-Penalty's
    surrogate plus kl_beta * KL(old, new) (--policy-objective; section 4 of the PPO paper). Returns the loss and
    detached statistics: policy and value loss, entropy, old and new approximate KL, clip fraction. `mask` (0/1 per
    sample) keeps fixed-shape minibatches exact, only the samples where it is 1 counting: the envpool scripts pass
    one."""

    def mean(x: torch.Tensor) -> torch.Tensor:
        return x.mean() if mask is None else (x * mask).sum() / mask.sum()

    logratio = newlogprob - oldlogprob
    ratio = logratio.exp()
    # KL(old || new) estimated from the sampled actions (http://joschu.net/blog/kl-approx.html): approx_kl is
    # never negative, its mean is the KL and so is the mean of its gradient: the penalty's term
    approx_kl = mean((ratio - 1) - logratio)
    with torch.no_grad():
        old_approx_kl = mean(-logratio)
        clipfrac = mean(((ratio - 1.0).abs() > args.clip_coef).float())

    if args.policy_objective == "clip":  # clipped surrogate (as a loss to minimise: the max of the negated terms)
        pg_loss1 = -advantages * ratio
        pg_loss2 = -advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
        pg_loss = mean(torch.max(pg_loss1, pg_loss2))
    else:  # KL-penalised surrogate
        pg_loss = mean(-advantages * ratio) + kl_beta * approx_kl

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
    loss, stats = ppo_loss(
        newlogprob, entropy, newvalue, logprobs, advantages, returns, values, args, kl_beta, mask=mask
    )
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


def train(args: Args, run: ppolab.Run) -> str:
    """PPO on args.env_id, from scratch or on from --resume's checkpoint; `run` (the package's) writes
    everything the run reports into its folder, which train returns."""
    ppolab.seed_everything(args.seed, args.torch_deterministic)  # same seed, same thread count: same numbers
    torch.distributions.Distribution.set_default_validate_args(False)  # no argument checks: costlier than the math
    device = ppolab.pick_device(args.cuda)

    # A resumed run reseeds its environments differently, so it does not replay the first levels
    envs = make_envs(args, args.num_envs, args.seed + (run.checkpoint["global_step"] if run.checkpoint else 0))
    agent = Agent(envs.action_space.n).to(device)
    # fused: one kernel for all parameters. The learning rate is a tensor, annealed in place without a recompile
    learning_rate = torch.tensor(args.learning_rate, device=device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=learning_rate, eps=1e-5, fused=True)
    reward_scaler = RewardScaler(args.num_envs, args.gamma, args.reward_clip)
    kl_beta = torch.tensor(args.kl_beta, device=device)  # PPO-Penalty's beta (adapt_kl_beta changes it in place)
    # a checkpoint's objects
    saved = {"model": agent, "optimizer": optimizer, "kl_beta": kl_beta, "reward_rms": reward_scaler.rms}
    start_iteration, global_step = run.start(saved)  # --resume's checkpoint restored; 1, 0 for a new run
    video = ppolab.VideoRecorder(f"{run.dir}/videos") if args.capture_video else None

    # --compile runs the same two functions through torch.compile; --cudagraphs also records their kernels
    # in CUDA graphs and replays them (one launch per call; its outputs are reused, so the loop clones them)
    act, update = agent.act, partial(update_step, agent, optimizer, args, kl_beta)
    if args.compile or args.cudagraphs:
        mode = "reduce-overhead" if args.cudagraphs else None
        act = torch.compile(agent.act, mode=mode)
        update = partial(torch.compile(update_step, mode=mode), agent, optimizer, args, kl_beta)

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
        for step in range(T):
            global_step += N
            obs[step] = as_images(next_obs)
            valid_np[step] = ~next_done
            # one copy to the device (from pinned memory on CUDA, without waiting) and one copy back:
            # action, log-prob and value stacked
            action, logprob, value = act(obs[step].to(device, non_blocking=True))
            actions_np[step], logprobs_np[step], values_np[step] = (
                torch.stack([action.float(), logprob, value]).cpu().numpy()
            )
            next_obs, reward, terminated, truncated, info = envs.step(actions_np[step])

            next_done = terminated | truncated
            rewards_np[step] = reward_scaler(reward, next_done, valid_np[step])  # the logged scores stay raw
            dones_np[step] = next_done
            terminations_np[step] = terminated if args.bootstrap_truncation else next_done
            if video is not None:
                video.add(next_obs[0], bool(next_done[0]))
            for i, episodic_return, episodic_length in episode_stats.step(reward, next_done, info):
                run.episode(global_step - N + i + 1, episodic_return, episodic_length)  # at the step it ended

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

        clipfracs, kls = [], []  # one per minibatch: losses/clipfrac is their mean, as CleanRL logs it
        for epoch in range(args.update_epochs):
            for minibatch, mb_inds in enumerate(minibatch_indices(b_valid, args.num_minibatches)):
                if args.cudagraphs:
                    torch.compiler.cudagraph_mark_step_begin()  # a new replay: the last one's outputs are done
                stats = update(
                    obs=b_obs[mb_inds],
                    actions=b_actions[mb_inds],
                    logprobs=b_logprobs[mb_inds],
                    advantages=b_advantages[mb_inds],
                    returns=b_returns[mb_inds],
                    values=b_values[mb_inds],
                    mask=b_mask[mb_inds],
                )
                stats = {k: v.clone() for k, v in stats.items()} if args.cudagraphs else stats
                if epoch == 0 and minibatch == 0:
                    # Nothing has been updated yet, so the ratio must be 1 to float precision; a larger
                    # deviation means the stored log-probs do not belong to the stored observations
                    first_ratio_deviation = stats["ratio_deviation"]
                clipfracs.append(stats["clipfrac"])
                kls.append(stats["approx_kl"])
            if args.target_kl is not None and stats["approx_kl"] > args.target_kl:  # the one wait per epoch
                break
        update_time = time.perf_counter() - update_start

        # the losses and KLs of the last minibatch, the clip fraction over the whole update; the critic's
        # explained variance and the reset rows from `valid`
        stats.update(clipfrac=torch.stack(clipfracs).mean(), ratio_deviation=first_ratio_deviation)
        adapt_kl_beta(kl_beta, kls, args, stats)  # PPO-Penalty: beta logged, then adapted (adaptive-kl)
        reset_rows = valid.numel() - int(valid.sum())
        run.iteration(
            iteration=iteration,
            global_step=global_step,
            stats=stats,
            learning_rate=lr,
            rollout_time=rollout_time,
            update_time=update_time,
            values=values[valid],
            returns=returns[valid],
            scalars={"debug/reset_rows": reset_rows},
        )
        run.evaluate_if_due(iteration, global_step, saved)
        run.checkpoint_if_due(iteration, global_step, saved)

    envs.close()
    run.finish(global_step, saved)  # --save-model: model.pt (with the reward statistics), evaluated
    return run.dir


# ==================================================================================================
# PPO ENDS HERE. What follows is what is particular to this script's run: its input checks, how its
# policy plays an evaluation, and the entry point. The rest of a run (the run folder, checkpoints and
# resuming, logging, Ctrl-C and full disks) is the package ppolab's; none of it changes what PPO computes.
# ==================================================================================================


QT_MISSING = (
    "envpool's Procgen needs the Qt 5 runtime: install the Debian/Ubuntu package libqt5gui5 "
    "(sudo apt-get install libqt5gui5)"
)


def check_args(args: Args):
    """Bad input ends in one line before any work: the checks of every script (numbers, counts, the batch,
    files, folders) with this script's own, then the game (and the Qt 5 runtime envpool's Procgen needs)."""
    ppolab.check_args(args, non_negative=("envpool_threads",))
    if args.reward_clip <= 0:
        ppolab.fail("--reward-clip must be positive")
    try:
        # loads envpool's Procgen extension, which links the system Qt 5 libraries
        envpool.make_spec(procgen_id(args.env_id))
    except ImportError as e:
        # envpool raises "EnvPool Procgen requires the system Qt 5 runtime ..." from the loader's
        # "libQt5Gui.so.5: cannot open shared object file"; other import errors are not ours to explain
        if "qt" not in f"{e} {e.__cause__}".lower():
            raise
        ppolab.fail(QT_MISSING)


def evaluate(checkpoint: dict, episodes: int, deterministic: bool, seed: int, *, video_prefix: str | None = None):
    """Plays `episodes` whole episodes, one per environment, with the policy of `checkpoint` (a saved model, or a
    snapshot of the training) on the CPU, on the training distribution (easy, all levels), and returns their raw
    scores. The levels and the action sampling come from `seed`, so the same model scores the same whether
    evaluated during training, after it or later from the saved file. `video_prefix` (`--evaluate
    --capture-video`): records the episode of environment 0 (the first) as `<video_prefix>-episode-0.mp4`, from
    the observed 64x64 frames (envpool cannot render)."""
    args = Args(**checkpoint["args"])
    envs = make_envs(args, episodes, seed)
    agent = Agent(envs.action_space.n)
    agent.load_state_dict(checkpoint["model"])
    torch.manual_seed(seed)
    episode_stats = EpisodeStatistics(episodes)
    scores = np.full(episodes, np.nan)
    obs, _ = envs.reset()
    video = (
        None
        if video_prefix is None
        else ppolab.VideoRecorder(str(Path(video_prefix).parent), name=f"{Path(video_prefix).name}-episode")
    )
    while np.isnan(scores).any():
        with torch.no_grad():
            logits = agent.actor(agent.features(as_images(obs)))
            action = logits.argmax(-1) if deterministic else Categorical(logits=logits).sample()
        obs, reward, terminated, truncated, info = envs.step(action.numpy())
        if video is not None and np.isnan(scores[0]):  # environment 0's first episode
            video.add(obs[0], bool(terminated[0] or truncated[0]))
        for i, score, _ in episode_stats.step(reward, terminated | truncated, info):
            if np.isnan(scores[i]):
                scores[i] = score
    envs.close()
    return scores.tolist()


def main(args: Args) -> str | list[float]:
    """Checks the arguments, then trains (returns the run folder) or, with --evaluate, evaluates (returns the
    episodes' returns)."""
    check_args(args)
    ppolab.use_threads(args.torch_threads)
    if args.evaluate is not None:
        return ppolab.evaluate_file(args, evaluate, procgen_id)
    with ppolab.Run(args, evaluate, procgen_id) as run:  # the run folder (a resumed run's own), Ctrl-C, refused writes
        return train(run.args, run)


if __name__ == "__main__":
    ppolab.run_program(main, Args)
