"""benchmark.events on a resumed run: two events files in one run folder, as a run killed after its last checkpoint
and resumed from it writes them, with wall times chosen here."""

import time

import pytest
from torch.utils.tensorboard import SummaryWriter

from benchmark.events import read_scalars, read_timed_scalars


def write_segment(run_dir, opened, points, monkeypatch):
    """An events file opened at wall time `opened` holding charts/episodic_return at (step, wall time, value)."""
    monkeypatch.setattr(time, "time", lambda: opened)  # the time TensorBoard stamps on the file's first event
    writer = SummaryWriter(str(run_dir))
    monkeypatch.undo()
    for step, wall_time, value in points:
        writer.add_scalar("charts/episodic_return", value, step, walltime=wall_time)
    writer.close()


def test_a_resumed_segment_supersedes_the_replayed_steps_and_the_stopped_time_is_left_out(tmp_path, monkeypatch):
    # trained to step 500 by t=1050 (checkpoint at step 300), killed; resumed at t=5000 from step 300
    write_segment(tmp_path, 1000, [(100, 1010, 1.0), (300, 1030, 2.0), (400, 1040, 9.0), (500, 1050, 9.0)], monkeypatch)
    write_segment(tmp_path, 5000, [(400, 5010, 3.0), (600, 5020, 4.0)], monkeypatch)
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    start, scalars = read_timed_scalars(tmp_path)
    # steps 400 and 500 of the first process were trained again: only the second file's step 400 counts
    assert [(step, value) for step, _, value in scalars["charts/episodic_return"]] == [
        (100, 1.0),
        (300, 2.0),
        (400, 3.0),
        (600, 4.0),
    ]
    # the first segment trained 30 s up to its last kept event, the second 20 s from its start: 50 s in all
    assert start == 1000
    assert [wall - start for _, wall, _ in scalars["charts/episodic_return"]] == pytest.approx([10, 30, 40, 50])
    assert read_scalars(tmp_path)["charts/episodic_return"][-1] == (600, 4.0)


def test_a_run_of_one_segment_reads_as_written(tmp_path, monkeypatch):
    write_segment(tmp_path, 1000, [(100, 1010, 1.0), (200, 1500, 2.0)], monkeypatch)
    start, scalars = read_timed_scalars(tmp_path)
    assert start == 1000 and scalars["charts/episodic_return"] == [(100, 1010, 1.0), (200, 1500, 2.0)]
