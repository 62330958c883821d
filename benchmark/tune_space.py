"""What benchmark.tune searches and how it scores: the search space of each script, a file that changes it, how a
space is sampled in an Optuna trial, and the score range of each environment that the normalisation uses.

A space is an ordered dict {flag: how to sample it}, the flag without its dashes (`learning-rate`):
- `{"choices": [...]}`: one of the values (numbers, strings; true/false for a `--x/--no-x` flag);
- `{"low": a, "high": b}`: a number in [a, b], an integer where both are integers; `"log": true` samples it
  uniformly on a log scale (a learning rate), `"step": s` on a grid of that step;
- `"when": {"policy-objective": "adaptive-kl"}` beside either: sampled only in the trials where the flags named
  (sampled before it) have that value (or one of a list of values); the other trials leave the flag alone.

The counts that must divide one another are sampled so that they always do: --num-steps and --num-minibatches
from powers of two, the minibatch count at most what leaves minibatches of several samples (and, in the LSTM
scripts, a divisor of their number of environment sequences). Values the script refuses all the same (a space
file's, or one with other fixed flags) end their trial as pruned with the script's line.
"""

import json
import math
import re
import tomllib
from pathlib import Path

# Common to every space: PPO's coefficients, from the ranges that CleanRL's tuner and RL Baselines3 Zoo search
COMMON = {
    "learning-rate": {"low": 1e-5, "high": 1e-2, "log": True},
    "update-epochs": {"low": 1, "high": 10},
    "gamma": {"choices": [0.9, 0.95, 0.98, 0.99, 0.995, 0.999]},
    "gae-lambda": {"choices": [0.8, 0.9, 0.92, 0.95, 0.98, 0.99, 1.0]},
    "clip-coef": {"choices": [0.1, 0.2, 0.3, 0.4]},
    "ent-coef": {"low": 1e-8, "high": 0.1, "log": True},
    "vf-coef": {"low": 0.1, "high": 1.0},
    "max-grad-norm": {"choices": [0.3, 0.5, 0.7, 1.0, 2.0, 5.0]},
    "policy-objective": {"choices": ["clip", "adaptive-kl", "fixed-kl"]},
    "kl-target": {"low": 0.003, "high": 0.03, "log": True, "when": {"policy-objective": "adaptive-kl"}},
    "kl-beta": {"choices": [0.3, 1.0, 3.0, 10.0], "when": {"policy-objective": "fixed-kl"}},
}


def family(changes: dict) -> dict:
    """COMMON with a family's own entries: those it changes keep their place, its new ones come first (the sizes
    of the rollout and of the minibatches, read first in the tables)."""
    return {
        **{k: v for k, v in changes.items() if k not in COMMON},
        **{k: changes.get(k, v) for k, v in COMMON.items()},
    }


# classic control, an MLP on discrete actions (4 environments): batches of 128 to 2,048 steps
CLASSIC = family({"num-steps": {"choices": [32, 64, 128, 256, 512]}, "num-minibatches": {"choices": [1, 2, 4, 8, 16]}})
# MuJoCo, one environment: a rollout of 256 to 4,096 steps, minibatches of 4 samples or more
CONTINUOUS = family(
    {
        "num-steps": {"choices": [256, 512, 1024, 2048, 4096]},
        "num-minibatches": {"choices": [1, 2, 4, 8, 16, 32, 64]},
        "learning-rate": {"low": 1e-5, "high": 3e-3, "log": True},
        "update-epochs": {"low": 1, "high": 20},
        "gamma": {"choices": [0.95, 0.98, 0.99, 0.995, 0.999]},
        "clip-coef": {"choices": [0.1, 0.2, 0.3]},
        "ent-coef": {"low": 1e-8, "high": 1e-2, "log": True},
        "distribution": {"choices": ["normal", "beta"]},
    }
)
# the Redis learner: its batch is --num-chunks chunks of --num-steps (256) steps
CONTINUOUS_REDIS = {"num-chunks": {"choices": [4, 8, 16]}, **{k: v for k, v in CONTINUOUS.items() if k != "num-steps"}}
# Atari (8 environments; the LSTM script's minibatches are sets of whole environments: divisors of 8)
ATARI = family(
    {
        "num-steps": {"choices": [64, 128, 256]},
        "num-minibatches": {"choices": [1, 2, 4, 8]},
        "learning-rate": {"low": 1e-5, "high": 1e-3, "log": True},
        "update-epochs": {"low": 1, "high": 8},
        "gamma": {"choices": [0.98, 0.99, 0.995]},
        "clip-coef": {"choices": [0.05, 0.1, 0.2, 0.3]},
        "ent-coef": {"low": 1e-4, "high": 0.05, "log": True},
    }
)
# Procgen (64 environments)
PROCGEN = family(
    {
        "num-steps": {"choices": [64, 128, 256, 512]},
        "num-minibatches": {"choices": [2, 4, 8, 16, 32]},
        "learning-rate": {"low": 1e-4, "high": 2e-3, "log": True},
        "update-epochs": {"low": 1, "high": 6},
        "gamma": {"choices": [0.99, 0.995, 0.999]},
        "ent-coef": {"low": 1e-3, "high": 0.05, "log": True},
    }
)
# the shared-memory LSTM (8 environments, chunks of 16 steps: a minibatch is a set of whole chunks)
SHARED_MEMORY_LSTM = family(
    {
        "num-steps": {"choices": [64, 128, 256]},
        "num-minibatches": {"choices": [1, 2, 4, 8]},
        "learning-rate": {"low": 1e-5, "high": 1e-2, "log": True},
    }
)

