"""Gymnasium's environments as the scripts take them: an environment id checked (Gymnasium's `module:Name-v0` ids
too), an environment that cannot be made here, a space a script does not support, an id that is not an Atari game
in an Atari script and --capture-video with an environment that cannot render each refused in one line before any
work, actions that the policy's numbers map onto exactly (`policy_actions`), and the one environment an evaluation
plays on (`make_eval_env`), whose episodes always end."""

import contextlib
import importlib
import os
import re
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np

from ppolab.checks import fail
from ppolab.settings import script_of

IDS = "gymnasium.pprint_registry() lists the valid ids"  # where to look for an id (env_spec's `ids`)


def described(error: BaseException) -> str:
    """An exception in a few words: its type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def env_module(env_id: str, whose: str = "") -> str:
    """Gymnasium's way to name an environment that a module registers is `module:Name-v0`
    (`my_pkg.my_envs:MyEnv-v0`): gym.make imports the module, then makes `Name-v0`. This imports the module the
    same way (a module that cannot be imported, whatever it raised, ends in one line naming it) and returns the id
    without it; any other id as it is (a `dm_control/<domain>-<task>-v0` id imports shimmy first, which registers
    them). `whose` starts the line (e.g. "the checkpoint's environment ")."""
    if env_id.startswith("dm_control/"):  # DeepMind Control's tasks, which shimmy registers when imported
        os.environ.setdefault("MUJOCO_GL", "egl")  # dm_control picks its renderer once, at import: EGL needs no display
        try:
            importlib.import_module("shimmy")
        except ImportError as e:
            fail(
                f"{env_id} needs shimmy and dm-control (requirements.txt; bash setup.sh installs them): {described(e)}"
            )
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except Exception as e:  # ImportError or whatever the module raised while it ran
            fail(f"cannot import the module {module} of {whose or 'the environment '}{env_id}: {described(e)}")
    return name


def env_spec(env_id: str, ids: str = IDS) -> gym.envs.registration.EnvSpec:
    """The registered spec of an environment id, `module:Name-v0` ids included (`env_module`), as gym.spec gives
    it (an id without its version is not one); an unknown id ends in one line (`ids`: where to find the known
    ones)."""
    name = env_module(env_id)
    try:
        spec = gym.spec(name)
    except gym.error.Error as e:
        fail(f"unknown environment id '{env_id}'{suggestion(e)} ({ids})")
    if str(spec.entry_point).startswith("gymnasium.envs.mujoco"):
        hold_mujoco_warnings()
    with making(env_id), warnings.catch_warnings():  # registered, yet not makeable here: Pusher-v4 needs mujoco<3
        warnings.simplefilter("ignore")  # (what making one says, the run's own says again)
        gym.make(name).close()
    return spec


# held: MuJoCo's warnings waiting for the run's first lines, or None; routed: whether they go through mujoco_warning
MUJOCO_WARNINGS = {"held": None, "seen": set(), "routed": False}


def hold_mujoco_warnings():
    """MuJoCo prints its warnings itself, from C, not through Python's warnings: HalfCheetah's model, which sets a
    deprecated compiler attribute (settotalmass), would print one before the run's first line each time it is made.
    From the first call on MuJoCo's warnings go through `mujoco_warning`: each distinct one once, held until
    `print_held_mujoco_warnings` (the run folder printed), then printed as they come. A later call (the environment
    checked, then made again) changes nothing: what is held stays held."""
    import mujoco

    if not MUJOCO_WARNINGS["routed"]:
        MUJOCO_WARNINGS.update(held=[], routed=True)
        mujoco.set_mju_user_warning(mujoco_warning)


def mujoco_warning(message: str):
    if message in MUJOCO_WARNINGS["seen"]:
        return
    MUJOCO_WARNINGS["seen"].add(message)
    if MUJOCO_WARNINGS["held"] is None:
        print(f"MuJoCo warning: {message}", flush=True)
    else:
        MUJOCO_WARNINGS["held"].append(message)


def print_held_mujoco_warnings():
    """Prints the warnings MuJoCo gave before the run's first lines; later ones print as they come."""
    held, MUJOCO_WARNINGS["held"] = MUJOCO_WARNINGS["held"] or [], None
    for message in held:
        print(f"MuJoCo warning: {message}", flush=True)


def suggestion(error: gym.error.Error) -> str:
    """Gymnasium's "Did you mean" for an id it does not know (`cartpole-v1`: CartPole), as `: did you mean CartPole?`;
    else nothing."""
    match = re.search(r"Did you mean: `([^`]+)`", str(error))
    return f": did you mean {match[1]}?" if match else ""


@contextlib.contextmanager
def making(env_id: str, whose: str = ""):
    """Around the code that makes the environment `env_id`: one that cannot be made here (an unknown id, its
    module, its own package or a dependency missing: Gymnasium's errors and ImportError) ends in one line naming
    it, `whose` first (e.g. "the checkpoint's environment ": `--evaluate` of a model trained elsewhere)."""
    env_module(env_id, whose)
    try:
        yield
    except (gym.error.Error, ImportError) as e:
        fail(f"cannot make {whose}{env_id} here: {described(e)}")


