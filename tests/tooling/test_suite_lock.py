"""The suite's own side-by-side rule (helpers.alone_or_side_by_side, around every test in conftest.py): under
pytest-xdist, tests run two at a time except those marked `exclusive`, which run alone; a test that arrives while an
exclusive one waits queues behind it; a pytest that a test starts takes no lock; and the run's lock files go with it."""

import inspect
import multiprocessing
import tempfile
import time
import uuid
from types import SimpleNamespace

import pytest

from xdist import newhooks

from helpers import alone_or_side_by_side, suite_locks


def hold(name: str, exclusive: bool, seconds: float, run: str, folder: str, log) -> None:
    """A test of `seconds` in an xdist worker of the run `run`: logs (name, "in" / "out", when) as it enters and
    leaves, `when` on the clock all processes share (a queue's items from several processes may arrive out of order:
    its writes go through a thread of each process, which a loaded machine can hold back)."""
    tempfile.tempdir = folder
    with alone_or_side_by_side(run, exclusive):
        log.put((name, "in", time.monotonic()))
        time.sleep(seconds)
        log.put((name, "out", time.monotonic()))


def start(tmp_path, run: str, *tests) -> tuple[list, multiprocessing.Queue]:
    """Starts each (name, exclusive, seconds, delay) `delay` seconds after the previous one."""
    context = multiprocessing.get_context("fork")  # the children start at once, with the imports made
    log, processes = context.Queue(), []
    for name, exclusive, seconds, delay in tests:
        time.sleep(delay)
        processes.append(context.Process(target=hold, args=(name, exclusive, seconds, run, str(tmp_path), log)))
        processes[-1].start()
    return processes, log


def order(tmp_path, *tests) -> list[tuple[str, str]]:
    """The log of `tests` (as `start` takes them) in the order of the events, as (name, "in" / "out")."""
    processes, log = start(tmp_path, uuid.uuid4().hex, *tests)
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    events = sorted((log.get(timeout=5) for _ in range(2 * len(tests))), key=lambda event: event[2])
    return [(name, event) for name, event, _ in events]


def test_side_by_side_tests_overlap(tmp_path):
    assert order(tmp_path, ("a", False, 3, 0), ("b", False, 3, 1))[:2] == [("a", "in"), ("b", "in")]


@pytest.mark.parametrize("exclusive_first", [False, True])
def test_an_exclusive_test_runs_alone_and_the_next_one_waits_behind_it(tmp_path, exclusive_first):
    """An exclusive test waits for the running one to end, the one that comes while it waits runs after it; and
    with the exclusive test running, a side-by-side test waits for it to end."""
    if exclusive_first:
        tests = ("x", True, 3, 0), ("a", False, 0.5, 1)
        assert order(tmp_path, *tests) == [("x", "in"), ("x", "out"), ("a", "in"), ("a", "out")]
    else:
        tests = ("a", False, 4, 0), ("x", True, 1, 1), ("b", False, 0.5, 1)
        expected = [("a", "in"), ("a", "out"), ("x", "in"), ("x", "out"), ("b", "in"), ("b", "out")]
        assert order(tmp_path, *tests) == expected


def test_only_the_workers_themselves_lock(tmp_path, monkeypatch):
    """conftest.py's hook locks for a worker (its config has xdist's `workerinput`) and not for a pytest that a test
    starts, which inherits the worker's environment (PYTEST_XDIST_TESTRUNUID too) but not its config: were it to
    lock, it would wait behind an exclusive test that waits for the test that started it."""
    from conftest import pytest_runtest_protocol

    run = uuid.uuid4().hex
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", run)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (holder,), log = start(tmp_path, run, ("x", True, 3, 0))
    assert log.get(timeout=30)[:2] == ("x", "in")
    waited = {}
    configs = {"started by a test": SimpleNamespace(), "worker": SimpleNamespace(workerinput={"testrunuid": run})}
    for kind, config in configs.items():
        protocol = pytest_runtest_protocol(SimpleNamespace(config=config, get_closest_marker=lambda name: None), None)
        began = time.monotonic()
        next(protocol)  # into the test: past the lock, if any
        waited[kind] = time.monotonic() - began
        protocol.close()
    holder.join(timeout=30)
    assert waited["started by a test"] < 1 and waited["worker"] > 1, waited


def test_without_xdist_nothing_locks(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with alone_or_side_by_side(None, True):
        assert list(tmp_path.iterdir()) == []  # no lock file, so nothing to wait on


def test_the_controller_removes_the_runs_lock_files(tmp_path, monkeypatch):
    """xdist's controller learns the run's id as it starts each worker (conftest.py's pytest_configure_node, a hook
    xdist has under that name) and removes the lock files when the run ends; another run's files stay."""
    from conftest import pytest_configure_node, pytest_unconfigure

    assert list(inspect.signature(newhooks.pytest_configure_node).parameters) == ["node"]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run, other = uuid.uuid4().hex, uuid.uuid4().hex
    for each in (run, other):
        with alone_or_side_by_side(each, False):
            pass
    assert {path.name for path in tmp_path.iterdir()} == {
        path.name for each in (run, other) for path in suite_locks(each)
    }
    controller = SimpleNamespace(stash=pytest.Stash())
    for worker in ("gw0", "gw1"):
        pytest_configure_node(SimpleNamespace(config=controller, workerinput={"workerid": worker, "testrunuid": run}))
    pytest_unconfigure(controller)
    assert {path.name for path in tmp_path.iterdir()} == {path.name for path in suite_locks(other)}
