"""Recurrent PPO with one learner process and N rollout worker processes that share memory (CPU).

Run:
    python ppo_shared_memory_lstm.py --env-id CartPole-v1                  # classic control, MLP + LSTM
    python ppo_shared_memory_lstm.py --env-id CartPole-v1 --hide-velocity  # positions only: needs the memory
    python ppo_shared_memory_lstm.py --env-id Pong --num-workers 4 --num-envs-per-worker 2 --seq-len 128 \\
        --clip-coef 0.1 --learning-rate 2.5e-4 --torch-threads 2 --total-timesteps 10000000   # Atari, CNN + LSTM

The defaults are for classic control (ppo.py's settings, 2 workers x 4 envs, 16-step chunks, learning rate
1e-3: see the README, Results, "Memory: CartPole without velocities"); the Pong line is ppo_atari_lstm.py's
settings, so the two files then train the same algorithm.

What this file shows: PPO's data collection spread over processes on one machine, the algorithm unchanged.
The learner (this process) owns the network and the optimizer; each rollout worker (a "spawn" process, one
PyTorch thread) owns `--num-envs-per-worker` environments and a CPU copy of the policy. One iteration:

    learner: publish weights -> Start to every worker -> wait for every Done -> check the slices
             -> GAE -> PPO update -> publish ...
    worker:  copy the weights in -> `collect_rollout`: `--num-steps` steps of its envs into its slice of
             the shared rollout buffer -> Done(episodes, timings, checksum of its slice)

Every rollout comes from the policy the learner is about to update: no stale data, no off-policy correction.
The buffer and the weights are tensors in shared memory, allocated once; the pipes carry small named records,
never tensors, and take turns instead of a lock. PPO ends at the banner after `train`; below it are the
machinery and the processes (shared memory and its handoff rule, the workers, starting and stopping them).

What is special in this file:
- Recurrent PPO with truncated back-propagation through time: the rollout is cut into chunks of `--seq-len`
  steps, the worker saves the LSTM state at the start of every chunk, the state is reset where an episode
  starts inside a chunk, a minibatch is a set of whole chunks replayed from their saved states (ratio 1).
- Reliability: a worker that raises, dies, or leaves a slice other than it reported (a checksum) makes the
  learner name it and stop every worker, before training on the batch; so do Ctrl-C, a full disk and an
  error of the learner; a worker whose learner died exits by itself. Nothing is left in /dev/shm.
- `--hide-velocity` (CartPole, positions only) and `--no-memory` (the LSTM reset at every step) show what the
  memory is for.
- Same-step autoreset, truncation bootstrapped with the LSTM state the final observation was reached with,
  every episode logged at its own step with its true score, as in ppo_atari_lstm.py; `--torch-deterministic`
  turns TF32 off in the learner's cuDNN, so on a GPU the first minibatch's ratio stays 1 to float precision.
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
import traceback
import warnings
import zlib
from dataclasses import asdict, dataclass
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path
from typing import NamedTuple

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.multiprocessing as mp
import torch.nn as nn
import tyro
from torch.distributions.categorical import Categorical

gym.register_envs(ale_py)  # registers PongNoFrameskip-v4, ALE/Pong-v5, ...
ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no ALE banner on stderr from every process


@dataclass
class Args:
    # PPO's hyperparameters (the defaults are for classic control; the Pong line at the top gives Atari's)
    env_id: str = "CartPole-v1"
    """a classic-control id (`CartPole-v1`) or an Atari game (`Pong`, read as `PongNoFrameskip-v4`, or a full id)"""
    hide_velocity: bool = False
    """CartPole only: the agent sees the cart position and the pole angle, not their velocities"""
    memory: bool = True
    """`--no-memory`: reset the LSTM state at every step, so the agent sees only the current observation
    (an ablation: same network and algorithm, no memory)"""
    total_timesteps: int = 500_000
    """total timesteps of the experiment"""
    learning_rate: float = 1e-3
    """the learning rate of the optimizer (2.5e-4 for Atari)"""
    num_workers: int = 2
    """the number of rollout worker processes"""
    num_envs_per_worker: int = 4
    """the number of environments each worker steps"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    seq_len: int = 16
    """the length of the chunks the rollout is cut into for back-propagation through time (divides num_steps)"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches (each a set of whole chunks)"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient (0.1 for Atari)"""
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
    max_episode_steps: int = 27_000
    """Atari only: agent steps after which a game is truncated (ALE stops it at 4x this many frames)"""

    # The run: where it goes, what it records, how it runs
    exp_name: str = Path(__file__).stem
    """the name of this experiment (part of the run folder's name)"""
    seed: int = 1
    """seed of the experiment (environments, PyTorch, NumPy, Python; each worker draws from its own stream)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, the learner uses cuda when available (the workers always act on the CPU)"""
    torch_threads: int = 1
    """CPU threads of the learner's PyTorch (each worker uses 1); 0 keeps PyTorch's default"""
    compile: bool = False
    """torch.compile the learner's update step (the workers' policy step stays eager). Off by default: on a
    2-core CPU it did not pay, for the update step (compiled, it runs the LSTM step by step) nor for a worker's
    policy step, and compiling takes long (benchmark/results/speed_cpu.md); meant for GPU
    learners"""
    cudagraphs: bool = False
    """capture the compiled update step in CUDA graphs (CUDA only; implies --compile; the workers act on the CPU)"""
    track: bool = False
    """if toggled, the run is tracked with Weights & Biases"""
    wandb_project_name: str = "ppo-lab"
    """the Weights & Biases project name"""
    wandb_entity: str | None = None
    """the entity (team) of the Weights & Biases project"""
    capture_video: bool = False
    """if toggled, videos of worker 0's environment 0 are saved to `runs/<run>/videos`"""
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
    model as `runs/<run>/best_model.pt` (0: never, the default: each evaluation pauses training; its cost,
    as ppo.py's on CartPole and as ppo_atari.py's on Atari, is in benchmark/results/evaluation.md)"""
    eval_episodes: int = 10
    """number of episodes of an evaluation"""
    eval_deterministic: bool = False
    """if toggled, evaluation takes the most probable action instead of sampling"""
    runs_dir: str = "runs"
    """folder under which each run writes its own folder"""

    @property
    def num_envs(self) -> int:
        """environments over all workers: num_workers * num_envs_per_worker"""
        return self.num_workers * self.num_envs_per_worker

    @property
    def batch_size(self) -> int:
        """transitions per update: num_envs * num_steps"""
        return self.num_envs * self.num_steps

    @property
    def num_chunks(self) -> int:
        """chunks of seq_len steps per update: num_envs * num_steps / seq_len"""
        return self.num_envs * (self.num_steps // self.seq_len)

    @property
    def num_iterations(self) -> int:
        """updates in the whole run: total_timesteps // batch_size"""
        return self.total_timesteps // self.batch_size


