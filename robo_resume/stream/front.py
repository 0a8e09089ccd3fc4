"""Which DataLoader ``dataloader()`` returns, for a dataset and for a mix alike: the start
method, images converted in the main process or not, stateful or not."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..items.options import ItemOptions
from .loader import BatchLoader
from .startup import worker_context

if TYPE_CHECKING:  # torchdata is optional: imported only for the loader that needs it
    from torch.utils.data import IterableDataset

    from .stateful import StatefulBatchLoader

__all__ = ["batch_loader"]


def batch_loader(
    batches: Callable[[tuple[str, ...]], IterableDataset],
    *,
    num_workers: int,
    options: ItemOptions,
    visual_keys: Sequence[str],
    start_method: str | None,
    stateful: bool = False,
    **kwargs: Any,
) -> BatchLoader | StatefulBatchLoader:
    """The DataLoader over whole batches that ``dataloader()`` of a dataset or a mix returns.

    ``batches`` is the IterableDataset of batches built for an ``image_dtype`` (given here as
    ``"uint8"`` when images cross to the main process as uint8 and are converted there: with
    workers, float32 images, no transform and no ``pin_memory``); ``options`` are the items'
    :class:`~robo_resume.items.ItemOptions`; ``visual_keys`` the keys holding images;
    ``start_method`` the start method used when ``kwargs`` names no
    ``multiprocessing_context`` (None: torch's default). ``stateful=True`` gives torchdata's
    StatefulDataLoader over the same batches (:class:`robo_resume.stream.stateful.
    StatefulBatchLoader`); else a :class:`BatchLoader`.
    """
    if num_workers > 0 and "multiprocessing_context" not in kwargs and start_method:
        kwargs["multiprocessing_context"] = worker_context(start_method)
    float_keys: tuple[str, ...] = ()
    if (
        num_workers > 0
        and options.image_dtype == "float32"
        and options.image_transforms is None
        and not kwargs.get("pin_memory", False)
    ):
        float_keys = tuple(visual_keys)
    if stateful:  # torchdata is optional: imported only for the loader that needs it
        from .stateful import StatefulBatchLoader

        cls: Any = StatefulBatchLoader
    else:
        cls = BatchLoader
    return cls(batches(float_keys), float_keys=float_keys, num_workers=num_workers, **kwargs)