def environment_failure(error: BaseException | None):
    """Where `error` (an exception that ends a run) was raised by an environment's step() or reset() (the user's
    environment, a wrapper, or the vector environment given what they returned: a wrong shape or dtype): (the
    traceback from the outermost environment frame on, the environment's id, the function, the run's global step
    where the training loop (`train`) has one, else None); None for any other error, and for a stop (a signal's
    SystemExit or KeyboardInterrupt, which may land while an environment steps: not the environment's doing)."""
    if not isinstance(error, Exception):
        return None
    envs, tb, step = [], getattr(error, "__traceback__", None), None
    while tb is not None:
        frame = tb.tb_frame
        obj = frame.f_locals.get("self")
        if frame.f_code.co_name == "train" and isinstance(frame.f_locals.get("global_step"), int):
            step = frame.f_locals["global_step"]
        if frame.f_code.co_name in ("step", "reset") and isinstance(obj, (gym.Env, gym.vector.VectorEnv)):
            envs.append((tb, obj, frame.f_code.co_name))
        tb = tb.tb_next
    if not envs:
        return None
    (outermost, _, _), (_, env, function) = envs[0], envs[-1]
    spec = getattr(env, "spec", None)
    name = spec.id if spec is not None else type(getattr(env, "unwrapped", env)).__name__
    return outermost, name, function, step


class ActionsFromZero(gym.ActionWrapper):
    """A `Discrete(n, start=k)` environment as the policy sees it: `Discrete(n)`, actions 0 to n - 1 (a categorical
    policy's), each shifted by k on its way to the environment, so the environment gets exactly its own k to
    k + n - 1."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.start = env.action_space.start
        self.action_space = gym.spaces.Discrete(env.action_space.n)

    def action(self, action):
        return action + self.start


class RoundedActions(gym.ActionWrapper):
    """An environment whose Box actions are integers (an integer dtype) as the policy sees it: a float32 Box of the
    same bounds; each action rounded to the nearest integer, clipped to the bounds and cast to the environment's
    dtype on its way there. The policy learns, and is scored, on the actions the environment took."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.action_space
        self.action_space = gym.spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32))

    def action(self, action):
        space = self.env.action_space
        return np.clip(np.rint(action), space.low, space.high).astype(space.dtype)


def policy_actions(env: gym.Env) -> gym.Env:
    """`env` with actions the policy's outputs map onto exactly: a `Discrete(n, start=k)` shifted to 0 to n - 1
    (ActionsFromZero), a Box of integers rounded and clipped (RoundedActions); any other environment as it is (no
    wrapper, no cost). A script's `make_env` and the evaluation's environment (make_eval_env) pass every
    environment through it."""
    space = env.action_space
    if isinstance(space, gym.spaces.Box) and (space.dtype == np.bool_ or not np.issubdtype(space.dtype, np.number)):
        env.close()
        fail(
            f"{env.spec.id if env.spec else type(env.unwrapped).__name__} has a Box of {space.dtype} actions, which "
            "a policy's numbers do not map onto: a Box of floats or integers, or MultiBinary for on/off actions"
        )
    if isinstance(space, gym.spaces.Discrete) and space.start != 0:
        return ActionsFromZero(env)
    if isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.integer):
        return RoundedActions(env)
    return env


def check_observations(env_id: str, space: gym.Space, envs: gym.vector.VectorEnv | None = None):
    """The MLP scripts (and the shared-memory script's classic-control path) observe vectors: a one-dimensional Box.
    Another space (a Dict, a Tuple, a Discrete, an image) ends in one line, `envs` closed first, as an action space
    that a script does not support does; the script would end in a traceback of its network."""
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        if envs is not None:
            envs.close()
        fail(
            f"{env_id} has observation space {space}; this script supports one-dimensional Box observations "
            "only (gymnasium.wrappers.FlattenObservation makes one of a Dict, Tuple or Discrete space; images: the "
            "Atari scripts)"
        )


def check_finite_bounds(env_id: str, space: gym.spaces.Box, envs: gym.vector.VectorEnv | None = None):
    """--distribution beta scales actions from [0, 1] to the action space's bounds: they must be finite. Bounds
    that are not end in one line, `envs` closed first."""
    if not (np.isfinite(space.low).all() and np.isfinite(space.high).all()):
        if envs is not None:
            envs.close()
        fail(f"--distribution beta scales actions to the bounds, and those of {env_id} are not finite: {space}")


def newer_version(env_id: str) -> str | None:
    """The id of a newer version of `env_id` that Gymnasium registers (`Hopper-v5` for `Hopper-v4`), else None.
    Gymnasium's own warning of it, with terminal colours, would come before the run folder: run_program silences it,
    and the run says it in one plain line after the folder (ppolab.run)."""
    try:
        namespace, name, version = gym.envs.registration.parse_env_id(env_id)
        highest = gym.envs.registration.find_highest_version(namespace, name)
    except gym.error.Error:
        return None
    if version is None or highest is None or highest <= version:
        return None
    return gym.envs.registration.get_env_id(namespace, name, highest)


