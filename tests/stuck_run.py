"""Run a multi-process command to its end, or fail with the stacks of the processes it left.

A hung torchrun run (its ranks in sessions of their own, their DataLoader workers forked from
them) otherwise ends as a bare pytest-timeout inside the test's wait for the output pipe, which
says nothing about which process waits where. :func:`run_or_dump` gives the command
``PYTHONFAULTHANDLER=1`` and, past ``timeout``, sends SIGABRT to every process still part of
the run: every descendant of the command and every process holding its output pipe (which is
what keeps the wait going, even after the command itself exited). ``faulthandler`` then writes
each Python process's threads to its stderr, the captured output, before it dies, after a line
``=== pid PID`` written there first. Processes are signalled one at a time, deepest first, so
that a DataLoader worker dumps before its rank dies (a worker dies with its rank,
robo_resume.stream.lifetime). The failure message holds the
process table (pid, parent, state, kernel wait channel, command) and the output's end.

Linux only (``/proc``); elsewhere the run is killed and only the output is shown.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

PROC = Path("/proc")


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process visible in /proc."""
    out = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # ended meanwhile
            out[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def _pipe_holders(inodes: set[int]) -> set[int]:
    """Processes with a descriptor on one of the pipes ``inodes``."""
    names = {f"pipe:[{i}]" for i in inodes}
    found = set()
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fds = list((entry / "fd").iterdir())
            if any(os.readlink(fd) in names for fd in fds):
                found.add(int(entry.name))
        except OSError:
            continue  # ended meanwhile, or not ours to look at
    return found


def _depths(root: int, parents: dict[int, int], pids: set[int]) -> dict[int, int]:
    """Depth below ``root`` of each of ``pids`` (a process outside its tree: 1000)."""
    out = {}
    for pid in pids:
        depth, at = 0, pid
        while at != root and at in parents and depth < 1000:
            at, depth = parents[at], depth + 1
        out[pid] = depth if at == root else 1000
    return out


def _mark(pid: int, inodes: set[int]) -> None:
    """Write ``=== pid PID`` into the process's stderr if that is one of the pipes ``inodes``
    (its stacks follow it there)."""
    fd = PROC / str(pid) / "fd" / "2"
    try:
        if os.readlink(fd) in {f"pipe:[{i}]" for i in inodes}:
            with open(fd, "w") as f:
                f.write(f"\n=== pid {pid}\n")
    except OSError:
        pass


def _row(pid: int, parents: dict[int, int]) -> str:
    try:
        state = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
        wchan = (PROC / str(pid) / "wchan").read_text().strip() or "-"
        args = (PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace")
        threads = len(list((PROC / str(pid) / "task").iterdir()))
    except OSError:
        return f"{pid:>7} (ended)"
    args = " ".join(args.replace("\0", " ").split())[:160]
    return f"{pid:>7} {parents.get(pid, 0):>7} {state} {threads:>3} {wchan:<28} {args}"


def run_or_dump(
    cmd: list[str], *, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, env=env)``, ended after
    ``timeout`` seconds with an ``AssertionError`` naming the processes left and holding
    their Python stacks (see the module)."""
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(env, PYTHONFAULTHANDLER="1"),
    )
    try:
        out, err = p.communicate(timeout=timeout)
        return subprocess.CompletedProcess(cmd, p.returncode, out, err)
    except subprocess.TimeoutExpired:
        pass
    table = ["(no /proc: processes not listed)"]
    if PROC.is_dir():
        assert p.stdout is not None and p.stderr is not None
        inodes = {os.fstat(p.stdout.fileno()).st_ino, os.fstat(p.stderr.fileno()).st_ino}
        parents = _parents()
        tree, todo = set(), [p.pid]
        while todo:
            pid = todo.pop()
            tree.add(pid)
            todo += [c for c, parent in parents.items() if parent == pid]
        pids = tree | _pipe_holders(inodes)
        table = ["    pid    ppid S thr wchan                        command"]
        table += [_row(pid, parents) for pid in sorted(pids)]
        depths = _depths(p.pid, parents, pids)
        for pid in sorted(pids, key=lambda q: -depths[q]):
            _mark(pid, inodes)
            try:
                os.kill(pid, signal.SIGABRT)
            except OSError:
                continue
            time.sleep(0.3)  # its stacks written (and a worker's, before its rank dies)
    p.kill()
    try:
        out, err = p.communicate(timeout=20)
    except subprocess.TimeoutExpired:  # a holder survived SIGABRT: no more output from it
        out, err = "", "(output not collected: a process still holds the pipe)"
    text = out + err
    raise AssertionError(
        f"{Path(cmd[0]).name} did not end within {timeout:.0f} s (exit status so far: "
        f"{p.returncode}); the processes left (SIGABRT sent to each, deepest first):\n"
        + "\n".join(table)
        + "\n--- the output's end (Python stacks from faulthandler after 'Fatal Python "
        f"error: Aborted'):\n{text[-30000:]}"
    )
