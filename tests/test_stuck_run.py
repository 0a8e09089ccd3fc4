"""tests/stuck_run.py: a command that does not end fails with the stacks of what it left."""

from __future__ import annotations

import os
import re
import sys

import pytest
from stuck_run import run_or_dump

# The command forks a child into a session of its own (as torchrun starts its ranks), which
# waits in one function while its parent waits in another, a thread beside it.
HANGS = """
import os, threading, time
def child_waits():
    time.sleep(60)
def parent_waits():
    time.sleep(60)
if os.fork() == 0:
    os.setsid()
    child_waits()
threading.Thread(target=time.sleep, args=(60,), name="beside").start()
print("started", flush=True)
parent_waits()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_hung_run_fails_naming_each_process_and_its_stacks():
    with pytest.raises(AssertionError, match="did not end within 2 s") as info:
        run_or_dump([sys.executable, "-c", HANGS], env=dict(os.environ), timeout=2)
    text = str(info.value)
    marks = [int(m) for m in re.findall(r"=== pid (\d+)", text)]
    assert len(marks) == 2, text
    child, parent = marks  # deepest first
    for pid in (child, parent):
        assert re.search(rf"^\s*{pid} ", text, re.M), f"pid {pid} not in the table:\n{text}"
    dumps = text.split("=== pid ")
    assert "child_waits" in dumps[1] and "parent_waits" not in dumps[1], text
    assert "parent_waits" in dumps[2] and "threading.py" in dumps[2], text
    assert "started" in text  # the output before the hang is kept


def test_a_run_that_ends_is_returned_as_is():
    p = run_or_dump(
        [
            sys.executable,
            "-c",
            "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)",
        ],
        env=dict(os.environ),
        timeout=60,
    )
    assert (p.returncode, p.stdout, p.stderr) == (3, "out\n", "err\n")
