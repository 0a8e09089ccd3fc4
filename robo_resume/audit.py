"""The overlap audit: crash a real DataLoader run, resume it, count replayed and lost frames.

Used by ``test_chunking_logic.py`` (the overlap suite), the tests and the CLI. Every scenario
runs real ``torch.utils.data.DataLoader``s with workers over a real dataset and compares the
``index`` values the training loop consumed, in order, with an uninterrupted run:

- ``restart``: no resume at all, the interrupted epoch starts over (everything replayed);
- ``naive``: the original design's per-sample formula, every worker skips
  ``resume_step // num_workers`` frames of its stream and roles are not rotated;
- ``arithmetic``: robo_resume's per-batch arithmetic from ``resume_step``;
- ``cursor``: robo_resume's recorded cursors (``CursorTracker.state_dict()``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .dataset import ChunkedEpisodeDataset
from .index.start import StartPoint
from .source import DataSource
from .stream.positions import StreamPositions

__all__ = [
    "SCENARIOS",
    "AuditResult",
    "NaivePositions",
    "NaiveResumeDataset",
    "audit",
    "consume",
    "epochs_started",
]

SCENARIOS = ("restart", "naive", "arithmetic", "cursor")


class NaivePositions(StreamPositions):
    """The original design's start point: ``resume_step // W`` frames per worker."""

    def start_point(self, num_workers: int) -> StartPoint:
        """Per-sample split of ``resume_step`` over workers, no rotation (the bug)."""
        sched = self.schedule(num_workers)
        wp = max(num_workers, 1)
        per_epoch = sched.batches_per_rank * self.batch_size
        epoch, within = divmod(self.resume_step, per_epoch) if per_epoch else (0, 0)
        pos = min(within // wp, sched.frames_per_stream)
        return StartPoint(0, [(epoch, pos)] * wp, self.resume_step // self.batch_size)


class NaiveResumeDataset(ChunkedEpisodeDataset):
    """The original design, for comparison only: skip ``resume_step // W`` frames per worker.

    It spreads the resumed samples evenly over workers and keeps worker roles, which replays
    frames on some workers and loses as many on others whenever ``steps % W != 0``.
    """

    positions_type = NaivePositions


@dataclass(frozen=True)
class AuditResult:
    """Outcome of one scenario: frames replayed and lost, and whether the order is identical."""

    scenario: str
    consumed: int
    replayed: int
    lost: int
    same_order: bool
    order: tuple[int, ...] | None = None  # what the training loop consumed (keep_order=True)

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe dict."""
        d = dict(self.__dict__)
        d["order"] = list(self.order) if self.order is not None else None
        return d


def consume(
    make: Callable[..., ChunkedEpisodeDataset],
    *,
    num_workers: int,
    epochs: int = 1,
    stop_after: int | None = None,
    loader_kwargs: Mapping[str, Any] | None = None,
    trackers: list[Any] | None = None,
    **ds_kwargs: Any,
) -> tuple[list[tuple[int, list[int]]], dict[str, Any] | None]:
    """Run a training loop over ``epochs`` iterations; return consumed ``(role, index list)``.

    Stops after ``stop_after`` batches in total if given, returning the tracker's state then
    (what a checkpoint would hold); otherwise returns ``None`` as the state. The tracker is
    appended to ``trackers`` when given (e.g. for its ``skip_report()``).
    """
    ds = make(**ds_kwargs)
    tracker = ds.tracker()
    if trackers is not None:
        trackers.append(tracker)
    loader = ds.dataloader(num_workers=num_workers, **(loader_kwargs or {}))
    from .keys import CURSOR_KEY

    batches: list[tuple[int, list[int]]] = []
    for _ in range(epochs):
        for batch in loader:
            role = int(batch[CURSOR_KEY][0, 1])
            batch = tracker.consume(batch)
            batches.append((role, batch["index"].tolist()))
            if stop_after is not None and len(batches) == stop_after:
                return batches, tracker.state_dict()
    return batches, (tracker.state_dict() if stop_after is not None else None)


def _compare(name: str, full: list[int], got: list[int], keep: bool) -> AuditResult:
    want, have = Counter(full), Counter(got)
    replayed = sum((have - want).values())
    lost = sum((want - have).values())
    return AuditResult(name, len(got), replayed, lost, got == full, tuple(got) if keep else None)


def audit(
    root: str | Path | DataSource,
    *,
    num_workers: int,
    batch_size: int,
    crash_at: int,
    epochs: int = 1,
    scenarios: tuple[str, ...] = SCENARIOS,
    loader_kwargs: Mapping[str, Any] | None = None,
    keep_order: bool = False,
    **ds_kwargs: Any,
) -> tuple[list[int], list[AuditResult]]:
    """Crash after ``crash_at`` batches, resume per scenario, compare with the full run.

    Returns the uninterrupted order (``index`` values, flattened) and one result per scenario.
    ``ds_kwargs`` go to :class:`ChunkedEpisodeDataset` (seed, chunk_frames, drop_last, ...).
    """

    def make(cls=ChunkedEpisodeDataset, **kw):
        return cls(root, batch_size=batch_size, **ds_kwargs, **kw)

    run: dict[str, Any] = dict(num_workers=num_workers, epochs=epochs, loader_kwargs=loader_kwargs)
    full_batches, _ = consume(make, **run)
    full = [i for _, b in full_batches for i in b]
    before_batches, state = consume(make, stop_after=crash_at, **run)
    before = [i for _, b in before_batches for i in b]
    if len(before_batches) < crash_at or state is None:  # consume gives a state at crash_at
        raise ValueError(
            f"crash_at={crash_at} is past the end of the run ({len(before_batches)} batches)"
        )
    left = epochs - epochs_started(make(), state, num_workers)
    results = []
    for name in scenarios:
        if name == "restart":
            after_b, _ = consume(
                make, num_workers=num_workers, epochs=left, loader_kwargs=loader_kwargs
            )
        elif name == "naive":
            after_b, _ = consume(
                lambda **kw: make(cls=NaiveResumeDataset, **kw),
                num_workers=num_workers,
                epochs=left,
                loader_kwargs=loader_kwargs,
                resume_step=crash_at * batch_size,
            )
        elif name == "arithmetic":
            after_b, _ = consume(
                make,
                num_workers=num_workers,
                epochs=left,
                loader_kwargs=loader_kwargs,
                resume_step=crash_at * batch_size,
            )
        elif name == "cursor":
            after_b, _ = consume(
                make,
                num_workers=num_workers,
                epochs=left,
                loader_kwargs=loader_kwargs,
                resume_state=state,
            )
        else:
            raise ValueError(f"unknown scenario {name!r}; expected one of {SCENARIOS}")
        after = [i for _, b in after_b for i in b]
        results.append(_compare(name, full, before + after, keep_order))
    return full, results


def epochs_started(ds: ChunkedEpisodeDataset, state: Mapping[str, Any], num_workers: int) -> int:
    """Epoch iterations the interrupted run finished (the resumed run does the remaining ones).

    Prefer ``for epoch in loader.epochs(n)`` (:meth:`BatchLoader.epochs`), which counts for
    you. This is the epoch a resume from ``state`` with ``num_workers`` workers starts in
    (:meth:`ChunkedEpisodeDataset.next_epoch`), for any topology ``state`` was saved with;
    ``ds`` may be built with or without that ``resume_state``. 0 in infinite mode.
    """
    if ds.infinite:
        return 0
    # a fresh view of ds resuming from ``state``: the start point depends on the resume state,
    # the per-topology plans made from it, and the epoch table (nothing else is shared state)
    return ds.positions.resuming(state).next_epoch(num_workers, ds.epochs.fresh())