# ENVIRONMENTS ------------------------------------------------------------------------------------


class HideVelocity(gym.ObservationWrapper):
    """Ours. CartPole observes (cart position, cart velocity, pole angle, pole angular velocity); this
    keeps the positions (indices 0 and 2) only. A policy without memory cannot tell where the pole is
    going; one with memory can work the velocities out from consecutive positions."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(space.low[[0, 2]], space.high[[0, 2]], dtype=space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[[0, 2]]


def make_env(
    env_id: str,
    idx: int,
    capture_video: bool,
    run_dir: str,
    *,
    hide_velocity: bool = False,
    max_episode_steps: int = 27_000,
    video_prefix: str = "rl-video",
    video_trigger=None,
):
    """A thunk that builds environment `idx` of a vector environment; with `capture_video`, environment 0
    records videos to `run_dir/videos`.

    Atari games get ppo_atari_lstm.py's preprocessing (bottom to top):

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
    | FrameStackObservation(1)  | Gymnasium  | one frame, (1, 84, 84) uint8: the LSTM remembers        |

    with grayscale from ALE itself and the v4 NoFrameskip settings passed explicitly, so `Pong`,
    `PongNoFrameskip-v4` and `ALE/Pong-v5` are the same environment (see ppo_atari_lstm.py); our
    wrappers are written out below the banner, under ATARI GAMES. Other environments get RecordEpisodeStatistics (return and length) and, with `hide_velocity`,
    HideVelocity below it.
    """
    atari, env_id = is_atari(env_id), atari_id(env_id)
    capture_video = capture_video and idx == 0

    def thunk():
        if not atari:
            if capture_video:
                # classic control draws its frames with pygame: SDL's dummy drivers need no display and no sound
                # card (without them SDL prints "XDG_RUNTIME_DIR is invalid" on a machine without a desktop session)
                os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
                os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
                env = gym.make(env_id, render_mode="rgb_array")
                env = gym.wrappers.RecordVideo(
                    env,
                    f"{run_dir}/videos",
                    name_prefix=video_prefix,
                    episode_trigger=video_trigger,
                    disable_logger=True,
                )
            else:
                env = gym.make(env_id)
            if hide_velocity:
                env = HideVelocity(env)
            return gym.wrappers.RecordEpisodeStatistics(env)
        settings = dict(
            obs_type="grayscale",
            frameskip=1,
            repeat_action_probability=0.0,
            full_action_space=False,
            max_num_frames_per_episode=4 * max_episode_steps,
        )
        if capture_video:
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
        return gym.wrappers.FrameStackObservation(env, 1)  # one frame: the LSTM is the memory

    return thunk


def make_envs(
    args: Args,
    num_envs: int,
    run_dir: str,
    capture_video: bool = False,
    video_prefix: str = "rl-video",
    video_trigger=None,
) -> gym.vector.VectorEnv:
    """One worker's vector environment, stepped in the worker's own process, with same-step autoreset:
    the step that ends an episode returns the next episode's first observation (the last one of the
    old episode is in `info["final_obs"]`), so every stored transition is real experience."""
    return gym.vector.SyncVectorEnv(
        [
            make_env(
                args.env_id,
                i,
                capture_video,
                run_dir,
                hide_velocity=args.hide_velocity,
                max_episode_steps=args.max_episode_steps,
                video_prefix=video_prefix,
                video_trigger=video_trigger,
            )
            for i in range(num_envs)
        ],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


def finished_episodes(infos: dict) -> list[tuple[int, float, int]]:
    """The episodes that ended at this vector step: (env index, return, length in agent steps).

    RecordEpisodeStatistics wraps each environment (for Atari below EpisodicLife, so it reports whole
    games with the unclipped score). With same-step autoreset the vector environment moves the info of
    a step that ended an episode to `info["final_info"]`; an Atari game can also end during a reset's
    own steps (see `step_in_reset`), and then its statistics are in the top-level info.
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


