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
buy speed, not a different algorithm (tests/test_multigpu.py checks the gradient).

To learn data-parallel PPO, read `train` (its distributed steps are marked DISTRIBUTED), `update_step`,
`all_reduce_gradients` and `global_advantage_stats`; below the banner, `broadcast_weights`,
`RolloutReport` and `Preemption`. PPO ends at the banner after `train`; below it is the machinery a run
needs (input checks, checkpoints, evaluation, logging, Ctrl-C and full disks) and the plumbing of the
job (joining it, the messages between ranks, timing the collectives).

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
  collectives (`perf/comm_time`, waits for slower ranks included).
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

import contextlib
import copy
import errno
import hashlib
import io
import json
import math
import os
import pickle
import random
import signal
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import NamedTuple

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import tyro
from torch.distributions.categorical import Categorical

gym.register_envs(ale_py)  # registers BreakoutNoFrameskip-v4, ALE/Breakout-v5, ...
ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no ALE banner on stderr from every process


@dataclass
class Args:
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
    bootstrap_truncation: bool = True
    """bootstrap the value of the final observation at a time-limit truncation (off: treat it as termination)"""
    max_episode_steps: int = 27_000
    """agent steps after which a game is truncated: ALE stops it at 4x this many frames (27,000 = 108,000 frames, the usual limit)"""
    preempt_fraction: float | None = None
    """straggler preemption (DD-PPO): once this fraction of the ranks finished their rollouts, the others end theirs
    early; the run then takes more iterations to reach --total-timesteps (off by default)"""
    preempt_min_steps: float = 0.25
    """with --preempt-fraction: the fraction of its --num-steps a rank collects before it may be preempted"""

    # The run: where it goes, what it records, how it runs
    exp_name: str = Path(__file__).stem
    """the name of this experiment (part of the run folder's name)"""
    seed: int = 1
    """seed of the experiment (rank r's PyTorch, NumPy and Python RNGs get seed + r)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True` and TF32 off (convolutions in full float32)"""
    cuda: bool = True
    """if toggled, cuda is used when available (one GPU per local rank, see --device-ids)"""
    device_ids: list[int] | None = None
    """GPUs of this machine's ranks: local rank i uses device_ids[i % len]; `--device-ids 0` puts all on GPU 0
    (several ranks per GPU need the gloo backend); default: local rank i uses GPU i"""
    backend: str | None = None
    """torch.distributed backend: `gloo` or `nccl`; default nccl on CUDA (with a PyTorch built with NCCL), else gloo"""
    timeout: float = 300.0
    """seconds a collective waits for the other ranks before the job fails (a dead or hung rank)"""
    sync_timing: bool = False
    """if toggled, on CUDA the GPU is synchronized around every timed collective, so perf/comm_time is the
    collectives' own time (costs two syncs per minibatch; off: see CommTimer for what is measured)"""
    torch_threads: int = 1
    """CPU threads for PyTorch per process; 1, because the ranks of a machine share its cores; 0 keeps PyTorch's default"""
    compile: bool = False
    """torch.compile the policy step and the update step (the all-reduce stays eager). Off, as in ppo_atari.py
    (why: its --compile): on the CPU it pays only over millions of steps, after minutes of compiling in every rank"""
    cudagraphs: bool = False
    """capture the compiled policy step and update step in CUDA graphs (CUDA only; implies --compile)"""
    track: bool = False
    """if toggled, the run is tracked with Weights & Biases (by rank 0)"""
    wandb_project_name: str = "ppo-lab"
    """the Weights & Biases project name"""
    wandb_entity: str | None = None
    """the entity (team) of the Weights & Biases project"""
    capture_video: bool = False
    """if toggled, videos of rank 0's environment 0 (the unpreprocessed RGB frames) are saved to `runs/<run>/videos`"""
    save_model: bool = False
    """if toggled, the final model is saved to `runs/<run>/model.pt` and evaluated (by rank 0)"""
    checkpoint_every: int = 0
    """write a resumable `runs/<run>/checkpoint.pt` every this many iterations (0: never), by rank 0"""
    resume: str | None = None
    """path of a checkpoint to continue from (rank 0 reads it); only --total-timesteps and machine flags may change"""
    evaluate: str | None = None
    """path of a checkpoint or model to evaluate; evaluates (on rank 0) and exits without training"""
    eval_every: int = 0
    """evaluate every this many iterations (--eval-episodes on a separate environment) and keep the best
    model as `runs/<run>/best_model.pt` (0: never, the default: each evaluation pauses training; its cost, as
    ppo_atari.py's, is in benchmark/results/evaluation.md; rank 0 evaluates while the other ranks wait in
    their next collective, so it must end within --timeout)"""
    eval_episodes: int = 10
    """number of episodes (whole games) of an evaluation"""
    eval_deterministic: bool = False
    """if toggled, evaluation takes the most probable action instead of sampling"""
    runs_dir: str = "runs"
    """folder under which each run writes its own folder"""

    # testing aids (fault injection for benchmarks/tests) -------------------------------------------
    straggler_delay: float = 0.0
    """testing aid, a fault injected for benchmarks and tests (not for training): seconds the last rank
    sleeps after each of its environment steps, which makes it a straggler"""

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


