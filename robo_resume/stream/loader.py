"""The loader of :meth:`robo_resume.dataset.ChunkedEpisodeDataset.dataloader`: a DataLoader over
whole batches, its epoch loop (:meth:`BatchLoader.epochs`), the float conversion in the main
process, ring slots freed when a batch is dropped, and worker deaths named with their cause."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import torch
from torch.utils.data import IterableDataset
from torch.utils.data._utils.collate import default_convert

from ..errors import (
    describe,
)
from ..format.metadata import DatasetMeta
from ..format.video import load_decoder_library
from ..items import to_float
from ..items.buffers import release_when_dropped
from ..items.names import renamed
from ..keys import RELEASE_KEY, SKIPPED_KEY
from ..state.resume import MAX_WORKERS
from ..state.skips import SkipLog
from ..workers import WORKER_DIED_HINT as WORKER_DIED_HINT  # re-exported (tests, callers)
from ..workers import check_worker_start, start_method, worker_death_hint
from .blocks import RING


class BatchSource(Protocol):
    """What :class:`DatasetBatches` needs of its dataset (a ChunkedEpisodeDataset, which builds
    on this module: a protocol, not an import)."""

    def iter_batches(
        self, *, image_dtype: str | None = None, ring: torch.Tensor | None = None
    ) -> Iterator[dict[str, Any]]:
        """The stream's batches (see ChunkedEpisodeDataset.iter_batches)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The stream's state (StatefulDataLoader protocol)."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a state (StatefulDataLoader protocol)."""
        ...

    @property
    def meta(self) -> DatasetMeta:
        """The dataset's metadata (its camera keys name the ring's buffers)."""
        ...

    @property
    def renames(self) -> Mapping[str, str]:
        """The dataset's feature renames (as batches name the cameras)."""
        ...


class DatasetBatches(IterableDataset):
    """The batches of a :class:`ChunkedEpisodeDataset` (a DataLoader with batch_size=None)."""

    def __init__(self, dataset: BatchSource, image_dtype: str | None = None) -> None:
        super().__init__()
        self.dataset = dataset
        self.image_dtype = image_dtype
        self.ring_flags: torch.Tensor | None = None  # set by BatchLoader when workers use a ring

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.dataset.iter_batches(image_dtype=self.image_dtype, ring=self.ring_flags)

    def state_dict(self) -> dict[str, Any]:
        """The dataset's stream state (StatefulDataLoader protocol)."""
        return self.dataset.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load the dataset's stream state (StatefulDataLoader protocol)."""
        self.dataset.load_state_dict(state)