class ActorCriticLSTM(nn.Module):
    """Two LSTMs side by side, the actor's and the critic's, used like one `nn.LSTM` whose input,
    output and state are the two halves concatenated, [actor | critic]: the rest of the file (state
    storage, resets, chunk replay) treats it as one LSTM of twice the hidden size."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.actor, self.critic = nn.LSTM(input_size, hidden_size), nn.LSTM(input_size, hidden_size)
        self.hidden_size = 2 * hidden_size

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]):
        (x_a, x_c), (h_a, h_c), (c_a, c_c) = (t.chunk(2, dim=-1) for t in (x, *state))
        out_a, (h_a, c_a) = self.actor(x_a, (h_a.contiguous(), c_a.contiguous()))
        out_c, (h_c, c_c) = self.critic(x_c, (h_c.contiguous(), c_c.contiguous()))
        return torch.cat((out_a, out_c), -1), (torch.cat((h_a, h_c), -1), torch.cat((c_a, c_c), -1))


class Agent(nn.Module):
    """Encoder -> LSTM -> policy head (std 0.01) and value head (std 1).

    | observations             | encoder                              | LSTM                           |
    |--------------------------|--------------------------------------|--------------------------------|
    | Atari, (1, 84, 84) uint8 | Nature CNN -> 512 (scaled to [0, 1]) | (512, 128), shared             |
    | vectors, (d,) float32    | MLP d -> 64 -> 64, tanh, one each    | (64, 64), one each for the     |
    |                          | for the actor and the critic         | actor and the critic           |

    Atari shares one CNN and LSTM between the heads, as ppo_atari_lstm.py does (clipped rewards keep
    the values small). Classic control gets separate actor and critic towers, as ppo.py has separate
    actor and critic networks: CartPole's values reach about 100, and with one shared LSTM the value
    loss's gradients pulled the shared features away from the policy's (measured: see the README,
    "One learner, many rollout workers" and Results).

    The recurrent state is a pair (h, c), each (1, B, H): one layer, B environments (for the towers,
    H = 128 = the actor's 64 then the critic's 64).
    """

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int):
        super().__init__()
        self.pixels = len(obs_shape) == 3
        if self.pixels:
            self.network = nn.Sequential(
                layer_init(nn.Conv2d(obs_shape[0], 32, 8, stride=4)),
                nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)),
                nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)),
                nn.ReLU(),
                nn.Flatten(),
                layer_init(nn.Linear(64 * 7 * 7, 512)),
                nn.ReLU(),
            )
            self.lstm = nn.LSTM(512, 128)
            head_size = 128
        else:

            def tower():
                return nn.Sequential(
                    layer_init(nn.Linear(int(np.prod(obs_shape)), 64)),
                    nn.Tanh(),
                    layer_init(nn.Linear(64, 64)),
                    nn.Tanh(),
                )

            self.network, self.critic_network = tower(), tower()
            self.lstm = ActorCriticLSTM(64, 64)
            head_size = 64
        for name, param in self.lstm.named_parameters():  # recurrent detail 1: orthogonal, zero bias
            if "bias" in name:
                nn.init.constant_(param, 0)
            elif "weight" in name:
                nn.init.orthogonal_(param, 1.0)
        self.actor = layer_init(nn.Linear(head_size, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(head_size, 1), std=1)
        if self.pixels:
            self.to(memory_format=torch.channels_last)

    def initial_state(self, num_envs: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Recurrent detail 2: every environment starts from the zero state."""
        return (
            torch.zeros(1, num_envs, self.lstm.hidden_size, device=device),
            torch.zeros(1, num_envs, self.lstm.hidden_size, device=device),
        )

    def features(self, x: torch.Tensor) -> torch.Tensor:
        if self.pixels:  # uint8 -> float32 in the input's own layout, then scaled in place
            return self.network(x.float().mul_(1.0 / 255.0))
        return torch.cat((self.network(x), self.critic_network(x)), -1)  # [actor | critic], for ActorCriticLSTM

    def heads(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy logits and values of LSTM outputs (..., H): each head reads its own tower's half
        (classic control) or the whole shared output (Atari)."""
        actor_out, critic_out = (out, out) if self.pixels else out.chunk(2, dim=-1)
        return self.actor(actor_out), self.critic(critic_out).squeeze(-1)

    def run_lstm(
        self,
        hidden: torch.Tensor,
        starts: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor],
        cuts: list[int] | None = None,
    ):
        """Runs the LSTM over T steps of B sequences, resetting the state where an episode starts.

        | tensor  | shape      | meaning                                                             |
        |---------|------------|---------------------------------------------------------------------|
        | hidden  | (T, B, F)  | encoder features of the observations, in time order                 |
        | starts  | (T, B)     | 1 where the observation at step t is the first of an episode        |
        | state   | 2x(1, B, H)| (h, c) before step 0                                                |
        | cuts    | list[int]  | the steps after 0 where some sequence starts an episode             |
        |         | or None    | (`episode_cuts`); None: cut at every step                           |
        | returns | (T, B, H), | the LSTM outputs, and the state after step T-1                      |
        |         | 2x(1, B, H)|                                                                     |

        Recurrent detail 3: the state is zeroed where an episode starts. The steps between two cuts run
        in one `nn.LSTM` call; the caller finds the cuts in the CPU copy of `starts` (finding them here,
        in a tensor on the GPU, would wait for the GPU at every call). Without `cuts` every step is its
        own call: the update under `--compile`, whose graph must not depend on where episodes start.
        ppo_atari_lstm.py shows that both give the numbers of a step-by-step loop.
        """
        T = hidden.shape[0]
        bounds = list(range(T + 1)) if cuts is None else [0, *cuts, T]
        h, c = state
        outputs = []
        for t0, t1 in zip(bounds[:-1], bounds[1:]):
            keep = (1.0 - starts[t0]).view(1, -1, 1)
            out, (h, c) = self.lstm(hidden[t0:t1], (h * keep, c * keep))
            outputs.append(out)
        return torch.cat(outputs), (h, c)

    def get_states(
        self,
        x: torch.Tensor,
        starts: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor],
        cuts: list[int] | None = None,
    ):
        """Observations (T, B, *obs_shape) -> LSTM outputs (T, B, H) and the state after step T-1."""
        T, B = starts.shape
        hidden = self.features(x.reshape((T * B,) + x.shape[2:])).view(T, B, -1)
        return self.run_lstm(hidden, starts, state, cuts)

    def get_value(
        self, x: torch.Tensor, starts: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """Values of one step of observations (B, *obs_shape), given the state before it."""
        out, _ = self.get_states(x.unsqueeze(0), starts.unsqueeze(0), state)
        return self.heads(out[0])[1]

    def get_action_and_value(self, x, starts, state, action=None, cuts=None):
        """For T steps of B sequences: action (sampled if not given), log-prob, entropy and value,
        each (T, B), and the state after step T-1 (`cuts`: see `run_lstm`)."""
        out, state = self.get_states(x, starts, state, cuts)
        logits, value = self.heads(out)
        dist = Categorical(logits=logits)
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), value, state

    @torch.no_grad()
    def act(self, x: torch.Tensor, starts: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]):
        """The worker's policy step for one step of observations (B, *obs_shape): action, log-prob,
        value and the new state, in one LSTM call, without autograd and entropy. Gumbel-max sampling
        draws what `Categorical(logits).sample()` would."""
        keep = (1.0 - starts).view(1, -1, 1)
        out, state = self.lstm(self.features(x).unsqueeze(0), (state[0] * keep, state[1] * keep))
        logits, value = self.heads(out[0])
        logprobs = logits.log_softmax(-1)
        action = (logprobs - torch.empty_like(logprobs).exponential_().log()).argmax(-1)
        return action, logprobs.gather(-1, action.unsqueeze(-1)).squeeze(-1), value, state


# THE ALGORITHM -----------------------------------------------------------------------------------


class Episode(NamedTuple):
    """An episode that ended in a rollout, as a worker reports it to the learner."""

    step: int  # the global step it ended at
    episodic_return: float  # its true score (Atari: the game's unclipped score over all lives)
    episodic_length: int  # in agent steps


def collect_rollout(
    agent: Agent,
    envs: gym.vector.VectorEnv,
    rollout: dict[str, torch.Tensor],
    carry: tuple,
    args: Args,
    *,
    first_step: int,
    first_env: int,
) -> tuple[tuple, list[Episode], float, float]:
    """`--num-steps` steps of one worker's environments, written into `rollout` (the worker's
    column slice of the rollout buffer, tabulated at `allocate_shared_buffer`).

    `carry` = (next observation, next episode starts, LSTM state) goes from one rollout to the next.
    `first_step` is the global step before this rollout and `first_env` the batch index of the slice's
    first environment: the batch counts its steps step by step, environment by environment, so an
    episode of environment i (of the slice) that ends at step t ended at global step
    first_step + t * num_envs + first_env + i + 1. Returns the new carry, the episodes that ended, and
    the seconds spent acting and stepping the environments.
    """
    next_obs, next_start, state = carry
    obs_np, starts_np, actions_np, logprobs_np, values_np, rewards_np, dones_np = (
        rollout[name].numpy() for name in ("obs", "starts", "actions", "logprobs", "values", "rewards", "dones")
    )
    final_values = rollout["final_values"]
    final_values.zero_()
    episodes, act_time, env_time = [], 0.0, 0.0
    for step in range(args.num_steps):
        if step % args.seq_len == 0:  # recurrent detail 5: the state each chunk will be replayed from
            rollout["chunk_h"][step // args.seq_len] = state[0][0]
            rollout["chunk_c"][step // args.seq_len] = state[1][0]
        obs_np[step] = next_obs
        starts_np[step] = next_start
        tick = time.perf_counter()
        action, logprob, value, state = agent.act(rollout["obs"][step], rollout["starts"][step], state)
        actions_np[step] = action.numpy()
        logprobs_np[step] = logprob.numpy()
        values_np[step] = value.numpy()
        tock = time.perf_counter()
        next_obs, reward, terminated, truncated, infos = envs.step(actions_np[step])
        env_time += time.perf_counter() - tock
        act_time += tock - tick

        rewards_np[step] = reward
        dones_np[step] = terminated | truncated
        # --no-memory: every step "starts an episode" for the LSTM, so its state is always zero
        next_start = dones_np[step].copy() if args.memory else np.ones_like(dones_np[step])
        # next_obs is already the next episode's first observation where an episode ended; the value of
        # where a truncated episode stopped comes from info["final_obs"], with the state after this step.
        # Gymnasium's TimeLimit sets truncated on the last allowed step even when the episode also
        # terminated there: such a step is a termination (value 0), so only truncated-and-not-terminated
        # environments bootstrap
        bootstrap = truncated & ~terminated
        if args.bootstrap_truncation and bootstrap.any():
            idx = np.flatnonzero(bootstrap)
            final_obs = torch.as_tensor(np.stack(infos["final_obs"][idx]))
            with torch.no_grad():
                final_values[step, idx] = agent.get_value(
                    final_obs, torch.full((len(idx),), 1.0 - args.memory), (state[0][:, idx], state[1][:, idx])
                )
        for i, episodic_return, episodic_length in finished_episodes(infos):
            episode_step = first_step + step * args.num_envs + first_env + i + 1
            episodes.append(Episode(episode_step, episodic_return, episodic_length))
    with torch.no_grad():
        rollout["last_values"][0] = agent.get_value(torch.as_tensor(next_obs), torch.as_tensor(next_start), state)
    return (next_obs, next_start, state), episodes, act_time, env_time


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

    The trace is cut at every episode end, not at chunk boundaries: chunks only concern the LSTM.
    Returns (advantages, returns = advantages + values), both (T, N).
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


def to_chunks(x: torch.Tensor, seq_len: int) -> torch.Tensor:
    """(T, N, ...) -> (seq_len, K * N, ...) with K = T / seq_len: chunk c = k * N + n holds steps
    [k * seq_len, (k + 1) * seq_len) of environment n, in time order; the same c indexes the chunk
    states `chunk_h.reshape(1, K * N, H)`."""
    T, N = x.shape[:2]
    K = T // seq_len
    return x.reshape((K, seq_len, N) + x.shape[2:]).transpose(0, 1).reshape((seq_len, K * N) + x.shape[2:])


def chunk_minibatches(num_chunks: int, num_minibatches: int, device: torch.device) -> list[torch.Tensor]:
    """A random partition of the chunks into `num_minibatches` equal minibatches (recurrent detail 4:
    a minibatch is a set of whole chunks, so each is replayed in time order from its saved state)."""
    return list(torch.randperm(num_chunks, device=device).chunk(num_minibatches))


def episode_cuts(starts: torch.Tensor) -> list[int]:
    """The time steps after 0 where some sequence starts an episode, from a CPU tensor (T, B) of
    episode starts: where `Agent.run_lstm` cuts the sequence."""
    return (torch.nonzero(starts[1:].any(dim=1)).squeeze(1) + 1).tolist()


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
    starts: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor],
    actions: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    cuts: list[int] | None = None,
) -> dict[str, torch.Tensor]:
    """One gradient step on one minibatch of whole chunks, (seq_len, B, ...) each, replayed from the
    `state` the workers saved at their starts (recurrent detail 5; `cuts`: see `Agent.run_lstm`):
    forward, advantage normalisation, the PPO loss, backward, global gradient clipping, the optimizer
    step. Returns the detached statistics of `ppo_loss` and `ratio_deviation`, max |ratio - 1| before
    the step (1e-7 at the first minibatch of an update).

    The whole step is one function so that `--compile` can hand it to torch.compile as it stands.
    """
    _, newlogprob, entropy, newvalue, _ = agent.get_action_and_value(obs, starts, state, actions, cuts)
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
    """PPO on args.env_id from scratch, or on from `checkpoint` (--resume), with the rollouts collected by
    the worker processes; everything the run writes goes to run_dir, which it returns."""
    observation_space, action_space = env_spaces(args)
    # Seeding: same seed, same machine, same thread count -> same numbers (each worker seeds its own stream)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_deterministic:  # cuDNN's float32 convolutions and LSTMs in full float32, not TF32
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        torch.backends.cudnn.rnn.fp32_precision = "ieee"
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    torch.distributions.Distribution.set_default_validate_args(False)  # checks cost more than tiny samples

    agent = Agent(observation_space.shape, int(action_space.n)).to(device)
    # fused: one kernel for all parameters instead of a loop of small ones (same update, less overhead).
    # The learning rate is a tensor that annealing overwrites in place, so a compiled update step sees the
    # same input every iteration and does not recompile; CUDA graphs need the step count on the device too
    learning_rate = torch.tensor(args.learning_rate, device=device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=learning_rate, eps=1e-5, fused=True, capturable=args.cudagraphs)
    # --compile: the same update step, compiled; --cudagraphs also records its kernels in CUDA graphs and
    # replays them. The compiled update runs the LSTM step by step (`cuts` None): one graph, wherever
    # episodes start
    update = update_step
    if args.compile or args.cudagraphs:
        update = torch.compile(update_step, mode="reduce-overhead" if args.cudagraphs else None)
    start_iteration, global_step = restore(checkpoint, agent, optimizer, args)  # 1, 0 for a new run
    log = RunLog(args, run_dir, global_step)

    # The rollout buffer and the weights, in shared memory once (the handoff rule: at SHARED MEMORY), handed
    # to the workers as they start
    buffer, weights = allocate_shared_memory(args, agent, observation_space)
    with rollout_workers(args, buffer, weights, run_dir, global_step) as (workers, conns):
        log.start_clock()  # SPS counts from here, the workers started
        for iteration in range(start_iteration, args.num_iterations + 1):
            lr = args.learning_rate * (1.0 - (iteration - 1.0) / args.num_iterations if args.anneal_lr else 1.0)
            learning_rate.fill_(lr)  # annealed linearly to 0 over the run

            # COLLECT TRAJECTORIES --------------------------------------------------------------
            # The workers step their environments with the weights published last; the learner waits
            rollout_start = time.perf_counter()
            send_to_all(conns, Start(iteration, global_step))
            replies = wait_for_workers(workers, conns, Done)
            rollout_time = time.perf_counter() - rollout_start
            global_step += args.batch_size

            update_start = time.perf_counter()
            check_slices(buffer, replies, args.num_envs_per_worker, iteration)  # before any use of the batch
            for episode in (episode for done in replies for episode in done.episodes):
                log.episode(episode.step, episode.episodic_return, episode.episodic_length)  # at its own step

            # CALCULATE ADVANTAGES --------------------------------------------------------------
            advantages, returns = compute_gae(
                rewards=buffer["rewards"],
                values=buffer["values"],
                dones=buffer["dones"],
                last_value=buffer["last_values"][0],
                gamma=args.gamma,
                gae_lambda=args.gae_lambda,
                final_values=buffer["final_values"],
            )

            # UPDATE THE NETWORK ----------------------------------------------------------------
            # Recurrent detail 4: a minibatch is a set of whole chunks, each replayed in time order
            # from the state the worker saved at its start (recurrent detail 5).
            c_obs, c_starts, c_actions, c_logprobs, c_values, c_advantages, c_returns = (
                to_chunks(x, args.seq_len).to(device)
                for x in (
                    buffer["obs"],
                    buffer["starts"],
                    buffer["actions"],
                    buffer["logprobs"],
                    buffer["values"],
                    advantages,
                    returns,
                )
            )
            H = agent.lstm.hidden_size
            c_state = (buffer["chunk_h"].reshape(1, -1, H).to(device), buffer["chunk_c"].reshape(1, -1, H).to(device))
            # where the eager update cuts the LSTM's sequences: where some chunk starts an episode (found
            # in the CPU copy of the starts; right for every minibatch, some cuts may be extra)
            cuts = None if args.compile or args.cudagraphs else episode_cuts(to_chunks(buffer["starts"], args.seq_len))
            clipfracs = []  # one per minibatch: losses/clipfrac is their mean, as CleanRL logs it
            for epoch in range(args.update_epochs):
                for k, mb in enumerate(chunk_minibatches(args.num_chunks, args.num_minibatches, device)):
                    if args.cudagraphs:
                        torch.compiler.cudagraph_mark_step_begin()  # a new replay: the last one's outputs are done
                    stats = update(
                        agent,
                        optimizer,
                        args,
                        c_obs[:, mb],
                        c_starts[:, mb],
                        (c_state[0][:, mb], c_state[1][:, mb]),
                        c_actions[:, mb],
                        c_logprobs[:, mb],
                        c_advantages[:, mb],
                        c_returns[:, mb],
                        c_values[:, mb],
                        cuts,
                    )
                    if args.cudagraphs:
                        stats = {k: v.clone() for k, v in stats.items()}  # the next replay overwrites its outputs
                    clipfracs.append(stats["clipfrac"])
                    if epoch == 0 and k == 0:
                        # Nothing has been updated yet, so the ratio must be 1 to float precision; a larger
                        # deviation means the replayed recurrent states differ from the workers'
                        first_ratio_deviation = stats["ratio_deviation"]
                if args.target_kl is not None and stats["approx_kl"] > args.target_kl:  # the one wait per epoch
                    break
            update_time = time.perf_counter() - update_start

            publish_start = time.perf_counter()
            publish_weights(agent, weights)  # the next rollout's policy
            publish_time = time.perf_counter() - publish_start

            # the losses and KLs of the last minibatch, the clip fraction over the whole update
            stats.update(clipfrac=torch.stack(clipfracs).mean(), ratio_deviation=first_ratio_deviation)
            log.iteration(
                iteration,
                global_step,
                stats,
                lr,
                buffer["values"],
                returns,
                rollout_time,
                update_time,
                publish_time=publish_time,
                replies=replies,
            )
            evaluate_if_due(args, iteration, global_step, agent, optimizer, run_dir, log)
            checkpoint_if_due(args, iteration, global_step, agent, optimizer, run_dir)

    finish(args, agent, optimizer, run_dir, global_step, log)
    return run_dir


# ==================================================================================================
# PPO ENDS HERE. What follows is the machinery a run needs around the algorithm: input checks, the
# run folder, checkpoints and resuming, evaluation, logging, Ctrl-C and full disks, the Atari wrappers,
# the processes (shared memory, the rollout workers) and the entry point. None of it changes what PPO
# computes.
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


def env_spaces(args: Args) -> tuple[gym.Space, gym.Space]:
    """The observation and action spaces of one environment, made with this file's wrappers."""
    envs = make_envs(args, 1, "")
    spaces = envs.single_observation_space, envs.single_action_space
    envs.close()
    return spaces


