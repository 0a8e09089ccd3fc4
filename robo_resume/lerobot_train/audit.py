"""The audit of a ``robo-resume train`` run: every frame of every epoch trained exactly once?

:func:`audit_run` reads a checkpoint (``OUTPUT_DIR/checkpoints/last`` by default): its per-step
record (:mod:`.record`), its data state and its step. In four steps, all arithmetic over the
pure schedule (nothing is decoded):

1. **Frames per step.** Each run of the record gets its dataset's plan back (the dataset's
   metadata, the run's episodes and options) and its :class:`~robo_resume.index.elastic.Layout`
   (the topology's schedule, plus the remainder epoch of an elastic resume, recomputed from the
   data state the run resumed from). A row's stream positions map to the dataset ``index``
   values they emit; the remainder epoch labelled ``e`` counts towards epoch ``e``.
2. **Each epoch's frames.** Epoch ``e``'s frames are what the schedule of the first run that
   played ``e`` as a normal epoch emits over all its streams (with ``tail="drop"`` the few
   frames past the streams' equal share are in no stream: reported, not a failure).
3. **Pending.** What the checkpoint's cursors have left of their epochs (the elastic leftover,
   :func:`~robo_resume.index.elastic.leftover`): the frames a resume trains next. An epoch no
   step has trained yet (the cursors at its start, e.g. after the last step of an epoch) is
   not audited: a note says so.
4. **Count.** Per epoch and frame: trained + pending must equal the epoch's count. More is a
   replay, less a loss; both are named (epoch, episode, frame ranges). The record must also hold
   one row per step and rank, steps 1 to the checkpoint's.

What the checkpoint attests is steps 1 to its step; steps a killed run trained after it are
trained again by the resume. With ``index_log`` (``ROBO_RESUME_TRAIN_INDEX_LOG``'s files), the
frames of every step are compared with the ``index`` values the run logged, and steps logged
after the checkpoint are reported.

A ``--mix.*`` run is refused (its record would need one layout per source).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import RoboResumeError, describe, format_ranges
from ..index.elastic import Layout, leftover
from ..index.schedule import Topology
from ..state.resume import ResumeState
from .options import DATA_DIR, DATA_STATE, INDEX_LOG_ENV, OPTIONS
from .record import ROWS_FILE, RUNS_FILE, RunHeader, StepRecord

if TYPE_CHECKING:
    from ..dataset import ChunkedEpisodeDataset

__all__ = ["AuditError", "EpochAudit", "RunAudit", "audit_record", "audit_run", "format_audit"]

_IDENTITY = ("dataset", "total_frames", "episodes", "plan", "seed")  # what the plan rests on
_SHOW = 12  # ranges named per list in the text summary (the JSON has them all)


class AuditError(RoboResumeError, ValueError):
    """The run cannot be audited: no checkpoint, no record, a mix, or its dataset changed."""


@dataclass
class EpochAudit:
    """One epoch's counts, in frames.

    ``frames``: the epoch's frames (its schedule); ``trained``: frames the record's steps
    trained (with repeats); ``once``: frames trained exactly as often as scheduled;
    ``replayed``/``lost``: frames trained (or pending) more/less often than scheduled;
    ``pending``: frames the checkpoint's cursors have still to train; ``tail``: frames of the
    plan in no stream of this epoch (``tail="drop"``); ``skipped``: frames of chunks skipped with
    ``on_error="skip"``. The ranges are ``[episode, first frame, last frame, times]`` (times:
    how many times too often, or missing).
    """

    epoch: int
    frames: int
    trained: int
    once: int
    replayed: int
    lost: int
    pending: int
    tail: int
    skipped: int
    replayed_ranges: list[list[int]] = field(default_factory=list)
    lost_ranges: list[list[int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Exactly once: nothing replayed, nothing lost."""
        return self.replayed == 0 and self.lost == 0