def make_env(
    env_id: str,
    idx: int,
    capture_video: bool,
    run_dir: str,
    max_episode_steps: int = 27_000,
    video_prefix: str = "rl-video",
    video_trigger=None,
):
    """A thunk that builds one Atari environment with the standard preprocessing (bottom to top):

    | wrapper                   | whose      | does                                                    |
    |---------------------------|------------|---------------------------------------------------------|
    | RecordVideo (env 0)       | Gymnasium  | `--capture-video`: the unpreprocessed RGB frames         |
    | NoopReset                 | ours       | 1 to 30 no-op frames after a reset                      |
    | MaxAndSkip                | ours       | action repeated 4 frames, max of the last two frames    |
    | RecordEpisodeStatistics   | Gymnasium  | the game score: unclipped reward over all lives, length |
    |                           |            | in agent steps; `info["episode"]` at the game's end     |
    | EpisodicLife              | ours       | lost life = terminated, the game goes on                |
    | FireReset (if FIRE)       | ours       | FIRE after every reset                                  |
    | TransformReward(np.sign)  | Gymnasium  | reward clipped to its sign, -1, 0 or 1                  |
    | ResizeObservation(84, 84) | Gymnasium  | cv2.resize with INTER_AREA                              |
    | FrameStackObservation(4)  | Gymnasium  | the last 4 frames, (4, 84, 84) uint8; a reset repeats   |
    |                           |            | its first frame                                         |

    Grayscale comes from ALE itself (`obs_type="grayscale"`: ALE's luminance palette, the same values
    as OpenCV's RGB2GRAY of the RGB screen on all 110 colours we met in 11 games), so the max of the
    last two frames is taken in grayscale, as envpool, ale-py's vector environment and Gymnasium's
    AtariPreprocessing do (OpenAI Baselines' wrappers take it in RGB, then convert).

    Every id is made with the v4 NoFrameskip settings: ale-py registers BreakoutNoFrameskip-v4 with
    frameskip=1, repeat_action_probability=0, full_action_space=False and ALE/Breakout-v5 with
    frameskip=4, repeat_action_probability=0.25; both with max_num_frames_per_episode=108,000 and no
    TimeLimit. We pass all four settings explicitly (ALE truncates the game at 4 x `max_episode_steps`
    frames), so `Breakout`, `BreakoutNoFrameskip-v4` and `ALE/Breakout-v5` are the same environment.
    """

    def thunk():
        settings = dict(
            obs_type="grayscale",
            frameskip=1,
            repeat_action_probability=0.0,
            full_action_space=False,
            max_num_frames_per_episode=4 * max_episode_steps,
        )
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array", **settings)
            env = gym.wrappers.RecordVideo(
                env, f"{run_dir}/videos", name_prefix=video_prefix, episode_trigger=video_trigger, disable_logger=True
            )
        else:
            env = gym.make(env_id, **settings)
        env = NoopReset(env, noop_max=30)
        env = MaxAndSkip(env, skip=4)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = EpisodicLife(env)
        if "FIRE" in env.unwrapped.get_action_meanings():
            env = FireReset(env)
        env = gym.wrappers.TransformReward(env, np.sign)
        env = gym.wrappers.ResizeObservation(env, (84, 84))
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
    return gym.vector.SyncVectorEnv(
        [
            make_env(
                atari_id(args.env_id), i, capture_video, run_dir, args.max_episode_steps, video_prefix, video_trigger
            )
            for i in range(num_envs)
        ],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


def finished_episodes(infos: dict) -> list[tuple[int, float, int]]:
    """The episodes (whole games) that ended at this vector step: (env index, episodic return, length
    in agent steps).

    RecordEpisodeStatistics sits below EpisodicLife, so it reports whole games, and their return is
    the unclipped game score. With same-step autoreset the vector environment moves the info of a
    step that ended an episode to `info["final_info"]` and returns the reset's info at the top level;
    a game ends in the former at its last step, or, rarely, in the latter when it ended during a
    reset's own steps (a truncation during the no-op after a lost life, see `step_in_reset`).
    """
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
    """The Nature CNN (Mnih et al. 2015) shared by a policy head (std 0.01) and a value head (std 1).

    Input: uint8 frames (B, 4, 84, 84), scaled to [0, 1] here. Weights are kept channels-last; the
    result is the same network, computed in the layout oneDNN's CPU convolutions prefer.
    """

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
    obs: torch.Tensor,
    actions: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    adv_stats: torch.Tensor,
    comm: "CommTimer",
    comm_device: torch.device,
) -> dict[str, torch.Tensor]:
    """One gradient step on this rank's piece of one global minibatch: forward, advantage normalisation
    with the global minibatch's (mean, std) `adv_stats`, the PPO loss, backward, THE ALL-REDUCE of the
    gradients and statistics (timed by `comm`), global gradient clipping of the averaged gradient, the
    optimizer step. Returns the all-reduced statistics of `ppo_loss`, `ranks_over_target` (the share of
    ranks whose own approx_kl exceeded --target-kl) and this rank's `ratio_deviation` (max |ratio - 1|
    before the step), all as tensors.

    One function so that `--compile` hands it to torch.compile as it stands; the collective runs
    eagerly between the compiled pieces (CommTimer.__call__).
    """
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
    if args.norm_adv:
        advantages = (advantages - adv_stats[0]) / (adv_stats[1] + 1e-8)
    loss, stats = ppo_loss(newlogprob, entropy, newvalue, logprobs, advantages, returns, values, args)
    optimizer.zero_grad()
    loss.backward()
    # A diagnostic, not a decision: would this rank, from its own KL alone, stop here? Averaged over
    # the ranks it says whether they would have disagreed (see the training loop)
    own_kl_over_target = torch.zeros((), device=loss.device)
    if args.target_kl is not None:
        own_kl_over_target = (stats["approx_kl"] > args.target_kl).float()
    # DISTRIBUTED: the gradient and the statistics of the global minibatch, on every rank
    params = list(agent.parameters())
    averaged = comm(
        all_reduce_gradients, params, obs.shape[0], torch.stack([*stats.values(), own_kl_over_target]), comm_device
    )
    stats = dict(zip(stats, averaged[:-1]))
    nn.utils.clip_grad_norm_(params, args.max_grad_norm)  # of the averaged gradient
    optimizer.step()
    stats["ranks_over_target"] = averaged[-1]
    stats["ratio_deviation"] = (newlogprob.detach() - logprobs).exp().sub(1).abs().max()
    return stats


