"""Recurrent PPO with one learner process and N rollout worker processes that share memory (CPU).

Run:
    python ppo_shared_memory_lstm.py --env-id CartPole-v1                  # classic control, MLP + LSTM
    python ppo_shared_memory_lstm.py --env-id CartPole-v1 --hide-velocity  # positions only: needs the memory
    python ppo_shared_memory_lstm.py --env-id Pong --num-workers 4 --num-envs-per-worker 2 --seq-len 128 \\
        --clip-coef 0.1 --learning-rate 2.5e-4 --torch-threads 2 --total-timesteps 10000000   # Atari, CNN + LSTM

The defaults are for classic control: ppo.py's hyperparameters but for 8 environments (2 workers x 4 envs),
16-step chunks and a learning rate of 1e-3 (benchmark/results/more_results.md, "Memory: CartPole without
velocities"); the Pong line is ppo_atari_lstm.py's settings, so the two files then train the same algorithm.

What this file shows: PPO's data collection spread over processes on one machine, the algorithm unchanged.
The learner (this process) owns the network and the optimizer; each rollout worker (a "spawn" process, one
PyTorch thread) owns `--num-envs-per-worker` environments and a CPU copy of the policy. One iteration:

    learner: publish weights -> Start to every worker -> wait for every Done -> check the slices
             -> GAE -> PPO update -> publish ...
    worker:  copy the weights in -> `collect_rollout`: `--num-steps` steps of its envs into its slice of
             the shared rollout buffer -> Done(episodes, checksum of its slice)

Every rollout comes from the policy the learner is about to update: no stale data, no off-policy correction.
The buffer and the weights are tensors in shared memory, allocated once; the pipes carry small named records,
never tensors, and take turns instead of a lock: THE PROCESSES, after `train`. PPO ends at the banner; below it
are the input checks, the evaluation and the entry point (the rest of a run is the package ppolab's).

What is special in this file:
- Recurrent PPO with truncated back-propagation through time: the rollout is cut into chunks of `--seq-len`
  steps, the worker saves the LSTM state at the start of every chunk, the state is reset where an episode
  starts inside a chunk, a minibatch is a set of whole chunks replayed from their saved states (ratio 1).
- Reliability: a worker that raises, dies, or leaves a slice other than it reported (a checksum) makes the
  learner name it and stop every worker, before training on the batch; so do Ctrl-C, a full disk and an
  error of the learner; a worker whose learner died exits by itself. Nothing is left in /dev/shm.
- `--hide-velocity` (CartPole, positions only) and `--no-memory` (the LSTM reset every step) show what memory does.
- Same-step autoreset, truncation bootstrapped with the LSTM state the final observation was reached with,
  every episode logged at its own step with its true score, as in ppo_atari_lstm.py; `--torch-deterministic`
  turns TF32 off in the learner's cuDNN, so on a GPU the first minibatch's ratio stays 1 to float precision.
"""

import contextlib
import os
import sys
import time
import traceback
import zlib
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal, NamedTuple

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributions.categorical import Categorical

import ppolab
import ppolab.processes
import ppolab.stops

gym.register_envs(ale_py)  # registers PongNoFrameskip-v4, ALE/Pong-v5, ...
ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no ALE banner on stderr from every process


@dataclass
class Args(ppolab.RunSettings):  # and every run's settings: --seed, --cuda, --track, --resume, ...
    # PPO's hyperparameters (the defaults are for classic control; the Pong line at the top gives Atari's)
    env_id: str = "CartPole-v1"
    """a classic-control id (`CartPole-v1`) or an Atari game (`Pong`, read as `PongNoFrameskip-v4`, or a full id)"""
    hide_velocity: bool = False
    """CartPole only: the agent sees the cart position and the pole angle, not their velocities"""
    memory: bool = True
    """`--no-memory`: the LSTM state reset at every step, the agent sees only the current observation (an ablation)"""
    total_timesteps: int = 500_000
    """total timesteps of the experiment"""
    learning_rate: float = 1e-3
    """the learning rate of the optimizer (2.5e-4 for Atari)"""
    num_workers: int = 2
    """the number of rollout worker processes"""
    num_envs_per_worker: int = 4
    """the number of environments each worker steps"""
    worker_timeout: float = 600.0
    """seconds a worker may take for a rollout (to start: at least 120) before the run ends naming it; 600 leaves a slow environment ample time"""
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
    policy_objective: Literal["clip", "adaptive-kl", "fixed-kl"] = "clip"
    """the policy's surrogate: PPO-Clip's clipped ratio, or PPO-Penalty's KL penalty with an adaptive or fixed beta"""
    kl_target: float = 0.01
    """adaptive-kl: the KL per update that beta is adapted towards (the PPO paper's d_targ)"""
    kl_beta: float = 1.0
    """the KL penalty's coefficient beta: fixed-kl's, and adaptive-kl's first"""
    bootstrap_truncation: bool = True
    """bootstrap the value of the final observation at a time-limit truncation (off: treat it as termination)"""
    max_episode_steps: int = 27_000
    """Atari only: agent steps after which a game is truncated (ALE stops it at 4x this many frames)"""
    changeable_on_resume = ("worker_timeout",)

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


