"""``dataset.dataloader(stateful=True)``: torchdata's StatefulDataLoader over whole batches.

A plain ``StatefulDataLoader(dataset, batch_size=B)`` works (the dataset speaks its
``state_dict()`` / ``load_state_dict()`` protocol) and, since its items collate back into the
batch they came from (:mod:`robo_resume.items.rows`), is about as fast, but it checks late:

* checks: torchdata asserts on a state saved with another ``num_workers`` before the dataset
  sees it (a bare ``AssertionError``, e.g. "State doesn't contain key '_snapshot'"). This
  loader's :meth:`StatefulBatchLoader.load_state_dict` checks every worker's state in the main
  process first (:func:`robo_resume.state.stream_state.check_stream_state`), so another
  dataset, selection, seed or topology raises :class:`~robo_resume.errors.ResumeStateError`
  before any worker starts.

torchdata is an optional dependency: this module is imported only when asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from ..errors import ResumeStateError, describe
from ..state.resume import MAX_WORKERS
from ..state.stream_state import ELASTIC_FIX, check_stream_state
from ..workers import check_worker_start
from .blocks import RING
from .loader import LoaderIterator

__all__ = ["StatefulBatchLoader"]


class StatefulBatchLoader(StatefulDataLoader):
    """The loader :meth:`ChunkedEpisodeDataset.dataloader` returns with ``stateful=True``.

    A torchdata ``StatefulDataLoader`` with ``batch_size=None`` over the dataset's whole
    batches: ``state_dict()`` / ``load_state_dict()`` save and restore every worker's stream
    (put the state in your checkpoint instead of a :class:`~robo_resume.CursorTracker`'s).
    The state must come from the same dataset, selection, seed, batch size, ``num_workers`` and
    world size; anything else raises :class:`~robo_resume.errors.ResumeStateError` from
    :meth:`load_state_dict`.
    """

    def __init__(self, dataset: IterableDataset, *, float_keys: Sequence[str] = (), **kwargs: Any):
        self.float_keys = tuple(float_keys)
        super().__init__(dataset, batch_size=None, **kwargs)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Check ``state_dict`` against this loader's dataset and topology, then load it."""
        if state_dict:
            ds = self.dataset.dataset
            saved, states = _stream_states(state_dict)
            for state in states:  # fingerprint first, then topology: the resume_state order
                check_stream_state(
                    state,
                    ds.fingerprint,
                    rank=ds.rank,
                    world_size=ds.world_size,
                    num_workers=self.num_workers,
                )
            if saved != self.num_workers:
                raise ResumeStateError(
                    describe(
                        "The StatefulDataLoader state was saved with another topology",
                        expected=f"num_workers={self.num_workers} (this loader)",
                        found=f"num_workers={saved} (the state)",
                        fix=ELASTIC_FIX,
                    )
                )
        super().load_state_dict(state_dict)

    def __iter__(self):
        if self.num_workers > 0 and getattr(self, "_iterator", None) is None:
            check_worker_start(self)  # spawn/forkserver: what fails in a worker, named here
        ring = None
        ds = self.dataset
        # as BatchLoader: workers reuse a ring of shared-memory camera buffers, freed when the
        # batch is dropped (not with pin_memory, whose copies would never free a slot)
        if (
            self.num_workers > 0
            and not self.pin_memory
            and getattr(self, "_iterator", None) is None
        ):
            if ds.ring_flags is None or not self.persistent_workers:
                ds.ring_flags = torch.zeros((MAX_WORKERS, RING), dtype=torch.int64)
                ds.ring_flags.share_memory_()
        if ds.ring_flags is not None:
            ring = (ds.ring_flags, tuple(ds.dataset.meta.camera_keys))
        return LoaderIterator(super().__iter__(), self.float_keys, ring)


def _stream_states(state: Mapping[str, Any]) -> tuple[Any, list[Mapping[str, Any]]]:
    """``(num_workers, dataset states)`` of a StatefulDataLoader state (one per worker)."""
    if not isinstance(state, Mapping):
        raise ResumeStateError(
            describe(
                "Invalid StatefulDataLoader state",
                expected="a dict from StatefulDataLoader.state_dict()",
                found=type(state).__name__,
            )
        )
    snapshot = state.get("_snapshot")
    if isinstance(snapshot, Mapping):  # saved with workers
        saved = snapshot.get("_main_snapshot", {}).get("_num_workers")
        workers = snapshot.get("_worker_snapshots", {})
        found = [w.get("dataset_state") for w in workers.values() if isinstance(w, Mapping)]
    else:  # saved without workers
        saved, found = 0, [state.get("dataset_state")]
    return saved, [s for s in found if s is not None]