class BatchLoader(torch.utils.data.DataLoader):
    """The DataLoader :meth:`ChunkedEpisodeDataset.dataloader` returns.

    Its dataset yields whole batches (``batch_size=None``). When ``float_keys`` is not empty,
    workers send those camera tensors as uint8 (4x fewer bytes between processes) and this
    loader's iterator converts them to float32 in [0, 1] in the main process, the same values
    as converting in the worker.
    """

    def __init__(self, dataset: IterableDataset, *, float_keys: Sequence[str] = (), **kwargs: Any):
        self.float_keys = tuple(float_keys)
        self._live_len: int | None = None  # length of the iteration under way
        self._iterations = 0  # iter() calls, for epochs()
        super().__init__(dataset, batch_size=None, **kwargs)

    def epochs(self, n: int) -> Iterator[int]:
        """The epoch numbers ``< n`` still to train, one per iteration of this loader.

        Write the loop once, for the first run and for every resume::

            for epoch in loader.epochs(n):
                for batch in loader:
                    ...

        The first epoch yielded is where the dataset's resume point stands (see
        :meth:`ChunkedEpisodeDataset.next_epoch`): after a checkpoint in the middle of epoch
        ``e``, ``e`` (its first iteration is the rest of it); at its end, ``e + 1``; after a
        resume with other workers, ranks or batch size, the remainder epoch ``e``. So the run
        ends after epoch ``n - 1`` whatever the checkpoint's topology, and nobody counts.
        Each step of the generator expects the body to iterate this loader (an epoch whose
        loop breaks early counts as done, as with ``range``); a body that never iterates it
        raises RuntimeError instead of yielding the same epoch again. Epoch mode only: an
        infinite dataset (or a mix with ``exhausted="cycle"``) raises TypeError.
        """
        source = _length_source(self.dataset)
        if source is None:
            raise TypeError(
                describe(
                    "epochs() needs a loader made by dataset.dataloader()",
                    found=f"a loader over {type(self.dataset).__name__}",
                )
            )
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(describe("epochs(n) needs an int n >= 0", found=repr(n)))
        while True:
            epoch = source.next_epoch(self.num_workers)
            if epoch >= n:
                return
            started = self._iterations
            yield epoch
            if self._iterations == started:
                raise RuntimeError(
                    describe(
                        "The body of `for epoch in loader.epochs(n)` did not iterate the loader",
                        expected="`for batch in loader:` (this loader) inside the epoch loop",
                        found=f"epoch {epoch} ended without an iteration of this loader",
                        fix="iterate the same loader that epochs() was called on, once per "
                        "epoch; each iteration is one epoch",
                    )
                )

    def __len__(self) -> int:
        """Batches of the iteration under way, else of the next one (epoch mode only).

        The first iteration is the epoch the dataset starts in, from its resume point (after a
        resume, what is left of the interrupted epoch, or the remainder epoch of an elastic
        resume); each later one is a whole epoch. Equal on every rank. An infinite dataset
        has no length: it raises TypeError (use ``dataset.batches_per_epoch(num_workers)``).
        """
        if self._live_len is not None:
            return self._live_len
        source = _length_source(self.dataset)
        if source is None:
            return super().__len__()
        return source.batches_next_iteration(self.num_workers)

    def __iter__(self):
        ds = self.dataset
        self._iterations += 1
        self._live_len = None
        source = _length_source(ds)
        length = len(self) if source is not None and not source.infinite else None
        ring = None
        # pinned batches are copies: the workers' ring slots would never be released
        if isinstance(ds, DatasetBatches) and self.num_workers > 0 and not self.pin_memory:
            # one flag table per set of workers: persistent workers keep theirs, new workers
            # (and a second live iterator) get a new one, so two never share a slot's flag
            if ds.ring_flags is None or not self.persistent_workers:
                ds.ring_flags = torch.zeros((MAX_WORKERS, RING), dtype=torch.int64)
                ds.ring_flags.share_memory_()
            cams = renamed(ds.dataset.meta.camera_keys, ds.dataset.renames)  # as batches name them
            ring = (ds.ring_flags, cams)
        if self.num_workers > 0 and _decodes_video(source):
            load_decoder_library()  # forked workers inherit the import
        if self.num_workers > 0 and hasattr(source, "share_schedule"):
            if getattr(self, "_iterator", None) is None:  # workers start now
                source.share_schedule(self.num_workers)
        if self.num_workers > 0 and getattr(self, "_iterator", None) is None:
            check_worker_start(self)  # spawn/forkserver: what fails in a worker, named here
        try:
            inner = super().__iter__()
        except RuntimeError as exc:  # a worker died while torch was still starting them
            hinted = _with_death_hint(exc, None, start_method(self))
            if hinted is not None:
                raise hinted from exc
            raise
        it = LoaderIterator(inner, self.float_keys, ring, owner=self)
        self._live_len = it._length = length
        return it


def _in_process_batches(it: Any) -> Callable[[], Any] | None:
    """For torch's single-process iterator over whole batches (0 workers, no pinning, torch's
    ``default_convert``): a function giving its next batch straight from the dataset's
    iterator, the values torch would give. Its per-batch bookkeeping (``record_function``,
    the sampler, the fetcher, and ``default_convert`` walking every value and every task
    string) are a noticeable share of the time per sample with small frames. The iterator
    itself is torch's, made as before (its seed draw from the global RNG included). None for
    any other iterator, or a torch whose iterator is not laid out so (then torch's ``next``).
    """
    fetcher = getattr(it, "_dataset_fetcher", None)
    source = getattr(fetcher, "dataset_iter", None)
    if (
        type(it).__name__ != "_SingleProcessDataLoaderIter"
        or getattr(it, "_pin_memory", True)
        or getattr(it, "_collate_fn", None) is not default_convert
        or getattr(it, "_auto_collation", True)
        or source is None
    ):
        return None

    def batch() -> Any:
        data = next(source)
        if type(data) is not dict:
            return default_convert(data)
        return {k: v if type(v) is torch.Tensor else _convert(v) for k, v in data.items()}

    return batch


def _convert(value: Any) -> Any:
    """``default_convert(value)``; a list of strings (the batch's tasks) without a call per
    string (torch's per-value ABC checks are slow)."""
    if type(value) is list and all(type(x) is str for x in value):
        return list(value)
    return default_convert(value)


