"""Small environments whose outcomes are known in advance (registered in conftest.py)."""

import gymnasium as gym
import numpy as np

FIXED_LENGTH = 3  # FixedLength*: terminates after exactly this many steps
TIME_LIMIT = 10  # Constant*: truncated by a TimeLimit after this many steps


def _action_space(continuous: bool) -> gym.Space:
    return gym.spaces.Box(-1.0, 1.0, (2,), np.float32) if continuous else gym.spaces.Discrete(2)


class FixedLengthEnv(gym.Env):
    """Terminates after exactly `length` steps, reward 1 per step; observation [t, 1] with t the
    number of steps taken in the current episode, so a test can tell which step it sees."""

    metadata = {"render_modes": []}

    def __init__(self, length: int = 3, continuous: bool = False):
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, np.inf, (2,), np.float32)
        self.action_space = _action_space(continuous)
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.t, 1.0], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t >= self.length, False, {}


class ConstantEnv(gym.Env):
    """Never terminates (only a TimeLimit ends it); reward 1 and the same observation at every step,
    so the critic cannot tell how far the time limit is."""

    metadata = {"render_modes": []}

    def __init__(self, continuous: bool = False):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = _action_space(continuous)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.ones(2, np.float32), {}

    def step(self, action):
        return np.ones(2, np.float32), 1.0, False, False, {}


MIXED_LIMIT = 5  # MixedEnds*: the time limit, and the step at which odd-numbered episodes terminate


class MixedEndsEnv(gym.Env):
    """Every episode lasts MIXED_LIMIT steps and is cut there by a TimeLimit; odd-numbered episodes also
    terminate on that step, so Gymnasium's TimeLimit reports both flags, and even-numbered ones are only
    truncated. Rewards tell the two kinds of end apart after any sign-preserving scaling: 1 per step,
    but on the last step -1 where the episode terminated and 0 where it was only truncated."""

    metadata = {"render_modes": []}

    def __init__(self, continuous: bool = False):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = _action_space(continuous)
        self.t, self.episodes = 0, 0

    def _obs(self) -> np.ndarray:
        return np.array([self.t / MIXED_LIMIT, self.episodes % 2], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.episodes = 0, self.episodes + 1
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        last = self.t >= MIXED_LIMIT
        terminated = last and self.episodes % 2 == 1
        reward = (-1.0 if terminated else 0.0) if last else 1.0
        return self._obs(), reward, terminated, False, {}


class SpaceEnv(gym.Env):
    """An environment whose observations live in the space it is given (a Dict, a Tuple, a Discrete, an
    image): a space that a script may not support. Episodes of FIXED_LENGTH steps of reward 1; observations
    are samples of the space."""

    metadata = {"render_modes": []}

    def __init__(self, observation_space: gym.Space, continuous: bool = False):
        self.observation_space, self.action_space = observation_space, _action_space(continuous)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), 1.0, self.t >= FIXED_LENGTH, False, {}


class NoDisplayEnv(FixedLengthEnv):
    """FixedLengthEnv that says it renders RGB frames but cannot here, as MuJoCo without EGL cannot: its render
    raises."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, render_mode: str | None = None, continuous: bool = False):
        super().__init__(FIXED_LENGTH, continuous)
        self.render_mode = render_mode

    def render(self):
        raise RuntimeError("cannot open a display (a renderer that cannot start here)")


class BoundsEnv(gym.Env):
    """Box actions with bounds that differ per dimension and are not [-1, 1] ([-3, -1] and [0.5, 2], or unbounded
    with `unbounded`): an action outside them raises, so a run that trains on it never sent one. The reward is
    the first action's distance from -1 (the middle of its range is -2), so a policy can learn something."""

    def __init__(self, unbounded: bool = False):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        low, high = (np.array([-np.inf, -np.inf]), np.array([np.inf, np.inf])) if unbounded else ([-3, 0.5], [-1, 2])
        self.action_space = gym.spaces.Box(np.array(low, np.float32), np.array(high, np.float32))
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        if not self.action_space.contains(np.asarray(action, np.float32)):
            raise ValueError(f"action {action} outside the bounds {self.action_space}")
        self.t += 1
        return np.full(2, self.t / FIXED_LENGTH, np.float32), -abs(float(action[0]) + 1), False, False, {}


class StrictActionsEnv(gym.Env):
    """Actions in a space that a policy's numbers do not cover as they are: `Discrete(3, start=1)` (actions 1, 2, 3)
    or, with `integers`, a Box of int64 ([-2, 0] to [2, 4]). An action outside the space (0, or a float) raises, so
    a run that trains on it never sent one; `taken` keeps every action it got. Episodes of FIXED_LENGTH steps; the
    reward is the first action's value, so a policy can learn something."""

    def __init__(self, integers: bool = False):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        if integers:
            self.action_space = gym.spaces.Box(np.array([-2, 0]), np.array([2, 4]), dtype=np.int64)
        else:
            self.action_space = gym.spaces.Discrete(3, start=1)
        self.t, self.taken = 0, []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} outside the action space {self.action_space}")
        self.taken.append(action)
        self.t += 1
        return np.full(2, self.t / FIXED_LENGTH, np.float32), float(np.ravel(action)[0]), False, False, {}


