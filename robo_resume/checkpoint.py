"""Atomic checkpoint files: a crash while saving leaves the previous checkpoint intact.

:func:`save_checkpoint` writes to a temporary file in the same folder, fsyncs it, renames it over
the target (atomic on POSIX) and fsyncs the folder. :func:`load_checkpoint` reads it back. Works
for anything ``torch.save`` accepts, e.g. ``{"model": ..., "optimizer": ..., "step": s,
"data": tracker.state_dict()}``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["load_checkpoint", "save_checkpoint"]


def save_checkpoint(obj: Any, path: str | Path) -> Path:
    """Save ``obj`` with ``torch.save`` to ``path`` atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def load_checkpoint(path: str | Path) -> Any:
    """Load a checkpoint written by :func:`save_checkpoint` (CPU tensors)."""
    return torch.load(Path(path), map_location="cpu", weights_only=False)