def atari_id(env_id: str) -> str:
    """`Breakout` -> `BreakoutNoFrameskip-v4`; full ids (`BreakoutNoFrameskip-v4`, `ALE/Breakout-v5`) as given."""
    return env_id if "-v" in env_id or "/" in env_id else f"{env_id}NoFrameskip-v4"


def is_atari(env_id: str) -> bool:
    """Whether the id names an ale-py game (else it is a vector-observation environment). Ids of the
    form `module:Name-v0` import `module` first, as `gym.make` does, so it can register the id (a module that
    cannot be imported ends in one line naming it)."""
    return str(gym.spec(atari_id(ppolab.env_module(env_id))).entry_point).startswith("ale_py")


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
    eval_max_steps: int | None = None,
):
    """A thunk that builds environment `idx` of a vector environment; with `capture_video`, environment 0
    records videos to `run_dir/videos` (of a game, the unpreprocessed RGB frames).

    Classic control gets RecordEpisodeStatistics (return and length) and, with `hide_velocity`, HideVelocity
    below it; an evaluation's (`eval_max_steps`) episodes are cut after that many steps where the environment has
    no time limit of its own. An Atari game gets ppo_atari_lstm.py's preprocessing, wrapper by wrapper from the bottom up (ours
    are written out under THE ATARI WRAPPERS), with grayscale from ALE itself and the v4 NoFrameskip settings
    passed explicitly, so `Pong`, `PongNoFrameskip-v4` and `ALE/Pong-v5` are the same environment.
    """
    atari, env_id = is_atari(env_id), atari_id(env_id)
    settings = {}
    if atari:  # grayscale from ALE, and the v4 NoFrameskip settings whatever the id
        settings = dict(obs_type="grayscale", frameskip=1, repeat_action_probability=0.0, full_action_space=False)
        settings.update(max_num_frames_per_episode=4 * max_episode_steps)

    def thunk():
        if capture_video and idx == 0:
            if not atari:
                # classic control draws its frames with pygame: SDL's dummy drivers need no display and no sound
                # card (without them SDL prints "XDG_RUNTIME_DIR is invalid" on a machine without a desktop session)
                os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
                os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
            env = gym.make(env_id, render_mode="rgb_array", **settings)
            env = gym.wrappers.RecordVideo(
                env, f"{run_dir}/videos", name_prefix=video_prefix, episode_trigger=video_trigger, disable_logger=True
            )
        else:
            env = gym.make(env_id, **settings)
        if not atari:
            env = ppolab.capped(env, env_id, eval_max_steps)  # none: training, or a time limit of its own
            env = ppolab.policy_actions(env)  # Discrete(n, start=k): the policy's action a sent as a + k
            return gym.wrappers.RecordEpisodeStatistics(HideVelocity(env) if hide_velocity else env)
        env = NoopReset(env, noop_max=30)  # ours: 1 to 30 no-op frames after a reset
        env = MaxAndSkip(env, skip=4)  # ours: the action repeated 4 frames, the max of the last two frames
        # the game score (unclipped, over all lives) and length in agent steps, in info["episode"] at the game's end
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = EpisodicLife(env)  # ours: a lost life is `terminated`, the game goes on
        if "FIRE" in env.unwrapped.get_action_meanings():
            env = FireReset(env)  # ours: FIRE after every reset
        env = gym.wrappers.TransformReward(env, np.sign)  # the reward clipped to its sign, -1, 0 or 1
        env = gym.wrappers.ResizeObservation(env, (84, 84))  # cv2.resize with INTER_AREA
        return gym.wrappers.ReshapeObservation(env, (1, 84, 84))  # one frame, (1, 84, 84) uint8: the LSTM remembers

    return thunk