def check_args(args: Args):
    """Reject arguments that would crash or silently misbehave later."""
    check_numbers(args)
    for name in (
        "total_timesteps",
        "num_workers",
        "num_envs_per_worker",
        "num_steps",
        "seq_len",
        "num_minibatches",
        "update_epochs",
        "eval_episodes",
        "max_episode_steps",
    ):
        if getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.checkpoint_every < 0 or args.torch_threads < 0:
        fail("--checkpoint-every and --torch-threads must not be negative")
    if args.num_steps % args.seq_len != 0:
        fail(f"--seq-len {args.seq_len} does not divide --num-steps {args.num_steps} (the rollout is cut into chunks)")
    if args.num_chunks % args.num_minibatches != 0:
        fail(
            f"--num-minibatches {args.num_minibatches} does not divide the {args.num_chunks} chunks "
            f"(--num-workers {args.num_workers} x --num-envs-per-worker {args.num_envs_per_worker} x "
            f"--num-steps {args.num_steps} / --seq-len {args.seq_len}; a minibatch is a set of whole chunks)"
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
        atari = is_atari(args.env_id)
    except (gym.error.Error, ImportError) as e:
        fail(
            f"unknown environment id '{args.env_id}' ({type(e).__name__}: {e}; gymnasium.pprint_registry() lists "
            "the ids: CartPole-v1, ..., and the Atari games as Pong, PongNoFrameskip-v4 or ALE/Pong-v5)"
        )
    if args.hide_velocity and (atari or "CartPole" not in args.env_id):
        fail(f"--hide-velocity is for CartPole only, not {args.env_id}")
    action_space = env_spaces(args)[1]
    if not isinstance(action_space, gym.spaces.Discrete):
        fail(
            f"{args.env_id} has action space {action_space}; this script supports Discrete actions only "
            "(ppo_continuous_action.py trains Box actions)"
        )


# THE RUN FOLDER, CHECKPOINTS AND RESUMING ---------------------------------------------------------


def prepare_run(args: Args) -> tuple[Args, str, dict | None]:
    """The run's arguments, folder and checkpoint: a new folder for a new run; for --resume the checkpoint's
    folder, arguments (with the flags that may change, checked again: the saved run's environment) and the
    checkpoint itself."""
    if args.resume is not None:
        checkpoint = load_checkpoint(args.resume)
        args = resume_args(args, checkpoint)
        check_args(args)
        return args, str(Path(args.resume).parent), checkpoint
    name = atari_id(args.env_id).replace("/", "-").replace(":", "-")
    run_dir = f"{args.runs_dir}/{name}__{args.exp_name}__{args.seed}__{int(time.time())}"
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
    """Everything needed to continue or evaluate: weights, optimizer, progress, the learner's RNG states,
    args. (The workers' random streams are drawn anew from the seed and the global step on resume.)

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
    """Plays `episodes` whole episodes (Atari: games, all lives), one per environment, in this process
    with the training preprocessing, and returns their returns (unclipped scores). The action sampling
    uses its own seeded RNG stream, so the same model and seed score the same right after training
    and later from the saved file.
    `video_prefix` (`--evaluate --capture-video`): records the episode of environment 0 (the first) with
    RecordVideo, the unpreprocessed RGB frames for a game, as `<video_prefix>-episode-0.mp4`."""
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
    state, starts = agent.initial_state(episodes, device), torch.ones(1, episodes, device=device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        while np.isnan(returns).any():
            with torch.no_grad():
                out, state = agent.get_states(torch.as_tensor(obs, device=device).unsqueeze(0), starts, state)
                logits = agent.heads(out[0])[0]
                action = logits.argmax(-1) if deterministic else Categorical(logits=logits).sample()
            obs, _, terminated, truncated, infos = envs.step(action.cpu().numpy())
            ended = np.ones_like(terminated) if not args.memory else terminated | truncated
            starts = torch.as_tensor(ended, dtype=torch.float32, device=device).unsqueeze(0)
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
    """`--evaluate PATH`: scores a saved model or checkpoint on the environment it was trained on."""
    checkpoint = load_checkpoint(path)
    saved = Args(**checkpoint["args"])
    observation_space, action_space = env_spaces(saved)
    agent = Agent(observation_space.shape, int(action_space.n))
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
        f"evaluation of {path} on {atari_id(saved.env_id)}: {len(returns)} episodes, "
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

    def start_clock(self):
        """SPS and ETA count the time from here on: from when the workers are ready, not from start-up."""
        self.start_time = time.time()

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
        publish_time: float,
        replies: list["Done"],
    ):
        """The iteration's scalars (the statistics copied from the device at once) and, when due, its line;
        besides the scalars of every script, the transitions per second of the rollout and of the update,
        the time the weights took to publish, and the workers' own split of the rollout (`replies`: their
        Done records; means over the workers)."""
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
        self.writer.add_scalar("charts/experience_SPS", self.args.batch_size / rollout_time, global_step)
        self.writer.add_scalar("charts/learning_SPS", self.args.batch_size / update_time, global_step)
        self.writer.add_scalar("debug/first_minibatch_ratio_deviation", first_ratio_deviation, global_step)
        self.writer.add_scalar("perf/rollout_time", rollout_time, global_step)
        self.writer.add_scalar("perf/update_time", update_time, global_step)
        self.writer.add_scalar("perf/publish_time", publish_time, global_step)
        self.writer.add_scalar("perf/act_time", np.mean([done.act_time for done in replies]), global_step)
        self.writer.add_scalar("perf/env_time", np.mean([done.env_time for done in replies]), global_step)
        line = self.progress.due(self.episode_returns, last=iteration == self.args.num_iterations)
        self.episode_returns = []
        if line:
            print(
                f"iteration {iteration}/{self.args.num_iterations} global_step={global_step} {line} SPS={sps} "
                f"ETA={eta} (rollout {rollout_time:.2f}s, update {update_time:.2f}s, publish {publish_time:.4f}s)",
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


def finish(args: Args, agent: Agent, optimizer: torch.optim.Optimizer, run_dir: str, global_step: int, log: RunLog):
    """The end of a run, after the workers stopped: with --save-model the final model saved and evaluated;
    the logs closed."""
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


# ATARI GAMES -----------------------------------------------------------------------------------
# The ids of the Atari games and the wrappers of make_env that are ours (make_env's table says what each does).


def atari_id(env_id: str) -> str:
    """`Pong` -> `PongNoFrameskip-v4`; full ids (`CartPole-v1`, `PongNoFrameskip-v4`, `ALE/Pong-v5`) as given."""
    return env_id if "-v" in env_id or "/" in env_id else f"{env_id}NoFrameskip-v4"


def is_atari(env_id: str) -> bool:
    """Whether the id names an ale-py game (else it is a vector-observation environment). Ids of the
    form `module:Name-v0` import `module` first, as `gym.make` does, so it can register the id."""
    if ":" in env_id:
        module, env_id = env_id.split(":", 1)
        __import__(module)
    return str(gym.spec(atari_id(env_id)).entry_point).startswith("ale_py")


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
    when the end came at the first frame)."""

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
    """Ours. Games that wait for FIRE to start get FIRE after every reset, then action 2, as the usual
    wrapper (OpenAI Baselines' FireResetEnv) does. Placed above EpisodicLife, it also fires after each
    lost life."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.fire = env.unwrapped.get_action_meanings().index("FIRE")

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        obs, info = step_in_reset(self.env, self.fire, info)
        return step_in_reset(self.env, 2, info)


# SHARED MEMORY -----------------------------------------------------------------------------------
# The lock-free handoff, the one rule the processes follow. The learner allocates two things in shared
# memory once, before it starts the workers: the rollout buffer (`allocate_shared_buffer`) and a flat
# weight vector. No lock guards them: the messages on the pipes (the records under ROLLOUT WORKERS)
# take turns instead, and each process touches them only in its turn.
#   - The learner writes the weights (`publish_weights`) only before it sends Start, and reads the
#     buffer only after every worker's Done and before the next Start.
#   - Worker w, between a Start and its Done only, reads the weights (`load_weights`) and writes its
#     own columns of the buffer: [w * num_envs_per_worker, (w + 1) * num_envs_per_worker), nothing else.
# So no byte is written while another process reads it; a pipe's send and receive are system calls,
# which order the memory, so what was written before a message is seen after it. The checksum a
# worker sends with Done, compared by the learner before training (`slice_checksum`), checks the rule.


def allocate_shared_memory(args: Args, agent: Agent, observation_space: gym.Space) -> tuple[dict, torch.Tensor]:
    """The rollout buffer and the flat weight vector in shared memory, the agent's weights published in it;
    a line says how large they are."""
    obs_dtype = torch.uint8 if observation_space.dtype == np.uint8 else torch.float32
    buffer = allocate_shared_buffer(args, observation_space.shape, obs_dtype, agent.lstm.hidden_size)
    weights = share({"weights": torch.zeros(sum(p.numel() for p in agent.parameters()))}, "the weights")["weights"]
    publish_weights(agent, weights)
    print(
        f"shared memory: rollout buffer {mib(buffer.values()):.2f} MiB, weights {mib([weights]):.2f} MiB; "
        f"{args.num_workers} workers x {args.num_envs_per_worker} envs",
        flush=True,
    )
    return buffer, weights


def allocate_shared_buffer(
    args: Args, obs_shape: tuple[int, ...], obs_dtype: torch.dtype, hidden_size: int
) -> dict[str, torch.Tensor]:
    """The rollout buffer, allocated once in shared memory and reused every iteration.

    T = num_steps, N = num_workers * num_envs_per_worker, K = T / seq_len chunks per environment,
    H = the LSTM's hidden size. Dimension 1 is always the environment, so a worker's slice is a range
    of columns of every tensor (see the handoff rule above).

    | name         | shape            | dtype         | meaning                                            |
    |--------------|------------------|---------------|----------------------------------------------------|
    | obs          | (T, N, *obs)     | uint8 (Atari) | the observation the action at step t was taken in  |
    |              |                  | else float32  |                                                    |
    | starts       | (T, N)           | float32       | 1 where obs[t] is an episode's first observation:  |
    |              |                  |               | the LSTM state is zeroed before step t             |
    | actions      | (T, N)           | int64         | the action taken at step t                         |
    | logprobs     | (T, N)           | float32       | its log-probability under the rollout's policy     |
    | values       | (T, N)           | float32       | V(obs[t]) with the rollout's LSTM state            |
    | rewards      | (T, N)           | float32       | the reward of step t                               |
    | dones        | (T, N)           | float32       | 1 if the episode ended at step t                   |
    | final_values | (T, N)           | float32       | where an episode was truncated and not terminated  |
    |              |                  |               | at step t: V(final observation) with the state     |
    |              |                  |               | after step t; else 0                               |
    | last_values  | (1, N)           | float32       | V(observation after step T-1), to bootstrap        |
    | chunk_h      | (K, N, H)        | float32       | h of the LSTM before step k * seq_len (before the  |
    | chunk_c      | (K, N, H)        | float32       | reset at that step): where chunk k is replayed from|
    """
    T, N, K = args.num_steps, args.num_envs, args.num_steps // args.seq_len
    buffer = {
        "obs": torch.zeros((T, N) + tuple(obs_shape), dtype=obs_dtype),
        "starts": torch.zeros(T, N),
        "actions": torch.zeros(T, N, dtype=torch.long),
    }
    for name in ("logprobs", "values", "rewards", "dones", "final_values"):
        buffer[name] = torch.zeros(T, N)
    buffer["last_values"] = torch.zeros(1, N)
    buffer["chunk_h"] = torch.zeros(K, N, hidden_size)
    buffer["chunk_c"] = torch.zeros(K, N, hidden_size)
    return share(buffer, "the rollout buffer")


def share(tensors: dict[str, torch.Tensor], what: str) -> dict[str, torch.Tensor]:
    """The tensors moved into shared memory. Each becomes a file in /dev/shm (PyTorch's file_descriptor
    strategy removes its name at once, so nothing is left there), which a file-size limit (`ulimit -f`)
    refuses as it refuses a checkpoint: then the file PyTorch left is removed, and an OSError naming `what`
    ends the run in one line as a refused checkpoint does (exit_on_write_error), not PyTorch's RuntimeError."""
    try:
        return {name: x.share_memory_() for name, x in tensors.items()}
    except RuntimeError as e:  # "unable to resize file </torch_...> to the right size: File too large (27)"
        code, file = re.search(r"\((\d+)\)$", str(e)), re.search(r"<(/torch_[\w-]+)>", str(e))
        if code is None or int(code[1]) not in WRITE_ERRORS:
            raise
        if file is not None:
            Path(f"/dev/shm{file[1]}").unlink(missing_ok=True)
        raise OSError(
            int(code[1]), os.strerror(int(code[1])), f"{what} in /dev/shm ({mib(tensors.values()):.2f} MiB)"
        ) from None


