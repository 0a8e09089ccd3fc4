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
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..dataset import ChunkedEpisodeDataset
from ..errors import DatasetFormatError, ResumeStateError, describe
from ..format.file_access import LOCAL
from ..index.schedule import Topology
from ..index.start import StartPoint
from ..keys import CURSOR_KEY
from ..state.fingerprint import value_hash
from ..state.mix import MixState
from ..state.resume import StreamCursor
from ..stream.epochs import EpochTable
from ..stream.front import batch_loader
from ..stream.loader import BatchLoader
from ..stream.startup import resolve_rank
from ..stream.tuning import StreamTuning
from .checks import SourceChecks, source_delta
from .levels import MixLevel
from .order import MixOrder
from .resume import MixPositions
from .source import (
    EXHAUSTED,
    MAX_PERIOD,
    MIX_KEY,
    SOURCE_SPAWN_KEY,
    VISUAL,
    MixSource,
    default_period,
    round_counts,
)
from .tracker import MixTracker

if TYPE_CHECKING:  # torchdata is optional (the stateful loader imports it when asked for)
    from ..stream.stateful import StatefulBatchLoader


class MixedDataset(IterableDataset):
    """Several LeRobot datasets (v3.0 and v2.1 may be mixed) interleaved by weight.

    Args:
        sources: the :class:`MixSource` s (their order is part of the state).
        batch_size: as in :class:`ChunkedEpisodeDataset` (the mix's batches; each batch comes
            from one source).
        seed: the mix seed; each source's seed derives from it (:meth:`source_seed`).
        exhausted: "cycle" (a source that runs out starts its next epoch; the mix is endless)
            or "stop" (each ``iter()`` is one mix epoch, ended by the first source to run out).
        period: batches per mixing round (see the module docstring); None: ``sum/gcd`` of
            integral weights, else 100.
        resume_step: ``batches * batch_size`` this rank consumed since the run started, with
            the same topology and batch size (arithmetic start; see the module docstring).
        resume_state: a :meth:`MixTracker.state_dict` (it may come from another topology or
            batch size: elastic resume).
        resume_strict: as for one dataset (:class:`ChunkedEpisodeDataset`).
        chunk_frames: the default for every source; None: the order's default, see
            :meth:`StreamTuning.chunk_frames`.
        delta_timestamps: in the mix's feature names.
        image_transforms: as in :class:`ChunkedEpisodeDataset`.
        image_dtype: as in :class:`ChunkedEpisodeDataset`.
        drop_last: as in :class:`ChunkedEpisodeDataset`.
        rank: as in :class:`ChunkedEpisodeDataset`.
        world_size: as in :class:`ChunkedEpisodeDataset`.
        tuning: the default :class:`StreamTuning` for every source without its own.
        on_error: "raise" or "skip", passed to every source (see the module docstring).

    Also speaks torchdata's StatefulDataLoader protocol (:meth:`state_dict` /
    :meth:`load_state_dict`, with ``batch_size=None``: the mix yields whole batches).

    Raises:
        ValueError: ``sources`` is empty or not all MixSource, an unknown ``exhausted``, a
            ``period`` outside 1..1000, or a source with ``StreamTuning(tail="keep")``.
        DatasetFormatError: the sources' features differ from source 0's (every mismatch in
            one error).
        ResumeStateError: ``resume_state`` is invalid or made for another mix.
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
        self.order = MixOrder(seed, self.counts, period, infinite=self.infinite)
        self.rank, self.world_size = resolve_rank(rank, world_size)
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
                    delta_timestamps=source_delta(src, delta_timestamps),
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
        self.checks = SourceChecks(sources, self.datasets)
        self.renames, self.features = self.checks.renames, self.checks.features
        problems = self.checks.problems()
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
        self.camera_keys = tuple(k for k, v in self.features.items() if v["dtype"] in VISUAL)
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
        self.epochs = EpochTable()  # which mix epoch each worker's next iteration plays
        self.on_error = on_error
        self.positions = MixPositions(
            self.order,
            self.datasets,
            batch_size=batch_size,
            rank=self.rank,
            world_size=self.world_size,
            on_error=on_error,
        )
        self.resume_step = self.positions.check_resume_step(resume_step, resume_state)
        if resume_state is not None:
            state = MixState.from_dict(resume_state)
            state.check(self)
            self.positions.install(state, resume_strict)
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
        """The seed of source ``i``'s dataset, derived from the mix seed (SeedSequence).

        Args:
            i: the source's index in ``sources``.

        Returns:
            The seed, a uint32 value.
        """
        ss = np.random.SeedSequence(entropy=self.seed, spawn_key=(SOURCE_SPAWN_KEY, i))
        return int(ss.generate_state(1, dtype=np.uint32)[0])

    # -- the mix order and positions (robo_resume.mix.order, robo_resume.mix.resume) ----------
    @property
    def resume_state(self) -> MixState | None:
        """The mix state this mix resumes from (None: ``resume_step`` or none)."""
        return self.positions.resume_state

    def round_sources(self, epoch: int, stream: int, round_index: int) -> np.ndarray:
        """Sources of the ``period`` batches of a round of a mix stream (a pure function).

        Args:
            epoch: the mix epoch (0 with "cycle").
            stream: the mix stream (its global id over ranks and workers).
            round_index: the round (batches ``round_index * period`` onwards).

        Returns:
            An int array of ``period`` source indices.
        """
        return self.order.round_sources(epoch, stream, round_index)

    def source_at(self, epoch: int, stream: int, j: int) -> int:
        """The source of one batch of a mix stream.

        Args:
            epoch: the mix epoch (0 with "cycle").
            stream: the mix stream (its global id over ranks and workers).
            j: the batch of ``stream`` in ``epoch``.

        Returns:
            The source index of batch ``j``.
        """
        return self.order.source_at(epoch, stream, j)

    def counts_before(self, epoch: int, stream: int, j: int) -> np.ndarray:
        """Batches each source gave mix stream ``stream`` before its batch ``j`` (prefix sums).

        Args:
            epoch: the mix epoch (0 with "cycle").
            stream: the mix stream (its global id over ranks and workers).
            j: the batch of ``stream`` in ``epoch``.

        Returns:
            An int array, one count per source.
        """
        return self.order.counts_before(epoch, stream, j)

    def level(self, num_workers: int) -> MixLevel:
        """This run's mix arithmetic with ``num_workers`` workers.

        Args:
            num_workers: the DataLoader's workers (0: the main process).

        Returns:
            The :class:`~robo_resume.mix.levels.MixLevel`.
        """
        return self.positions.level(num_workers)

    def start_point(self, num_workers: int) -> StartPoint:
        """Where this rank's mix streams and their sources' streams start.

        New worker ``w`` plays role ``(w + rotation) % W`` in the first iteration. From the
        resume state (same topology: each role goes on where it stood; another topology or
        batch size: every role starts the *remainder mix epoch* at ``j = 0``, see the module
        docstring), from ``resume_step`` (arithmetic), or from the start.

        Args:
            num_workers: the DataLoader's workers (0: the main process).

        Returns:
            A :class:`~robo_resume.index.start.StartPoint` ``(rotation, [(epoch, j, [(epoch,
            position)] per source)] per role, batches)``.
        """
        return self.positions.start_point(num_workers)

    def epoch_batches(self, epoch: int, num_workers: int) -> int | None:
        """``J``: batches every mix stream yields in a mix epoch.

        Args:
            epoch: the mix epoch.
            num_workers: the DataLoader's workers (0: the main process).

        Returns:
            ``J`` with "stop"; None with "cycle".
        """
        return self.positions.epoch_batches(epoch, num_workers)

    def batches_per_epoch(self, num_workers: int) -> int | None:
        """Batches this rank's DataLoader yields in mix epoch 0.

        Args:
            num_workers: the DataLoader's workers (0: the main process).

        Returns:
            The batch count with "stop"; None with "cycle".
        """
        return self.positions.batches_per_epoch(num_workers)

    def batches_next_iteration(self, num_workers: int) -> int:
        """Batches the next iteration of this rank's DataLoader yields (``len(loader)``).

        ``exhausted="stop"``: the first iteration runs from :meth:`start_point` (after a
        resume, what is left of the interrupted mix epoch) to the epoch's end ``J`` of every
        role; later ones are whole mix epochs.

        Args:
            num_workers: the DataLoader's workers (0: the main process).

        Returns:
            The batch count.

        Raises:
            TypeError: with "cycle" (no end).
        """
        return self.positions.batches_next_iteration(num_workers, self.epochs)

    def next_epoch(self, num_workers: int) -> int:
        """The mix epoch the next iteration of this rank's loader plays ("stop" only).

        As :meth:`ChunkedEpisodeDataset.next_epoch`: the resume point's epoch (the next one
        when the checkpoint was taken at an epoch's end), then one more per iteration; what
        :meth:`~robo_resume.stream.loader.BatchLoader.epochs` counts with.

        Args:
            num_workers: the DataLoader's workers (0: the main process).

        Returns:
            The mix epoch number.

        Raises:
            TypeError: with "cycle".
        """
        return self.positions.next_epoch(num_workers, self.epochs)

    def share_schedule(self, num_workers: int) -> None:
        """Compute each source's layout of the epoch the next iteration starts in, here.

        Before the DataLoader's workers start (as
        :meth:`~robo_resume.dataset.ChunkedEpisodeDataset.share_schedule` does for one
        dataset). What :class:`~robo_resume.stream.loader.BatchLoader` calls.

        Args:
            num_workers: the DataLoader's workers (0: the main process).
        """
        self.positions.share_schedule(num_workers, self.epochs)

    def epochs_started(self, state: Mapping[str, Any] | MixState, num_workers: int) -> int:
        """Mix epochs the interrupted run finished.

        Prefer ``for epoch in loader.epochs(n)`` (:meth:`next_epoch` counts for you).

        Args:
            state: the interrupted run's mix state.
            num_workers: the DataLoader's workers (0: the main process).

        Returns:
            The epoch count with "stop"; 0 with "cycle".
        """
        return self.positions.epochs_started(state, num_workers)

    def source_name(self, i: int) -> str:
        """How messages name source ``i``.

        Args:
            i: the source's index.

        Returns:
            Its index and repo id or folder, e.g. ``source 1 (data/b)``.
        """
        return self.checks.name(i)

    def resume_label(self, i: int) -> str:
        """What ends source ``i``'s ``resume:`` lines.

        Args:
            i: the source's index.

        Returns:
            The suffix, e.g. `` source=1 (data/b)``.
        """
        return " " + self.source_name(i).replace("source ", "source=", 1)

    # -- StatefulDataLoader protocol -------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This worker's mix stream (what it has yielded), for torchdata's StatefulDataLoader.

        Returns:
            A JSON-safe dict: ``rank, role, num_workers, epoch, j`` and each source stream's
            ``(epoch, position)``.
        """
        live = dict(self._live)
        live["sources"] = [list(p) for p in live["sources"]]
        return live

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict` in the next ``iter()`` (StatefulDataLoader hook).

        The position is checked against the mix arithmetic (each source stream's position must
        be what ``j`` batches of the mix order leave it at), so a state of another mix,
        topology or batch size is refused instead of replaying or losing frames; an elastic
        resume needs :class:`MixTracker`'s state.

        Args:
            state: a :meth:`state_dict` value.

        Raises:
            ResumeStateError: the state lacks keys, is of another rank, or does not fit this
                mix, topology or batch size.
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
        lv = self.positions.level(nw)
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

    # -- streaming -------------------------------------------------------------------------------
    def __iter__(self):
        return self.iter_batches()

    def iter_batches(self, *, image_dtype: str | None = None):
        """This worker's mix stream as whole batches (what :meth:`dataloader` uses).

        Args:
            image_dtype: the camera tensors' dtype, "float32" or "uint8"; None: the mix's
                ``image_dtype``.

        Returns:
            An iterator of batch dicts, each from one source, with ``MIX_KEY`` and
            ``CURSOR_KEY``.

        Raises:
            RuntimeError: a second ``iter()`` of a cycling mix (one endless iteration).
        """
        info = get_worker_info()
        num_workers = info.num_workers if info is not None else 0
        worker = info.id if info is not None else 0
        wp = max(num_workers, 1)
        row = self.epochs.worker(worker)
        resumed = False
        if self._loaded is not None:  # StatefulDataLoader: this worker's saved mix stream
            st, self._loaded = self._loaded, None
            role, epoch, j = st["role"], st["epoch"], st["j"]
            positions = [tuple(p) for p in st["sources"]]
            resumed = True
        elif not row.started:
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
            role, epoch, j = worker, row.next_epoch, 0
            positions = [(epoch, 0)] * len(self.sources)
        row.playing(epoch)
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
                    resume_label=self.resume_label(i),
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
    def dataloader(
        self, *, num_workers: int = 0, **kwargs: Any
    ) -> BatchLoader | StatefulBatchLoader:
        """A DataLoader of this mix's batches (as :meth:`ChunkedEpisodeDataset.dataloader`).

        Args:
            num_workers: DataLoader worker processes (0: load in the main process).
            **kwargs: other DataLoader arguments (``pin_memory``, ``multiprocessing_context``,
                ...).

        Returns:
            The DataLoader.

        Raises:
            ValueError: ``kwargs`` sets ``batch_size``, ``drop_last``, ``shuffle``,
                ``sampler``, ``batch_sampler`` or ``collate_fn`` (the mix sets them).
        """
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
            start_method=dataset.WORKER_START_METHOD
            or ("forkserver" if any(d.meta.files is not LOCAL for d in self.datasets) else None),
            **kwargs,
        )

    def tracker(self) -> MixTracker:
        """A tracker for batches of this mix.

        Returns:
            A new :class:`MixTracker`.
        """
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