SPACES = {"ppo": CLASSIC, "ppo_continuous_action": CONTINUOUS, "ppo_continuous_action_redis": CONTINUOUS_REDIS}
SPACES |= dict.fromkeys(["ppo_atari", "ppo_atari_lstm", "ppo_atari_envpool", "ppo_atari_multigpu"], ATARI)
SPACES |= {"ppo_procgen": PROCGEN, "ppo_shared_memory_lstm": SHARED_MEMORY_LSTM}


class SpaceError(ValueError):
    """A space (a file's) that cannot be sampled: the message says which entry and why, in one line."""


def check_entry(name: str, spec) -> dict:
    """`spec` as a space entry, or SpaceError."""
    if not isinstance(spec, dict):
        raise SpaceError(f"[{name}] must be a table (choices = [...], or low = ... and high = ...), or false")
    unknown = set(spec) - {"choices", "low", "high", "log", "step", "when"}
    if unknown:
        raise SpaceError(f"[{name}] has unknown keys {sorted(unknown)} (choices, low, high, log, step, when)")
    if "choices" in spec:
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices or set(spec) - {"choices", "when"}:
            raise SpaceError(f"[{name}]: choices must be a non-empty list, alone (without low, high, log, step)")
        distinct = len(set(map(repr, choices))) == len(choices)
        if not distinct or not all(isinstance(c, (bool, int, float, str)) for c in choices):
            raise SpaceError(f"[{name}]: choices must be distinct numbers, strings or true/false")
    else:
        low, high = spec.get("low"), spec.get("high")
        numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (low, high))
        if not numbers or not low < high:
            raise SpaceError(f"[{name}] needs numbers low < high (or choices = [...]), got low={low}, high={high}")
        if spec.get("log") and low <= 0:
            raise SpaceError(f"[{name}]: log = true needs low > 0, got {low}")
        if spec.get("log") and "step" in spec:
            raise SpaceError(f"[{name}]: log and step cannot go together")
    when = spec.get("when", {})
    if not isinstance(when, dict):
        raise SpaceError(
            f'[{name}]: when must be a table of flags and values, e.g. when = {{policy-objective = "clip"}}'
        )
    return spec


def read_space(path: Path, base: dict) -> dict:
    """The space of a file (TOML or JSON, by its suffix) applied to `base`: each table of the file replaces or adds
    that flag's entry, `flag = false` leaves the flag out of the search, and `inherit = false` starts from
    nothing instead of `base`. Raises SpaceError (an unreadable file, an entry that cannot be sampled)."""
    try:
        text = Path(path).read_text()
        data = json.loads(text) if Path(path).suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as e:
        raise SpaceError(f"cannot read {path}: {e}")
    if not isinstance(data, dict):
        raise SpaceError(f"{path} must hold a table of flags")
    space = dict(base) if data.pop("inherit", True) else {}
    for name, spec in data.items():
        if spec is False:
            space.pop(name, None)
        else:
            space[name] = check_entry(name, spec)
    names = list(space)
    for i, (name, spec) in enumerate(space.items()):
        for other in spec.get("when", {}):
            if other not in names[:i]:
                raise SpaceError(f"[{name}]: when names {other}, which the space does not sample before it")
    if not space:
        raise SpaceError(f"{path} leaves nothing to search")
    return space