def mib(tensors) -> float:
    return sum(x.numel() * x.element_size() for x in tensors) / 2**20


def slice_checksum(buffer: dict[str, torch.Tensor], lo: int, hi: int) -> int:
    """CRC-32 of the columns [lo, hi) of every tensor of the buffer: the worker computes it after
    writing its slice, the learner again before training on it; equal sums mean that the learner's
    batch holds exactly what the worker wrote."""
    checksum = 0
    for name in sorted(buffer):
        checksum = zlib.crc32(np.ascontiguousarray(buffer[name][:, lo:hi].numpy()), checksum)
    return checksum


@torch.no_grad()
def publish_weights(agent: Agent, weights: torch.Tensor):
    """The learner copies its parameters into the shared weight vector (from the GPU if there: one copy)."""
    weights.copy_(torch.cat([param.reshape(-1) for param in agent.parameters()]))


@torch.no_grad()
def load_weights(agent: Agent, weights: torch.Tensor):
    """A worker copies the shared weight vector into its own model's parameters."""
    offset = 0
    for param in agent.parameters():
        param.copy_(weights[offset : offset + param.numel()].view(param.shape))
        offset += param.numel()


# ROLLOUT WORKERS ---------------------------------------------------------------------------------
# The messages on the pipes, each a named record (the tensors go through shared memory).