def make_envs(
    args: Args,
    num_envs: int,
    run_dir: str,
    capture_video: bool = False,
    video_prefix: str = "rl-video",
    video_trigger=None,
    eval_max_steps: int | None = None,
) -> gym.vector.VectorEnv:
    """One worker's vector environment, stepped in the worker's own process, with same-step autoreset:
    the step that ends an episode returns the next episode's first observation (the last one of the
    old episode is in `info["final_obs"]`), so every stored transition is real experience."""
    extras = dict(hide_velocity=args.hide_velocity, max_episode_steps=args.max_episode_steps)
    extras.update(video_prefix=video_prefix, video_trigger=video_trigger, eval_max_steps=eval_max_steps)
    thunks = [make_env(args.env_id, i, capture_video, run_dir, **extras) for i in range(num_envs)]
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


def env_spaces(args: Args) -> tuple[gym.Space, gym.Space]:
    """The observation and action spaces of one environment, made with this file's wrappers."""
    envs = make_envs(args, 1, "")
    spaces = envs.single_observation_space, envs.single_action_space
    envs.close()
    return spaces


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
    loss's gradients pulled the shared features away from the policy's (measured: benchmark/results/
    more_results.md, "Memory: CartPole without velocities").

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
    loss, stats = ppo_loss(newlogprob, entropy, newvalue, logprobs, advantages, returns, values, args, kl_beta)
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    stats["ratio_deviation"] = (newlogprob.detach() - logprobs).exp().sub(1).abs().max()
    return stats


# TRAINING ----------------------------------------------------------------------------------------


