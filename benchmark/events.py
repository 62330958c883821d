"""Reading the TensorBoard event files that the training scripts write (shared by the benchmark tools)."""

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def read_timed_scalars(run_dir: str | Path) -> tuple[float, dict[str, list[tuple[int, float, float]]]]:
    """All scalars of one run folder (every events file in it, e.g. after a resume) with their wall
    times: (start, {tag: [(step, wall_time, value), ...]}) sorted by step, then wall time. `start` is
    the wall time (s since the epoch) of the run's first event, the one TensorBoard writes when the run
    opens its writer, so that wall times relative to it include the time before the first scalar."""
    scalars: dict[str, list[tuple[int, float, float]]] = {}
    start = float("inf")
    for events_file in sorted(Path(run_dir).glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events_file), size_guidance={"scalars": 0})
        accumulator.Reload()
        try:
            start = min(start, accumulator.FirstEventTimestamp())
        except ValueError:  # an empty file (a run killed as it started)
            continue
        for tag in accumulator.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((e.step, e.wall_time, e.value) for e in accumulator.Scalars(tag))
    return start, {tag: sorted(points) for tag, points in scalars.items()}


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """All scalars of one run folder as {tag: [(step, value), ...]} sorted by step."""
    _, scalars = read_timed_scalars(run_dir)
    return {tag: sorted((step, value) for step, _, value in points) for tag, points in scalars.items()}


class ScalarTail:
    """The scalars of one run folder read as the run writes them: each `read()` adds what its events files gained
    since the last one (a record written in part is read whole the next time) and returns every scalar so far as
    {tag: [(step, value), ...]} in the order written. A long run is read once, not again at each look."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.loaders = {}  # events file -> its loader, which keeps its place in the file
        self.scalars: dict[str, list[tuple[int, float]]] = {}

    def read(self) -> dict[str, list[tuple[int, float]]]:
        from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

        for path in sorted(self.run_dir.glob("events.out.tfevents.*")):
            loader = self.loaders.setdefault(path, LegacyEventFileLoader(str(path)))
            for event in loader.Load():
                for value in event.summary.value:
                    if value.HasField("simple_value"):  # what SummaryWriter.add_scalar writes
                        self.scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
        return self.scalars
