"""Reading the TensorBoard event files that the training scripts write (shared by the benchmark tools)."""

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """All scalars of one run folder (every events file in it, e.g. after a resume), as
    {tag: [(step, value), ...]} sorted by step."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    for events_file in sorted(Path(run_dir).glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events_file), size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((e.step, e.value) for e in accumulator.Scalars(tag))
    return {tag: sorted(points) for tag, points in scalars.items()}