def _decodes_video(source: Any) -> bool:
    """Whether the dataset (or any dataset of the mix) a loader counts with has video."""
    datasets = getattr(source, "datasets", None) or [source]
    return any(getattr(getattr(d, "meta", None), "camera_keys", ()) for d in datasets)


def _length_source(ds: Any) -> Any:
    """The dataset that counts a BatchLoader's batches (single dataset or mix), else None."""
    inner = getattr(ds, "dataset", None) or getattr(ds, "mix", None)
    return inner if hasattr(inner, "batches_next_iteration") else None


def _to_float(batch: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    for k in keys:
        if batch[k].dtype == torch.uint8:  # (depth maps come as float32 millimetres already)
            batch[k] = to_float(batch[k])  # one pass into a pooled buffer (see BufferPool)
    return batch


_WORKER_DIED = re.compile(r"DataLoader worker \(pid")


def _with_death_hint(exc: RuntimeError, it: Any, method: str | None) -> RuntimeError | None:
    """torch's dead-worker error with robo_resume's hint appended (None: another error)."""
    text = str(exc)
    if not _WORKER_DIED.search(text) or "robo_resume: a DataLoader" in text:
        return None
    return RuntimeError(f"{text}\n{worker_death_hint(it, method, text)}")


def _dead_workers(it: Any, wait_s: float = 2.0) -> list[str]:
    """Pids of the iterator's dead workers, waiting up to ``wait_s`` for one to be seen dead."""
    workers = getattr(it, "_workers", None) or []
    deadline = time.monotonic() + wait_s
    while True:
        dead = [str(w.pid) for w in workers if not w.is_alive()]
        if dead or not workers or time.monotonic() > deadline:
            return dead
        time.sleep(0.05)


def _release_when_dropped(
    batch: dict[str, Any], ticket: Sequence[int], flags: torch.Tensor, cameras: Sequence[str]
) -> None:
    """Free the worker's ring slot ``ticket`` once the batch's camera tensors are all gone
    (:func:`robo_resume.items.buffers.release_when_dropped`): the slot's flag goes back to 0
    if it still holds this batch's token."""
    idx, token = int(ticket[0]), int(ticket[1])
    flat = flags.view(-1)

    def free() -> None:
        if int(flat[idx]) == token:
            flat[idx] = 0

    keys = [k for k in cameras if isinstance(batch.get(k), torch.Tensor)]
    release_when_dropped(batch, keys, free)


class LoaderIterator:
    """:class:`BatchLoader`'s iterator: torch's, with float conversion and a hint on dead workers.

    Other attributes (``_workers``, ``__len__``, ...) are torch's iterator's.
    """

    def __init__(
        self,
        it: Any,
        float_keys: tuple[str, ...],
        ring: Any = None,
        owner: BatchLoader | None = None,
    ) -> None:
        self._it = it
        self._float_keys = float_keys
        self._ring = ring  # (flag table, camera keys) when workers reuse ring buffers
        self._owner = owner  # the BatchLoader (its len() is this iteration's until the end)
        self._length: int | None = None
        self._skips = SkipLog()
        self._next = _in_process_batches(it) or it.__next__

    def __iter__(self) -> LoaderIterator:
        return self

    def __next__(self) -> dict[str, Any]:
        try:
            batch = self._next()
        except StopIteration:
            self._skips.finish()
            if self._owner is not None and self._owner._live_len == self._length:
                self._owner._live_len = None
            raise
        except RuntimeError as exc:
            hinted = _with_death_hint(exc, self._it, self._method())
            if hinted is not None:
                raise hinted from exc
            raise
        except (EOFError, ConnectionError) as exc:
            # a worker killed while handing over a batch's shared memory: torch raises this
            # raw when it has not yet seen the worker die
            dead = _dead_workers(self._it)
            if not dead:
                raise
            raise RuntimeError(
                f"DataLoader worker (pid(s) {', '.join(dead)}) died while sending a batch "
                f"({type(exc).__name__}: {exc})\n{worker_death_hint(self._it, self._method())}"
            ) from exc
        ticket = batch.pop(RELEASE_KEY, None) if isinstance(batch, dict) else None
        if ticket is not None and self._ring is not None:
            _release_when_dropped(batch, ticket, *self._ring)
        if isinstance(batch, dict) and batch.get(SKIPPED_KEY):
            self._skips.add(batch[SKIPPED_KEY])
        return _to_float(batch, self._float_keys) if self._float_keys else batch

    def __len__(self) -> int:
        return self._length if self._length is not None else len(self._it)

    def _method(self) -> str | None:
        return start_method(self._owner) if self._owner is not None else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_it"], name)