# TRAINING ----------------------------------------------------------------------------------------


def train(
    args: Args,
    run_dir: str,
    checkpoint: dict | None,
    rank: int,
    world_size: int,
    device: torch.device,
    comm_device: torch.device,
) -> str:
    """One rank's PPO on args.env_id from scratch, or on from `checkpoint` (--resume): every rank runs this
    loop in step with the others (the steps that involve them are marked DISTRIBUTED); rank 0 also writes
    everything the run writes to run_dir, which it returns. The collectives reduce on `comm_device`."""
    # Seeding: rank r seeds its RNGs with seed + r, so the ranks sample different actions
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed + rank)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_deterministic:  # cuDNN's float32 convolutions and LSTMs in full float32, not TF32
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        torch.backends.cudnn.rnn.fp32_precision = "ieee"
    torch.distributions.Distribution.set_default_validate_args(False)  # checks cost more than tiny samples

    T, N = args.num_steps, args.num_envs // world_size  # this rank's environments
    envs = make_envs(args, N, run_dir, args.capture_video and rank == 0)
    agent = Agent(int(envs.single_action_space.n)).to(device)
    # fused: one kernel for all parameters instead of a loop of small ones (same update, less overhead).
    # The learning rate is a tensor that annealing overwrites in place: a compiled optimizer step reads
    # it as data, where a Python float would be a constant of the compiled code (a recompile per update)
    learning_rate = torch.tensor(args.learning_rate, device=device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=learning_rate, eps=1e-5, fused=True)
    start_iteration, global_step = restore(checkpoint, agent, optimizer, args)  # 1, 0 for a new run
    broadcast_weights(agent, comm_device)  # DISTRIBUTED: every rank starts from rank 0's weights
    log = RunLog(args, run_dir, global_step, device) if rank == 0 else None  # rank 0 logs every rank's data

    # --compile runs the same two functions through torch.compile; --cudagraphs also records their kernels
    # in CUDA graphs and replays them (one launch per call; its outputs are reused, so the loop clones them)
    act, update = agent.act, update_step
    if args.compile or args.cudagraphs:
        mode = "reduce-overhead" if args.cudagraphs else None
        act, update = torch.compile(agent.act, mode=mode), torch.compile(update_step, mode=mode)

    # Rollout storage of this rank, on the CPU and shared with NumPy, as in ppo_atari.py: observations
    # uint8 and channels-last, allocated (T, N, 84, 84, 4) and viewed as (T, N, 4, 84, 84); on CUDA in
    # pinned memory, so the copy of a step's frames to the device does not block
    obs_shape = envs.single_observation_space.shape  # (4, 84, 84)
    obs = torch.zeros(
        (T, N) + obs_shape[1:] + obs_shape[:1], dtype=torch.uint8, pin_memory=device.type == "cuda"
    ).permute(0, 1, 4, 2, 3)
    actions = torch.zeros((T, N), dtype=torch.long)
    logprobs = torch.zeros((T, N))
    rewards = torch.zeros((T, N))
    dones = torch.zeros((T, N))
    values = torch.zeros((T, N))
    final_values = torch.zeros((T, N))  # value where an episode ended (see compute_gae)
    actions_np, logprobs_np, rewards_np, dones_np, values_np = (
        x.numpy() for x in (actions, logprobs, rewards, dones, values)
    )
    preemption = make_preemption(args, world_size)  # DISTRIBUTED: straggler preemption (None: off)
    straggler_delay = args.straggler_delay if rank == world_size - 1 else 0.0  # a testing aid

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
            if straggler_delay:
                time.sleep(straggler_delay)

            rewards_np[step] = reward  # clipped to the sign in make_env
            dones_np[step] = terminated | truncated
            # next_obs is already the next episode's first observation where an episode ended. Gymnasium's
            # TimeLimit sets truncated on the last allowed step even when the episode also terminated
            # there: such a step is a termination (value 0), so only truncated-and-not-terminated
            # environments bootstrap, with the value of final_obs, computed after the rollout
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
        comm = CommTimer(device, args.sync_timing)
        reports = comm(
            all_gather, RolloutReport(steps * N, episodes, rollout_time, ValueSums.of(values[:steps], returns))
        )
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

        clipfracs = []  # every minibatch's (all-reduced) clip fraction, as tensors: no sync per minibatch
        epochs, kl_stop_disagreements = 0, torch.zeros(())
        for epoch in range(args.update_epochs):
            minibatches = torch.randperm(steps * N, device=device).tensor_split(args.num_minibatches)
            adv_stats = torch.zeros((len(minibatches), 2), device=device)
            if args.norm_adv:  # DISTRIBUTED: the advantage statistics of every global minibatch of this epoch
                adv_stats = comm(global_advantage_stats, b_advantages, minibatches, comm_device)
            for k, mb_inds in enumerate(minibatches):
                if args.cudagraphs:
                    torch.compiler.cudagraph_mark_step_begin()
                stats = update(
                    agent,
                    optimizer,
                    args,
                    b_obs[mb_inds],
                    b_actions[mb_inds],
                    b_logprobs[mb_inds],
                    b_advantages[mb_inds],
                    b_returns[mb_inds],
                    b_values[mb_inds],
                    adv_stats[k],
                    comm,
                    comm_device,
                )
                stats = {k: v.clone() for k, v in stats.items()} if args.cudagraphs else stats
                if epoch == 0 and k == 0:
                    # Nothing has been updated yet, so the ratio must be 1 to float precision; a larger
                    # deviation means the stored log-probs do not belong to the stored observations
                    first_ratio_deviation = stats["ratio_deviation"]
                clipfracs.append(stats["clipfrac"])
            epochs += 1
            # a share strictly between 0 and 1: ranks deciding alone would have disagreed, and the one
            # that stopped would have left the others waiting in their next all-reduce (a hang)
            ranks_over_target = stats.pop("ranks_over_target")
            kl_stop_disagreements += ((0 < ranks_over_target) & (ranks_over_target < 1)).cpu()
            # decided from the all-reduced KL of the global minibatch: every rank stops after the same
            # epoch (a sync, only when --target-kl is set)
            if args.target_kl is not None and stats["approx_kl"] > args.target_kl:
                break
        update_time = time.perf_counter() - update_start

        # the losses and KLs of the last minibatch, the clip fraction over the whole update
        stats.update(clipfrac=torch.stack(clipfracs).mean(), ratio_deviation=first_ratio_deviation)
        if rank == 0:  # with every rank's episodes and sums from the reports; the others wait for it
            log.iteration(
                iteration,
                global_step,
                stats,
                learning_rate.item(),
                reports,
                epochs,
                int(kl_stop_disagreements),
                rollout_time,
                update_time,
                comm.seconds,
            )
            evaluate_if_due(args, iteration, global_step, agent, optimizer, run_dir, log)
        checkpoint_if_due(args, iteration, global_step, agent, optimizer, run_dir)  # DISTRIBUTED: all RNGs
        if global_step >= total_steps:  # the same global_step on every rank: they end together
            break

    # DISTRIBUTED: finish checks first that every rank ends with the same weights
    finish(args, envs, agent, optimizer, run_dir, global_step, log, iteration=iteration)
    return run_dir