def sample(trial, space: dict) -> dict:
    """The values of one trial, {flag: value} in the space's order, drawn by Optuna's `trial`."""
    params = {}
    for name, spec in space.items():
        wanted = {flag: want if isinstance(want, list) else [want] for flag, want in spec.get("when", {}).items()}
        if any(params.get(flag) not in want for flag, want in wanted.items()):
            continue
        low, high, step, log = spec.get("low"), spec.get("high"), spec.get("step"), spec.get("log", False)
        if "choices" in spec:
            params[name] = trial.suggest_categorical(name, spec["choices"])
        elif isinstance(low, int) and isinstance(high, int) and isinstance(step or 1, int):
            params[name] = trial.suggest_int(name, low, high, step=step or 1, log=log)
        else:
            params[name] = trial.suggest_float(name, low, high, step=step, log=log)
    return params


def as_flags(params: dict) -> list[str]:
    """{flag: value} as command-line arguments: `--num-steps 128`, `--norm-adv` / `--no-norm-adv` for true/false."""
    argv = []
    for name, value in params.items():
        if isinstance(value, bool):
            argv.append(f"--{name}" if value else f"--no-{name}")
        else:
            argv += [f"--{name}", str(value)]
    return argv


# The normalisation: a run's score s on the scale of its environment's range [low, high], (s - low) / (high - low).
# Sources: classic control, the least and the most its time limit allows (as CleanRL's tuner's example takes them);
# MuJoCo, D4RL's reference scores (Fu et al. 2020, d4rl/infos.py: a random policy's and an expert's return, measured
# on the -v2 tasks); Atari, a random policy's and a human's score (Mnih et al. 2015, as tabulated in Badia et al.
# 2020, Agent57); Procgen, the easy mode's normalisation constants of Cobbe et al. 2020; DeepMind Control, the range
# every task's return has (a reward in [0, 1] for 1,000 steps).
SCORE_RANGES = {"CartPole-v1": (0.0, 500.0), "CartPole-v0": (0.0, 200.0), "Acrobot-v1": (-500.0, 0.0)}
SCORE_RANGES |= {"MountainCar-v0": (-200.0, 0.0), "HalfCheetah": (-280.178953, 12135.0), "Hopper": (-20.272305, 3234.3)}
SCORE_RANGES |= {"Walker2d": (1.629008, 4592.3), "Ant": (-325.6, 3879.7)}
SCORE_RANGES |= {"Breakout": (1.7, 30.5), "Pong": (-20.7, 14.6), "BeamRider": (363.9, 16926.5), "Enduro": (0.0, 860.5)}
SCORE_RANGES |= {"SpaceInvaders": (148.0, 1668.7), "Seaquest": (68.4, 42054.7), "Qbert": (163.9, 13455.0)}
SCORE_RANGES |= {"coinrun": (5.0, 10.0), "starpilot": (2.5, 64.0), "caveflyer": (3.5, 12.0), "dodgeball": (1.5, 19.0)}
SCORE_RANGES |= {"fruitbot": (-1.5, 32.4), "chaser": (0.5, 13.0), "miner": (1.5, 13.0), "jumper": (3.0, 10.0)}
SCORE_RANGES |= {"leaper": (3.0, 10.0), "maze": (5.0, 10.0), "bigfish": (1.0, 40.0), "heist": (3.5, 10.0)}
SCORE_RANGES |= {"climber": (2.0, 12.6), "plunder": (4.5, 30.0), "ninja": (3.5, 10.0), "bossfight": (0.5, 13.0)}


def score_range(env_id: str, given: dict | None = None) -> tuple[float, float] | None:
    """[low, high] of an environment: given (--score-range), else SCORE_RANGES by the id as written, by the name
    without its version (`HalfCheetah-v4`, `Breakout-v5`), by the Atari game (`ALE/Pong-v5`,
    `PongNoFrameskip-v4`), and (0, 1000) for DeepMind Control; None where none is known."""
    given = given or {}
    if env_id in given:
        return given[env_id]
    if env_id in SCORE_RANGES:
        return SCORE_RANGES[env_id]
    if env_id.startswith("dm_control/"):
        return (0.0, 1000.0)
    name = re.sub(r"^ALE/|(NoFrameskip)?-v\d+$", "", env_id)
    return SCORE_RANGES.get(name)


def min_max(score: float, bounds: tuple[float, float]) -> float:
    """(score - low) / (high - low): 0 at low, 1 at high; nan stays nan."""
    low, high = bounds
    return (score - low) / (high - low) if math.isfinite(score) else float("nan")
