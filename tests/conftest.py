import importlib
import signal

import pytest
import torch
from threadpoolctl import threadpool_limits

from fake_envs import MixedEndsEnvPool  # importing fake_envs registers the fake environments
from helpers import alone_or_side_by_side, suite_locks
from scripts import MODULES, SCRIPTS

torch.set_num_threads(1)

ENVPOOL_FRAMES = {"ppo_atari_envpool": (4, 84, 84), "ppo_procgen": (64, 64, 3)}  # the contract's fake envpool


@pytest.fixture(autouse=True)
def on_the_cpu(request, monkeypatch):
    """The suite gives the same verdict on a machine with a GPU: scripts run in-process see no CUDA
    (those started as commands get `--no-cuda` from helpers.script_command), except in the tests
    marked `gpu` (tests/test_gpu.py)."""
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture(autouse=True)
def one_thread_again():
    """A script run in-process sets its --torch-threads (2 in the pixel scripts) for PyTorch and NumPy's BLAS: the
    next test starts with the suite's one thread again, so its numbers do not depend on which tests ran before."""
    yield
    torch.set_num_threads(1)
    threadpool_limits(1, user_api="blas")


@pytest.fixture(autouse=True)
def keep_the_ctrl_c_handler():
    """A script run in-process installs its Ctrl-C handler (exit_on_ctrl_c): the suite's own comes back after."""
    handler = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, handler)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Setup, call and teardown of each test (its fixtures' runs included) inside alone_or_side_by_side; an xdist
    worker's config has `workerinput`, with the run's id."""
    run = getattr(item.config, "workerinput", {}).get("testrunuid")
    with alone_or_side_by_side(run, item.get_closest_marker("exclusive") is not None):
        return (yield)


XDIST_RUNS = pytest.StashKey[set]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist's hook, in its controller as it starts a worker: the run's id, for pytest_unconfigure."""
    node.config.stash.setdefault(XDIST_RUNS, set()).add(node.workerinput["testrunuid"])


def pytest_unconfigure(config):
    """The controller's end of the run: the lock files its workers shared (alone_or_side_by_side) are removed."""
    for run in config.stash.get(XDIST_RUNS, ()):
        for path in suite_locks(run):
            path.unlink(missing_ok=True)


@pytest.fixture(params=MODULES)
def script(request):
    """The module under test: ppo or ppo_continuous_action."""
    return importlib.import_module(request.param)


@pytest.fixture(params=SCRIPTS)
def every_script(request):
    """Each training script in turn, for the pieces that all of them hold."""
    return importlib.import_module(request.param)


@pytest.fixture(params=SCRIPTS)
def contract(request, monkeypatch):
    """The script, with envpool's vector environment replaced by MixedEndsEnvPool where it has one, and
    compute_gae spied on: every call's keyword arguments are recorded."""
    script = importlib.import_module(request.param)
    if request.param in ENVPOOL_FRAMES:
        frames = ENVPOOL_FRAMES[request.param]
        monkeypatch.setattr(script, "make_envs", lambda args, num_envs, *_, **__: MixedEndsEnvPool(num_envs, frames))
    calls, real_gae = [], script.compute_gae

    def spy(**kwargs):
        calls.append({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})
        return real_gae(**kwargs)

    monkeypatch.setattr(script, "compute_gae", spy)
    return script, calls


def pytest_terminal_summary(terminalreporter):
    """Each script's length, where its training loop starts and how long `train` is: printed to watch, never a
    limit to fail on (a file that reads well is the goal: docs/design.md)."""
    from scripts import shape

    terminalreporter.write_sep("-", "the scripts' shape (printed, not checked)")
    terminalreporter.write_line(f"{'script':<34} {'lines':>6} {'loop at':>8} {'train':>6}")
    for name in SCRIPTS:
        try:
            lines, loop, train = shape(name)
        except (KeyError, StopIteration, SyntaxError):  # a script broken mid-edit: the tests say what is wrong
            continue
        terminalreporter.write_line(f"{name + '.py':<34} {lines:>6} {loop:>8} {train:>6}")