@dataclass
class RunAudit:
    """The audit of one checkpoint of a run (see the module docstring)."""

    checkpoint: str
    step: int
    runs: list[dict[str, Any]]
    epochs: list[EpochAudit]
    problems: list[str]
    notes: list[str]
    log_steps_checked: int | None = None

    @property
    def ok(self) -> bool:
        """Every epoch exactly once and the record complete and consistent."""
        return not self.problems and all(e.ok for e in self.epochs)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (what ``robo-resume audit --json`` prints)."""
        return {
            "checkpoint": self.checkpoint,
            "step": self.step,
            "ok": self.ok,
            "runs": self.runs,
            "epochs": [{**vars(e), "ok": e.ok} for e in self.epochs],
            "problems": self.problems,
            "notes": self.notes,
            "log_steps_checked": self.log_steps_checked,
        }


# -- reading the checkpoint ---------------------------------------------------------------------
def _checkpoint(output_dir: Path, checkpoint: str) -> Path:
    ckpt = output_dir / "checkpoints" / checkpoint
    if not (ckpt / "training_state").is_dir():
        have = sorted(p.name for p in (output_dir / "checkpoints").glob("[0-9]*"))
        raise AuditError(
            describe(
                "No checkpoint to audit",
                expected=f"{ckpt}/training_state (a checkpoint robo-resume train wrote)",
                found=f"checkpoints {have}" if have else "no checkpoint",
                fix="pass the --output_dir of a robo-resume train run that saved a checkpoint, "
                "or another one with --checkpoint STEP",
            )
        )
    return ckpt


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise AuditError(
            describe(
                "A checkpoint file cannot be read",
                found=f"{type(exc).__name__}: {exc}",
                file=path,
                fix="audit another checkpoint with --checkpoint STEP",
            )
        ) from exc


def _dataset(run: RunHeader) -> Any:
    from ..dataset import ChunkedEpisodeDataset
    from ..stream.tuning import StreamTuning

    d = run.dataset
    episodes = [e for a, b in d["episodes"] for e in range(a, b + 1)]
    try:
        return ChunkedEpisodeDataset(
            d["root"],
            repo_id=None if d["root"] else d["repo_id"],
            revision=d["revision"],
            episodes=episodes,
            features=d["features"],
            chunk_frames=d["chunk_frames"],
            delta_timestamps=d["delta_timestamps"],
            batch_size=run.batch_size,
            seed=d["seed"],
            infinite=d.get("infinite", True),
            drop_last=d.get("drop_last", False),
            resume_state=run.start_state,
            rank=0,
            world_size=run.world_size,
            tuning=StreamTuning(**d["tuning"]) if d["tuning"] else None,
        )
    except (RoboResumeError, FileNotFoundError) as exc:
        raise AuditError(
            describe(
                f"Cannot plan the dataset of the run that started at step {run.first_step}",
                found=f"{type(exc).__name__}: {exc}",
                file=d["root"] or d["repo_id"],
                fix="run the audit where the run's dataset is, at the same path (the record "
                "names it)",
            )
        ) from exc


# -- frames of stream positions -----------------------------------------------------------------
def _frames(layout: Layout, epoch: int, stream: int, lo: int, hi: int) -> np.ndarray:
    """Dataset ``index`` values stream ``stream`` emits at positions ``[lo, hi)`` of ``epoch``."""
    parts = []
    for grp, offset in layout.iter_groups(epoch, stream, lo):
        if grp.position >= hi:
            break
        parts.append(grp.global_indices()[offset : hi - grp.position])
    out = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if len(out) != hi - lo:
        raise AuditError(
            describe(
                "The record names stream positions past the end of their epoch",
                expected=f"positions below {layout.length(epoch, stream)} of stream {stream} "
                f"in epoch {epoch}",
                found=f"positions {lo}..{hi - 1}",
                fix="audit an unmodified checkpoint of the run (--checkpoint STEP)",
            )
        )
    return out


def _pieces(layout: Layout, stream: int, row: np.ndarray) -> list[tuple[int, int, int]]:
    """``(epoch, lo, hi)`` position ranges a record row consumed (a batch may cross an epoch)."""
    _, _, _, e0, p0, e1, p1 = (int(x) for x in row)
    if e0 == e1:
        return [(e0, p0 - 1, p1)]
    out = [(e0, p0 - 1, layout.length(e0, stream))]
    out += [(e, 0, layout.length(e, stream)) for e in range(e0 + 1, e1)]
    return [*out, (e1, 0, p1)]


class _Spans:
    """Dataset index -> (episode, frame) for naming frames."""

    def __init__(self, ds: ChunkedEpisodeDataset) -> None:
        spans = ds.positions.spans
        order = np.argsort(spans.dataset_from_index)
        self.first = np.asarray(spans.dataset_from_index)[order]
        self.episode = np.asarray(spans.episode_index)[order]
        self.length = np.asarray(spans.length)[order]
        self.size = int((spans.dataset_from_index + spans.length).max())

    def ranges(self, index: np.ndarray, times: np.ndarray) -> list[list[int]]:
        """``[episode, first frame, last frame, times]`` runs of consecutive frames."""
        if not len(index):
            return []
        k = np.searchsorted(self.first, index, side="right") - 1
        ep, frame = self.episode[k], index - self.first[k]
        new = np.ones(len(index), bool)
        new[1:] = (np.diff(index) != 1) | (np.diff(ep) != 0) | (np.diff(times) != 0)
        starts = np.flatnonzero(new)
        ends = np.append(starts[1:], len(index)) - 1
        return [
            [int(ep[a]), int(frame[a]), int(frame[b]), int(times[a])]
            for a, b in zip(starts, ends, strict=True)
        ]


# -- the audit ----------------------------------------------------------------------------------
def audit_run(
    output_dir: str | Path, *, checkpoint: str = "last", index_log: str | Path | None = None
) -> RunAudit:
    """Audit ``output_dir``'s checkpoint ``checkpoint`` (see the module docstring); ``index_log``:
    the ``ROBO_RESUME_TRAIN_INDEX_LOG`` path of the run (its ``.rankN`` files), or None.

    Raises :class:`AuditError` when the run cannot be audited (no checkpoint or record, a mix,
    a dataset that is gone or changed).
    """
    ckpt = _checkpoint(Path(output_dir), checkpoint)
    folder = ckpt / "training_state" / DATA_DIR
    options = _json(folder / OPTIONS) if (folder / OPTIONS).is_file() else {}
    mix = options.get("mix")
    if mix:
        raise AuditError(
            describe(
                "robo-resume audit does not audit --mix.* runs yet",
                found=f"a mix of {len(mix.get('roots') or mix.get('repo_ids') or ())} sources",
                file=ckpt,
                fix="train the mix with ROBO_RESUME_TRAIN_INDEX_LOG=PATH to log the index values "
                "of every step, and count them per source",
            )
        )
    record = StepRecord.load(folder)
    if record is None or not record.runs:
        raise AuditError(
            describe(
                "The checkpoint holds no per-step record",
                expected=f"{folder}/{RUNS_FILE} and {ROWS_FILE}",
                found="no record (a checkpoint of plain lerobot-train, or of robo-resume train "
                "before the record)",
                file=ckpt,
                fix="train (or resume) with this robo-resume version: checkpoints it writes from "
                "then on hold the record",
            )
        )
    step = int(_json(ckpt / "training_state" / "training_step.json")["step"])
    final = ResumeState.from_dict(_json(folder / DATA_STATE))
    return audit_record(
        record, final, step, checkpoint=str(ckpt), label=ckpt.resolve().name, index_log=index_log
    )


def audit_record(
    record: StepRecord,
    final: ResumeState,
    step: int,
    *,
    checkpoint: str,
    label: str | None = None,
    index_log: str | Path | None = None,
) -> RunAudit:
    """Audit a checkpoint's contents: its per-step record, its data state and its step.

    :func:`audit_run` reads these from a ``robo-resume train`` checkpoint folder; a training
    loop of its own (``robo-resume demo``'s) keeps a :class:`~.record.StepRecord` and its
    tracker's state in its own checkpoint file and audits them here.

    Args:
        record: the per-step record saved with the checkpoint (its runs' headers and rows).
        final: the data state saved with the checkpoint (the cursors after step ``step``).
        step: the checkpoint's step: the record must hold steps 1 to ``step`` on every rank.
        checkpoint: the checkpoint's path or name, for the report.
        label: how the notes name the checkpoint (default: ``checkpoint``).
        index_log: the ``ROBO_RESUME_TRAIN_INDEX_LOG`` path of the run, or None.

    Returns:
        The audit: per epoch, the frames trained once, replayed, lost and pending.

    Raises:
        AuditError: the record is empty, or its dataset is gone or changed.
    """
    if not record.runs:
        raise AuditError(
            describe(
                "The checkpoint holds no per-step record",
                found="a record without runs",
                file=checkpoint,
                fix="audit a checkpoint saved after at least one step",
            )
        )
    problems: list[str] = []
    notes = [
        f"audited: steps 1..{step}, what checkpoint {label or checkpoint} attests; steps a killed "
        "run trained after it are in no checkpoint, and a resume trains them again"
    ]
    if record.runs[0].first_step > 1:
        problems.append(
            f"the record starts at step {record.runs[0].first_step}: steps 1.."
            f"{record.runs[0].first_step - 1} were trained by a version without the record "
            "(they cannot be audited)"
        )

    runs, layouts, spans = [], [], None
    for i, run in enumerate(record.runs):
        ds = _dataset(run)
        mismatch = [k for k in _IDENTITY if ds.fingerprint.get(k) != final.fingerprint.get(k)]
        if mismatch:
            raise AuditError(
                describe(
                    "The dataset the record names is not the one the run trained on",
                    expected=f"the checkpoint's {', '.join(mismatch)}",
                    found=", ".join(f"{k} {ds.fingerprint.get(k)!r}" for k in mismatch),
                    file=run.dataset["root"] or run.dataset["repo_id"],
                    fix="audit with the run's dataset unchanged at the path the record names",
                )
            )
        spans = spans or _Spans(ds)
        layout = ds.layout(run.num_workers)
        layouts.append(layout)
        rows = record.run_rows(i)
        runs.append(
            {
                "first_step": run.first_step,
                "last_step": int(rows[:, 0].max()) if len(rows) else None,
                "world_size": run.world_size,
                "num_workers": run.num_workers,
                "batch_size": run.batch_size,
                "resumed_from": run.resumed_from,
                "remainder_epoch": layout.epoch,
            }
        )
    assert spans is not None
    problems += _step_problems(record, step)

    # 1. frames per step; counts per epoch
    counts: dict[int, np.ndarray] = {}
    row_frames: dict[tuple[int, int], list[tuple[int, np.ndarray]]] = {}  # (step, rank) -> ...
    want_rows = index_log is not None
    normal: dict[int, int] = {}  # epoch -> first run playing it as a normal epoch
    for i, run in enumerate(record.runs):
        topo, layout = Topology(run.world_size, run.num_workers), layouts[i]
        by_key: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
        rows = record.run_rows(i)
        for j, row in enumerate(rows):
            g = topo.stream_id(int(row[1]), int(row[2]))
            for e, lo, hi in _pieces(layout, g, row):
                by_key.setdefault((e, g), []).append((lo, hi, j))
                if e != layout.epoch:
                    normal.setdefault(e, i)
        per_row: dict[int, list[tuple[int, np.ndarray]]] = {}
        for (e, g), spans_ in sorted(by_key.items()):
            lo, hi = min(s[0] for s in spans_), max(s[1] for s in spans_)
            frames = _frames(layout, e, g, lo, hi)
            cover: np.ndarray = np.zeros(hi - lo + 1, np.int64)
            for a, b, j in spans_:
                cover[a - lo] += 1
                cover[b - lo] -= 1
                if want_rows:
                    per_row.setdefault(j, []).append((e, frames[a - lo : b - lo]))
            cover = np.cumsum(cover[:-1])
            c = counts.setdefault(e, np.zeros(spans.size, np.int64))
            c += np.bincount(frames, weights=cover, minlength=spans.size).astype(np.int64)
            twice = np.flatnonzero(cover > 1)
            if len(twice):
                steps = sorted(
                    {int(rows[j][0]) for a, b, j in spans_ if _overlaps(a, b, twice + lo)}
                )
                problems.append(
                    f"epoch {e} stream {g} (run {i + 1}): steps "
                    f"{format_ranges(steps, limit=80)} consumed stream positions "
                    f"{format_ranges(twice + lo, limit=80)} more than once"
                )
        for j, parts in per_row.items():
            row_frames.setdefault((int(rows[j][0]), int(rows[j][1])), []).append(
                (j, np.concatenate([f for _, f in parts]))
            )

    # 3. pending: what the checkpoint's cursors have left
    last_run, last_layout = record.runs[-1], layouts[-1]
    here = (last_run.world_size, last_run.num_workers, last_run.batch_size)
    if (final.world_size, final.num_workers, final.batch_size) != here:
        problems.append(
            f"the checkpoint's data state is of world_size={final.world_size} num_workers="
            f"{final.num_workers} batch_size={final.batch_size}, its last run's record of "
            f"world_size={here[0]} num_workers={here[1]} batch_size={here[2]}"
        )
    topo = Topology(last_run.world_size, last_run.num_workers)
    cursors = {topo.stream_id(c.rank, c.role): (c.epoch, c.position) for c in final.cursors}
    pending: dict[int, np.ndarray] = {}
    if cursors:
        left = leftover(last_layout, cursors, max(e for e, _ in cursors.values()))
        for e in np.unique(left.epoch).tolist():
            sel = left.epoch == e
            idx = np.concatenate(
                [
                    np.arange(a, a + n)
                    for a, n in zip(left.dataset_from_index[sel], left.lengths[sel], strict=True)
                ]
            )
            pending[int(e)] = np.bincount(idx, minlength=spans.size)

    skipped: dict[int, np.ndarray] = {}
    for r in final.skipped:
        k = np.flatnonzero(spans.episode == r["episode"])
        if len(k):
            s = skipped.setdefault(int(r["epoch"]), np.zeros(spans.size, np.int64))
            s[spans.first[k[0]] + r["frame"] : spans.first[k[0]] + r["stop"]] += 1

    # 2. and 4. each epoch's frames, and the count
    epochs = []
    zero = np.zeros(spans.size, np.int64)
    plan_frames = np.zeros(spans.size, np.int64)
    for a, n in zip(spans.first.tolist(), spans.length.tolist(), strict=True):
        plan_frames[a : a + n] = 1
    for e in sorted(set(pending) - set(counts)):  # cursors at the start of an epoch
        notes.append(
            f"epoch {e}: not started (the checkpoint's cursors are at its start: its "
            f"{int(pending[e].sum())} frames are what a resume trains next)"
        )
    for e in sorted(counts):
        base = layouts[normal.get(e, 0)].schedule
        sched = np.concatenate([base.frame_indices(e, g) for g in range(base.topology.num_streams)])
        expected = np.bincount(sched, minlength=spans.size)
        c, p = counts.get(e, zero), pending.get(e, zero)
        total = c + p
        over, under = np.flatnonzero(total > expected), np.flatnonzero(total < expected)
        epochs.append(
            EpochAudit(
                epoch=e,
                frames=int(expected.sum()),
                trained=int(c.sum()),
                once=int(((c == expected) & (c > 0)).sum()),
                replayed=int((total - expected)[over].sum()),
                lost=int((expected - total)[under].sum()),
                pending=int(p.sum()),
                tail=int(((plan_frames > 0) & (expected == 0)).sum()),
                skipped=int(skipped.get(e, zero).sum()),
                replayed_ranges=spans.ranges(over, (total - expected)[over]),
                lost_ranges=spans.ranges(under, (expected - total)[under]),
            )
        )

    checked = None
    if index_log is not None:
        checked, log_problems, log_notes = _check_log(Path(index_log), row_frames, step, skipped)
        problems += log_problems
        notes += log_notes
    return RunAudit(checkpoint, step, runs, epochs, problems, notes, checked)


def _overlaps(a: int, b: int, positions: np.ndarray) -> bool:
    return bool(((positions >= a) & (positions < b)).any())


def _step_problems(record: StepRecord, step: int) -> list[str]:
    """One row per step and rank, steps 1..``step``, each run's steps after the one before."""
    have = Counter((int(s), int(r)) for s, r in record.rows[:, :2])
    want: set[tuple[int, int]] = set()
    for i, run in enumerate(record.runs):
        end = record.runs[i + 1].first_step if i + 1 < len(record.runs) else step + 1
        want |= {(s, r) for s in range(run.first_step, end) for r in range(run.world_size)}
    out = []
    twice = sorted({s for (s, _), n in have.items() if n > 1})
    if twice:
        out.append(f"steps {format_ranges(twice, limit=80)} are recorded more than once")
    missing = sorted({s for s, _ in want - set(have)})
    if missing:
        out.append(f"steps {format_ranges(missing, limit=80)} are missing from the record")
    extra = sorted({s for s, _ in set(have) - want})
    if extra:
        out.append(f"steps {format_ranges(extra, limit=80)} are recorded but not in any run")
    return out


def _check_log(
    path: Path,
    row_frames: dict[tuple[int, int], list[tuple[int, np.ndarray]]],
    step: int,
    skipped: dict[int, np.ndarray],
) -> tuple[int, list[str], list[str]]:
    """Compare each step's frames with the last ``index`` list the run logged for it."""
    ranks = sorted({r for _, r in row_frames})
    logged: dict[tuple[int, int], list[int]] = {}
    for r in ranks:
        f = Path(f"{path}.rank{r}")
        if not f.is_file():
            raise AuditError(
                describe(
                    "The index log has no file for a rank of the run",
                    expected=f"{f} ({INDEX_LOG_ENV}'s file of rank {r})",
                    found="no such file",
                    fix="pass --index-log with the value ROBO_RESUME_TRAIN_INDEX_LOG had during "
                    "the run, or leave it out",
                )
            )
        for line in f.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                logged[int(entry["step"]), r] = entry["index"]  # the newest entry of a step wins
    problems, notes, checked = [], [], 0
    any_skips = any(s.any() for s in skipped.values())
    for key, rows in sorted(row_frames.items()):
        if key[0] > step or key not in logged:
            continue
        frames = rows[-1][1].tolist()
        checked += 1
        if any_skips:  # skipped frames hold positions but are not trained (not in the log)
            same = Counter(logged[key]) <= Counter(frames)
        else:
            same = frames == logged[key]
        if not same:
            problems.append(
                f"step {key[0]} rank {key[1]}: the record's frames "
                f"{format_ranges(frames, limit=60)} (in order: {frames[:8]}...) differ from the "
                f"index log's {logged[key][:8]}..."
            )
    later = sorted({s for s, _ in logged if s > step})
    if later:
        notes.append(
            f"steps {format_ranges(later, limit=80)} were logged after checkpoint step {step} "
            "(trained by a run killed before it saved them): not in the checkpoint, so a resume "
            "trains them again"
        )
    return checked, problems, notes


# -- text ---------------------------------------------------------------------------------------
def _ranges_text(ranges: list[list[int]]) -> str:
    parts = [
        f"episode {ep} frame{'s' if a != b else ''} {a}{f'-{b}' if a != b else ''}"
        + (f" ({n}x)" if n > 1 else "")
        for ep, a, b, n in ranges[:_SHOW]
    ]
    more = (
        f", ... ({len(ranges) - _SHOW} more ranges, --json lists all)"
        if len(ranges) > _SHOW
        else ""
    )
    return ", ".join(parts) + more


def format_audit(audit: RunAudit) -> str:
    """The human summary of :func:`audit_run`'s result (a few lines)."""
    lines = [f"checkpoint {audit.checkpoint} (step {audit.step})"]
    for i, r in enumerate(audit.runs):
        how = (
            "fresh" if r["resumed_from"] is None else f"resumed from {Path(r['resumed_from']).name}"
        )
        rem = (
            f", remainder of epoch {r['remainder_epoch']} re-partitioned"
            if r["remainder_epoch"] is not None
            else ""
        )
        lines.append(
            f"  run {i + 1}: steps {r['first_step']}..{r['last_step']}, {how}, world_size="
            f"{r['world_size']} num_workers={r['num_workers']} batch_size={r['batch_size']}{rem}"
        )
    for e in audit.epochs:
        state = "complete" if e.pending == 0 else f"in progress, {e.pending} pending"
        extra = f", {e.tail} in no stream (tail)" if e.tail else ""
        extra += f", {e.skipped} skipped (on_error=skip)" if e.skipped else ""
        lines.append(
            f"  epoch {e.epoch} ({state}): {e.frames} frames, {e.once} trained once, "
            f"{e.replayed} replayed, {e.lost} lost{extra}"
        )
        if e.replayed_ranges:
            lines.append(f"    replayed: {_ranges_text(e.replayed_ranges)}")
        if e.lost_ranges:
            lines.append(f"    lost: {_ranges_text(e.lost_ranges)}")
    if audit.log_steps_checked is not None:
        lines.append(f"  index log: {audit.log_steps_checked} step(s) compared with the record")
    lines += [f"  problem: {p}" for p in audit.problems]
    lines += [f"  note: {n}" for n in audit.notes]
    lines.append(
        "robo_resume: exactly once"
        if audit.ok
        else "robo_resume: FAILED (frames replayed or lost, see above)"
    )
    return "\n".join(lines)
