"""PPO on Atari through ale-py and Gymnasium 1.x (BreakoutNoFrameskip-v4 by default).

Run:
    python ppo_atari.py --env-id Breakout        # or BreakoutNoFrameskip-v4, ALE/Breakout-v5, Pong, ...
    tensorboard --logdir runs

What this file shows, top to bottom: PPO with the 9 Atari details of "The 37 Implementation Details of PPO"
(Huang et al. 2022): no-op reset, max-and-skip 4, episodic life, fire on reset, reward clipping, 84x84 grayscale
and frame stack 4 (the wrappers of `make_env`), a Nature CNN shared by actor and critic and pixels scaled to
[0, 1] (`Agent`). PPO ends at the banner after `train`; below it are this script's input checks, its evaluation
and the entry point (the rest of a run is the package ppolab's).

What is special in this file (the places where Atari scripts usually go wrong): same-step autoreset, so every
stored transition is real (`make_envs`); a lost life ends the learning episode, not the game (`EpisodicLife`),
and the score logged is the whole game's, unclipped (`finished_episodes`); a time-limit truncation bootstraps
(`--no-bootstrap-truncation`: as older scripts); every id of a game is the same environment (`make_env`);
frames stay uint8, channels-last.
"""

import os
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

# Before PyTorch loads OpenMP: an idle pool thread sleeps, not spins (a spinning one takes CPU time from the thread
# the pool waits for when a core is busy: benchmark/results/speed.md, Pixel scripts). Your own policy is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch.distributions.categorical import Categorical

import ppolab

gym.register_envs(ale_py)  # registers BreakoutNoFrameskip-v4, ALE/Breakout-v5, ...
ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no ALE banner on stderr from every process


@dataclass
class Args(ppolab.RunSettings):  # and every run's settings: --seed, --cuda, --track, --resume, ...
    # PPO's hyperparameters (the defaults are the published ones)
    env_id: str = "BreakoutNoFrameskip-v4"
    """the Atari game: `Breakout` (read as `BreakoutNoFrameskip-v4`), `BreakoutNoFrameskip-v4` or `ALE/Breakout-v5`"""
    total_timesteps: int = 10_000_000
    """total timesteps of the experiment"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
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
    clip_coef: float = 0.1
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
    """bootstrap the value of the final observation at a time-limit truncation (off: treat it as termination)"""
    max_episode_steps: int = 27_000
    """agent steps after which a game is truncated (ALE stops it at 4x this many frames: the usual 108,000)"""

    # This script's own run settings (those of every script: ppolab.RunSettings)
    torch_threads: int = 2
    """CPU threads for PyTorch and NumPy's BLAS (0 keeps their defaults)"""

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
    """The vector environment, with same-step autoreset: the step that ends an episode returns the next one's first
    observation (the last one in `info["final_obs"]`), so no stored transition spans two episodes (Gymnasium's
    default resets on the next step, a fake transition). The games step one after the other in this process
    (faster than a process per game: benchmark/results/speed.md, Pixel scripts)."""
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
    """PPO on args.env_id, from scratch or on from --resume's checkpoint; `run` (the package's) writes everything
    the run reports into its folder, which train returns."""
    ppolab.seed_everything(args.seed, args.torch_deterministic)  # same seed, same thread count: same numbers
    torch.distributions.Distribution.set_default_validate_args(False)  # no argument checks: costlier than the math
    device = ppolab.pick_device(args.cuda)

    envs = make_envs(args, args.num_envs, run.dir, args.capture_video)
    agent = Agent(int(envs.single_action_space.n)).to(device)
    # fused: one kernel for all parameters. The learning rate is a tensor, annealed in place without a recompile
    learning_rate = torch.tensor(args.learning_rate, device=device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=learning_rate, eps=1e-5, fused=True)
    kl_beta = torch.tensor(args.kl_beta, device=device)  # PPO-Penalty's beta (adapt_kl_beta changes it in place)
    saved = {"model": agent, "optimizer": optimizer, "kl_beta": kl_beta}  # besides progress, RNG and args
    start_iteration, global_step = run.start(saved)  # --resume's checkpoint restored; 1, 0 for a new run

    # --compile runs the same two functions through torch.compile; --cudagraphs also records their kernels
    # in CUDA graphs and replays them (one launch per call; its outputs are reused, so the loop clones them)
    act, update = agent.act, partial(update_step, agent, optimizer, args, kl_beta)
    if args.compile or args.cudagraphs:
        mode = "reduce-overhead" if args.cudagraphs else None
        act = torch.compile(agent.act, mode=mode)
        update = partial(torch.compile(update_step, mode=mode), agent, optimizer, args, kl_beta)

    # Rollout storage on the CPU, shared with NumPy. Frames stay uint8, allocated (T, N, 84, 84, 4) and viewed as
    # (T, N, 4, 84, 84): a step is transposed once, every minibatch is channels-last; pinned on CUDA (no blocking)
    T, N = args.num_steps, args.num_envs
    obs_shape = envs.single_observation_space.shape  # (4, 84, 84)
    obs = torch.zeros(
        (T, N) + obs_shape[1:] + obs_shape[:1], dtype=torch.uint8, pin_memory=device.type == "cuda"
    ).permute(0, 1, 4, 2, 3)
    actions = torch.zeros((T, N), dtype=torch.long)
    logprobs, rewards, dones, values = (torch.zeros((T, N)) for _ in range(4))
    final_values = torch.zeros((T, N))  # value where an episode ended (see compute_gae)
    actions_np, logprobs_np, rewards_np, dones_np, values_np = (
        x.numpy() for x in (actions, logprobs, rewards, dones, values)
    )

    # A resumed run reseeds its environments differently, so it does not replay the first games
    next_obs, _ = envs.reset(seed=args.seed + global_step)
    for iteration in range(start_iteration, args.num_iterations + 1):
        lr = args.learning_rate * (1.0 - (iteration - 1.0) / args.num_iterations if args.anneal_lr else 1.0)
        learning_rate.fill_(lr)  # annealed linearly to 0 over the run (detail 4)

        # COLLECT TRAJECTORIES ------------------------------------------------------------------
        rollout_start = time.perf_counter()
        final_values.zero_()
        final_obs, final_steps, final_envs = [], [], []  # truncated games' last observations, and where
        for step in range(T):
            global_step += N
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
            for i, episodic_return, episodic_length in finished_episodes(infos):
                run.episode(global_step - N + i + 1, episodic_return, episodic_length)  # at the step it ended

        # CALCULATE ADVANTAGES ------------------------------------------------------------------
        # the values after the last step and where truncated games stopped, in one forward pass
        with torch.no_grad():
            bootstrap_values = agent.get_value(torch.from_numpy(np.stack([*next_obs, *final_obs])).to(device)).cpu()
        last_value = bootstrap_values[:N]
        final_values[final_steps, final_envs] = bootstrap_values[N:]
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
        b_obs = obs.reshape((-1,) + obs_shape).to(device)  # a view: still channels-last
        b_actions = actions.reshape(-1).to(device)
        b_logprobs = logprobs.reshape(-1).to(device)
        b_advantages = advantages.reshape(-1).to(device)
        b_returns = returns.reshape(-1).to(device)
        b_values = values.reshape(-1).to(device)

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
# PPO ENDS HERE. What follows is what is particular to this script's run: its input checks, how its
# policy plays an evaluation, and the entry point. The rest of a run (the run folder, checkpoints and
# resuming, logging, Ctrl-C and full disks) is the package ppolab's; none of it changes what PPO computes.
# ==================================================================================================