def train(args: Args, run: ppolab.Run) -> str:
    """PPO on args.env_id, from scratch or on from --resume's checkpoint, with the rollouts collected by the worker
    processes; `run` (the package's) writes everything the run reports into its folder, which train returns."""
    observation_space, action_space = env_spaces(args)
    ppolab.seed_everything(args.seed, args.torch_deterministic)  # same seed, same thread count: same numbers
    torch.distributions.Distribution.set_default_validate_args(False)  # no argument checks: costlier than the math
    device = ppolab.pick_device(args.cuda)  # the learner's; each worker acts on the CPU from its own stream

    agent = Agent(observation_space.shape, int(action_space.n)).to(device)
    # fused: one kernel for all parameters. The learning rate is a tensor, annealed in place without a recompile
    learning_rate = torch.tensor(args.learning_rate, device=device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=learning_rate, eps=1e-5, fused=True)
    # --compile: the same update step, compiled (it runs the LSTM step by step, `cuts` None: one graph, wherever
    # episodes start); --cudagraphs also records its kernels in CUDA graphs and replays them
    update = update_step
    if args.compile or args.cudagraphs:
        update = torch.compile(update_step, mode="reduce-overhead" if args.cudagraphs else None)
    kl_beta = torch.tensor(args.kl_beta, device=device)  # PPO-Penalty's beta (adapt_kl_beta changes it in place)
    saved = {"model": agent, "optimizer": optimizer, "kl_beta": kl_beta}  # besides progress, RNG and args
    start_iteration, global_step = run.start(saved)  # --resume's checkpoint restored; 1, 0 for a new run

    # The rollout buffer and the weights, in shared memory once (the handoff rule: at THE PROCESSES), handed
    # to the workers as they start
    buffer, weights = allocate_shared_memory(args, agent, observation_space)
    with rollout_workers(args, buffer, weights, run.dir, start_step=global_step) as (workers, conns):
        run.start_clock()  # SPS counts from here, the workers started
        for iteration in range(start_iteration, args.num_iterations + 1):
            lr = args.learning_rate * (1.0 - (iteration - 1.0) / args.num_iterations if args.anneal_lr else 1.0)
            learning_rate.fill_(lr)  # annealed linearly to 0 over the run

            # COLLECT TRAJECTORIES --------------------------------------------------------------
            # The workers step their environments with the weights published last; the learner waits
            rollout_start = time.perf_counter()
            ppolab.processes.send_to_all(conns, Start(iteration, global_step))
            replies = wait_for_workers(workers, conns, Done, args.worker_timeout)
            rollout_time = time.perf_counter() - rollout_start
            global_step += args.batch_size

            update_start = time.perf_counter()
            check_slices(buffer, replies, args.num_envs_per_worker, iteration)  # before any use of the batch
            for episode in (episode for done in replies for episode in done.episodes):
                run.episode(episode.step, episode.episodic_return, episode.episodic_length)  # at its own step

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
            rollout = [buffer[name] for name in ("obs", "starts", "actions", "logprobs", "values")]
            c_obs, c_starts, c_actions, c_logprobs, c_values, c_advantages, c_returns = (
                to_chunks(x, args.seq_len).to(device) for x in (*rollout, advantages, returns)
            )
            H = agent.lstm.hidden_size
            c_state = (buffer["chunk_h"].reshape(1, -1, H).to(device), buffer["chunk_c"].reshape(1, -1, H).to(device))
            # where the eager update cuts the LSTM's sequences: where some chunk starts an episode (found
            # in the CPU copy of the starts; right for every minibatch, some cuts may be extra)
            cuts = None if args.compile or args.cudagraphs else episode_cuts(to_chunks(buffer["starts"], args.seq_len))
            clipfracs, kls = [], []  # one per minibatch: losses/clipfrac is their mean, as CleanRL logs it
            for epoch in range(args.update_epochs):
                for k, mb in enumerate(chunk_minibatches(args.num_chunks, args.num_minibatches, device)):
                    if args.cudagraphs:
                        torch.compiler.cudagraph_mark_step_begin()  # a new replay: the last one's outputs are done
                    stats = update(
                        agent=agent,
                        optimizer=optimizer,
                        args=args,
                        kl_beta=kl_beta,
                        obs=c_obs[:, mb],
                        starts=c_starts[:, mb],
                        state=(c_state[0][:, mb], c_state[1][:, mb]),
                        actions=c_actions[:, mb],
                        logprobs=c_logprobs[:, mb],
                        advantages=c_advantages[:, mb],
                        returns=c_returns[:, mb],
                        values=c_values[:, mb],
                        cuts=cuts,
                    )
                    if args.cudagraphs:  # the next replay overwrites its outputs
                        stats = {name: value.clone() for name, value in stats.items()}
                    clipfracs.append(stats["clipfrac"])
                    kls.append(stats["approx_kl"])
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

            # the losses and KLs of the last minibatch, the clip fraction over the whole update; besides, the steps
            # per second of the rollout and of the update, the publication's time
            stats.update(clipfrac=torch.stack(clipfracs).mean(), ratio_deviation=first_ratio_deviation)
            adapt_kl_beta(kl_beta, kls, args, stats)  # PPO-Penalty: beta logged, then adapted (adaptive-kl)
            perf = {
                "charts/experience_SPS": args.batch_size / rollout_time,
                "charts/learning_SPS": args.batch_size / update_time,
                "perf/publish_time": publish_time,
            }
            times = f", publish {publish_time:.4f}s"  # the end of the line's times
            run.iteration(
                iteration=iteration,
                global_step=global_step,
                stats=stats,
                learning_rate=lr,
                rollout_time=rollout_time,
                update_time=update_time,
                values=buffer["values"],
                returns=returns,
                scalars=perf,
                line_extra=times,
            )
            run.evaluate_if_due(iteration, global_step, saved)
            run.checkpoint_if_due(iteration, global_step, saved)

    run.finish(global_step, saved)  # after the workers stopped; --save-model: model.pt, evaluated
    return run.dir