class Start(NamedTuple):
    """learner -> worker: collect the rollout of `iteration`, which starts at `global_step`."""

    iteration: int
    global_step: int


class Stop(NamedTuple):
    """learner -> worker: close the environments and exit."""


class Ready(NamedTuple):
    """worker -> learner: environments and policy built, waiting for Start."""

    worker: int


class Done(NamedTuple):
    """worker -> learner: its slice of the rollout buffer is written."""

    worker: int
    episodes: list[Episode]  # the episodes that ended in this rollout
    act_time: float  # seconds spent in the policy's steps
    env_time: float  # seconds spent in the environments' steps
    checksum: int  # `slice_checksum` of the slice, as the worker wrote it


class Failed(NamedTuple):
    """worker -> learner: an exception, with its traceback; the worker exits with code 1."""

    worker: int
    traceback: str


# A worker of a learner that runs this file as a script imports the file as `__mp_main__`; the learner
# knows these classes as `__main__.*` (also under a runner such as runpy, where `__mp_main__` names the
# runner), so a worker's replies are pickled under that name
if __name__ == "__mp_main__":
    for record in (Episode, Ready, Done, Failed):
        record.__module__ = "__main__"


def next_command(conn, parent_pid: int) -> Start | Stop:
    """The learner's next command. Polls, so that a worker whose learner died (its pipe closed, or
    this process handed to another parent) gets Stop within a second instead of waiting forever."""
    while not conn.poll(0.5):
        if os.getppid() != parent_pid:
            return Stop()
    try:
        return conn.recv()
    except EOFError:
        return Stop()