# ==================================================================================================
# PPO ENDS HERE. What follows is the machinery a run needs around the algorithm: input checks, the
# run folder, checkpoints and resuming, evaluation, logging, Ctrl-C and full disks, the distributed
# plumbing and the entry point. None of it changes what PPO computes.
# ==================================================================================================


# INPUT CHECKS ------------------------------------------------------------------------------------


def fail(message: str):
    """Bad input: one line on stderr naming the problem, exit code 2, before any long work. Under torchrun
    every rank checks the same things, so every rank prints the line and exits 2; the line also goes to
    torchrun's summary of the failed ranks (see tell_torchrun), the last thing torchrun prints."""
    line = f"{Path(sys.argv[0]).name}: error: {message}"
    print(line, file=sys.stderr)
    tell_torchrun(line)
    raise SystemExit(2)


def tell_torchrun(line: str):
    """Under torchrun: writes `line` to this rank's error file (TORCHELASTIC_ERROR_FILE), which torchrun
    reads when the rank fails: its ChildFailedError summary then shows the line as the rank's
    `traceback :` instead of a link to its documentation."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        with open(path, "w") as f:
            # the layout of torch.distributed.elastic's own error files (its @record decorator writes them)
            json.dump(
                {"message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))}}},
                f,
            )


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


def check_args(args: Args, world_size: int):
    """Reject arguments that would crash or silently misbehave later (on every rank, before any collective)."""
    check_numbers(args)
    for name in (
        "total_timesteps",
        "num_envs",
        "num_steps",
        "num_minibatches",
        "update_epochs",
        "eval_episodes",
        "max_episode_steps",
        "timeout",
    ):
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.checkpoint_every < 0 or args.torch_threads < 0 or args.straggler_delay < 0:
        fail("--checkpoint-every, --torch-threads and --straggler-delay must not be negative")
    if args.num_envs % world_size != 0:
        fail(
            f"the world size {world_size} does not divide --num-envs {args.num_envs} (the global number of "
            f"environments); pass a multiple of {world_size}"
        )
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
    if args.preempt_fraction is not None:
        if not 0 < args.preempt_fraction <= 1 or not 0 < args.preempt_min_steps <= 1:
            fail("--preempt-fraction and --preempt-min-steps must be in (0, 1]")
        if math.ceil(args.preempt_min_steps * args.num_steps) * (args.num_envs // world_size) < args.num_minibatches:
            fail("--preempt-min-steps leaves a rank fewer samples than --num-minibatches")
    if args.backend not in (None, "gloo", "nccl"):
        fail(f"--backend must be gloo or nccl, got {args.backend}")
    if args.backend == "nccl" and not (args.cuda and torch.cuda.is_available()):
        fail("--backend nccl needs CUDA (pass --backend gloo, or run on GPUs)")
    if args.device_ids is not None and torch.cuda.is_available():
        bad = [i for i in args.device_ids if not 0 <= i < torch.cuda.device_count()]
        if bad or not args.device_ids:
            fail(f"--device-ids {args.device_ids}: this machine has GPUs 0 to {torch.cuda.device_count() - 1}")
    if args.eval_every < 0:
        fail(f"--eval-every must not be negative, got {args.eval_every}")
    check_tracking(args)
    if args.resume is None and args.evaluate is None:
        check_runs_dir(args.runs_dir)
    for name in ("resume", "evaluate"):
        path = getattr(args, name)
        # only rank 0 reads these files (and sends what it read), so only its machine needs them
        if path is not None and launch_info()[0] == 0 and not Path(path).is_file():
            fail(f"--{name}: no such file: {path}")
    env_id = atari_id(args.env_id)
    try:
        gym.spec(env_id)
    except gym.error.Error:
        fail(
            f"unknown Atari game '{args.env_id}' (python -c 'import gymnasium as gym, ale_py; "
            "gym.register_envs(ale_py); gym.pprint_registry()' lists the ids: Breakout, Pong, ... as "
            "BreakoutNoFrameskip-v4 or ALE/Breakout-v5)"
        )
    try:  # an Atari game is an environment with what the wrappers use: lives and action meanings
        env = gym.make(env_id)
        atari = hasattr(env.unwrapped, "ale") and hasattr(env.unwrapped, "get_action_meanings")
        env.close()
    except gym.error.Error as e:
        fail(f"cannot make {env_id}: {e}")
    if not atari:
        fail(f"{env_id} is not an Atari game; ppo_atari_multigpu.py trains Atari games only")


# THE RUN FOLDER, CHECKPOINTS AND RESUMING ---------------------------------------------------------


def prepare_run(args: Args, rank: int, world_size: int) -> tuple[Args, str, dict | None]:
    """The same (args, run folder, checkpoint) on every rank: a new folder, named by rank 0, for a new run;
    for --resume the checkpoint (read by rank 0 and sent: only its machine needs the file), its saved
    arguments (with the flags that may change) and its folder."""
    if args.resume is not None:
        checkpoint = from_rank0(read_checkpoint(args.resume) if rank == 0 else None)
        if isinstance(checkpoint, str):
            fail(checkpoint)
        saved = resume_args(args, checkpoint)  # the saved arguments, with the flags that may change
        check_args(saved, world_size)  # the saved arguments with this job's world size
        return saved, str(Path(args.resume).parent), checkpoint
    run_dir, problem = None, None
    if rank == 0:
        run_name = f"{atari_id(args.env_id).replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"
        run_dir = f"{args.runs_dir}/{run_name}"
        if os.path.exists(run_dir):
            problem = (
                f"run folder {run_dir} exists already (same env, name and seed started in the same "
                "second); pass another --exp-name"
            )
    run_dir, problem = from_rank0((run_dir, problem))
    if problem:
        fail(problem)
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
    rank_rng: list[dict],
):
    """Everything needed to continue or evaluate: weights, optimizer, progress, args, the RNG states
    of this process (`rng`, rank 0's when rank 0 writes) and of every rank (`rank_rng[r]`, a dict made
    by `rng_state`, for a resume with the same world size): data only. Written by rank 0 (the weights and
    the optimizer are the same on all ranks).

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
        "rank_rng": rank_rng,
    }
    write_checkpoint_file(checkpoint, path)