def check_atari_game(args, env_id: str):
    """`env_id` (the full id that --env-id names) is an Atari game of ale-py that Gymnasium can make here, with
    what the Atari wrappers use (lives, action meanings); else one line."""
    try:
        gym.spec(env_module(env_id))  # `module:Name-v0`: the module imported first, as gym.make does
    except gym.error.Error as e:
        fail(
            f"unknown Atari game '{args.env_id}'{suggestion(e)} (python -c 'import gymnasium as gym, ale_py; "
            "gym.register_envs(ale_py); gym.pprint_registry()' lists the ids: Breakout, Pong, ... as "
            "BreakoutNoFrameskip-v4 or ALE/Breakout-v5)"
        )
    try:
        env = gym.make(env_id)
        atari = hasattr(env.unwrapped, "ale") and hasattr(env.unwrapped, "get_action_meanings")
        space = env.action_space
        env.close()
    except gym.error.Error as e:
        fail(f"cannot make {env_id}: {e}")
    if not atari:
        fail(f"{env_id} is not an Atari game; {script_of(args)} trains Atari games only")
    if not isinstance(space, gym.spaces.Discrete) or space.start != 0:  # (ale-py's games: actions 0 to n - 1)
        fail(f"{env_id} has action space {space}; {script_of(args)} trains Discrete actions from 0 (ale-py's games)")


def offscreen():
    """Rendering without a display: classic control draws with pygame, whose SDL gets its dummy drivers (no display,
    no sound card: without them SDL complains on a machine without a desktop session); MuJoCo renders with EGL. A
    choice already made in the environment stays."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    os.environ.setdefault("MUJOCO_GL", "egl")


def check_video(env_id: str, whose: str = ""):
    """--capture-video: the environment renders RGB frames here. Checked before any work on one environment made,
    reset, rendered and closed: one that has no `rgb_array` render mode, or whose rendering fails here (pygame or
    EGL missing, ...), ends in one line, not in a library's traceback once the run is under way."""
    offscreen()
    with making(env_id, whose):
        env = gym.make(env_id)
    modes = env.metadata.get("render_modes") or []
    env.close()
    if "rgb_array" not in modes:
        fail(f"--capture-video: {whose}{env_id} cannot render frames to record (its render modes: {modes or 'none'})")
    try:
        env = gym.make(env_id, render_mode="rgb_array")
        env.reset(seed=0)
        frame = env.render()
        env.close()
    except Exception as e:  # whatever the renderer raised
        fail(f"--capture-video: {whose}{env_id} cannot render here: {described(e)}")
    if not isinstance(frame, np.ndarray) or frame.ndim != 3:
        fail(f"--capture-video: {whose}{env_id} renders {type(frame).__name__}, not an RGB frame")


class EvaluationCap(gym.wrappers.TimeLimit):
    """gymnasium's TimeLimit on an evaluation's environment that has no time limit of its own: an episode is cut
    (truncated) after `max_steps` steps, and a line says so, so that an evaluation always ends."""

    def __init__(self, env: gym.Env, max_steps: int, env_id: str):
        super().__init__(env, max_steps)
        self.env_id = env_id

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if truncated and not terminated and self._elapsed_steps >= self._max_episode_steps:
            print(
                f"evaluation: an episode cut after {self._max_episode_steps} steps (--eval-max-steps): {self.env_id} "
                "has no time limit of its own",
                flush=True,
            )
        return obs, reward, terminated, truncated, info


def capped(env: gym.Env, env_id: str, max_steps: int | None) -> gym.Env:
    """`env` with its episodes cut after `max_steps` steps (EvaluationCap) where it has no time limit of its own
    (gym.make puts gymnasium's TimeLimit on an environment registered with max_episode_steps); as it is otherwise,
    or where `max_steps` is None."""
    if max_steps is None or (env.spec is not None and env.spec.max_episode_steps is not None):
        return env
    return EvaluationCap(env, max_steps, env_id)


def make_eval_env(env_id: str, video_prefix: str | None, max_steps: int) -> gym.Env:
    """The one environment of an evaluation of a policy trained on `env_id` (the scripts with a single evaluation
    environment of Gymnasium's). Its episodes always end: `max_steps` (--eval-max-steps) cuts them where it has
    no time limit of its own (capped); its actions are the policy's (policy_actions). `video_prefix`
    (`--evaluate --capture-video`): every episode is recorded as `<video_prefix>-episode-<k>.mp4`, the rendering checked first (check_video). An environment that
    cannot be made here ends in one line naming it (`making`)."""
    whose = "the checkpoint's environment "
    if video_prefix is None:
        with making(env_id, whose):
            return policy_actions(capped(gym.make(env_id), env_id, max_steps))
    check_video(env_id, whose)
    env = capped(gym.make(env_id, render_mode="rgb_array"), env_id, max_steps)
    return policy_actions(
        gym.wrappers.RecordVideo(
            env,
            str(Path(video_prefix).parent),
            name_prefix=Path(video_prefix).name,
            episode_trigger=lambda episode: True,
            disable_logger=True,
        )
    )
