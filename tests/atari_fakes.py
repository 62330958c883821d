"""A small ALE-like environment whose frames, rewards and lives are known in advance, for the tests of
ppo_atari.py's wrappers. It offers exactly what those wrappers use: Gymnasium's reset/step with a
seeded `np_random`, `get_action_meanings()` and `ale.lives()`; `gym.make` passes it the ALE settings
that `ppo_atari.make_env` gives every game.

A game: frame t (counted from the game's reset) is `frame_image(t)`, its reward `frame_reward(t)`;
a life is lost at each of LIFE_LOSS_FRAMES, and the game is over at GAME_OVER_FRAME. MixedEndsAtari, at
the end, is a variant whose games end as the contract's environments end theirs (tests/test_contract.py)."""

import gymnasium as gym
import numpy as np

LIVES = 3
LIFE_LOSS_FRAMES = (50, 121)  # lives 3 -> 2 -> 1
GAME_OVER_FRAME = 202  # lives 1 -> 0, terminated; not a multiple of 4: the last agent step is cut short
SHAPE = (210, 160)


def frame_image(t: int) -> np.ndarray:
    """Sprites flicker: even frames draw the left half, odd frames the right half, with a value that
    jumps around from frame to frame, so a max over two frames differs from any single frame and
    from a max over more frames."""
    image = np.full(SHAPE, (5 * t) % 17, dtype=np.uint8)
    half = slice(0, SHAPE[1] // 2) if t % 2 == 0 else slice(SHAPE[1] // 2, None)
    image[:, half] = 20 + (37 * t) % 211
    return image


def frame_reward(t: int) -> float:
    """0 during the first 30 frames (the no-ops), then 3 on multiples of 7 and -2 on multiples of 11."""
    if t <= 30:
        return 0.0
    return 3.0 * (t % 7 == 0) - 2.0 * (t % 11 == 0)


def game_score(last_frame: int = GAME_OVER_FRAME) -> float:
    return sum(frame_reward(t) for t in range(1, last_frame + 1))


class FakeALE:
    def __init__(self, env: "FakeAtariEnv"):
        self.env = env

    def lives(self) -> int:
        return self.env.lives


class FakeAtariEnv(gym.Env):
    """`frame`: frames since the game's reset; `actions`: the action of each of those frames;
    `resets`: real game resets so far; `settings`: the keyword arguments it was made with.

    has_fire: whether the action meanings include FIRE.
    truncate_on_noop_after_life_loss: the frame limit falls on the first no-op after a lost life
    (the tests' agent never chooses NOOP itself), so a game ends inside the reset that follows.
    truncate_on_life_loss: the frame limit falls on the frame of the first lost life, so the agent
    step that loses it is both terminated (episodic life) and truncated, and the game ends there."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 60}

    def __init__(
        self,
        has_fire: bool = True,
        truncate_on_noop_after_life_loss: bool = False,
        truncate_on_life_loss: bool = False,
        render_mode=None,
        **settings,
    ):
        assert settings.get("obs_type", "grayscale") == "grayscale"
        self.settings = settings
        self.render_mode = render_mode
        self.meanings = ["NOOP", "FIRE", "RIGHT", "LEFT"] if has_fire else ["NOOP", "RIGHT", "LEFT"]
        self.truncate_on_noop_after_life_loss = truncate_on_noop_after_life_loss
        self.truncate_on_life_loss = truncate_on_life_loss
        self.observation_space = gym.spaces.Box(0, 255, SHAPE, np.uint8)
        self.action_space = gym.spaces.Discrete(len(self.meanings))
        self.ale = FakeALE(self)
        self.resets, self.frame, self.lives, self.actions = 0, 0, LIVES, []

    def get_action_meanings(self) -> list[str]:
        return list(self.meanings)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.resets += 1
        self.frame, self.lives, self.actions = 0, LIVES, []
        return frame_image(0), {"lives": self.lives}

    def step(self, action):
        self.frame += 1
        self.actions.append(int(action))
        self.lives = LIVES - sum(self.frame >= f for f in LIFE_LOSS_FRAMES) - (self.frame >= GAME_OVER_FRAME)
        terminated = self.frame >= GAME_OVER_FRAME
        limit = self.settings.get("max_num_frames_per_episode")
        truncated = limit is not None and self.frame >= limit
        if self.truncate_on_noop_after_life_loss and action == 0 and self.lives < LIVES:
            truncated = True
        if self.truncate_on_life_loss and self.lives < LIVES:
            truncated = True
        return frame_image(self.frame), frame_reward(self.frame), terminated, truncated, {"lives": self.lives}

    def render(self):
        return np.repeat(frame_image(self.frame)[:, :, None], 3, axis=2)


for env_id, kwargs in (
    ("FakeAtari-v0", {}),
    ("FakeAtariNoFire-v0", {"has_fire": False}),
    ("FakeAtariNoopTruncation-v0", {"truncate_on_noop_after_life_loss": True}),
    ("FakeAtariLifeLossTruncation-v0", {"truncate_on_life_loss": True}),
):
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=FakeAtariEnv, kwargs=kwargs)


ATARI_END_FRAME = 120  # MixedEndsAtari: every game ends here (about 25 agent steps after the reset's frames)


class MixedEndsAtari(FakeAtariEnv):
    """The game above without life losses, for the contract's runs (tests/helpers.py RUNS), ended at
    ATARI_END_FRAME as MixedEndsEnv ends its episodes: odd-numbered games by game over *and* the frame
    limit, even ones by the limit only; reward 0 on every frame except -1 on the frame of a game over."""

    def step(self, action):
        self.frame += 1
        self.actions.append(int(action))
        truncated = self.frame >= ATARI_END_FRAME
        terminated = truncated and self.resets % 2 == 1
        return frame_image(self.frame), -1.0 if terminated else 0.0, terminated, truncated, {"lives": LIVES}


if "MixedEndsAtari-v0" not in gym.registry:
    gym.register("MixedEndsAtari-v0", entry_point=MixedEndsAtari)


class OffsetActionsAtari(FakeAtariEnv):
    """The game above with its actions numbered from 1 (`Discrete(4, start=1)`), as no ale-py game numbers them."""

    def __init__(self, **settings):
        super().__init__(**settings)
        self.action_space = gym.spaces.Discrete(len(self.meanings), start=1)


if "OffsetActionsAtari-v0" not in gym.registry:
    gym.register("OffsetActionsAtari-v0", entry_point=OffsetActionsAtari)
