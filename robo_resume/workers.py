"""DataLoader worker start: checks before workers start, and what a dead worker's error says.

Workers start with the method the user picks (``multiprocessing_context=``; torch's default,
``fork`` on Linux, when none is given). robo_resume never switches it: forking after this
process decoded video is safe (see ``robo_resume.format.video``, which detaches inherited
decoders in the child).

``spawn`` and ``forkserver`` workers are fresh processes: they receive the dataset, transforms
and functions by pickle and import the script's main module again. Three ways that fails are
found here before any worker starts (:func:`check_worker_start`), each named with its fix:

1. an object that does not pickle (a lambda, a function defined inside a function);
2. an object pickled by reference to a module a fresh interpreter cannot import: the
   ``__main__`` of a notebook, of ``python -`` or ``python -c`` (no file), or a module made at
   run time;
3. a script that starts workers from module-level code outside ``if __name__ == "__main__":``
   (every worker would run the script again, and fail).

What cannot be seen before (a module that a fresh interpreter fails to import) makes the
worker exit with code 1: :func:`worker_death_hint` says so, and gives the out-of-memory hint only
for a worker killed by a signal.
"""

from __future__ import annotations

import ast
import io
import multiprocessing
import os
import pickle
import re
import signal
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import WorkerStartError, describe

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

__all__ = [
    "WORKER_DIED_HINT",
    "WORKER_EXITED_HINT",
    "WORKER_START_FAILED_HINT",
    "check_worker_start",
    "start_method",
    "worker_death_hint",
]

_RESUME = (
    "The resume state is intact: the tracker only records batches the training loop consumed. "
    "Restart and resume from your last checkpoint with "
    "ChunkedEpisodeDataset(..., resume_state=checkpoint['data']); batches consumed after that "
    "checkpoint are redone, like the model's steps."
)

WORKER_DIED_HINT = (
    "robo_resume: a DataLoader worker died (killed by the OS, e.g. out of memory, or by a "
    f"signal). {_RESUME} If memory ran out, lower num_workers, "
    "StreamTuning(interleave=..., block_frames=...) or prefetch_factor."
)
"""Appended to torch's dead-worker RuntimeError when a worker was killed by a signal (negative
exit code). torch's SIGCHLD handler (forked workers) can also raise its error outside the
iterator, e.g. during the training step; that one arrives without the hint."""

WORKER_START_FAILED_HINT = (
    "robo_resume: a DataLoader worker exited with code {code} while starting, it was not "
    "killed: a {method!r} worker imports your main module and the modules of the dataset, "
    "transforms and functions again and unpickles them, and that failed. Its traceback is "
    "printed above this one: an ImportError or ModuleNotFoundError there names a module this "
    "process has but a fresh interpreter cannot import (deleted or moved since, or only "
    "importable here); make it importable (install it, or add its folder to PYTHONPATH), or "
    f"start the workers with multiprocessing_context='fork' (Linux). {_RESUME}"
)
"""The hint for a ``spawn`` or ``forkserver`` worker that exited with a code > 0 (the checks of
:func:`check_worker_start` passed, so the failure was in the worker's imports)."""

WORKER_EXITED_HINT = (
    "robo_resume: a DataLoader worker exited by itself with code {code}, it was not killed: "
    "code that runs in the worker (a transform, collate_fn or worker_init_fn) called sys.exit "
    f"or os._exit; its output is above this one. {_RESUME}"
)
"""The hint for a forked worker that exited with a code > 0 (an exception would have reached
the main process as torch's "Caught ... in DataLoader worker process" error instead)."""


def start_method(loader: DataLoader) -> str:
    """The start method ``loader``'s workers use: its context's, else this process's default."""
    ctx = getattr(loader, "multiprocessing_context", None)
    if ctx is not None:
        return ctx.get_start_method()
    return multiprocessing.get_start_method()