def checkpoint_if_due(
    args: Args, iteration: int, global_step: int, agent: Agent, optimizer: torch.optim.Optimizer, run_dir: str
):
    """--checkpoint-every N: `run_dir/checkpoint.pt` after every N-th iteration, written by rank 0 with the
    random streams of every rank (one all_gather, on every rank)."""
    if args.checkpoint_every and iteration % args.checkpoint_every == 0:
        rank_rng = all_gather(rng_state(next(agent.parameters()).device))
        if dist.get_rank() == 0:
            save_checkpoint(
                f"{run_dir}/checkpoint.pt", agent, optimizer, args, iteration, global_step, rank_rng=rank_rng
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
    "backend",
    "device_ids",
    "timeout",
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
    """--resume, on every rank: the weights, the optimizer's state and, when the job has the world size that
    wrote `checkpoint`, this rank's random streams (with another world size each rank keeps its new seed's);
    returns the first iteration to run and the global step (1 and 0 for a new run)."""
    if checkpoint is None:
        return 1, 0
    learning_rate = optimizer.param_groups[0]["lr"]  # the tensor that annealing fills
    agent.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    optimizer.param_groups[0]["lr"] = learning_rate  # loading put the saved float there
    if len(checkpoint["rank_rng"]) == dist.get_world_size():  # every rank continues its own streams
        set_rng_state(checkpoint["rank_rng"][dist.get_rank()], next(agent.parameters()).device)
    if dist.get_rank() == 0:
        print(
            f"resumed from {args.resume} at iteration {checkpoint['iteration']}, global step "
            f"{checkpoint['global_step']}"
        )
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
    """Plays `episodes` whole games (all lives), one per environment, with the training preprocessing,
    and returns their returns (the unclipped game scores). The action sampling uses its own seeded RNG
    stream, so the same model and seed score the same right after training and later from the saved file.
    `video_prefix` (`--evaluate --capture-video`): records the game of environment 0 (the first) with
    RecordVideo, the unpreprocessed RGB frames, as `<video_prefix>-episode-0.mp4`."""
    # environment 0 records its first episode to <run_dir>/videos (the videos folder's parent), named by the prefix
    envs = make_envs(
        args,
        episodes,
        str(Path(video_prefix or ".").parent.parent),
        video_prefix is not None,
        video_prefix=Path(video_prefix or "rl-video").name,
        video_trigger=lambda episode: episode == 0,
    )
    returns = np.full(episodes, np.nan)
    obs, _ = envs.reset(seed=seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        while np.isnan(returns).any():
            with torch.no_grad():
                logits = agent.actor(agent.features(torch.as_tensor(obs, device=device)))
                action = logits.argmax(-1) if deterministic else Categorical(logits=logits).sample()
            obs, _, _, _, infos = envs.step(action.cpu().numpy())
            for i, episodic_return, _ in finished_episodes(infos):
                if np.isnan(returns[i]):
                    returns[i] = episodic_return
    envs.close()
    return returns.tolist()


def evaluate_if_due(
    args: Args,
    iteration: int,
    global_step: int,
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    run_dir: str,
    log: "RunLog",
):
    """--eval-every N, on rank 0: after every N-th iteration the policy as it is now plays --eval-episodes on a
    separate environment with its own seeded RNG stream (the same episodes every time, those of the final
    evaluation); the best evaluation's model is kept as `run_dir/best_model.pt`. The other ranks go on to
    their next collective and wait there for rank 0."""
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
            f"{run_dir}/best_model.pt",
            agent,
            optimizer,
            args,
            iteration,
            global_step,
            rank_rng=[rng_state(next(agent.parameters()).device)],
        )
    print(
        f"evaluation at global_step={global_step}: mean return {np.mean(returns):.2f} (best, in "
        f"best_model.pt: {log.best_return:.2f}; {time.perf_counter() - eval_start:.1f}s)",
        flush=True,
    )


def run_evaluation(path: str, args: Args) -> list[float]:
    """`--evaluate PATH`: scores a saved model or checkpoint on the game it was trained on (one process)."""
    checkpoint = load_checkpoint(path)
    saved = Args(**checkpoint["args"])
    env = gym.make(atari_id(saved.env_id))
    agent = Agent(int(env.action_space.n))
    env.close()
    agent.load_state_dict(checkpoint["model"])
    # the trained run's seed: the same games as the evaluation reported right after training
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
        f"evaluation of {path} on {atari_id(saved.env_id)}: {len(returns)} episodes, "
        f"mean return {np.mean(returns):.2f} +- {np.std(returns):.2f}"
    )
    if video_prefix is not None:
        videos = sorted(Path(video_prefix).parent.glob(f"{Path(video_prefix).name}-*.mp4"))
        print(f"videos of the evaluation in {Path(video_prefix).parent}: {', '.join(v.name for v in videos)}")
    return returns


