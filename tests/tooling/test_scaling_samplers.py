"""benchmark.studies.scaling samplers (and benchmark.studies.scaling workers's time split) on event files written here with
known values: medians over the iterations after the first, the last end-to-end SPS, the split of the time."""

from torch.utils.tensorboard import SummaryWriter

from benchmark.events import read_scalars
from benchmark.studies.scaling import summarize


def test_summary_leaves_out_the_first_iteration_and_splits_the_time(tmp_path):
    writer = SummaryWriter(tmp_path)
    iterations = {  # per iteration: experience SPS, learner SPS, bytes/step, SPS, rollout/transfer/update/publish
        1: (10.0, 20.0, 500.0, 50.0, (9.0, 1.0, 9.0, 1.0)),  # slow first iteration, left out
        2: (100.0, 300.0, 120.0, 60.0, (1.0, 0.0, 1.0, 0.0)),
        3: (200.0, 100.0, 140.0, 70.0, (2.0, 0.5, 1.0, 0.5)),
        4: (300.0, 200.0, 100.0, 80.0, (1.0, 0.5, 2.0, 0.5)),
    }
    for k, (experience, learner, size, sps, split) in iterations.items():
        for tag, value in (
            ("charts/experience_SPS", experience),
            ("charts/learner_SPS", learner),
            ("charts/bytes_per_step", size),
            ("charts/SPS", sps),
        ):
            writer.add_scalar(tag, value, 2048 * k)
        for part, seconds in zip(("rollout", "transfer", "update", "publish"), split):
            writer.add_scalar(f"perf/{part}_time", seconds, 2048 * k)
    writer.close()
    summary = summarize(read_scalars(tmp_path))
    assert summary["experience_sps"] == 200.0 and summary["learner_sps"] == 200.0
    assert summary["bytes_per_step"] == 120.0 and summary["sps"] == 80.0
    # iterations 2-4: rollout 4 s, transfer 1 s, update 4 s, publish 1 s of 10
    assert summary["time_split"] == "40.0% rollout / 10.0% transfer / 40.0% update / 10.0% publish"
