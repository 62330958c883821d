import importlib
import signal

import pytest
import torch

import fake_envs  # noqa: F401  (registers the fake environments)
from helpers import MODULES
from scripts import SCRIPTS

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def on_the_cpu(request, monkeypatch):
    """The suite gives the same verdict on a machine with a GPU: scripts run in-process see no CUDA
    (those started as commands get `--no-cuda` from helpers.script_command), except in the tests
    marked `gpu` (tests/test_gpu.py)."""
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture(autouse=True)
def keep_the_ctrl_c_handler():
    """A script run in-process installs its Ctrl-C handler (exit_on_ctrl_c): the suite's own comes back after."""
    handler = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, handler)


@pytest.fixture(params=MODULES)
def script(request):
    """The module under test: ppo or ppo_continuous_action."""
    return importlib.import_module(request.param)


@pytest.fixture(params=SCRIPTS)
def every_script(request):
    """Each training script in turn, for the pieces that all of them hold."""
    return importlib.import_module(request.param)