# LOGGING AND THE END OF A RUN --------------------------------------------------------------------


class ValueSums(NamedTuple):
    """Sums over one rank's samples (float64) from which the explained variance of the values follows:
    added up over the ranks they give the numbers of one process on all samples (see
    `explained_variance`). y are the returns, e = y - values the errors."""

    count: int
    y: float
    y_squared: float
    e: float
    e_squared: float

    @classmethod
    def of(cls, values: torch.Tensor, returns: torch.Tensor) -> "ValueSums":
        y, e = returns.double().numpy().ravel(), (returns - values).double().numpy().ravel()
        return cls(y.size, y.sum(), (y**2).sum(), e.sum(), (e**2).sum())


def explained_variance(sums: list[ValueSums]) -> float:
    """1 - Var(returns - values) / Var(returns) over every rank's samples, from the ranks' ValueSums
    (nan when the returns do not vary): what one process computes on the concatenated samples."""
    n, y, y_squared, e, e_squared = (sum(column) for column in zip(*sums))
    var_y = y_squared / n - (y / n) ** 2
    return float("nan") if var_y <= 0 else float(1 - (e_squared / n - (e / n) ** 2) / var_y)


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
    """What a run reports, written by rank 0 with the data of every rank: the run folder and its TensorBoard
    scalars (charts/, losses/, debug/, perf/, eval/), the per-iteration line, and Weights & Biases with
    --track. Creating it creates the run folder."""

    def __init__(self, args: Args, run_dir: str, global_step: int, device: torch.device):
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

        world_size = dist.get_world_size()
        self.writer = SummaryWriter(run_dir)
        self.writer.add_text(
            "hyperparameters",
            "|param|value|\n|-|-|\n"
            + "\n".join(f"|{k}|{v}|" for k, v in {**asdict(args), "world_size": world_size}.items()),
        )
        print(
            f"{world_size} ranks x {args.num_envs // world_size} environments, backend {dist.get_backend()}, "
            f"rank 0 on {device}"
        )
        self.args, self.run_dir, self.progress = args, run_dir, ProgressLine()
        self.start_time, self.start_step = time.time(), global_step
        self.best_return = float("-inf")  # the best evaluation's mean (--eval-every)

    def iteration(
        self,
        iteration: int,
        global_step: int,
        stats: dict[str, torch.Tensor],
        learning_rate: float,
        reports: list["RolloutReport"],
        epochs: int,
        kl_stop_disagreements: int,
        rollout_time: float,
        update_time: float,
        comm_time: float,
    ):
        """The iteration's scalars (the statistics copied from the device at once), the episodes of every
        rank's report at the steps they ended, and, when due, the iteration's line."""
        args, writer = self.args, self.writer
        stats = dict(zip(stats, torch.stack(list(stats.values())).tolist()))
        first_ratio_deviation = stats.pop("ratio_deviation")
        sps = int((global_step - self.start_step) / (time.time() - self.start_time))
        writer.add_scalar("charts/learning_rate", learning_rate, global_step)
        for name, value in stats.items():
            writer.add_scalar(f"losses/{name}", value, global_step)
        writer.add_scalar(
            "losses/explained_variance", explained_variance([report.value_sums for report in reports]), global_step
        )
        writer.add_scalar("charts/SPS", sps, global_step)
        writer.add_scalar("debug/first_minibatch_ratio_deviation", first_ratio_deviation, global_step)
        writer.add_scalar("debug/update_epochs", epochs, global_step)
        writer.add_scalar("debug/kl_stop_disagreements", kl_stop_disagreements, global_step)
        full = args.num_steps * (args.num_envs // dist.get_world_size())  # a rank's steps, not preempted
        writer.add_scalar("debug/preempted_ranks", sum(report.steps < full for report in reports), global_step)
        writer.add_scalar("perf/rollout_time", rollout_time, global_step)
        writer.add_scalar("perf/rollout_time_max", max(report.rollout_time for report in reports), global_step)
        writer.add_scalar("perf/update_time", update_time, global_step)  # collectives included
        writer.add_scalar("perf/comm_time", comm_time, global_step)  # what it measures: see CommTimer
        episode_returns = []
        for episode in (episode for report in reports for episode in report.episodes):
            writer.add_scalar("charts/episodic_return", episode.episodic_return, episode.step)
            writer.add_scalar("charts/episodic_length", episode.episodic_length, episode.step)
            episode_returns.append(episode.episodic_return)
        total_steps = args.num_iterations * args.batch_size
        line = self.progress.due(episode_returns, last=global_step >= total_steps)
        if line:
            # with --preempt-fraction the number of iterations is unknown in advance: no "/N"
            planned = "" if args.preempt_fraction is not None else f"/{args.num_iterations}"
            eta = str(timedelta(seconds=int((total_steps - global_step) / max(sps, 1))))
            print(
                f"iteration {iteration}{planned} global_step={global_step} {line} SPS={sps} ETA={eta} "
                f"(rollout {rollout_time:.2f}s, update {update_time:.2f}s, comm {comm_time:.2f}s)",
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
    log: RunLog | None,
    *,
    iteration: int,
):
    """The end of a run. On every rank: the weights compared across the ranks (every rank took the same
    optimizer steps, so they must be identical: a difference ends the job in a line naming them), the
    environments closed. On rank 0 (`log`) then: the weights' checksums printed; with --save-model the final
    model saved and evaluated; the logs closed."""
    digest = hashlib.sha256(flatten(list(agent.state_dict().values())).cpu().numpy().tobytes()).hexdigest()[:16]
    digests = all_gather(digest)
    envs.close()
    if len(set(digests)) > 1:
        raise SystemExit(
            f"{Path(sys.argv[0]).name}: rank {dist.get_rank()}: the weights differ across ranks: {digests}"
        )
    if log is None:
        return
    print(f"final weights of the {len(digests)} ranks: sha256 {' '.join(digests)}")
    if args.save_model:
        model_path = f"{run_dir}/model.pt"
        # saved by rank 0 alone, with its own random streams only: a model is for evaluation, or a resume
        save_checkpoint(
            model_path,
            agent,
            optimizer,
            args,
            iteration,
            global_step,
            rank_rng=[rng_state(next(agent.parameters()).device)],
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
    """Where a stopped run can go on from: its last checkpoint (on rank 0's machine) and the command that
    resumes it, under torchrun the job's own command with --resume."""
    checkpoint = Path(run_dir) / "checkpoint.pt"
    if checkpoint.is_file():
        command = f"python {sys.argv[0]}" if launch_info()[2] == 1 else "the same torchrun command with"
        return f"last checkpoint {checkpoint}; continue with: {command} --resume {checkpoint}"
    return f"no checkpoint in {run_dir} (--checkpoint-every N writes one every N iterations)"


def exit_on_ctrl_c(run_dir: str):
    """From here on, Ctrl-C (SIGINT) ends the run with one line on stderr, where its last checkpoint is and
    how to resume from it, and exit code 130 (128 + SIGINT), instead of a KeyboardInterrupt traceback.
    It raises SystemExit, so `finally` blocks still run (leaving the process group). Under torchrun each
    rank gets the signal and prints its line, naming its rank; the checkpoint is on rank 0's machine."""
    rank, _, world_size = launch_info()

    def handler(signum, frame):
        who = "" if world_size == 1 else f"rank {rank}: "
        print(f"{Path(sys.argv[0]).name}: {who}interrupted: {resume_hint(run_dir)}", file=sys.stderr, flush=True)
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


# THE DISTRIBUTED PLUMBING ------------------------------------------------------------------------
# Joining the job and leaving it, the messages between ranks, timing the collectives, preemption's
# counter. Every collective is called by every rank, in the same order: that is the whole protocol.


def launch_info() -> tuple[int, int, int]:
    """(rank, local rank, world size) from torchrun's environment variables; (0, 0, 1) without torchrun."""
    return tuple(
        int(os.environ.get(name, default)) for name, default in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1))
    )