# the observation spaces of SpaceEnv's ids: `<name>Obs-v0` (Discrete actions), `<name>ObsBox-v0` (Box actions)
ODD_SPACES = {
    "Dict": gym.spaces.Dict({"position": gym.spaces.Box(-1.0, 1.0, (2,), np.float32), "flag": gym.spaces.Discrete(2)}),
    "Tuple": gym.spaces.Tuple((gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Discrete(3))),
    "Discrete": gym.spaces.Discrete(5),
    "Image": gym.spaces.Box(0, 255, (16, 16, 3), np.uint8),
}


def register_fake_envs():
    """Registers the environments above (idempotent). Importing this module as `tests.fake_envs`
    registers them too, so an id like `tests.fake_envs:MixedEnds-v0` works in spawned processes.
    `Endless*-v0` is ConstantEnv without a time limit: its episodes never end. `NoDisplay*-v0` cannot render here,
    `FixedLength*-v0` cannot render at all. `Bounds-v0`: BoundsEnv (`Unbounded-v0` without bounds). `OffsetActions-v0`
    and `IntegerActions-v0`: StrictActionsEnv, its Discrete(3, start=1) and its Box of integers."""
    for suffix, continuous in (("", False), ("Box", True)):
        for env_id, entry_point, kwargs, limit in (
            (f"FixedLength{suffix}-v0", FixedLengthEnv, dict(length=FIXED_LENGTH, continuous=continuous), None),
            (f"Constant{suffix}-v0", ConstantEnv, dict(continuous=continuous), TIME_LIMIT),
            (f"MixedEnds{suffix}-v0", MixedEndsEnv, dict(continuous=continuous), MIXED_LIMIT),
            (f"Endless{suffix}-v0", ConstantEnv, dict(continuous=continuous), None),
            (f"NoDisplay{suffix}-v0", NoDisplayEnv, dict(continuous=continuous), None),
            *[
                (f"{name}Obs{suffix}-v0", SpaceEnv, dict(observation_space=space, continuous=continuous), None)
                for name, space in ODD_SPACES.items()
            ],
        ):
            if env_id not in gym.registry:
                gym.register(env_id, entry_point=entry_point, kwargs=kwargs, max_episode_steps=limit)
    for env_id, kwargs in (("Bounds-v0", {}), ("Unbounded-v0", {"unbounded": True})):
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=BoundsEnv, kwargs=kwargs, max_episode_steps=FIXED_LENGTH)
    for env_id, kwargs in (("OffsetActions-v0", {}), ("IntegerActions-v0", {"integers": True})):
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=StrictActionsEnv, kwargs=kwargs, max_episode_steps=FIXED_LENGTH)


register_fake_envs()


class MixedEndsEnvPool:
    """envpool's vector API (gymnasium style) with its next-step reset, on MixedEndsEnv's episodes: each
    lasts MIXED_LIMIT steps; odd-numbered ones end terminated and truncated, even ones truncated only;
    reward 0 except -1 on a terminating step. The step after an episode end is the reset row (reward 0,
    no flags, elapsed_step 0). `info` carries what the scripts read: the unclipped reward, game over
    (`terminated`) and `elapsed_step`. Frames are uint8 of `obs_shape`, filled with the step count."""

    def __init__(self, num_envs: int, obs_shape: tuple, n_actions: int = 4):
        self.observation_space = gym.spaces.Box(0, 255, obs_shape, np.uint8)
        self.action_space = gym.spaces.Discrete(n_actions)
        self.num_envs = num_envs
        self.t = np.zeros(num_envs, dtype=np.int64)
        self.episodes = np.ones(num_envs, dtype=np.int64)
        self.ended = np.zeros(num_envs, dtype=bool)

    def _obs(self) -> np.ndarray:
        return np.broadcast_to(
            (self.t * 40 % 256).astype(np.uint8).reshape(-1, *[1] * len(self.observation_space.shape)),
            (self.num_envs,) + self.observation_space.shape,
        ).copy()

    def reset(self):
        self.t[:], self.episodes[:], self.ended[:] = 0, 1, False
        return self._obs(), {"env_id": np.arange(self.num_envs)}

    def step(self, actions):
        assert len(actions) == self.num_envs
        self.episodes += self.ended
        self.t = np.where(self.ended, 0, self.t + 1)
        truncated = self.t >= MIXED_LIMIT
        terminated = truncated & (self.episodes % 2 == 1)
        reward = np.where(terminated, -1.0, 0.0)
        self.ended = truncated
        info = {
            "env_id": np.arange(self.num_envs),
            "reward": reward,
            "terminated": terminated.astype(np.int32),
            "elapsed_step": self.t.copy(),
        }
        return self._obs(), reward, terminated, truncated.copy(), info

    def close(self):
        pass
