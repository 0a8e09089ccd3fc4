"""The per-step record of ``robo-resume train``: which stream positions each step consumed.

Every batch carries its cursor rows ``[rank, role, num_workers, epoch, position]`` (one per
frame; ``position`` counts the frames the stream has delivered, so the row of the frame at
stream position ``p`` holds ``p + 1``). A batch comes from one stream and its positions are
consecutive, except that in infinite mode it may run from the end of one epoch into the next.
So one row per step and rank says all a step consumed::

    step, rank, role, first_epoch, first_position, last_epoch, last_position

(the first and the last cursor row of the batch), and the frames follow from the pure schedule
of the run's topology by arithmetic (:mod:`robo_resume.lerobot_train.audit`). The topology a
row ran under is its *run*'s: a run is one ``robo-resume train`` process (group), from a fresh
start or a resume to its end; its header (:class:`RunHeader`) holds the world size, workers,
batch size, the data state it resumed from (the remainder epoch of an elastic resume is
recomputed from it) and the dataset's planning options.

The record is saved with every checkpoint (``training_state/robo_resume/``: :data:`RUNS_FILE`,
the headers as JSON, and :data:`ROWS_FILE`, the rows as a compressed ``.npz``, a few bytes per
step); a resumed run continues the record of the checkpoint it resumes from. Steps a killed run
trained after its last checkpoint are in no checkpoint's record: the resumed run trains them
again, by definition of a resume.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ResumeStateError, describe

if TYPE_CHECKING:
    import torch

    from ..dataset import ChunkedEpisodeDataset

__all__ = ["COLUMNS", "ROWS_FILE", "RUNS_FILE", "RunHeader", "StepRecord", "episode_ranges"]

RUNS_FILE = "consumed_runs.json"
ROWS_FILE = "consumed_steps.npz"
RECORD_VERSION = 1
COLUMNS = (
    "step",
    "rank",
    "role",
    "first_epoch",
    "first_position",
    "last_epoch",
    "last_position",
)


def episode_ranges(episodes: Any) -> list[list[int]]:
    """Sorted episode indices as ``[first, last]`` ranges (compact in JSON)."""
    values = np.unique(np.asarray(list(episodes), dtype=np.int64))
    if not len(values):
        return []
    cut = np.flatnonzero(np.diff(values) != 1) + 1
    return [[int(p[0]), int(p[-1])] for p in np.split(values, cut)]


@dataclass(frozen=True)
class RunHeader:
    """One run of the record: where its rows start and what its streams were.

    Attributes:
        first_step: the first step the run trained (the resumed checkpoint's step + 1).
        first_row: index of the run's first row in the record (rows are kept in order).
        world_size, num_workers, batch_size: the run's topology and batch size.
        resumed_from: the checkpoint folder it resumed from (None: a fresh run).
        start_state: the data state it resumed from (None: a fresh run).
        dataset: what the schedule's plan needs: ``root``, ``repo_id``, ``revision``,
            ``episodes`` (ranges), ``features`` (the selection, renames left out),
            ``chunk_frames``, ``delta_timestamps`` (dataset keys), ``seed``, ``tuning``,
            ``infinite`` and ``drop_last`` (absent in records before them: infinite, as
            ``robo-resume train`` streams).
    """

    first_step: int
    first_row: int
    world_size: int
    num_workers: int
    batch_size: int
    resumed_from: str | None = None
    start_state: dict[str, Any] | None = None
    dataset: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (see :meth:`from_dict`)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunHeader:
        """The header of :meth:`to_dict`."""
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    @classmethod
    def of_run(
        cls,
        dataset: ChunkedEpisodeDataset,
        *,
        first_step: int,
        first_row: int,
        num_workers: int,
        tuning: Mapping[str, Any] | None,
        resumed_from: Path | None,
        start_state: Mapping[str, Any] | None,
    ) -> RunHeader:
        """The header of a run of ``dataset`` (a ChunkedEpisodeDataset) starting now."""
        src = dataset.source
        delta = dataset.items.options.delta_timestamps or None
        return cls(
            first_step=first_step,
            first_row=first_row,
            world_size=dataset.world_size,
            num_workers=num_workers,
            batch_size=dataset.batch_size,
            resumed_from=None if resumed_from is None else str(Path(resumed_from).resolve()),
            start_state=None if start_state is None else dict(start_state),
            dataset={
                "root": None if src.root is None else str(src.root),
                "repo_id": src.repo_id,
                "revision": src.revision,
                "episodes": episode_ranges(dataset.episodes),
                "features": src.selection(),
                "chunk_frames": src.chunk_frames,
                "delta_timestamps": (
                    None if delta is None else {k: [float(x) for x in v] for k, v in delta.items()}
                ),
                "seed": dataset.seed,
                "tuning": None if tuning is None else dict(tuning),
                "infinite": dataset.infinite,
                "drop_last": dataset.drop_last,
            },
        )


class StepRecord:
    """The record: run headers and one row per step and rank (:data:`COLUMNS`).

    A training loop calls :meth:`add` with every batch it consumes (before the cursor is
    stripped), and :meth:`files` at each checkpoint (a collective under DDP: every rank calls
    it; it gathers the ranks' new rows).
    """

    def __init__(self, runs: list[RunHeader], rows: np.ndarray | Sequence[Sequence[int]]) -> None:
        self.runs = list(runs)
        self.rows: np.ndarray = np.asarray(rows, dtype=np.int64).reshape(-1, len(COLUMNS))
        self._new: list[list[int]] = []  # this rank's rows since the last files()

    @classmethod
    def load(cls, folder: Path) -> StepRecord | None:
        """The record saved in a checkpoint's ``training_state/robo_resume`` folder (None: the
        checkpoint has none)."""
        runs, rows = folder / RUNS_FILE, folder / ROWS_FILE
        if not runs.is_file():
            return None
        try:
            files = {RUNS_FILE: runs.read_bytes(), ROWS_FILE: rows.read_bytes()}
        except OSError as exc:
            raise cls._unreadable(folder, exc) from exc
        return cls.from_files(files, where=folder)

    @classmethod
    def from_files(cls, files: Mapping[str, bytes], *, where: str | Path) -> StepRecord:
        """The record of :meth:`files`' output (``where``: the file or folder it came from, for
        the message).

        Raises:
            ResumeStateError: the bytes are not a record this version writes.
        """
        try:
            data = json.loads(files[RUNS_FILE])
            with np.load(io.BytesIO(files[ROWS_FILE]), allow_pickle=False) as z:
                table = z["rows"]
            if data.get("version") != RECORD_VERSION or list(data.get("columns", ())) != list(
                COLUMNS
            ):
                raise ValueError(f"version {data.get('version')}, columns {data.get('columns')}")
            return cls([RunHeader.from_dict(r) for r in data["runs"]], table)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise cls._unreadable(where, exc) from exc

    @staticmethod
    def _unreadable(where: str | Path, exc: Exception) -> ResumeStateError:
        return ResumeStateError(
            describe(
                "The checkpoint's per-step record cannot be read",
                expected=f"{RUNS_FILE} (version {RECORD_VERSION}) and {ROWS_FILE} as "
                "robo-resume train writes them",
                found=f"{type(exc).__name__}: {exc}",
                file=where,
                fix="resume from an earlier checkpoint (checkpoints/<step>), or delete both "
                "files to resume without a record (the audit then starts at that step)",
            )
        )

    def begin(self, header: RunHeader) -> None:
        """Start a new run (its ``first_row`` must be the number of rows held)."""
        self.runs.append(header)

    def add(self, step: int, rank: int, cursor: torch.Tensor) -> None:
        """Record what ``step`` consumed on this rank: ``cursor`` is the batch's cursor tensor
        ``(batch, 5)``."""
        first, last = cursor[0].tolist(), cursor[-1].tolist()
        self._new.append([step, rank, first[1], first[3], first[4], last[3], last[4]])

    def files(self, world: int) -> dict[str, bytes]:
        """Gather every rank's new rows (a collective when ``world > 1``) and return the
        record's files, name -> bytes, for the checkpoint folder."""
        mine = self._new
        self._new = []
        parts: list[Any] = [mine]
        if world > 1:
            import torch.distributed as dist

            parts = [None] * world
            dist.all_gather_object(parts, mine)
        new = sorted((r for p in parts for r in p), key=lambda r: (r[0], r[1]))
        if new:
            self.rows = np.concatenate([self.rows, np.asarray(new, dtype=np.int64)])
        buf = io.BytesIO()
        np.savez_compressed(buf, rows=self.rows)
        runs = {
            "version": RECORD_VERSION,
            "columns": list(COLUMNS),
            "runs": [r.to_dict() for r in self.runs],
        }
        return {RUNS_FILE: json.dumps(runs).encode(), ROWS_FILE: buf.getvalue()}

    def run_rows(self, i: int) -> np.ndarray:
        """The rows of run ``i``."""
        a = self.runs[i].first_row
        b = self.runs[i + 1].first_row if i + 1 < len(self.runs) else len(self.rows)
        return self.rows[a:b]