# THE PROCESSES -----------------------------------------------------------------------------------
# SHARED MEMORY: the lock-free handoff, the one rule the processes follow. The learner allocates two things in
# shared memory once, before it starts the workers: the rollout buffer (`allocate_shared_buffer`) and a flat
# weight vector. No lock guards them: the messages on the pipes (the records under THE MESSAGES)
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
    size = sum(p.numel() for p in agent.parameters())
    weights = ppolab.processes.share_memory({"weights": torch.zeros(size)}, "the weights")["weights"]
    publish_weights(agent, weights)
    buffer_mib, weights_mib = ppolab.processes.mib(buffer.values()), ppolab.processes.mib([weights])
    sizes = f"rollout buffer {buffer_mib:.2f} MiB, weights {weights_mib:.2f} MiB"
    print(f"shared memory: {sizes}; {args.num_workers} workers x {args.num_envs_per_worker} envs", flush=True)
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
    return ppolab.processes.share_memory(buffer, "the rollout buffer")


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
    """The learner copies its parameters into the shared weight vector (from the GPU if there: one copy). Not
    `nn.utils.parameters_to_vector`: it views each parameter flat, which the CNN's channels-last weights refuse."""
    weights.copy_(torch.cat([param.reshape(-1) for param in agent.parameters()]))


@torch.no_grad()
def load_weights(agent: Agent, weights: torch.Tensor):
    """A worker copies the shared weight vector into its own model's parameters."""
    offset = 0
    for param in agent.parameters():
        param.copy_(weights[offset : offset + param.numel()].view(param.shape))
        offset += param.numel()


# THE MESSAGES on the pipes, each a named record (the tensors go through shared memory)
class Start(NamedTuple):
    """learner -> worker: collect the rollout of `iteration`, which starts at `global_step`."""

    iteration: int
    global_step: int


class Stop(NamedTuple):
    """learner -> worker: close the environments and exit."""


class Ready(NamedTuple):
    """worker -> learner: environments and policy built, waiting for Start."""

    worker: int


class Episode(NamedTuple):
    """An episode that ended in a rollout, as a worker reports it to the learner."""

    step: int  # the global step it ended at
    episodic_return: float  # its true score (Atari: the game's unclipped score over all lives)
    episodic_length: int  # in agent steps


class Done(NamedTuple):
    """worker -> learner: its slice of the rollout buffer is written."""

    worker: int
    episodes: list[Episode]  # the episodes that ended in this rollout
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


