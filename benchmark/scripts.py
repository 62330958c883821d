"""The training scripts, as the benchmark tools and the tests know them: the one list of the nine, the
environment each is measured on, where they stand, and how to import one or start one in a fresh
process. tests/test_copies.py fails when a ppo*.py at the repository root is missing from SCRIPTS."""

import importlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPTS = [
    "ppo",
    "ppo_continuous_action",
    "ppo_atari",
    "ppo_atari_lstm",
    "ppo_atari_envpool",
    "ppo_procgen",
    "ppo_atari_multigpu",
    "ppo_shared_memory_lstm",
    "ppo_continuous_action_redis",
]

# script -> the real environment it is measured and run end to end on: its default (the Atari scripts:
# the short id they expand; ppo_procgen: the game, in easy mode)
ENV_ID = {
    "ppo": "CartPole-v1",
    "ppo_continuous_action": "Hopper-v4",
    "ppo_atari": "Breakout",
    "ppo_atari_lstm": "Breakout",
    "ppo_atari_envpool": "Breakout-v5",
    "ppo_procgen": "starpilot",
}


def import_script(script: str):
    """The training script as a module (its functions and Args, without running it). The environment
    variables are as before the import: what a script sets for itself (the pixel scripts'
    OMP_WAIT_POLICY) must not reach the other processes started from here, CleanRL's among them."""
    sys.path.insert(0, str(ROOT))
    environ = dict(os.environ)
    try:
        return importlib.import_module(script)
    finally:
        for name in set(os.environ) - set(environ):
            del os.environ[name]
        os.environ.update(environ)


def child_env() -> dict[str, str]:
    """The environment of a script started in a fresh process: one thread, the repository importable."""
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
