"""One live ``robo-resume train`` run per ``--output_dir``: the run lock.

The main process of a run holds a POSIX record lock (``fcntl.lockf``) on
``OUTPUT_DIR/.robo-resume-train.lock`` from before the policy is built to the end of the run.
Why this kind of lock:

1. The kernel releases it when the process ends, however it ends (SIGKILL included), so
   whether a run is alive is the kernel's answer, not a guess from a PID (which the system
   reuses). A lock file that names a run but that no process holds is *stale*: that run ended
   without releasing it (killed, or crashed before its clean-up).
2. It is not inherited by forked children. A DataLoader worker started with ``fork`` keeps a
   copy of the descriptor, but not the lock: a worker outliving a SIGKILLed trainer does not
   keep the directory locked (``flock`` and open-file-description locks are shared with such
   children; an ``O_CREAT|O_EXCL`` file outlives a SIGKILL and needs a PID check).
3. Its trap: closing *any* descriptor of the file in the holding process releases the lock.
   The holder therefore never opens the file again; it reads and writes through its own
   descriptor.

The file holds one JSON object naming the holder (``pid``, ``host``, ``started``). A run that
ends by itself (also by an exception or Ctrl-C) empties the file and releases the lock. The
file is never removed: a process that opened it before the removal would lock the unlinked
file while a third one created a new file, and both would hold "the" lock.

What a starting run finds (:meth:`RunLock.acquire`):

- **free** (lockable, empty): taken;
- **stale** (lockable, names a run on this host): taken, and :attr:`RunLock.stale` names the
  dead run for the caller's WARNING;
- **held** (not lockable): refused with :class:`~.options.TrainSetupError` naming the holder;
- **foreign** (lockable, names a run on another host): refused, because a lock taken on another
  host may not be visible here (a network filesystem without lock support), and the message
  says which file to remove if that run is known to be dead.

Only the main process (rank 0) takes the lock; the pipeline passes its verdict to the other
ranks.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import describe
from .options import TrainSetupError

LOCK_FILE = ".robo-resume-train.lock"  # in the output directory

_held: dict[Path, RunLock] = {}  # the locks this process holds, by lock file


@dataclass(frozen=True)
class Holder:
    """The run a lock file names: its main process's ``pid``, its ``host`` and start time."""

    pid: int | None
    host: str | None
    started: str | None

    def __str__(self) -> str:
        if self.pid is None:
            return "a run whose lock file is unreadable (killed while writing it)"
        return f"PID {self.pid} on host {self.host}, started {self.started}"


def lock_path(output_dir: Path) -> Path:
    """The lock file of ``output_dir``."""
    return Path(output_dir) / LOCK_FILE


def _read(fd: int) -> Holder | None:
    """The holder named by the open lock file ``fd`` (None: the file is empty)."""
    data = b""
    while chunk := os.pread(fd, 65536, len(data)):
        data += chunk
    if not data.strip():
        return None
    try:
        info = json.loads(data)
        return Holder(int(info["pid"]), str(info["host"]), str(info["started"]))
    except (ValueError, KeyError, TypeError):
        return Holder(None, None, None)


def _try_lock(fd: int) -> bool:
    """Lock ``fd`` without waiting: True if taken, False if another process holds it."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    return True


def _held_error(path: Path, holder: Holder | None) -> TrainSetupError:
    who = str(holder) if holder else "a run that has not written its details yet"
    return TrainSetupError(
        describe(
            "Another robo-resume train run is training into this --output_dir (two runs in one "
            "output directory would overwrite each other's checkpoints)",
            found=f"{who}, holding the lock {path}",
            fix="wait until that run ends (to train it further, resume it then with "
            f"--resume=true --config_path={path.parent}/checkpoints/last/pretrained_model/"
            "train_config.json), or give this run another --output_dir",
        )
    )


def _foreign_error(path: Path, holder: Holder) -> TrainSetupError:
    return TrainSetupError(
        describe(
            "This --output_dir is locked by a run on another host, which cannot be checked "
            "from here",
            expected=f"a lock of host {socket.gethostname()}, or none",
            found=f"{holder} (it did not end cleanly, or it is still training there)",
            file=path,
            fix="if that run is still training, wait for it or give this run another "
            f"--output_dir; if you know it is dead, remove the lock file (rm {path}) and run "
            "the same command again",
        )
    )


def check_free(output_dir: Path) -> None:
    """Raise :class:`~.options.TrainSetupError` if a live run (or one on another host, see
    the module) holds ``output_dir``'s lock; nothing otherwise. Takes no lock: a check made
    before lerobot's own check of the output directory, whose advice (resume it) is wrong for
    a directory that a live run is writing to."""
    path = lock_path(output_dir)
    if path in _held:
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return  # no lock file (or not ours to open): RunLock.acquire decides
    try:
        holder = _read(fd)
        if not _try_lock(fd):
            raise _held_error(path, holder)
        if holder is not None and holder.host not in (None, socket.gethostname()):
            raise _foreign_error(path, holder)
    except OSError:
        return  # a filesystem without locks: RunLock.acquire says so
    finally:
        os.close(fd)  # releases the probe's lock, if it took it


class RunLock:
    """The lock of one output directory, held by this process (see the module).

    Make one with :meth:`acquire`; :meth:`release` at the end of the run (also registered with
    ``atexit``, for runs ended by an exception). ``stale``: the dead run whose lock was taken
    over (None: the lock was free); ``supported``: False on a filesystem without locks (then
    nothing is held and two runs are not detected)."""

    def __init__(self, path: Path, fd: int | None, stale: Holder | None) -> None:
        self.path, self._fd, self.stale = path, fd, stale
        self.pid = os.getpid()
        self.supported = fd is not None

    @classmethod
    def acquire(cls, output_dir: Path) -> RunLock:
        """Take ``output_dir``'s lock (creating the folder), or raise
        :class:`~.options.TrainSetupError` naming the run that holds it (see the module)."""
        path = lock_path(output_dir)
        if path in _held:  # an earlier run of this process that ended by an exception
            _held.pop(path).release()
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise TrainSetupError(
                describe(
                    "Cannot create the run lock in the output directory",
                    found=f"{type(exc).__name__}: {exc}",
                    file=path,
                    fix="give a writable --output_dir",
                )
            ) from exc
        try:
            taken = _try_lock(fd)
        except OSError:  # ENOLCK, EOPNOTSUPP: a filesystem without POSIX locks
            os.close(fd)
            return cls(path, None, None)
        holder = _read(fd)
        if not taken:
            os.close(fd)
            raise _held_error(path, holder)
        if holder is not None and holder.host not in (None, socket.gethostname()):
            os.close(fd)
            raise _foreign_error(path, holder)
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        os.fsync(fd)
        lock = cls(path, fd, holder)
        _held[path] = lock
        atexit.register(lock.release)
        return lock

    def stale_note(self) -> str | None:
        """The WARNING for a stale lock taken over (None: the lock was free)."""
        if self.stale is None:
            return None
        return (
            f"the output directory's lock {self.path} named {self.stale}, which ended without "
            "releasing it (killed, or its machine stopped): this run takes it over"
        )

    def release(self) -> None:
        """Empty the lock file and release the lock (nothing in a forked child, nor twice)."""
        if self._fd is None or os.getpid() != self.pid:
            return
        fd, self._fd = self._fd, None
        _held.pop(self.path, None)
        try:
            os.ftruncate(fd, 0)  # a free lock: the next run takes it without a warning
            os.fsync(fd)
        finally:
            os.close(fd)  # releases the lock


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (a zombie counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
