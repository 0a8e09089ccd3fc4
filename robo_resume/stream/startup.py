"""Process facts: the forkserver context for DataLoader workers, and a run's rank and world size.

The worker context is a visible choice, never a silent switch.
"""

from __future__ import annotations

from ..errors import (
    describe,
)
from ..workers import WORKER_DIED_HINT as WORKER_DIED_HINT  # re-exported (tests, callers)

FORKSERVER_PRELOAD = [
    "torch",
    "robo_resume.dataset",
    "pyarrow.parquet",
    "pandas",
    "pyarrow.pandas_compat",
]
"""Modules a forkserver started by :func:`worker_context` imports once for all workers."""


def worker_context(method: str = "forkserver"):
    """A multiprocessing context for DataLoader workers, if you choose one other than fork.

    ``worker_context()`` is a forkserver whose server preloads torch, robo_resume, pyarrow and
    pandas once (each worker then starts without importing them); pass it as
    ``multiprocessing_context=`` to :meth:`ChunkedEpisodeDataset.dataloader`, a DataLoader or
    torchdata's StatefulDataLoader. Not needed for safety: fork works after this process
    decoded (see :meth:`ChunkedEpisodeDataset.dataloader`).

    Args:
        method: the start method, "forkserver" (preloading :data:`FORKSERVER_PRELOAD`),
            "spawn" or "fork".

    Returns:
        The multiprocessing context, or None where ``method`` does not exist (no forkserver
        on Windows).
    """
    import multiprocessing as mp

    if method not in mp.get_all_start_methods():
        return None  # e.g. no forkserver on Windows, where spawn is the default anyway
    if method == "forkserver":
        # what every worker imports: a worker that imports pyarrow and pandas itself (to read
        # its first parquet rows) starts later
        mp.set_forkserver_preload(FORKSERVER_PRELOAD)
    return mp.get_context(method)


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: the given values, else ``torch.distributed``'s, else ``(0, 1)``.

    Raises ValueError unless ``0 <= rank < world_size``.
    """
    if rank is None or world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
    rank = 0 if rank is None else int(rank)
    world_size = 1 if world_size is None else int(world_size)
    if not 0 <= rank < world_size:
        raise ValueError(
            describe("rank must be in [0, world_size)", found=f"rank={rank}, world={world_size}")
        )
    return rank, world_size