def rollout_worker(
    worker_id: int,
    args: Args,
    buffer: dict[str, torch.Tensor],
    weights: torch.Tensor,
    conn,
    parent_pid: int,
    start_step: int,
    run_dir: str,
):
    """A rollout worker process: builds its environments and policy copy, replies Ready, then for
    every Start: loads the weights, collects a rollout into its slice of `buffer` and replies Done.
    Ends at Stop; on an exception replies Failed and exits with code 1."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the learner's: it stops the workers
    torch.set_num_threads(1)
    envs = None
    try:
        n = args.num_envs_per_worker
        lo = worker_id * n
        # its own random stream: a function of the seed, the worker and the step a (resumed) run starts at
        torch.manual_seed(int(np.random.SeedSequence([args.seed, worker_id, start_step]).generate_state(1)[0]))
        envs = make_envs(args, n, run_dir, args.capture_video and worker_id == 0)
        agent = Agent(envs.single_observation_space.shape, int(envs.single_action_space.n))
        rollout = {name: x[:, lo : lo + n] for name, x in buffer.items()}
        # env j of worker w gets seed + w * num_envs_per_worker + j: no two envs share a seed; a resumed
        # run adds its global step, so it does not replay the first episodes
        next_obs, _ = envs.reset(seed=args.seed + start_step + lo)
        carry = (next_obs, np.ones(n, dtype=np.float32), agent.initial_state(n, torch.device("cpu")))
        conn.send(Ready(worker_id))
        while isinstance(command := next_command(conn, parent_pid), Start):
            load_weights(agent, weights)
            carry, episodes, act_time, env_time = collect_rollout(
                agent, envs, rollout, carry, args, first_step=command.global_step, first_env=lo
            )
            conn.send(Done(worker_id, episodes, act_time, env_time, slice_checksum(buffer, lo, lo + n)))
    except Exception:
        try:
            conn.send(Failed(worker_id, traceback.format_exc()))
        except OSError:  # the learner is gone
            pass
        raise SystemExit(1)
    finally:
        if envs is not None:
            envs.close()


class WorkerFailed(Exception):
    """A rollout worker raised an exception, died, or left a slice that is not what it wrote."""


@contextlib.contextmanager
def rollout_workers(args: Args, buffer: dict[str, torch.Tensor], weights: torch.Tensor, run_dir: str, start_step: int):
    """Starts the rollout workers, each a fresh interpreter ("spawn": safe with a CUDA learner) given the
    shared buffer and weights as it is created, waits for every Ready, and yields (processes, pipes). On
    leaving, every worker is stopped, also on an error, a refused write or Ctrl-C of the learner (no process
    is left behind), and a WorkerFailed ends the run in one line, exit code 1."""
    context = mp.get_context("spawn")
    workers, conns, finished = [], [], False
    try:
        for w in range(args.num_workers):
            conn, child_conn = context.Pipe()
            process = context.Process(
                target=rollout_worker,
                name=f"rollout-worker-{w}",
                daemon=True,
                args=(w, args, buffer, weights, child_conn, os.getpid(), start_step, run_dir),
            )
            process.start()
            child_conn.close()
            workers.append(process)
            conns.append(conn)
        wait_for_workers(workers, conns, Ready)
        yield workers, conns
        finished = True
    except WorkerFailed as e:
        raise SystemExit(f"{Path(sys.argv[0]).name}: error: {e}; stopped all workers") from None
    finally:
        stop_workers(workers, conns, graceful=finished)


def send_to_all(conns: list, message: Start | Stop):
    """`message` to every worker; one that died (a broken pipe) is named by wait_for_workers."""
    for conn in conns:
        try:
            conn.send(message)
        except OSError:  # that worker is gone
            pass


def wait_for_workers(workers: list, conns: list, expected: type) -> list:
    """One reply of type `expected` (Ready or Done) from each worker, in worker order. Waits on the
    pipes and on the processes themselves (their sentinels), so a worker that dies without a word
    (killed, crashed) is noticed at once; raises WorkerFailed naming the worker and its error or exit
    code."""
    replies, pending = [None] * len(workers), set(range(len(workers)))
    while pending:
        wait([conns[i] for i in pending] + [workers[i].sentinel for i in pending], timeout=1.0)
        for i in sorted(pending):
            if conns[i].poll():  # read before looking at the exit code: Failed is sent just before exiting
                try:
                    reply = conns[i].recv()
                except (EOFError, OSError):  # the worker is gone (its end closed or reset): its exit code says how
                    reply = None
                if isinstance(reply, Failed):
                    print(reply.traceback, file=sys.stderr, end="")
                    last_line = reply.traceback.strip().splitlines()[-1]
                    raise WorkerFailed(f"rollout worker {i} failed: {last_line} (its traceback is above)")
                if reply is not None:
                    assert isinstance(reply, expected) and reply.worker == i, reply
                    replies[i] = reply
                    pending.discard(i)
                    continue
            exitcode = workers[i].exitcode
            if exitcode is not None:
                how = f"signal {signal.Signals(-exitcode).name}" if exitcode < 0 else f"exit code {exitcode}"
                raise WorkerFailed(f"rollout worker {i} (pid {workers[i].pid}) died ({how})")
    return replies


def check_slices(buffer: dict[str, torch.Tensor], replies: list[Done], num_envs_per_worker: int, iteration: int):
    """The learner's check of the handoff before it trains: each worker's slice of the buffer has the
    checksum the worker reported. A mismatch is fatal (WorkerFailed): the batch is not what the
    workers collected."""
    for done in replies:
        lo = done.worker * num_envs_per_worker
        if slice_checksum(buffer, lo, lo + num_envs_per_worker) != done.checksum:
            raise WorkerFailed(
                f"rollout worker {done.worker}: its slice of the rollout buffer in iteration "
                f"{iteration} is not what it wrote (checksum mismatch)"
            )


def stop_workers(workers: list, conns: list, graceful: bool):
    """Stops every worker: with `graceful`, Stop and a moment to close their environments; then
    SIGTERM for those still there, SIGKILL after a grace period, and join, so no process is left."""
    if graceful:
        send_to_all(conns, Stop())
    deadline = time.monotonic() + (5.0 if graceful else 0.0)
    for process in workers:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in workers:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + 2.0
    for process in workers:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()
    for conn in conns:
        conn.close()


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
