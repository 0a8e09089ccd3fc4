"""A pre-imported parent that forks one ``robo-resume train`` or ``lerobot-train`` run per request.

Used by tests/test_lerobot_train.py. Each run of either command spends about 8 s of CPU
importing torch, lerobot and the policy before its first step; this *zygote* imports them once
and forks every run from there, so a run costs a fork instead (as tests/fault_train.py does for
the fault-injection test). With ``--scripts`` it imports torch and robo_resume only and runs
``python SCRIPT ARGS`` requests (command ``"python"``): the examples' crash-and-resume runs in
tests/test_examples.py, test_epochs.py and test_mix.py, about 2.5 s of CPU each as a fresh
interpreter.

``python tests/train_zygote.py`` reads one JSON request per line on stdin:
``{"command": "robo-resume" | "lerobot-train" | "python", "args": [...], "env": {...},
"out": PATH}`` (optionally ``"err": PATH``).
It forks a child that becomes what ``COMMAND ARGS`` in a fresh process would be, as far as a
fork can: its own session (process group = its pid, so the test's ``os.killpg`` takes the
DataLoader workers with it), stdin from /dev/null, stdout and stderr into the file ``out`` (stderr
into ``err`` if given), ``os.environ`` replaced by ``env``, ``sys.argv`` set (for ``python``:
the script's folder first on ``sys.path``), numpy's global generator freshly seeded
(``random`` reseeds itself after a fork), and then runs the command's entry point (the one its
console script calls; for ``python`` the script as ``__main__``) at this module's top level and
ends like a console script, ``sys.exit(main())``, with Python's normal shutdown. The zygote
prints ``pid PID``, waits for the child and prints ``exit PID STATUS`` (negative: killed by that
signal). End of stdin ends it; it also dies with its parent (``PR_SET_PDEATHSIG``), so it never
outlives the test run.

What a fork does not give a run: its own hash seed (``PYTHONHASHSEED``) and memory layout. The
test starts zygotes with different ``PYTHONHASHSEED`` values for the runs it compares, and keeps
the run that must prove a fresh process resumes exactly as a real ``robo-resume train``
subprocess.

The client side is :class:`Zygote` (standard library only: importing this module from a test
imports nothing heavy).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

BIN = Path(sys.executable).parent


class Zygote:
    """One zygote process, started on the first :meth:`start` or :meth:`launch` (its imports take
    a few seconds).

    ``hash_seed`` is its (and its runs') ``PYTHONHASHSEED``; ``env`` the environment it imports
    under (each run gets its own). :meth:`close` ends it.
    """

    def __init__(
        self, hash_seed: int, env: dict[str, str], errfile: Path, *, scripts: bool = False
    ) -> None:
        self.hash_seed, self.env, self.errfile = hash_seed, env, errfile
        self.scripts = scripts  # preload for ``python SCRIPT`` runs only (see the module doc)
        self.proc: subprocess.Popen[str] | None = None
        self.running: int | None = None  # the pid of a run not waited for yet

    def launch(self) -> None:
        """Start the zygote process now, if not started yet, without waiting for its imports:
        they run while the caller goes on (e.g. while another zygote's run trains)."""
        self._ensure()

    def _ensure(self) -> subprocess.Popen[str]:
        if self.proc is None:
            with open(self.errfile, "w") as err:
                self.proc = subprocess.Popen(
                    [sys.executable, __file__, *(["--scripts"] if self.scripts else [])],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                    env=dict(self.env, PYTHONHASHSEED=str(self.hash_seed)),
                )
        return self.proc

    def _line(self) -> str:
        line = self._ensure().stdout.readline()
        assert line, f"the zygote died: {self.errfile.read_text()[-3000:]}"
        return line

    def start(
        self,
        command: str,
        args: list[str],
        env: dict[str, str],
        out: Path,
        err: Path | None = None,
    ) -> int:
        """Fork ``COMMAND ARGS`` with environment ``env`` and output into ``out`` (stderr into
        ``err`` if given, else also into ``out``): its pid."""
        proc = self._ensure()
        request = {"command": command, "args": args, "env": env, "out": str(out)}
        if err is not None:
            request["err"] = str(err)
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
        kind, pid = self._line().split()
        assert kind == "pid", kind
        self.running = int(pid)
        return self.running

    def wait(self, pid: int, timeout: float) -> int:
        """The run's exit status (negative: the signal that killed it). After ``timeout``
        seconds its process group is SIGKILLed (as ``subprocess.run(timeout=...)`` would end
        a hung run, and the status then says so)."""
        timer = threading.Timer(timeout, kill_group, (pid,))
        timer.start()
        try:
            kind, done, status = self._line().split()
        finally:
            timer.cancel()
        assert (kind, int(done)) == ("exit", pid), (kind, done)
        self.running = None
        return int(status)

    def close(self) -> None:
        """End the zygote, and first a run still going (a test that failed or timed out while
        it ran: the run has its own session and would outlive the zygote)."""
        if self.running is not None:
            kill_group(self.running)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def kill_group(pid: int) -> None:
    """SIGKILL process group ``pid`` (a run and its DataLoader workers), if it still exists."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# -- the zygote ----------------------------------------------------------------------------------
def _die_with_parent() -> None:
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() == 1:  # the parent ended before prctl
        os._exit(1)


def _preload() -> None:
    """What both commands import before their first step (all of it import only: no data is
    read and no torch work is done here, so the fork is as safe as a DataLoader worker's)."""
    import accelerate  # noqa: F401
    import lerobot.configs.parser
    import lerobot.configs.train
    import lerobot.datasets.lerobot_dataset
    import lerobot.policies.act.modeling_act
    import lerobot.scripts.lerobot_train  # noqa: F401

    import robo_resume.cli
    import robo_resume.lerobot_train.pipeline
    import robo_resume.lerobot_train.setup  # noqa: F401


def _preload_for_scripts() -> None:
    """What the examples' training scripts import (``--scripts``): torch and robo_resume, and
    torch.optim's lazily imported parts (as tests/fault_train.py warms them); no data is read,
    and no random number is drawn (a tensor is made from given values)."""
    import pandas  # noqa: F401  (the metadata reader imports it on first use)
    import torch

    import robo_resume.audit
    import robo_resume.checkpoint  # noqa: F401

    weight = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.Adam([weight], lr=1e-3)
    opt.load_state_dict(opt.state_dict())
    del weight, opt


def _serve() -> dict | None:
    """Fork a child per request; returns the request in the child, None in the zygote at the
    end of stdin.

    The imported objects are moved out of the cyclic garbage collector's reach first
    (``gc.freeze()``, as Python's documentation advises before forking without exec): a child's
    collections, and the one at its normal shutdown, would otherwise visit every object the
    imports made and copy each page they touch (measured: a forked ``robo-resume --help`` took
    1.8 s to end, 0.6 s with the freeze). Nothing a run computes changes: those objects live for
    the whole process either way.
    """
    gc.freeze()
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _become(request)
            return request
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exit {pid} {os.waitstatus_to_exitcode(status)}", flush=True)
    return None


def _become(request: dict) -> None:
    """Turn the forked child into the requested run (see the module docstring)."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(os.devnull)
    for fd, path in ((1, request["out"]), (2, request.get("err", request["out"]))):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    os.environ.clear()
    os.environ.update(request["env"])
    if request["command"] == "python":  # python SCRIPT ARGS: argv[0] the script, its folder first
        sys.argv = list(request["args"])
        sys.path[0] = str(Path(sys.argv[0]).resolve().parent)
    else:
        sys.argv = [str(BIN / request["command"]), *request["args"]]
    if "numpy" in sys.modules:  # a fresh process seeds numpy's global generator from the OS
        sys.modules["numpy"].random.seed()


def _run_script() -> int:
    """``python SCRIPT ARGS`` (``sys.argv`` as :func:`_become` set it): the script runs as
    ``__main__``; its ``sys.exit`` or ``os._exit`` ends the run as it would end the process."""
    import runpy

    runpy.run_path(sys.argv[0], run_name="__main__")
    return 0


def _entry(command: str):
    if command == "python":
        return _run_script
    if command == "robo-resume":
        from robo_resume.cli import main

        return main
    if command == "lerobot-train":
        from lerobot.scripts.lerobot_train import main

        return main
    raise ValueError(f"unknown command {command!r}")


if __name__ == "__main__":
    _die_with_parent()
    if "--scripts" in sys.argv[1:]:
        _preload_for_scripts()
    else:
        _preload()
    request = _serve()
    if request is None:  # end of stdin: nothing to clean up (a normal exit takes seconds)
        os._exit(0)
    sys.exit(_entry(request["command"])())