def select_device(args: Args, local_rank: int) -> torch.device:
    """Local rank i uses GPU device_ids[i % len] (default: GPU i % GPU count), or the CPU."""
    if not (args.cuda and torch.cuda.is_available()):
        return torch.device("cpu")
    ids = args.device_ids or list(range(torch.cuda.device_count()))
    return torch.device("cuda", ids[local_rank % len(ids)])


def select_backend(args: Args, device: torch.device) -> str:
    """nccl when every local rank has a GPU of its own (and PyTorch has NCCL), else gloo (NCCL refuses
    two ranks on one GPU)."""
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


def init_distributed(backend: str, world_size: int, timeout: float):
    """Joins the job's process group. Under torchrun, `env://` finds the store of torchrun's rendezvous
    through MASTER_ADDR and MASTER_PORT (and RANK, WORLD_SIZE); without torchrun the process is a world
    of one, with an in-memory store. A collective that waits `timeout` seconds raises instead."""
    kwargs = dict(backend=backend, timeout=timedelta(seconds=timeout))
    if "MASTER_ADDR" in os.environ or world_size > 1:
        dist.init_process_group(init_method="env://", **kwargs)
    else:
        dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1, **kwargs)


def job_store(name: str) -> dist.Store:
    """A client of the job's key-value store (the one torchrun's rendezvous runs, in torchrun's own process
    where it hosts it: it outlives the ranks), with its own keys under `name`: the ranks leave each other
    notes there without a collective (the finished rollouts of preemption, a rank that ended on purpose)."""
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=60)
    )
    # torchrun --max-restarts starts the ranks again in the same store: each start has keys of its own
    return dist.PrefixStore(f"{Path(__file__).stem}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)}/{name}", store)


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
                f"{Path(sys.argv[0]).name}: rank {rank}: lost the other ranks (one died or hung for more than "
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