def remote_url(loader: DataLoader) -> str | None:
    """The URL of the remote dataset behind ``loader`` (or of a mix's remote source), else None."""
    seen, todo = 0, [getattr(loader, "dataset", None)]  # the loader's source wraps the dataset
    while todo and seen < 64:
        d = todo.pop()
        seen += 1
        url = getattr(getattr(getattr(d, "meta", None), "files", None), "shown", None)
        if isinstance(url, str):
            return url
        inner = getattr(d, "dataset", None)
        todo += [inner] if inner is not None else []
        todo += list(getattr(d, "datasets", ()) or ())
    return None


def check_worker_start(loader: DataLoader) -> None:
    """Raise :class:`WorkerStartError` if ``loader``'s workers cannot start; see the module doc.

    Call it before the workers start. Nothing is checked under ``fork`` (the worker is a copy
    of this process) or without workers. The objects checked are the ``image_transforms`` of
    each dataset behind the loader, ``collate_fn``, ``worker_init_fn`` and the dataset.
    """
    if getattr(loader, "num_workers", 0) <= 0:
        return
    method = start_method(loader)
    remote = remote_url(loader)
    if method == "fork" and remote is not None:
        raise WorkerStartError(
            describe(
                "The DataLoader workers of a remote dataset cannot be forked: the network "
                "client of its store (obstore's runtime) does not survive a fork, and forked "
                "workers would hang on their first read",
                expected="multiprocessing_context='forkserver' or 'spawn' (a remote dataset's "
                "dataloader() uses robo_resume.worker_context(), a forkserver, by default)",
                found="multiprocessing_context='fork'",
                file=remote,
                fix="drop multiprocessing_context=, or pass "
                "multiprocessing_context=robo_resume.worker_context()",
            )
        )
    if method == "fork":
        return
    where = _unguarded_start()
    if where is not None:
        raise WorkerStartError(
            describe(
                f"DataLoader workers start with {method!r}, and every such worker imports the "
                "main script again: this script starts them from module-level code without a "
                "main guard, so each worker would run the script (and start workers) itself",
                expected='the code that starts workers under `if __name__ == "__main__":`',
                found=f"workers started at line {where[1]}, outside such a guard",
                file=where[0],
                fix="put the training code in a function called under `if __name__ == "
                '"__main__":`'
                + (
                    ""
                    if remote is not None  # a remote dataset's workers cannot be forked
                    else ', or start the workers with multiprocessing_context="fork" (Linux)'
                ),
            )
        )
    for name, obj in _candidates(loader):
        try:
            modules = _pickled_modules(obj)
        except Exception as exc:
            raise WorkerStartError(
                describe(
                    f"DataLoader workers start with {method!r}, which sends {name} to every "
                    "worker by pickle, and it does not pickle",
                    expected="a module-level function or an object of a module-level class",
                    found=f"{name} = {obj!r} ({type(exc).__name__}: {exc})",
                    fix="define it at module level (not a lambda or a function inside a "
                    "function), or start the workers with multiprocessing_context='fork' "
                    "(Linux)",
                )
            ) from exc
        for module in sorted(modules):
            why = _not_importable(module)
            if why:
                raise WorkerStartError(
                    describe(
                        f"DataLoader workers start with {method!r}: each worker imports the "
                        f"modules of {name} again, and a fresh interpreter cannot import "
                        f"module {module!r} ({why})",
                        expected="functions and classes defined in a file Python can import",
                        found=f"{name} = {obj!r}",
                        fix="move them into a .py module next to your notebook or script and "
                        "import them from there, or start the workers with "
                        "multiprocessing_context='fork' (Linux)",
                    )
                )


def _candidates(loader: DataLoader) -> list[tuple[str, Any]]:
    ds = loader.dataset
    inner = getattr(ds, "dataset", None) or getattr(ds, "mix", None) or ds
    parts = getattr(inner, "datasets", None) or [inner]
    out: list[tuple[str, Any]] = []
    for d in parts:
        options = getattr(getattr(d, "items", None), "options", None)
        transform = getattr(options, "image_transforms", None)
        if transform is not None:
            out.append(("image_transforms", transform))
    out += [
        ("collate_fn", getattr(loader, "collate_fn", None)),
        ("worker_init_fn", getattr(loader, "worker_init_fn", None)),
        ("the dataset", ds),
    ]
    return [(name, obj) for name, obj in out if obj is not None]


