"""Reading the TensorBoard event files that the training scripts write (shared by the benchmark tools)."""

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def read_segments(run_dir: str | Path) -> list[tuple[float, dict[str, list[tuple[int, float, float]]]]]:
    """The events files of one run folder, one per process that wrote it (a resumed run has several), in the order
    they were opened: [(the time the file was opened, {tag: [(step, wall_time, value), ...]}), ...]. An empty file
    (a run killed as it started) is left out."""
    segments = []
    for events_file in Path(run_dir).glob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events_file), size_guidance={"scalars": 0})
        accumulator.Reload()
        try:
            opened = accumulator.FirstEventTimestamp()
        except ValueError:
            continue
        tags = accumulator.Tags()["scalars"]
        segments.append(
            (opened, {tag: [(e.step, e.wall_time, e.value) for e in accumulator.Scalars(tag)] for tag in tags})
        )
    return sorted(segments, key=lambda segment: segment[0])


def first_steps(segments: list) -> list[int | None]:
    """The first step each segment logged a scalar at (None for a segment without scalars)."""
    return [min((p[0][0] for p in points.values() if p), default=None) for _, points in segments]


def read_timed_scalars(
    run_dir: str | Path, segments: list | None = None
) -> tuple[float, dict[str, list[tuple[int, float, float]]]]:
    """All scalars of one run folder with their wall times: (start, {tag: [(step, wall_time, value), ...]}) sorted
    by step, then wall time. `start` is the wall time (s since the epoch) of the run's first event, the one
    TensorBoard writes when the run opens its writer, so that wall times relative to it include the time before the
    first scalar.

    A resumed run has one events file per process that wrote it (a segment). Two rules make its scalars read like
    those of one uninterrupted run:
    - a segment supersedes the one before it from its first scalar's step on: the steps that the earlier process
      trained after its last checkpoint, which the resumed process trained again, are counted once, from the later
      file;
    - the time between two segments (the run stopped, waiting for its resume) is not training time: a later
      segment's wall times are moved back by the gap between the earlier one's last kept event and its own start.
    So the wall time of the last event, minus `start`, is the time the run trained (its replayed stretches excepted).
    `segments`: the folder's `read_segments`, where the caller has read them already.
    """
    segments = read_segments(run_dir) if segments is None else segments
    starts = first_steps(segments)
    scalars: dict[str, list[tuple[int, float, float]]] = {}
    shift, last_time = 0.0, None  # the stopped time so far; the previous segment's last kept wall time
    for k, (opened, points) in enumerate(segments):
        until = next((step for step in starts[k + 1 :] if step is not None), None)  # superseded from here
        if last_time is not None:
            shift += opened - last_time
        last_time = opened
        for tag, tag_points in points.items():
            for step, wall_time, value in tag_points:
                if until is None or step < until:
                    scalars.setdefault(tag, []).append((step, wall_time - shift, value))
                    last_time = max(last_time, wall_time)
    start = segments[0][0] if segments else float("inf")
    # by step, then wall time; what a process logged at one step and time keeps the order it was logged in
    return start, {tag: sorted(points, key=lambda point: point[:2]) for tag, points in scalars.items()}


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """All scalars of one run folder as {tag: [(step, value), ...]} sorted by step."""
    _, scalars = read_timed_scalars(run_dir)
    return {tag: sorted((step, value) for step, _, value in points) for tag, points in scalars.items()}


def read_hyperparameters(run_dir: str | Path) -> list[dict[str, str]]:
    """The `hyperparameters` text each events file of a run folder opens with (the run's arguments, name -> value as
    written), one dict per file in the order the files were opened: a resumed run has one per process, and a resume
    may change some of them (e.g. --torch-threads). A file without the text gives none. Only each file's first
    events are read."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    found = []
    for path in Path(run_dir).glob("events.out.tfevents.*"):
        for event in LegacyEventFileLoader(str(path)).Load():
            texts = [value for value in event.summary.value if value.tag.startswith("hyperparameters")]
            if texts:
                rows = texts[0].tensor.string_val[0].decode().splitlines()[2:]  # after |param|value| and |-|-|
                found.append(
                    (event.wall_time, dict(row.strip("|").split("|", 1) for row in rows if row.count("|") >= 3))
                )
                break
            if event.HasField("summary") and any(value.HasField("simple_value") for value in event.summary.value):
                break  # scalars have begun: the writer wrote no text when it opened
    return [params for _, params in sorted(found, key=lambda opened_params: opened_params[0])]


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