def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One 1-D tensor holding all `tensors` one after the other (a copy)."""
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten_into(flat: torch.Tensor, tensors: list[torch.Tensor]):
    """The inverse of `flatten`: copies the pieces of `flat` back into `tensors` (in their own layout)."""
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view(t.shape))
        offset += t.numel()


# The Python objects that ranks send each other (the checkpoint and run folder from rank 0, the rollout
# reports, the random states for a checkpoint, the weights' checksums) travel pickled, through
# torch.distributed's object collectives, and unpickling can run code. Here that is safe by construction:
# every pickle was made by a rank of this same job (this file, started by the same launch and joined through
# its rendezvous), never read from a file or taken from outside the job; a checkpoint file is read as data
# only (read_checkpoint) before rank 0 sends what it read. They are pickled by torch.save, not by pickle
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


def broadcast_weights(agent: Agent, comm_device: torch.device):
    """Every rank takes rank 0's weights (one broadcast of all of them, flattened)."""
    tensors = list(agent.state_dict().values())
    flat = flatten(tensors).to(comm_device)
    dist.broadcast(flat, src=0)
    unflatten_into(flat, tensors)


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
    value_sums: ValueSums  # for losses/explained_variance


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

    @torch.compiler.disable
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


def make_preemption(args: Args, world_size: int) -> "Preemption | None":
    """--preempt-fraction: DD-PPO's straggler preemption, counted in the job's store (None: off, or a world
    of one)."""
    if args.preempt_fraction is None or world_size == 1:
        return None
    return Preemption(
        job_store("finished_rollouts"),
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


# THE ENTRY POINT ---------------------------------------------------------------------------------


def main(args: Args) -> str | list[float] | None:
    """Checks the arguments, then trains (returns the run folder) or, with --evaluate, evaluates on rank 0
    (returns the episodes' returns). Training joins the job's process group and leaves it on every path."""
    rank, local_rank, world_size = launch_info()
    check_args(args, world_size)
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    if args.evaluate is not None:
        return run_evaluation(args.evaluate, args) if rank == 0 else None

    device = select_device(args, local_rank)
    backend = select_backend(args, device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    init_distributed(backend, world_size, args.timeout)
    comm_device = device if backend == "nccl" else torch.device("cpu")  # gloo reduces CPU tensors
    with in_the_job(rank, world_size, args.timeout):
        args, run_dir, checkpoint = prepare_run(args, rank, world_size)
        exit_on_ctrl_c(run_dir)  # on every rank: each says where rank 0 writes its checkpoints
        with exit_on_write_error(run_dir):
            return train(args, run_dir, checkpoint, rank, world_size, device, comm_device)


if __name__ == "__main__":
    main(tyro.cli(Args))