class _ModulePickler(pickle.Pickler):
    """A pickler that records the modules of the classes and functions it pickles by name.

    A numpy array of numbers is pickled as an empty one of its dtype: it always pickles, and its
    bytes are not what is checked (a dataset of 10^6 episodes holds about 200 MB of them, which
    the check would copy before every spawn or forkserver start).
    """

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.modules: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is np.ndarray and not obj.dtype.hasobject:
            return np.empty, (0, obj.dtype)
        if isinstance(obj, (type, types.FunctionType)):
            module = getattr(obj, "__module__", None)
            if module:
                self.modules.add(module)
        return NotImplemented


def _pickled_modules(obj: Any) -> set[str]:
    """Pickle ``obj`` (raising what pickle raises) and return the modules it refers to."""
    p = _ModulePickler(io.BytesIO())
    p.dump(obj)
    return p.modules


def _not_importable(module: str) -> str | None:
    """Why a fresh interpreter cannot import ``module`` (None: it can)."""
    mod = sys.modules.get(module)
    if module in ("__main__", "__mp_main__"):
        if mod is None or _main_file(mod) or getattr(getattr(mod, "__spec__", None), "name", None):
            return None
        return "it is the __main__ of a notebook or of code read from stdin or -c: no file"
    if mod is not None and getattr(mod, "__spec__", None) is None:
        return "it was made at run time, it has no file"
    return None


def _main_file(main: Any) -> str | None:
    """The file a spawned worker runs as the main module again, if it is a file."""
    path = getattr(main, "__file__", None)
    return path if path and os.path.isfile(path) else None


def _unguarded_start() -> tuple[str, int] | None:
    """(file, line) where the main script's module-level code, outside a main guard, is
    starting workers; None when the script has no file, a guard holds the line, or the
    workers are started from elsewhere (a function, a notebook)."""
    main = sys.modules.get("__main__")
    if main is None or not _main_file(main):
        return None
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
            break
        frame = frame.f_back
    if frame is None:
        return None
    path, line = frame.f_code.co_filename, frame.f_lineno
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test):
            if node.lineno <= line <= (node.end_lineno or node.lineno):
                return None
    return path, line


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either side)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    if not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    values = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and values == ["__main__"]


def worker_death_hint(it: Any, method: str | None = None, message: str = "") -> str:
    """The hint for torch's dead-worker error, from the dead workers' exit codes.

    A negative code (killed by a signal) gets :data:`WORKER_DIED_HINT` (out of memory is one
    such case); codes > 0 get :data:`WORKER_START_FAILED_HINT` under ``spawn`` or
    ``forkserver`` and :data:`WORKER_EXITED_HINT` under ``fork``; no dead worker seen gets the
    resume advice alone. Without an iterator (a worker died while torch started them), the
    code is read from torch's ``message`` ("exited unexpectedly with exit code N", "killed by
    signal").
    """
    workers = getattr(it, "_workers", None) or []
    codes = [w.exitcode for w in workers if not w.is_alive() and w.exitcode is not None]
    if not codes:
        found = re.search(r"exit code (-?\d+)", message)
        if found:
            codes = [int(found.group(1))]
        elif "killed by signal" in message:
            codes = [-getattr(signal, "SIGKILL", 9)]
    killed = [c for c in codes if c < 0]
    if killed:
        try:
            name = signal.Signals(-killed[0]).name
        except ValueError:
            name = f"signal {-killed[0]}"
        return f"{WORKER_DIED_HINT} (exit code {killed[0]}: {name})"
    failed = [c for c in codes if c > 0]
    if failed:
        method = method or multiprocessing.get_start_method()
        if method == "fork":
            return WORKER_EXITED_HINT.format(code=failed[0])
        return WORKER_START_FAILED_HINT.format(code=failed[0], method=method)
    return f"robo_resume: a DataLoader worker died. {_RESUME}"