def check_args(args: Args):
    """Bad input ends in one line before any work: the checks of every script (numbers, counts, the batch,
    files, folders), then that the game is an Atari game."""
    ppolab.check_args(
        args, positive=("max_episode_steps",), batch=f"--num-envs {args.num_envs} x --num-steps {args.num_steps}"
    )
    ppolab.check_atari_game(args, atari_id(args.env_id))


def evaluate(checkpoint: dict, episodes: int, deterministic: bool, seed: int, *, video_prefix: str | None = None):
    """Plays `episodes` whole games (all lives), one per environment, with the training preprocessing and the
    policy of `checkpoint` (a saved model, or a snapshot of the training) on the CPU, and returns their scores
    (unclipped). The games and the action sampling come from `seed`, so the same model scores the same whether
    evaluated during training, after it or later from the saved file. `video_prefix` (`--evaluate
    --capture-video`): records the game of environment 0 (the first) with RecordVideo, the unpreprocessed RGB
    frames, as `<video_prefix>-episode-0.mp4`."""
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
    scores = np.full(episodes, np.nan)
    obs, _ = envs.reset(seed=seed)
    while np.isnan(scores).any():
        with torch.no_grad():
            logits = agent.actor(agent.features(torch.as_tensor(obs)))
            action = logits.argmax(-1) if deterministic else Categorical(logits=logits).sample()
        obs, _, _, _, infos = envs.step(action.numpy())
        for i, score, _ in finished_episodes(infos):
            if np.isnan(scores[i]):
                scores[i] = score
    envs.close()
    return scores.tolist()


def main(args: Args) -> str | list[float]:
    """Checks the arguments, then trains (returns the run folder) or with --evaluate evaluates (returns the scores)."""
    check_args(args)
    ppolab.use_threads(args.torch_threads)
    if args.evaluate is not None:
        return ppolab.evaluate_file(args, evaluate, atari_id)
    with ppolab.Run(args, evaluate, atari_id) as run:  # the run folder (a resumed run's own), Ctrl-C, refused writes
        return train(run.args, run)


if __name__ == "__main__":
    ppolab.run_program(main, Args)
