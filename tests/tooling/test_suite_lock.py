"""The suite's own side-by-side rule (helpers.alone_or_side_by_side, used by conftest.py for every test): under
pytest-xdist, tests run two at a time except those marked `exclusive`, which run alone, and a test that arrives
while an exclusive one waits queues behind it."""

import multiprocessing
import os
import tempfile
import time
import uuid

import pytest

from helpers import alone_or_side_by_side


def hold(name: str, exclusive: bool, seconds: float, run: str, folder: str, log) -> None:
    """A test of `seconds` in one xdist worker: logs (name, "in" / "out") as it enters and leaves."""
    os.environ["PYTEST_XDIST_TESTRUNUID"] = run
    tempfile.tempdir = folder
    with alone_or_side_by_side(exclusive):
        log.put((name, "in"))
        time.sleep(seconds)
        log.put((name, "out"))


def order(tmp_path, *tests) -> list[tuple[str, str]]:
    """Starts each (name, exclusive, seconds, delay) `delay` seconds after the previous one; the log in order."""
    context = multiprocessing.get_context("fork")  # the children start at once, with the imports made
    log, run, processes = context.Queue(), uuid.uuid4().hex, []
    for name, exclusive, seconds, delay in tests:
        time.sleep(delay)
        processes.append(context.Process(target=hold, args=(name, exclusive, seconds, run, str(tmp_path), log)))
        processes[-1].start()
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    return [log.get(timeout=5) for _ in range(2 * len(tests))]


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


def test_without_xdist_nothing_waits(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_TESTRUNUID", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with alone_or_side_by_side(True), alone_or_side_by_side(True):  # with a lock, the second would wait forever
        pass
    assert list(tmp_path.iterdir()) == []
