"""benchmark.scores' learning curves and reference column on event files written here with known
values and known wall times: the curve data, the plot files and the table cells follow from them."""

import json

import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from benchmark.scores import REFERENCES, curves, load_references, plot, smooth, table

SEEDS = (1, 2, 3)


def write_events(run_dir, start, points):
    """An event file whose first event is at wall time `start`, then one `charts/episodic_return`
    scalar per (step, wall_time, value) and a final `charts/SPS`."""
    run_dir.mkdir(parents=True)
    with open(run_dir / f"events.out.tfevents.{int(start)}.test", "wb") as f:
        writer = RecordWriter(f)
        writer.write(event_pb2.Event(wall_time=start, file_version="brain.Event:2").SerializeToString())
        final_step, final_time, _ = points[-1]
        scalars = [("charts/episodic_return", p) for p in points] + [("charts/SPS", (final_step, final_time, 100.0))]
        for tag, (step, wall_time, value) in scalars:
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
            writer.write(event_pb2.Event(wall_time=wall_time, step=step, summary=summary).SerializeToString())


def write_linear_runs(root, env_id="Fake-v0"):
    """Three seeds whose episodes end at different steps (a different spacing per seed) with return
    0.02 * step + 10 * seed, each logged 5 s + step / 10 s after its run's first event; the runs start
    1000 s apart. Returns each seed's run folder."""
    run_dirs = {}
    for seed in SEEDS:
        start = 1_700_000_000.0 + 1000 * seed
        steps = np.arange(10 * seed, 2000, 7 * seed + 3)
        points = [(int(s), start + 5 + s / 10, 0.02 * s + 10 * seed) for s in steps]
        run_dirs[seed] = root / f"{env_id}__ppo__{seed}__{int(start)}"
        write_events(run_dirs[seed], start, points)
    return run_dirs


def test_step_curves_interpolate_each_seed_onto_the_steps_all_seeds_cover(tmp_path):
    run_dirs = write_linear_runs(tmp_path)
    grid, values = curves(list(run_dirs.values()), "step", window=1, points=50)
    first = max(10 * seed for seed in SEEDS)
    last = min(np.arange(10 * seed, 2000, 7 * seed + 3)[-1] for seed in SEEDS)
    assert values.shape == (3, 50) and grid[0] == first and grid[-1] == last
    # linear interpolation of a linear function is exact: the mean, min and max follow
    np.testing.assert_allclose(values.mean(0), 0.02 * grid + 20, rtol=1e-5)
    np.testing.assert_allclose(values.min(0), 0.02 * grid + 10, rtol=1e-5)
    np.testing.assert_allclose(values.max(0), 0.02 * grid + 30, rtol=1e-5)


def test_time_curves_use_wall_time_since_each_runs_first_event(tmp_path):
    run_dirs = write_linear_runs(tmp_path)
    grid, values = curves(list(run_dirs.values()), "time", window=1, points=50)
    # return = 0.02 * step + 10 * seed and time = 5 + step / 10, so return = 0.2 * (time - 5) + 10 * seed
    assert grid[0] == pytest.approx(5 + 30 / 10)
    np.testing.assert_allclose(values.mean(0), 0.2 * (grid - 5) + 20, rtol=1e-4)


def test_smoothing_averages_the_previous_episodes():
    np.testing.assert_allclose(smooth(np.array([1.0, 2.0, 3.0, 4.0]), 2), [1.0, 1.5, 2.5, 3.5])
    np.testing.assert_allclose(smooth(np.array([1.0, 2.0, 3.0, 4.0]), 3), [1.0, 1.5, 2.0, 3.0])
    np.testing.assert_allclose(smooth(np.array([5.0, 1.0]), 1), [5.0, 1.0])


def test_seeds_without_a_common_range_give_no_curve(tmp_path):
    write_events(tmp_path / "Fake-v0__ppo__1__1", 0.0, [(10, 1.0, 1.0), (20, 2.0, 2.0)])
    write_events(tmp_path / "Fake-v0__ppo__2__1", 0.0, [(30, 3.0, 1.0), (40, 4.0, 2.0)])
    assert curves(sorted(tmp_path.iterdir()), "step") is None and curves(sorted(tmp_path.iterdir()), "time") is None
    assert plot(tmp_path, tmp_path / "plots", references={}) == []
    assert not list((tmp_path / "plots").iterdir())


def test_plot_writes_a_step_and_a_time_png_per_group(tmp_path):
    write_linear_runs(tmp_path / "runs", "Fake-v0")
    write_linear_runs(tmp_path / "runs", "Other-v1")
    written = plot(tmp_path / "runs", tmp_path / "plots", window=5, references={})
    names = ["Fake-v0__ppo.png", "Fake-v0__ppo-time.png", "Other-v1__ppo.png", "Other-v1__ppo-time.png"]
    assert sorted(p.name for p in written) == sorted(names)
    for name in names:
        data = (tmp_path / "plots" / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000


def test_table_puts_the_published_reference_beside_ours(tmp_path):
    write_linear_runs(tmp_path, "CartPole-v1")
    write_linear_runs(tmp_path, "Fake-v0")
    rows = {line.split("|")[2].strip(): line for line in table(tmp_path, last=100).splitlines() if "| ppo.py |" in line}
    assert rows["CartPole-v1"].rstrip(" |").endswith("490.04 ± 6.12 (500k steps, 3 seeds)")
    assert rows["Fake-v0"].rstrip(" |").endswith("—")
    assert "https://docs.cleanrl.dev/rl-algorithms/ppo/" in table(tmp_path, last=100)


def test_references_come_from_the_data_file(tmp_path):
    reference_file = tmp_path / "reference.json"
    reference_file.write_text(
        json.dumps(
            {
                "references": [
                    {
                        "script": "ppo.py",
                        "env_ids": ["Fake-v0", "Fake"],
                        "mean": 12.5,
                        "std": 1.25,
                        "steps": 2000,
                        "seeds": 4,
                        "source": "a test",
                    }
                ]
            }
        )
    )
    write_linear_runs(tmp_path / "runs", "Fake")
    text = table(tmp_path / "runs", last=100, references=load_references(reference_file))
    assert "| 12.50 ± 1.25 (2k steps, 4 seeds) |" in text and "Published references (CleanRL): a test." in text


def test_reference_file_entries_are_complete():
    entries = json.loads(REFERENCES.read_text())["references"]
    assert len(entries) >= 4
    for entry in entries:
        assert set(entry) - {"metric"} == {"script", "env_ids", "mean", "std", "steps", "seeds", "source"}
        assert entry.get("metric", "avg_episodic_return") == "avg_episodic_return"  # (the one other metric there is)
        assert entry["source"].startswith("https://docs.cleanrl.dev/rl-algorithms/ppo/")
    references = load_references()
    assert (
        references[("ppo_continuous_action.py", "Hopper-v4")]["mean"],
        references[("ppo_continuous_action.py", "Hopper-v4")]["steps"],
    ) == (2382.86, 1_000_000)
