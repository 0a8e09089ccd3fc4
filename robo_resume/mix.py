"""MixedDataset: several LeRobot datasets interleaved by weight, with exact per-source resume.

Design (one concept per layer, as in the rest of the package):

- **One ChunkedEpisodeDataset per source.** Each source keeps its own plan, schedule, streams,
  epochs and cursors (its seed is derived from the mix seed and the source's position). With
  ``exhausted="cycle"`` every source runs in infinite mode (it cycles through its own epochs)
  and the mix is one endless iteration (step-based training); with ``exhausted="stop"`` every
  source runs in epoch mode and each ``iter()`` over the loader is one mix epoch that ends
  when the first source runs out.
- **Mixing per batch.** Every batch comes whole from one source (a batch has one layout and one
  stream cursor). DataLoader worker roles play their own *mix stream*: role ``r``'s batch ``j``
  comes from source ``source_at(epoch, g, j)``, a pure function of ``(seed, epoch, g, j)``
  where ``g`` is the global stream id (``rank * W + r``). Batches are grouped in *rounds* of
  ``period`` batches; in every round source ``i`` gets ``counts[i]`` batches (the weights'
  largest-remainder share of ``period``), in a seeded permutation per round. So the mix matches
  the weights exactly every ``period`` batches of a stream, and the number of batches source
  ``i`` gave stream ``g`` before position ``j`` is ``(j // period) * counts[i]`` plus a count
  inside one round: arithmetic, O(period), whatever ``j``.
- **DataLoader arithmetic.** Worker ``w`` plays role ``w`` and takes its source batches from
  stream ``w`` of each source, so the round-robin rule of the single dataset still holds (batch
  ``k`` from worker ``k % W``) and a resume rotates roles the same way. With ``"stop"``, every
  stream of every rank stops at the same ``J`` (the smallest position at which one of its
  sources would need a batch past its epoch), so all workers and ranks yield the same number of
  batches, which the round-robin rule needs. Batches of the other sources after that point are
  not used in that epoch (like the tail of a single dataset).
- **Resume state** (:class:`MixState`, JSON-safe, versioned): the mix fingerprint (weights,
  period, exhausted, seed, batch size, key mappings, each source's dataset fingerprint), the
  topology, each role's mix position ``(epoch, j)``, and for every source its own
  :class:`~robo_resume.state.ResumeState` (one cursor per stream: where that source stands).
  On resume each source stream continues from its recorded cursor; the cursors are checked
  against the arithmetic (prefix counts at the mix position), so a state that does not fit is
  refused instead of replaying or losing frames. :class:`MixTracker` keeps one
  :class:`~robo_resume.tracker.CursorTracker` per source (its cursor checks, skip records and
  state), plus each role's mix position.
- **Elastic resume** (another ``num_workers``, world size or batch size than the state's). Each
  source hands its own state, with every stream's cursor put where the mix arithmetic says it
  stands, to its dataset's elastic machinery (:mod:`robo_resume.index.elastic`): what each source's
  interrupted epoch(s) have left becomes that source's *remainder epoch* over the new topology.
  The mix position after the hop: every new role starts at batch ``j = 0`` of a fresh mix
  epoch, and each source's streams start at their remainder epoch (``MixState.source_starts``
  records where). With ``"cycle"`` the mix epoch label goes up by one at each hop (it only seeds
  the mix order): every frame each source had left in its interrupted epochs is delivered
  exactly once, then the sources' normal epochs of the new topology follow. With ``"stop"`` the
  interrupted mix epoch ``e`` keeps its label: it continues on what every source has left of
  its epoch ``e`` until the first source runs out in some stream (as any ``"stop"`` epoch: no
  frame twice, the other sources' rest is the epoch's unused tail); the next ``iter()`` is
  epoch ``e + 1`` of the new topology. A hop is refused (by the source's own checks) when the
  state lacks some rank's positions, or the leftover cannot be split exactly into equal batch
  counts per rank (see :mod:`robo_resume.index.elastic`).
- **resume_step** (``batches * batch_size`` this rank consumed since the start of the run, the
  topology and batch size unchanged) is turned into the same start as the tracker's state:
  the DataLoader's round-robin per mix epoch, and per source the prefix counts of the mix
  order. It cannot know which chunks ``on_error="skip"`` skipped, so it is refused there.
- **Skipped chunks** (``on_error="skip"``, passed to every source): a chunk whose files fail is
  skipped in its source's stream from the failing read on; its frames keep their positions, so
  the mix's batches and positions are unchanged (a batch may hold fewer frames, even none).
  Exactly once per source then means: every position of the source's streams is consumed once,
  its frame delivered in a batch or (if unreadable) listed once in that source's skip records
  (``MixTracker.skipped``, saved in the source's nested state, skipped again without a retry
  after a resume, elastic or not).
- **Changed weights** (or period, exhausted, sources, keys) are refused with
  :class:`~robo_resume.errors.ResumeStateError`: the mix position only says how many batches each
  source gave under the weights it was recorded with. To change the mix, start a new run.
- **One item layout.** ``MixSource.keys`` maps a source's feature names to the mix's names
  (``None`` drops a feature, e.g. a camera the other sources lack). After mapping, every source
  must have the same features with the same shapes (and dtypes for non-video features) and the
  same fps; otherwise a :class:`~robo_resume.errors.DatasetFormatError` says what was expected,
  what was found and how to map it. Keys of batches are renamed (``<key>_is_pad`` too);
  ``delta_timestamps`` are given in mix names.

Every batch carries the source's frame cursors (:data:`~robo_resume.dataset.CURSOR_KEY`) and the
mix cursor ``MIX_KEY`` = ``[rank, role, num_workers, epoch, j, source]``; pass batches through
:meth:`MixTracker.consume`, which records and strips both (``tracker.last_source`` tells which
source the batch came from).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from .dataset import ChunkedEpisodeDataset
from .errors import DatasetFormatError, ResumeStateError, describe
from .index.elastic import Layout, build_layout
from .index.schedule import Topology, worker_batches_done
from .keys import CURSOR_KEY, SKIPPED_KEY
from .splits import EpisodeSelection
from .state.mix import MixState
from .state.resume import MAX_STATE_INT, MAX_WORKERS, ResumeState, StreamCursor
from .stream.loader import BatchLoader
from .stream.startup import _resolve_rank, worker_context
from .stream.tuning import StreamTuning
from .tracker import CursorTracker

__all__ = ["EXHAUSTED", "MIX_KEY", "MixSource", "MixState", "MixTracker", "MixedDataset"]

MIX_KEY = "robo_resume_mix"
"""Batch key of the mix cursor: int64 ``[rank, role, num_workers, epoch, j, source]``."""

EXHAUSTED = ("cycle", "stop")
MAX_PERIOD = 1000
DEFAULT_PERIOD = 100
_MIX, _SOURCE = 0x4D4958, 0x535243  # SeedSequence spawn keys ("MIX", "SRC")
_VISUAL = ("video", "image")


@dataclass(frozen=True)
class MixSource:
    """One dataset of a mix.

    Attributes:
        root: dataset folder (or where a Hub download goes, with ``repo_id``).
        weight: share of the mix's batches (relative to the other sources' weights).
        keys: this source's feature name -> mix name (None drops the feature); unmapped
            features keep their names.
        episodes: episode selection of this source (indices, slice string or ``Split``).
        repo_id, revision: a Hub dataset, as in :class:`ChunkedEpisodeDataset`.
        chunk_frames, tuning: per-source overrides of the mix's values.
    """

    root: str | Path | None = None
    weight: float = 1.0
    keys: Mapping[str, str | None] = field(default_factory=dict)
    episodes: EpisodeSelection = None
    repo_id: str | None = None
    revision: str | None = None
    chunk_frames: int | None = None
    tuning: StreamTuning | None = None

    def __post_init__(self) -> None:
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w <= 0:
            raise ValueError(
                describe(
                    "A mix source's weight must be a positive number",
                    found=repr(w),
                    fix="give every source a weight > 0 (drop a source instead of weight 0)",
                )
            )
        if self.root is None and self.repo_id is None:
            raise ValueError(describe("A mix source needs a root or a repo_id", found="neither"))


def round_counts(weights: Sequence[float], period: int) -> tuple[int, ...]:
    """Batches per round of ``period`` for each weight (largest remainder, ties: lower index)."""
    total = math.fsum(weights)
    quotas = [w * period / total for w in weights]
    counts = [math.floor(q + 1e-9) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[: period - sum(counts)]:
        counts[i] += 1
    return tuple(counts)


def default_period(weights: Sequence[float]) -> int:
    """``sum / gcd`` of integral weights up to :data:`MAX_PERIOD` (exact), else 100."""
    if all(float(w).is_integer() for w in weights):
        ints = [int(w) for w in weights]
        g = math.gcd(*ints)
        if sum(ints) // g <= MAX_PERIOD:
            return sum(ints) // g
    return DEFAULT_PERIOD


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


class MixedDataset(IterableDataset):
    """Several LeRobot datasets (v3.0 and v2.1 may be mixed) interleaved by weight.

    Args:
        sources: the :class:`MixSource` s (their order is part of the state).
        batch_size, seed, drop_last, rank, world_size: as in :class:`ChunkedEpisodeDataset`.
        exhausted: "cycle" (a source that runs out starts its next epoch; the mix is endless)
            or "stop" (each ``iter()`` is one mix epoch, ended by the first source to run out).
        period: batches per mixing round (see the module docstring); None: ``sum/gcd`` of
            integral weights, else 100.
        resume_step: ``batches * batch_size`` this rank consumed since the run started, with
            the same topology and batch size (arithmetic start; see the module docstring).
        resume_state: a :meth:`MixTracker.state_dict` (it may come from another topology or
            batch size: elastic resume); resume_strict as for one dataset.
        chunk_frames, tuning: defaults for every source.
        delta_timestamps: in the mix's feature names.
        image_transforms, image_dtype: as in :class:`ChunkedEpisodeDataset`.
        on_error: "raise" or "skip", passed to every source (see the module docstring).

    Also speaks torchdata's StatefulDataLoader protocol (:meth:`state_dict` /
    :meth:`load_state_dict`, with ``batch_size=None``: the mix yields whole batches).
    """

    def __init__(
        self,
        sources: Sequence[MixSource],
        *,
        batch_size: int,
        seed: int = 0,
        exhausted: str = "cycle",
        period: int | None = None,
        resume_step: int = 0,
        resume_state: Mapping[str, Any] | MixState | None = None,
        resume_strict: bool = True,
        chunk_frames: int = 64,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        image_transforms: Callable[[torch.Tensor], torch.Tensor] | None = None,
        image_dtype: str = "float32",
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        tuning: StreamTuning | None = None,
        on_error: str = "raise",
    ) -> None:
        super().__init__()
        sources = tuple(sources)
        if not sources or not all(isinstance(s, MixSource) for s in sources):
            raise ValueError(
                describe("sources must be a non-empty list of MixSource", found=repr(sources)[:120])
            )
        if exhausted not in EXHAUSTED:
            raise ValueError(
                describe("Unknown exhausted mode", expected=" or ".join(EXHAUSTED), found=exhausted)
            )
        weights = [float(s.weight) for s in sources]
        period = default_period(weights) if period is None else period
        if isinstance(period, bool) or not isinstance(period, int) or not 1 <= period <= MAX_PERIOD:
            raise ValueError(describe("period must be an int in 1..1000", found=repr(period)))
        keep = [
            i
            for i, s in enumerate(sources)
            if (s.tuning or tuning or StreamTuning()).tail == "keep"
        ]
        if keep:
            raise ValueError(
                describe(
                    "A mix cannot use StreamTuning(tail='keep') (every frame once)",
                    expected="tail 'drop' or 'pad' (a mix stream stops when its first source "
                    "runs out, which leaves frames of the other sources out)",
                    found=f"tail='keep' for source(s) {keep}",
                    fix="evaluate each dataset with ChunkedEpisodeDataset(root, episodes=..., "
                    "tuning=StreamTuning.evaluation()) and rename its keys to the mix's names",
                )
            )
        self.sources = sources
        self.batch_size = batch_size
        self.seed = seed
        self.exhausted = exhausted
        self.infinite = exhausted == "cycle"
        self.drop_last = drop_last
        self.period = period
        self.weights = weights
        self.counts = np.asarray(round_counts(weights, period), dtype=np.int64)
        self.rank, self.world_size = _resolve_rank(rank, world_size)
        self.datasets: list[ChunkedEpisodeDataset] = []
        for i, src in enumerate(sources):
            self.datasets.append(
                ChunkedEpisodeDataset(
                    src.root,
                    repo_id=src.repo_id,
                    revision=src.revision,
                    batch_size=batch_size,
                    seed=self.source_seed(i),
                    chunk_frames=src.chunk_frames or chunk_frames,
                    episodes=src.episodes,
                    features={k: None for k, v in src.keys.items() if v is None} or None,
                    delta_timestamps=self._source_delta(i, delta_timestamps),
                    image_transforms=image_transforms,
                    image_dtype=image_dtype,
                    drop_last=drop_last,
                    infinite=self.infinite,
                    rank=self.rank,
                    world_size=self.world_size,
                    tuning=src.tuning or tuning,
                    on_error=on_error,
                )
            )
        self.renames = [self._check_source(i) for i in range(len(sources))]
        self.features = self._layout(0)
        problems = [p for i in range(1, len(sources)) for p in self._check_fits(i)]
        if len(problems) == 1:
            raise DatasetFormatError(problems[0])
        if problems:  # every mismatch in one error, not one per run
            raise DatasetFormatError(
                describe(
                    f"The mix's sources differ from source 0 in {len(problems)} ways",
                    found=" ".join(f"({n}) {p}" for n, p in enumerate(problems, 1)),
                    fix="fix each of them (each says how), or leave the source out",
                )
            )
        self.camera_keys = tuple(k for k, v in self.features.items() if v["dtype"] in _VISUAL)
        self.fingerprint = {
            "sources": [ds.fingerprint["dataset"] for ds in self.datasets],
            "weights": weights,
            "period": period,
            "exhausted": exhausted,
            "seed": seed,
            "batch_size": batch_size,
            "drop_last": drop_last,
            "keys": _hash([dict(s.keys) for s in sources]),
        }
        # Shared table, one row per worker: [next epoch, started]
        self._slots = torch.zeros((MAX_WORKERS, 2), dtype=torch.int64).share_memory_()
        self._round_cache: dict[tuple[int, int, int], np.ndarray] = {}
        self.on_error = on_error
        self.resume_step = self._check_resume_step(resume_step, resume_state)
        self._levels: dict[int, _Level] = {}
        self._starts: dict[int, tuple[int, list[tuple[int, int, list]], int]] = {}
        self.resume_state: MixState | None = None
        if resume_state is not None:
            state = MixState.from_dict(resume_state)
            state.check(self)
            self._install(state, resume_strict)
            self.resume_state = state
        # this stream's position, for the StatefulDataLoader protocol (state_dict)
        self._live: dict[str, Any] = {
            "rank": self.rank,
            "role": 0,
            "num_workers": 0,
            "epoch": 0,
            "j": 0,
            "sources": [(0, 0)] * len(sources),
        }
        self._loaded: dict[str, Any] | None = None

    def _check_resume_step(self, step: Any, state: Any) -> int:
        b = self.batch_size
        if isinstance(step, bool) or not isinstance(step, int) or step < 0 or step % b:
            raise ValueError(
                describe(
                    "resume_step must be a non-negative multiple of batch_size",
                    expected=f"step * batch_size (a multiple of {b})",
                    found=repr(step),
                    fix="pass resume_step=step * batch_size, where step counts this rank's "
                    "batches since the start of the run",
                )
            )
        if step // b > MAX_STATE_INT:
            raise ResumeStateError(
                describe(
                    "resume_step is beyond any run's length",
                    expected=f"resume_step // batch_size <= {MAX_STATE_INT} batches",
                    found=f"resume_step={step}",
                )
            )
        if step and state is not None:
            raise ValueError(
                describe(
                    "Pass resume_step or resume_state, not both",
                    expected="one resume position",
                    found=f"resume_step={step} and a resume_state",
                    fix="pass only resume_state (it is exact across topology changes)",
                )
            )
        if step and self.on_error == "skip":
            raise ValueError(
                describe(
                    "resume_step cannot be exact with on_error='skip'",
                    expected="resume_state=MixTracker.state_dict() (it carries the skipped chunks)",
                    found=f"resume_step={step}, on_error='skip'",
                    fix="resume from the tracker's state: a step count does not say which "
                    "chunks were skipped, so they would be read again and skipped records lost",
                )
            )
        return step

    # -- layout --------------------------------------------------------------------------------
    def source_seed(self, i: int) -> int:
        """The seed of source ``i``'s dataset, derived from the mix seed (SeedSequence)."""
        ss = np.random.SeedSequence(entropy=self.seed, spawn_key=(_SOURCE, i))
        return int(ss.generate_state(1, dtype=np.uint32)[0])

    def _name(self, i: int) -> str:
        s = self.sources[i]
        return f"source {i} ({s.repo_id or s.root})"

    def _source_delta(self, i: int, delta: Mapping[str, Sequence[float]] | None):
        if not delta:
            return None
        back = {v: k for k, v in self.sources[i].keys.items() if v is not None}
        return {back.get(k, k): v for k, v in delta.items()}

    def _check_source(self, i: int) -> dict[str, str | None]:
        feats = self.datasets[i].meta.features  # without the features mapped to None
        keys = dict(self.sources[i].keys)
        unknown = [k for k in keys if k not in feats and k not in self.datasets[i].meta.dropped]
        if unknown:
            raise DatasetFormatError(
                describe(
                    f"The key mapping of {self._name(i)} names features it does not have",
                    expected=f"names among {list(feats)}",
                    found=unknown,
                    file=Path(self.datasets[i].meta.root) / "meta" / "info.json",
                    fix="map this source's own feature names, e.g. keys={'<its name>': "
                    "'<mix name>'}",
                )
            )
        targets = [keys.get(k, k) for k in feats if keys.get(k, k) is not None]
        dup = sorted({t for t in targets if targets.count(t) > 1})
        if dup:
            raise DatasetFormatError(
                describe(
                    f"The key mapping of {self._name(i)} gives two features one name",
                    expected="distinct mix names",
                    found=dup,
                    fix="map or drop (None) the feature that already has that name",
                )
            )
        return {k: keys.get(k, k) for k in feats}

    def _layout(self, i: int) -> dict[str, dict[str, Any]]:
        out = {}
        for k, ft in self.datasets[i].meta.features.items():
            name = self.renames[i][k]
            if name is not None:
                out[name] = {"dtype": ft.get("dtype"), "shape": list(ft.get("shape") or [])}
        return out

    def _check_fits(self, i: int) -> list[str]:
        """Every way source ``i`` differs from source 0 (fps, features, shapes, dtypes)."""
        problems: list[str] = []
        ref, mine = self.features, self._layout(i)
        meta0, meta = self.datasets[0].meta, self.datasets[i].meta
        info = Path(meta.root) / "meta" / "info.json"
        if meta.fps != meta0.fps:
            problems.append(
                describe(
                    f"{self._name(i)} has another fps than source 0",
                    expected=f"fps={meta0.fps} (source 0)",
                    found=f"fps={meta.fps}",
                    file=info,
                    fix="mix datasets recorded at one frame rate (delta_timestamps and video "
                    "times assume it); resample the dataset or leave it out",
                )
            )
        missing = [k for k in ref if k not in mine]
        extra = [k for k in mine if k not in ref]
        if missing or extra:
            problems.append(
                describe(
                    f"{self._name(i)} does not have the mix's features",
                    expected=f"features {list(ref)} (source 0, after its key mapping)",
                    found=(f"missing {missing}" if missing else "")
                    + ("; " if missing and extra else "")
                    + (f"extra {extra}" if extra else ""),
                    file=info,
                    fix="map this source's names with MixSource(keys={'<its name>': "
                    "'<mix name>'}), or drop a feature with keys={'<its name>': None}",
                )
            )
        for k, want in ref.items():
            got = mine.get(k)
            if got is None:
                continue
            if got["shape"] != want["shape"]:
                problems.append(
                    describe(
                        f"Feature '{k}' of {self._name(i)} has another shape than in source 0",
                        expected=f"shape {want['shape']} (source 0)",
                        found=f"shape {got['shape']}",
                        file=info,
                        fix="mix features of one shape: map another feature to this name, or "
                        "drop it from every source (keys={'<name>': None})",
                    )
                )
            kinds = {want["dtype"] in _VISUAL, got["dtype"] in _VISUAL}
            if len(kinds) > 1 or (not kinds.pop() and got["dtype"] != want["dtype"]):
                problems.append(
                    describe(
                        f"Feature '{k}' of {self._name(i)} has another dtype than in source 0",
                        expected=f"dtype {want['dtype']} (source 0)",
                        found=f"dtype {got['dtype']}",
                        file=info,
                        fix="map a feature of the same dtype to this name",
                    )
                )
        return problems

    # -- the pure mix order ----------------------------------------------------------------------
    def round_sources(self, epoch: int, stream: int, round_index: int) -> np.ndarray:
        """Sources of the ``period`` batches of a round of a mix stream (a pure function)."""
        key = (epoch, stream, round_index)
        got = self._round_cache.get(key)
        if got is None:
            ss = np.random.SeedSequence(
                entropy=self.seed, spawn_key=(_MIX, epoch, stream, round_index)
            )
            base = np.repeat(np.arange(len(self.sources), dtype=np.int64), self.counts)
            got = np.random.default_rng(ss).permutation(base)
            if len(self._round_cache) > 64:
                self._round_cache.clear()
            self._round_cache[key] = got
        return got

    def source_at(self, epoch: int, stream: int, j: int) -> int:
        """Source of batch ``j`` of mix stream ``stream`` in ``epoch`` (epoch 0 with "cycle")."""
        r, k = divmod(j, self.period)
        return int(self.round_sources(epoch, stream, r)[k])

    def counts_before(self, epoch: int, stream: int, j: int) -> np.ndarray:
        """Batches each source gave mix stream ``stream`` before its batch ``j`` (prefix sums)."""
        r, k = divmod(j, self.period)
        part = np.bincount(self.round_sources(epoch, stream, r)[:k], minlength=len(self.sources))
        return r * self.counts + part

    def epoch_batches(self, epoch: int, num_workers: int) -> int | None:
        """``J``: batches every mix stream yields in ``epoch`` ("stop"); None with "cycle"."""
        return self.level(num_workers).epoch_end(epoch)

    def batches_next_iteration(self, num_workers: int) -> int:
        """Batches the next iteration of this rank's DataLoader yields (``len(loader)``).

        ``exhausted="stop"``: the first iteration runs from :meth:`start_point` (after a
        resume, what is left of the interrupted mix epoch) to the epoch's end ``J`` of every
        role; later ones are whole mix epochs. ``"cycle"`` has no end: TypeError.
        """
        if self.infinite:
            raise TypeError(
                describe(
                    "A cycling mix's loader has no len()",
                    expected="exhausted='stop' for a loader with a length",
                    found="exhausted='cycle': one endless iteration",
                    fix="count steps yourself (the mix cycles through its sources' epochs)",
                )
            )
        wp = max(num_workers, 1)
        if int(self._slots[0, 1]) == 0:  # nothing started yet: from the resume point
            _, starts, _ = self.start_point(num_workers)
            return sum(
                max(int(self.epoch_batches(epoch, num_workers)) - j, 0) for epoch, j, _ in starts
            )
        return int(self.epoch_batches(int(self._slots[0, 0]), num_workers)) * wp

    def next_epoch(self, num_workers: int) -> int:
        """The mix epoch the next iteration of this rank's loader plays ("stop" only).

        As :meth:`ChunkedEpisodeDataset.next_epoch`: the resume point's epoch (the next one
        when the checkpoint was taken at an epoch's end), then one more per iteration; what
        :meth:`~robo_resume.dataset.BatchLoader.epochs` counts with. TypeError with "cycle".
        """
        if self.infinite:
            raise TypeError(
                describe(
                    "A cycling mix has no epochs to count",
                    expected="exhausted='stop' for epochs",
                    found="exhausted='cycle': one endless iteration",
                    fix="count steps (the mix cycles through its sources' epochs)",
                )
            )
        if int(self._slots[0, 1]) == 0:
            _, starts, _ = self.start_point(num_workers)
            return min(e for e, _, _ in starts)
        return int(self._slots[0, 0])

    def batches_per_epoch(self, num_workers: int) -> int | None:
        """Batches this rank's DataLoader yields in mix epoch 0 ("stop"); None with "cycle"."""
        j = self.epoch_batches(0, num_workers)
        return None if j is None else j * max(num_workers, 1)

    # -- resume ----------------------------------------------------------------------------------
    def _install(self, state: MixState, strict: bool) -> None:
        """Hand each source its part of ``state``, its cursors put where the mix says.

        The positions are checked against the arithmetic of the run that saved the state
        (:meth:`_Level.source_positions`); in "stop" mode a source cursor left in an earlier
        epoch (the source gave that stream nothing yet this epoch) becomes ``(epoch, 0)``,
        and after a finished mix epoch every cursor is the next epoch's start. So the sources'
        own elastic re-partition (:mod:`robo_resume.index.elastic`) sees what each source has
        really left.
        """
        old = self._state_level(state)
        positions, _ = old.positions(state, ranks=None)
        topo = old.topology
        normal: list[list[StreamCursor]] = [[] for _ in self.datasets]
        for g, (e, j) in sorted(positions.items()):
            rank, role = divmod(g, topo.workers_per_rank)
            recorded = [
                {(c.rank, c.role): c for c in st.cursors}.get((rank, role)) for st in state.sources
            ]
            for i, (ep, p) in enumerate(old.source_positions(e, g, j, recorded, role=role)):
                normal[i].append(StreamCursor(rank, role, ep, p))
        for ds, st, cur in zip(self.datasets, state.sources, normal, strict=True):
            ds.use_resume_state(dataclasses.replace(st, cursors=tuple(cur)), strict=strict)

    def _state_level(self, state: MixState) -> _Level:
        """The arithmetic of the run that saved ``state`` (its topology, batch size, layouts)."""
        layouts = tuple(
            build_layout(ds.chunks, ds.config, [*st.origin, st.level], infinite=self.infinite)
            for ds, st in zip(self.datasets, state.sources, strict=True)
        )
        topo = Topology(state.world_size, state.num_workers)
        return _Level(self, topo, state.batch_size, layouts, state.source_starts)

    def _elastic(self, num_workers: int) -> bool:
        st = self.resume_state
        return st is not None and st.topology != (self.world_size, num_workers, self.batch_size)

    def level(self, num_workers: int) -> _Level:
        """This run's mix arithmetic with ``num_workers`` workers (see :class:`_Level`)."""
        lv = self._levels.get(num_workers)
        if lv is None:
            layouts = tuple(ds.layout(num_workers) for ds in self.datasets)
            st = self.resume_state
            if st is None:
                starts = (0,) * len(self.datasets)
            elif self._elastic(num_workers):  # where each source's re-partition starts
                starts = tuple(ds.start_point(num_workers)[1][0][0] for ds in self.datasets)
            else:
                starts = st.source_starts
            topo = Topology(self.world_size, num_workers)
            lv = self._levels[num_workers] = _Level(self, topo, self.batch_size, layouts, starts)
        return lv

    def start_point(self, num_workers: int) -> tuple[int, list[tuple[int, int, list]], int]:
        """``(rotation, [(epoch, j, [(epoch, position)] per source)] per role, batches)``.

        New worker ``w`` plays role ``(w + rotation) % W`` in the first iteration. From the
        resume state (same topology: each role goes on where it stood; another topology or
        batch size: every role starts the *remainder mix epoch* at ``j = 0``, see the module
        docstring), from ``resume_step`` (arithmetic), or from the start.
        """
        got = self._starts.get(num_workers)
        if got is None:
            got = self._starts[num_workers] = self._start_point(num_workers)
        return got

    def _start_point(self, num_workers: int):
        wp = max(num_workers, 1)
        lv = self.level(num_workers)
        st = self.resume_state
        if st is None and self.resume_step == 0:
            return 0, [(0, 0, [(0, 0)] * len(self.sources)) for _ in range(wp)], 0
        if st is None:
            return lv.step_start(self.rank, self.resume_step // self.batch_size)
        if self._elastic(num_workers):
            last = max(e for *_, e, _ in st.mix)
            old = self._state_level(st)
            if self.infinite:
                label = last + 1  # "cycle": the mix epoch counts topology changes
            else:
                done = all(j >= old.epoch_end(last) for *_, e, j in st.mix if e == last)
                label = last + 1 if done else last
            return 0, [(label, 0, [(s, 0) for s in lv.starts]) for _ in range(wp)], 0
        mine, done = lv.positions(st, ranks=(self.rank,))
        if done is not None:
            n = len(self.sources)
            return 0, [(done, 0, [(done, 0)] * n) for _ in range(wp)], st.batches
        cur = [mine[lv.topology.stream_id(self.rank, r)] for r in range(wp)]
        total = sum(j for _, j in cur)
        expect = [worker_batches_done(total, num_workers, r) for r in range(wp)]
        if [j for _, j in cur] != expect:
            raise ResumeStateError(
                describe(
                    "Mix positions are not a DataLoader round-robin prefix",
                    expected=f"batches per stream {expect}",
                    found=[j for _, j in cur],
                    fix="record batches with MixTracker.consume on every batch, in order",
                )
            )
        starts = []
        for role, (e, j) in enumerate(cur):
            g = lv.topology.stream_id(self.rank, role)
            sources = [ds.resume_state for ds in self.datasets]
            recorded = [
                {(c.rank, c.role): c for c in s.cursors}.get((self.rank, role)) for s in sources
            ]
            starts.append((e, j, lv.source_positions(e, g, j, recorded, role=role)))
        return total % wp, starts, st.batches

    # -- streaming -------------------------------------------------------------------------------
    def __iter__(self):
        return self.iter_batches()

    def iter_batches(self, *, image_dtype: str | None = None):
        """This worker's mix stream as whole batches (what :meth:`dataloader` uses)."""
        info = get_worker_info()
        num_workers = info.num_workers if info is not None else 0
        worker = info.id if info is not None else 0
        wp = max(num_workers, 1)
        slot = self._slots[worker]
        resumed = False
        if self._loaded is not None:  # StatefulDataLoader: this worker's saved mix stream
            st, self._loaded = self._loaded, None
            role, epoch, j = st["role"], st["epoch"], st["j"]
            positions = [tuple(p) for p in st["sources"]]
            resumed = True
        elif int(slot[1]) == 0:
            rotation, starts, _ = self.start_point(num_workers)
            role = (worker + rotation) % wp
            epoch, j, positions = starts[role]
            resumed = self.resume_state is not None or self.resume_step > 0
        elif self.infinite:
            raise RuntimeError(
                describe(
                    "A cycling mix (exhausted='cycle') is one endless iteration",
                    expected="one iter() over the loader",
                    found="a second iter()",
                    fix="loop over one iterator and stop after a number of steps, or use "
                    "exhausted='stop' for epochs",
                )
            )
        else:
            role, epoch, j = worker, int(slot[0]), 0
            positions = [(epoch, 0)] * len(self.sources)
        slot[1] = 1
        slot[0] = epoch + 1
        # now, not at the first batch: a StatefulDataLoader snapshots a worker before it yields
        self._live.update(
            role=role, num_workers=num_workers, epoch=epoch, j=j, sources=list(positions)
        )
        return self._generate(role, num_workers, epoch, j, positions, resumed, image_dtype)

    def _generate(self, role, num_workers, epoch, j, positions, resumed, image_dtype):
        g = Topology(self.world_size, num_workers).stream_id(self.rank, role)
        stop = self.epoch_batches(epoch, num_workers)
        positions = list(positions)
        live = self._live
        gens: dict[int, Any] = {}
        while stop is None or j < stop:
            i = self.source_at(epoch, g, j)
            it = gens.get(i)
            if it is None:
                it = gens[i] = self.datasets[i].stream_batches(
                    role, num_workers, *positions[i], image_dtype=image_dtype, log_resume=resumed
                )
            batch = next(it, None)
            if batch is None:  # cannot happen when the arithmetic above is right
                raise RuntimeError(f"mix: source {i} ended early at epoch {epoch}, batch {j}")
            j += 1
            cur = batch[CURSOR_KEY]
            positions[i] = (int(cur[-1, 3]), int(cur[-1, 4]))
            live.update(epoch=epoch, j=j, sources=list(positions))
            out = {self._rename(i, k): v for k, v in batch.items() if self._rename(i, k)}
            out[MIX_KEY] = torch.tensor(
                [self.rank, role, num_workers, epoch, j, i], dtype=torch.int64
            )
            yield out

    def _rename(self, i: int, key: str) -> str | None:
        names = self.renames[i]
        if key in names:
            return names[key]
        if key.endswith("_is_pad") and key[: -len("_is_pad")] in names:
            base = names[key[: -len("_is_pad")]]
            return None if base is None else base + "_is_pad"
        return key  # task, cursor, skip records

    # -- StatefulDataLoader protocol -------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This worker's mix stream (what it has yielded), for torchdata's StatefulDataLoader:
        ``rank, role, num_workers, epoch, j`` and each source stream's ``(epoch, position)``."""
        live = dict(self._live)
        live["sources"] = [list(p) for p in live["sources"]]
        return live

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict` in the next ``iter()`` (StatefulDataLoader hook).

        The position is checked against the mix arithmetic (each source stream's position must
        be what ``j`` batches of the mix order leave it at), so a state of another mix,
        topology or batch size is refused instead of replaying or losing frames; an elastic
        resume needs :class:`MixTracker`'s state.
        """
        need = ("rank", "role", "num_workers", "epoch", "j", "sources")
        if not isinstance(state, Mapping) or any(k not in state for k in need):
            raise ResumeStateError(
                describe(
                    "Invalid mix dataset state",
                    expected=f"keys {need} (MixedDataset.state_dict())",
                    found=sorted(state) if isinstance(state, Mapping) else type(state).__name__,
                    fix="pass the unmodified StatefulDataLoader state_dict()",
                )
            )
        if int(state["rank"]) != self.rank:
            raise ResumeStateError(
                describe(
                    "Mix dataset state of another rank",
                    expected=f"rank {self.rank}",
                    found=f"rank {state['rank']}",
                )
            )
        role, nw = int(state["role"]), int(state["num_workers"])
        epoch, j = int(state["epoch"]), int(state["j"])
        sources = [(int(e), int(p)) for e, p in state["sources"]]
        lv = self.level(nw)
        g = lv.topology.stream_id(self.rank, role)
        recorded = [StreamCursor(self.rank, role, e, p) for e, p in sources]
        try:
            fits = len(sources) == len(self.sources) and lv.source_positions(
                epoch, g, j, recorded, role=role
            ) == [max(p, (epoch, 0)) if not self.infinite else p for p in sources]
            why = ""
        except ResumeStateError as exc:
            fits, why = False, f" ({str(exc).split('. Fix:')[0]})"
        if not fits:
            raise ResumeStateError(
                describe(
                    "The mix dataset state does not fit this mix",
                    expected=f"{len(self.sources)} source positions matching mix batch {j} of "
                    f"epoch {epoch}",
                    found=f"{sources}{why}",
                    fix="load the state into the same mix, topology and batch size it was saved "
                    "with (for another topology resume from MixTracker.state_dict())",
                )
            )
        self._loaded = {"role": role, "epoch": epoch, "j": j, "sources": sources}
        self._live.update(role=role, num_workers=nw, epoch=epoch, j=j, sources=sources)

    # -- helpers ---------------------------------------------------------------------------------
    def dataloader(self, *, num_workers: int = 0, **kwargs: Any) -> torch.utils.data.DataLoader:
        """A DataLoader of this mix's batches (as :meth:`ChunkedEpisodeDataset.dataloader`)."""
        for bad in ("batch_size", "drop_last", "shuffle", "sampler", "batch_sampler", "collate_fn"):
            if bad in kwargs:
                raise ValueError(
                    describe(
                        f"MixedDataset.dataloader() sets {bad} itself",
                        found=f"{bad}={kwargs[bad]!r}",
                        fix=f"set {bad} on the mix (batches are built whole per source)",
                    )
                )
        if num_workers > 0 and "multiprocessing_context" not in kwargs:
            from . import dataset

            if dataset.WORKER_START_METHOD:
                kwargs["multiprocessing_context"] = worker_context(dataset.WORKER_START_METHOD)
        opts = self.datasets[0].items.options
        float_keys: tuple[str, ...] = ()
        if (
            num_workers > 0
            and opts.image_dtype == "float32"
            and opts.image_transforms is None
            and not kwargs.get("pin_memory", False)
        ):
            float_keys = self.camera_keys
        return BatchLoader(
            _MixBatches(self, "uint8" if float_keys else None),
            float_keys=float_keys,
            num_workers=num_workers,
            **kwargs,
        )

    def tracker(self) -> MixTracker:
        """A :class:`MixTracker` for batches of this mix."""
        return MixTracker(self)

    def epochs_started(self, state: Mapping[str, Any] | MixState, num_workers: int) -> int:
        """Mix epochs the interrupted run finished ("stop"; 0 with "cycle").

        Prefer ``for epoch in loader.epochs(n)`` (:meth:`next_epoch` counts for you)."""
        if self.infinite:
            return 0
        st = MixState.from_dict(state)
        last = max(e for _, _, e, _ in st.mix)
        done = self._state_level(st).epoch_end(last)
        return last + 1 if all(e == last and j >= done for _, _, e, j in st.mix) else last

    def __repr__(self) -> str:
        return (
            f"MixedDataset(sources={len(self.sources)}, weights={self.weights}, "
            f"period={self.period}, exhausted={self.exhausted!r}, batch_size={self.batch_size}, "
            f"seed={self.seed}, rank={self.rank}/{self.world_size})"
        )


@dataclass(eq=False)
class _Level:
    """The mix arithmetic of one run: its topology, batch size, and per source the layout of
    its streams (:class:`~robo_resume.index.elastic.Layout`: a remainder epoch after an
    elastic resume) and the epoch its streams started the run in (``starts``; a source has
    nothing in earlier epochs). Pure: no I/O."""

    mix: MixedDataset
    topology: Topology
    batch_size: int
    layouts: tuple[Layout, ...]
    starts: tuple[int, ...]
    _ends: dict[int, int | None] = field(default_factory=dict)

    def length(self, i: int, epoch: int, g: int) -> int:
        """Frames source ``i``'s stream ``g`` has in ``epoch``."""
        return 0 if epoch < self.starts[i] else self.layouts[i].length(epoch, g)

    def epoch_end(self, epoch: int) -> int | None:
        """``J`` of ``epoch`` ("stop"): the smallest mix position, over every stream of every
        rank, at which a source would need a batch past its stream-epoch. None with "cycle"."""
        mix = self.mix
        if mix.infinite:
            return None
        if epoch not in self._ends:
            best = None
            for g in range(self.topology.num_streams):
                for i, c in enumerate(mix.counts.tolist()):
                    if c == 0:
                        continue
                    n = -(-self.length(i, epoch, g) // self.batch_size)
                    r, k = divmod(n, c)
                    first = np.flatnonzero(mix.round_sources(epoch, g, r) == i)[k]
                    at = r * mix.period + int(first)
                    best = at if best is None else min(best, at)
            self._ends[epoch] = best
        return self._ends[epoch]

    def positions(
        self, state: MixState, *, ranks: Sequence[int] | None
    ) -> tuple[dict[int, tuple[int, int]], int | None]:
        """Stream id -> ``(epoch, j)`` of ``state`` (of ``ranks``; None: every rank it has), and
        the epoch to start when every stream has finished its mix epoch ("stop"), else None.

        "stop": a stream that finished epoch ``e - 1`` before its first batch of ``e`` stands
        at ``(e, 0)``; streams in other epochs are refused.
        """
        topo, wp = self.topology, self.topology.workers_per_rank
        have = {
            topo.stream_id(r, role): (e, j)
            for r, role, e, j in state.mix
            if ranks is None or r in ranks
        }
        for r in ranks or ():
            roles = sorted(g - r * wp for g in have if g // wp == r)
            if roles != list(range(wp)):
                raise ResumeStateError(
                    describe(
                        "The mix state lacks positions of this rank's streams",
                        expected=f"roles 0..{wp - 1} of rank {r}",
                        found=roles,
                        fix="save the state with MixTracker.state_dict() (it gathers all ranks)",
                    )
                )
        if self.mix.infinite or not have:
            return have, None
        last = max(e for e, _ in have.values())
        for g, (e, j) in have.items():
            if e == last - 1 and j >= self.epoch_end(e):
                have[g] = (last, 0)
            elif e != last:
                raise ResumeStateError(
                    describe(
                        "Mix streams stand in different epochs",
                        expected=f"every stream in epoch {last} (or at the end of {last - 1})",
                        found=sorted(have.items()),
                        fix="pass the unmodified dict from MixTracker.state_dict()",
                    )
                )
        if all(j >= self.epoch_end(last) for _, j in have.values()):
            return {g: (last + 1, 0) for g in have}, last + 1
        return have, None

    def source_positions(
        self, epoch: int, g: int, j: int, recorded: Sequence[Any], *, role: int
    ) -> list[tuple[int, int]]:
        """Where each source's stream ``g`` stands after ``j`` batches of mix ``epoch``, checked
        against ``recorded`` (each source's cursor of that stream, or None).

        Source ``i`` gave the stream ``counts_before(epoch, g, j)[i]`` batches of
        ``batch_size`` frames since its start ("cycle": from ``(starts[i], 0)``, whatever the
        source's epochs; "stop": from ``(epoch, 0)``, a short last batch at the stream-epoch's
        end). A recorded cursor that disagrees is refused.
        """
        counts = self.mix.counts_before(epoch, g, j)
        out = []
        for i, c in enumerate(recorded):
            want = int(counts[i]) * self.batch_size
            lay = self.layouts[i]
            if self.mix.infinite:
                s = self.starts[i]
                if c is None:
                    ok, pos = want == 0, (s, 0)
                else:
                    pos = (c.epoch, c.position)
                    ok = (c.epoch, c.position) >= (s, 0) and lay.frames_done(
                        c.epoch, g, c.position
                    ) - lay.frames_done(s, g, 0) == want
            elif want == 0:
                ok, pos = c is None or (c.epoch, c.position) <= (epoch, 0), (epoch, 0)
            else:
                pos = (epoch, min(want, self.length(i, epoch, g)))
                ok = c is not None and (c.epoch, c.position) == pos
            if not ok:
                raise ResumeStateError(
                    describe(
                        f"Source {i}'s cursor does not match the mix position",
                        expected=f"role {role}: {want} frames of source {i} consumed at mix "
                        f"position (epoch {epoch}, batch {j})",
                        found=None if c is None else f"epoch {c.epoch}, position {c.position}",
                        fix="pass the unmodified state from MixTracker.state_dict()",
                    )
                )
            out.append(pos)
        return out

    def step_start(self, rank: int, batches: int):
        """:meth:`MixedDataset.start_point` after ``batches`` batches of this rank's loader
        (``resume_step // batch_size``), counted from the start of the run: the DataLoader's
        round-robin per mix epoch ("stop": each epoch yields ``J * W`` batches; found by
        summing the epochs, so the cost grows with the epoch, not with the batch)."""
        mix, topo = self.mix, self.topology
        wp = topo.workers_per_rank
        epoch, rem = 0, batches
        while not mix.infinite:
            per = int(self.epoch_end(epoch)) * wp
            if per == 0:
                raise ResumeStateError(
                    describe(
                        "resume_step cannot be placed: a mix epoch of this topology is empty",
                        found=f"epoch {epoch} yields no batch",
                        fix="resume from MixTracker.state_dict() instead",
                    )
                )
            if rem < per:
                break
            rem, epoch = rem - per, epoch + 1
        starts = []
        for role in range(wp):
            j = worker_batches_done(rem, topo.num_workers, role)
            g = topo.stream_id(rank, role)
            counts = mix.counts_before(epoch, g, j)
            pos = []
            for i, c in enumerate(counts.tolist()):
                f = c * self.batch_size
                if mix.infinite:
                    pos.append(divmod(f, self.layouts[i].length(0, g)))
                else:
                    pos.append((epoch, min(f, self.length(i, epoch, g))))
            starts.append((epoch, j, pos))
        return rem % wp, starts, batches


class _MixBatches(IterableDataset):
    def __init__(self, mix: MixedDataset, image_dtype: str | None) -> None:
        super().__init__()
        self.mix = mix
        self.image_dtype = image_dtype

    def __iter__(self):
        return self.mix.iter_batches(image_dtype=self.image_dtype)


class MixTracker:
    """Records, in the main process, what the training loop consumed from a mix.

    One :class:`~robo_resume.tracker.CursorTracker` per source records that source's frame
    cursors, checks its batches and keeps its skip records (``on_error="skip"``); this class
    adds each role's mix position. :meth:`consume` returns the batch without the cursor keys;
    :meth:`state_dict` is the JSON-safe :class:`MixState` to put into the checkpoint (a
    collective under DDP: every rank must call it).
    """

    def __init__(self, mix: MixedDataset) -> None:
        self.mix = mix
        self.num_workers: int | None = None
        self.positions: dict[int, tuple[int, int]] = {}
        self.trackers = [CursorTracker(ds) for ds in mix.datasets]
        self.batches = 0
        self.last_source: int | None = None

    def _init(self, num_workers: int) -> None:
        _, starts, batches = self.mix.start_point(num_workers)
        self.num_workers = num_workers
        self.positions = {r: (e, j) for r, (e, j, _) in enumerate(starts)}
        prev = None if self.mix._elastic(num_workers) else self.mix.resume_state
        for i, t in enumerate(self.trackers):
            cursors = {r: tuple(s[2][i]) for r, s in enumerate(starts)}
            t.start(num_workers, cursors, prev.sources[i].batches if prev else 0)
        self.batches = batches

    def update(self, batch: Mapping[str, Any]) -> None:
        """Record a batch the training loop consumed."""
        m = batch.get(MIX_KEY) if isinstance(batch, Mapping) else None
        if not isinstance(m, torch.Tensor) or m.shape != (6,):
            raise ValueError(
                describe(
                    "The batch carries no mix cursor",
                    expected=f"batch['{MIX_KEY}'] of shape (6,) and batch['{CURSOR_KEY}']",
                    found=None if m is None else getattr(m, "shape", type(m).__name__),
                    fix="pass batches of MixedDataset.dataloader() unchanged to consume()",
                )
            )
        rank, role, num_workers, epoch, j, i = (int(x) for x in m)
        if rank != self.mix.rank:
            raise ValueError(
                describe("A batch from another rank", expected=self.mix.rank, found=rank)
            )
        if self.num_workers is None:
            self._init(num_workers)
        elif num_workers != self.num_workers:
            raise ValueError(
                describe(
                    "Batches from DataLoaders with different num_workers reached one tracker",
                    expected=f"num_workers={self.num_workers}",
                    found=f"num_workers={num_workers}",
                    fix="use one tracker per DataLoader configuration",
                )
            )
        self.trackers[i].update(batch)  # the source's cursor, batch checks and skip records
        self.positions[role] = (epoch, j)
        self.batches += 1
        self.last_source = i

    def consume(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`update`, then the batch without the cursor keys and skip records.

        With ``on_error="skip"`` a batch can hold fewer frames than ``batch_size``, even
        none: skip such a batch in the training step.
        """
        self.update(batch)
        return {k: v for k, v in batch.items() if k not in (MIX_KEY, CURSOR_KEY, SKIPPED_KEY)}

    @property
    def skipped(self) -> tuple[dict[str, Any], ...]:
        """Chunks skipped with ``on_error="skip"`` (see ``CursorTracker.skipped``), each record
        with the ``source`` it belongs to; saved per source in :meth:`state_dict`."""
        return tuple({"source": i, **r} for i, t in enumerate(self.trackers) for r in t.skipped)

    def skip_report(self) -> str:
        """A human-readable summary of :attr:`skipped`, per source."""
        if not any(t.skipped for t in self.trackers):
            return "robo_resume: no chunk skipped"
        return "\n".join(
            f"source {i} ({self.mix._name(i)}): {t.skip_report()}"
            for i, t in enumerate(self.trackers)
            if t.skipped
        )

    def state(self, *, gather: bool = True) -> MixState:
        """The :class:`MixState` (all ranks' positions when DDP is initialised and gather)."""
        if self.num_workers is None:
            raise ResumeStateError(
                describe(
                    "The mix tracker has not seen a batch yet",
                    expected="at least one consume(batch) before state_dict()",
                    found="no batch",
                )
            )
        mix, rank = self.mix, self.mix.rank
        local = MixState(
            fingerprint=mix.fingerprint,
            world_size=mix.world_size,
            num_workers=self.num_workers,
            batches=self.batches,
            mix=tuple((rank, r, e, j) for r, (e, j) in sorted(self.positions.items())),
            sources=tuple(t.state(gather=False, settle=False) for t in self.trackers),
            source_starts=mix.level(self.num_workers).starts,
        )
        if gather and mix.world_size > 1:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                parts: list[Any] = [None] * dist.get_world_size()
                dist.all_gather_object(parts, local.to_dict())
                states = [MixState.from_dict(p) for p in parts]
                return dataclasses.replace(
                    local,
                    batches=max(s.batches for s in states),
                    mix=tuple(sorted(m for s in states for m in s.mix)),
                    sources=tuple(
                        _merge([s.sources[i] for s in states]) for i in range(len(mix.datasets))
                    ),
                )
        return local

    def state_dict(self, *, gather: bool = True) -> dict[str, Any]:
        """JSON-safe mix state (see :meth:`state`)."""
        return self.state(gather=gather).to_dict()


def _merge(states: list[ResumeState]) -> ResumeState:
    out = states[0]
    for s in states[1:]:
        out = out.merged(s)
    return out
