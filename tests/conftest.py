import importlib

import gymnasium as gym
import pytest
import torch

from fake_envs import ConstantEnv, FixedLengthEnv
from helpers import FIXED_LENGTH, MODULES, TIME_LIMIT
from scripts import SCRIPTS

torch.set_num_threads(1)

for suffix, continuous in (("", False), ("Box", True)):
    gym.register(f"FixedLength{suffix}-v0", entry_point=FixedLengthEnv,
                 kwargs=dict(length=FIXED_LENGTH, continuous=continuous))
    gym.register(f"Constant{suffix}-v0", entry_point=ConstantEnv, kwargs=dict(continuous=continuous),
                 max_episode_steps=TIME_LIMIT)


@pytest.fixture(params=MODULES)
def script(request):
    """The module under test: ppo or ppo_continuous_action."""
    return importlib.import_module(request.param)


@pytest.fixture(params=SCRIPTS)
def every_script(request):
    """Each training script in turn, for the pieces that all of them hold."""
    return importlib.import_module(request.param)