# THE WORKER: a rollout of its environments into its slice of the buffer, and its loop
def collect_rollout(
    agent: Agent,
    envs: gym.vector.VectorEnv,
    rollout: dict[str, torch.Tensor],
    carry: tuple,
    args: Args,
    *,
    first_step: int,
    first_env: int,
) -> tuple[tuple, list[Episode]]:
    """`--num-steps` steps of one worker's environments, written into `rollout` (the worker's
    column slice of the rollout buffer, tabulated at `allocate_shared_buffer`).

    `carry` = (next observation, next episode starts, LSTM state) goes from one rollout to the next.
    `first_step` is the global step before this rollout and `first_env` the batch index of the slice's
    first environment: the batch counts its steps step by step, environment by environment, so an
    episode of environment i (of the slice) that ends at step t ended at global step
    first_step + t * num_envs + first_env + i + 1. Returns the new carry and the episodes that ended.
    """
    next_obs, next_start, state = carry
    obs_np, starts_np, actions_np, logprobs_np, values_np, rewards_np, dones_np = (
        rollout[name].numpy() for name in ("obs", "starts", "actions", "logprobs", "values", "rewards", "dones")
    )
    final_values = rollout["final_values"]
    final_values.zero_()
    episodes = []
    for step in range(args.num_steps):
        if step % args.seq_len == 0:  # recurrent detail 5: the state each chunk will be replayed from
            rollout["chunk_h"][step // args.seq_len] = state[0][0]
            rollout["chunk_c"][step // args.seq_len] = state[1][0]
        obs_np[step] = next_obs
        starts_np[step] = next_start
        action, logprob, value, state = agent.act(rollout["obs"][step], rollout["starts"][step], state)
        actions_np[step] = action.numpy()
        logprobs_np[step] = logprob.numpy()
        values_np[step] = value.numpy()
        next_obs, reward, terminated, truncated, infos = envs.step(actions_np[step])

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
    return (next_obs, next_start, state), episodes


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
    ppolab.processes.leave_signals_to_parent()  # Ctrl-C and a closed terminal are the learner's: it stops the workers
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
        # the learner's commands; None once the learner is gone (its pipe closed, or this process orphaned)
        while isinstance(command := ppolab.processes.receive(conn, parent_pid), Start):
            load_weights(agent, weights)
            carry, episodes = collect_rollout(
                agent, envs, rollout, carry, args, first_step=command.global_step, first_env=lo
            )
            conn.send(Done(worker_id, episodes, slice_checksum(buffer, lo, lo + n)))
    except Exception:
        try:
            conn.send(Failed(worker_id, traceback.format_exc()))
        except OSError:  # the learner is gone
            pass
        raise SystemExit(1)
    finally:
        if envs is not None:
            envs.close()


# THE LEARNER'S SIDE: starting the workers, hearing from them, checking their slices, stopping them
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
            worker_args = (w, args, buffer, weights, child_conn, os.getpid(), start_step, run_dir)
            process = context.Process(target=rollout_worker, name=f"rollout-worker-{w}", args=worker_args, daemon=True)
            process.start()
            child_conn.close()
            workers.append(process)
            conns.append(conn)
        wait_for_workers(workers, conns, Ready, max(args.worker_timeout, ppolab.processes.START_TIMEOUT))
        yield workers, conns
        finished = True
    except WorkerFailed as e:  # one line, with the last checkpoint and the command that resumes from it
        raise SystemExit(ppolab.stops.error_line(f"{e}; stopped all workers", run_dir, args.checkpoint_every)) from None
    finally:  # with Stop and a moment to close their environments, else (an error, Ctrl-C) at once
        if finished:
            ppolab.processes.send_to_all(conns, Stop())
        ppolab.processes.end_processes(workers, grace=5.0 if finished else 0.0)
        for conn in conns:
            conn.close()


def wait_for_workers(workers: list, conns: list, expected: type, timeout: float) -> list:
    """One reply of type `expected` (Ready or Done) from each worker, in worker order. A worker that replies
    Failed, dies without a word (killed, crashed: its process is watched too) or sends nothing for `timeout` seconds
    (stopped, stuck) raises WorkerFailed naming the worker and its error or how it ended."""
    replies = [None] * len(workers)
    for i, reply in ppolab.processes.receive_from_each(workers, conns, timeout):
        if isinstance(reply, Failed):
            print(reply.traceback, file=sys.stderr, end="")
            last_line = reply.traceback.strip().splitlines()[-1]
            raise WorkerFailed(f"rollout worker {i} failed: {last_line} (its traceback is above)")
        if reply is None:
            raise WorkerFailed(
                f"rollout worker {i} (pid {workers[i].pid}) {ppolab.processes.how_it_ended(workers[i], timeout)}"
            )
        assert isinstance(reply, expected) and reply.worker == i, reply
        replies[i] = reply
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
# plays an evaluation (in this process, carrying the recurrent state), and the entry point. The rest of a run
# (the run folder, checkpoints and resuming, logging, Ctrl-C and full disks) and the processes' plumbing that is
# not their lesson (ppolab/processes.py) are the package ppolab's. None of it changes what PPO computes; what
# the processes compute and exchange is all above.
# ==================================================================================================


def check_args(args: Args):
    """Bad input ends in one line before any work: how the rollout is cut into chunks and the chunks into
    minibatches (after the counts that takes), the checks of every script (numbers, counts, files, folders),
    then the environment: its id, --hide-velocity, its action space, and where it is not a game its observation
    space (vectors) and, with --capture-video, its rendering."""
    for name in ("num_workers", "num_envs_per_worker", "num_steps", "seq_len", "num_minibatches"):
        if getattr(args, name) <= 0:
            ppolab.fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.num_steps % args.seq_len != 0:
        ppolab.fail(
            f"--seq-len {args.seq_len} does not divide --num-steps {args.num_steps} (the rollout is cut into chunks)"
        )
    if args.num_chunks % args.num_minibatches != 0:
        ppolab.fail(
            f"--num-minibatches {args.num_minibatches} does not divide the {args.num_chunks} chunks "
            f"(--num-workers {args.num_workers} x --num-envs-per-worker {args.num_envs_per_worker} x "
            f"--num-steps {args.num_steps} / --seq-len {args.seq_len}; a minibatch is a set of whole chunks)"
        )
    ppolab.check_args(args, positive=("max_episode_steps",))  # its batch check holds: the chunks divide
    try:
        atari = is_atari(args.env_id)
    except (gym.error.Error, ImportError) as e:
        ppolab.fail(
            f"unknown environment id '{args.env_id}' ({type(e).__name__}: {e}; gymnasium.pprint_registry() lists "
            "the ids: CartPole-v1, ..., and the Atari games as Pong, PongNoFrameskip-v4 or ALE/Pong-v5)"
        )
    if args.hide_velocity and (atari or "CartPole" not in args.env_id):
        ppolab.fail(f"--hide-velocity is for CartPole only, not {args.env_id}")
    observation_space, action_space = env_spaces(args)
    if not isinstance(action_space, gym.spaces.Discrete):
        ppolab.fail(
            f"{args.env_id} has action space {action_space}; this script supports Discrete actions only "
            "(ppo_continuous_action.py trains Box actions)"
        )
    if not atari:  # a game's frames go to the CNN
        ppolab.check_observations(args.env_id, observation_space)
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
    """Plays `episodes` whole episodes (Atari: games, all lives), one per environment, in this process with the
    training preprocessing and the policy of `checkpoint` (a saved model, or a snapshot of the training) on the
    CPU, and returns their returns (unclipped scores). The episodes and the action sampling come from `seed`, so
    the same model scores the same during training, after it or later from the saved file. `video_prefix`
    (`--evaluate --capture-video`): records environment 0's episode as `<video_prefix>-episode-0.mp4`. An episode
    of an environment without a time limit of its own is cut after `max_steps` steps (by default the
    checkpoint's --eval-max-steps); an environment that cannot be made here ends in one line."""
    args = Args(**checkpoint["args"])
    max_steps, whose = args.eval_max_steps if max_steps is None else max_steps, "the checkpoint's environment "
    # environment 0 records its first episode to <run_dir>/videos (the videos folder's parent), named by the prefix
    run_dir, name = str(Path(video_prefix or ".").parent.parent), Path(video_prefix or "rl-video").name
    extras = dict(video_prefix=name, video_trigger=lambda e: e == 0, eval_max_steps=max_steps)
    with ppolab.making(args.env_id, whose):
        if video_prefix is not None and not is_atari(args.env_id):
            ppolab.check_video(args.env_id, whose)
        envs = make_envs(args, episodes, run_dir, video_prefix is not None, **extras)
    agent = Agent(envs.single_observation_space.shape, int(envs.single_action_space.n))
    agent.load_state_dict(checkpoint["model"])
    torch.manual_seed(seed)
    returns = np.full(episodes, np.nan)
    obs, _ = envs.reset(seed=seed)
    state, starts = agent.initial_state(episodes, torch.device("cpu")), torch.ones(1, episodes)
    while np.isnan(returns).any():
        with torch.no_grad():
            out, state = agent.get_states(torch.as_tensor(obs).unsqueeze(0), starts, state)
            logits = agent.heads(out[0])[0]
            action = logits.argmax(-1) if deterministic else Categorical(logits=logits).sample()
        obs, _, terminated, truncated, infos = envs.step(action.numpy())
        ended = np.ones_like(terminated) if not args.memory else terminated | truncated
        starts = torch.as_tensor(ended, dtype=torch.float32).unsqueeze(0)
        for i, episodic_return, _ in finished_episodes(infos):
            if np.isnan(returns[i]):
                returns[i] = episodic_return
    envs.close()
    return returns.tolist()


def main(args: Args) -> str | list[float]:
    """Checks the arguments, then trains (returns the run folder) or, with --evaluate, evaluates (returns the
    episodes' returns)."""
    check_args(args)
    ppolab.use_threads(args.torch_threads)
    if args.evaluate is not None:  # with this command line's --eval-max-steps
        return ppolab.evaluate_file(args, partial(evaluate, max_steps=args.eval_max_steps), atari_id)
    # the run folder (a resumed run's own; the full id in its name), Ctrl-C, refused writes
    with ppolab.Run(args, evaluate, lambda env_id: atari_id(env_id).replace(":", "-")) as run:
        return train(run.args, run)


if __name__ == "__main__":
    ppolab.run_program(main, Args)
