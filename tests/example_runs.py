"""Launched by tests/test_examples.py (under torchrun): one example, several runs, one process.

``python tests/example_runs.py SCRIPT ARGS... [--- ARGS...]...`` runs ``examples/SCRIPT``'s
``main`` once per argument list (``---`` separates them), one after the other, in this process:
one torchrun start (and one import of torch and accelerate per rank) for runs that need no
process of their own, as ``python examples/SCRIPT ARGS`` each in turn would. The examples
folder is first on ``sys.path``, as for ``python examples/SCRIPT`` (its ``tiny_policy``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def runs(argv: list[str]) -> tuple[str, list[list[str]]]:
    """(script, [argument list per run]) from ``SCRIPT ARGS [--- ARGS]...``."""
    script, *rest = argv
    out: list[list[str]] = [[]]
    for arg in rest:
        if arg == "---":
            out.append([])
        else:
            out[-1].append(arg)
    return script, out


def main(argv: list[str]) -> None:
    script, arg_lists = runs(argv)
    sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(Path(script).stem, EXAMPLES / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for args in arg_lists:
        module.main(args)


if __name__ == "__main__":
    main(sys.argv[1:])
    # The runs are over and their files written and closed: end here rather than through
    # Python's shutdown of torch and accelerate, which the test does not check and which held
    # both ranks (and so torchrun) about a second longer. An exception above still ends the
    # process the usual way, with its traceback and exit code 1.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
