"""benchmark.studies.scaling multigpu on event files written here with known wall times: SPS after the first iteration,
the time split, speedup S = SPS_W / SPS_1 and efficiency E = S / W."""

import pytest
from torch.utils.tensorboard import SummaryWriter

from benchmark.events import read_timed_scalars
from benchmark.studies.scaling import measure, scaling_table, time_to_return


def write_run(path, batch, seconds_per_iteration, split, iterations=5):
    """A run whose iteration k ends at 100 + k * seconds_per_iteration (wall time), after a slow first one."""
    writer = SummaryWriter(path)
    for k in range(1, iterations + 1):
        wall = 100 + 30 + (k - 1) * seconds_per_iteration  # the first iteration took 30 s
        writer.add_scalar("charts/SPS", 1, k * batch, walltime=wall)
        for part, seconds in split.items():
            writer.add_scalar(f"perf/{part}_time", seconds * (10 if k == 1 else 1), k * batch, walltime=wall)
    writer.close()
    return path


def test_sps_speedup_and_efficiency_follow_from_the_iterations_after_the_first(tmp_path):
    # the script logs perf/update_time with its collectives included (perf/comm_time), and no learn time
    one = measure(write_run(tmp_path / "w1", 1024, 4.0, dict(rollout=1, update=3, comm=0)))
    two = measure(write_run(tmp_path / "w2", 1024, 2.5, dict(rollout=0.5, update=2.0, comm=0.5)))
    assert one["sps"] == pytest.approx(1024 / 4.0) and two["sps"] == pytest.approx(1024 / 2.5)
    assert (one["rollout"], one["learn"], one["comm"]) == pytest.approx((0.25, 0.75, 0))
    assert (two["rollout"], two["learn"], two["comm"]) == pytest.approx((0.2, 0.6, 0.2))
    rows = scaling_table({("global", 1): one, ("global", 2): two}, cpus=1)
    assert [(row["world_size"], row["oversubscribed"]) for row in rows] == [(1, False), (2, True)]
    assert rows[1]["speedup"] == pytest.approx(4.0 / 2.5) and rows[1]["efficiency"] == pytest.approx(0.8)


def test_time_to_return_is_the_first_time_the_mean_of_the_last_games_reaches_the_target(tmp_path):
    writer = SummaryWriter(tmp_path)
    scores = [0, 1, 0, 2, 3, 1, 5, 0]  # means of 2 games: 0.5, 0.5, 1, 2.5, 2, 3, 2.5
    for k, score in enumerate(scores, start=1):
        writer.add_scalar("charts/episodic_return", score, 100 * k, walltime=1000 + 10 * k)
    writer.close()
    start, _ = read_timed_scalars(tmp_path)
    wall, step = time_to_return(tmp_path, 2.5, games=2)
    assert step == 500 and wall == pytest.approx(1050 - start)
    assert time_to_return(tmp_path, 3.5, games=2) is None
