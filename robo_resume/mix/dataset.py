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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..dataset import ChunkedEpisodeDataset
from ..errors import DatasetFormatError, describe
from ..index.schedule import Topology
from ..keys import CURSOR_KEY
from ..state.fingerprint import value_hash
from ..state.mix import MixState
from ..state.resume import MAX_WORKERS
from ..stream.front import batch_loader
from ..stream.startup import _resolve_rank
from ..stream.tuning import StreamTuning
from .checks import _SourceChecks
from .levels import _Level
from .order import _MixOrder
from .resume import _MixResume
from .source import (
    _SOURCE,
    _VISUAL,
    EXHAUSTED,
    MAX_PERIOD,
    MIX_KEY,
    MixSource,
    default_period,
    round_counts,
)
from .tracker import MixTracker


class MixedDataset(_SourceChecks, _MixOrder, _MixResume, IterableDataset):
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
        chunk_frames, tuning: defaults for every source (``chunk_frames`` None: the order's
            default, see :meth:`StreamTuning.chunk_frames`).
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
        chunk_frames: int | None = None,
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
                    replace(
                        src.source,
                        features=src.source.selection(),  # the mix renames (self.renames)
                        chunk_frames=src.chunk_frames or chunk_frames,  # None: the order's
                    ),
                    batch_size=batch_size,
                    seed=self.source_seed(i),
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
            "keys": value_hash([dict(s.keys) for s in sources]),
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

    # -- layout --------------------------------------------------------------------------------
    def source_seed(self, i: int) -> int:
        """The seed of source ``i``'s dataset, derived from the mix seed (SeedSequence)."""
        ss = np.random.SeedSequence(entropy=self.seed, spawn_key=(_SOURCE, i))
        return int(ss.generate_state(1, dtype=np.uint32)[0])

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
                    role,
                    num_workers,
                    *positions[i],
                    image_dtype=image_dtype,
                    log_resume=resumed,
                    resume_label=f" {self._name(i).replace('source ', 'source=', 1)}",
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
        from .. import dataset  # its WORKER_START_METHOD, read at call time

        return batch_loader(
            lambda float_keys: _MixBatches(self, "uint8" if float_keys else None),
            num_workers=num_workers,
            options=self.datasets[0].items.options,
            visual_keys=self.camera_keys,
            start_method=dataset.WORKER_START_METHOD,
            **kwargs,
        )

    def tracker(self) -> MixTracker:
        """A :class:`MixTracker` for batches of this mix."""
        return MixTracker(self)

    def __repr__(self) -> str:
        return (
            f"MixedDataset(sources={len(self.sources)}, weights={self.weights}, "
            f"period={self.period}, exhausted={self.exhausted!r}, batch_size={self.batch_size}, "
            f"seed={self.seed}, rank={self.rank}/{self.world_size})"
        )


class _MixBatches(IterableDataset):
    def __init__(self, mix: MixedDataset, image_dtype: str | None) -> None:
        super().__init__()
        self.mix = mix
        self.image_dtype = image_dtype

    def __iter__(self):
        return self.mix.iter_batches(image_dtype=self.image_dtype)
