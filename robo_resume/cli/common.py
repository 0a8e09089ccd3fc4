"""What every command shares: exit codes, --episodes parsing, one-line error messages, output."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..errors import describe

OK, FAILED, USAGE = 0, 1, 2


CHUNK_HELP = (
    "frames per chunk (default: the order's: 2 for the shuffle order, 1 without video; 64 for the "
    "interleave order)"
)
ORDER_HELP = "the stream order (default: shuffle; interleave with --interleave*)"
EPISODES_HELP = (
    "episodes to use: indices and ranges (0-9,12), a slice string (train[:90%%]), or "
    "'readable' (the episodes whose files all exist and open); default: all"
)
ON_ERROR_HELP = (
    "raise (default): stop at the first missing or broken file with an error naming it; "
    "skip: skip the chunks whose files fail to read, and report them"
)


def parse_episodes(text: str | None, root: str | Path | None = None) -> list[int] | str | None:
    """``--episodes``: None, ``readable``, a slice string, or indices with ranges (``0-9,12``)."""
    if not text:
        return None
    text = text.strip()
    if text == "readable":
        from ..files import readable_episodes

        if root is None:
            raise ValueError(describe("--episodes readable needs a dataset", found="no --root"))
        return list(readable_episodes(root))
    if "[" in text:
        return text
    out: list[int] = []
    try:
        for part in text.split(","):
            a, sep, b = part.strip().partition("-")
            out.extend(range(int(a), int(b) + 1) if sep and a else [int(part)])
    except ValueError:
        raise ValueError(
            describe(
                "--episodes is not an episode selection",
                expected="indices and ranges such as 0-9,12, a slice string such as "
                "'train[:90%]', or 'readable'",
                found=repr(text),
            )
        ) from None
    return out


def error_message(exc: BaseException) -> str:
    """The error's own message on one line, without torch's worker traceback.

    An error raised in a DataLoader worker reaches the main process as ``Caught X in DataLoader
    worker process N. Original Traceback (most recent call last): ... X: <message>``; the
    message is the last line (our messages are one paragraph).
    """
    text = str(exc)
    if "Original Traceback" in text:
        name = type(exc).__name__
        lines = text.rstrip().splitlines()
        for i in range(len(lines) - 1, -1, -1):
            head, sep, rest = lines[i].partition(": ")
            if sep and head.rsplit(".", 1)[-1] == name:
                text = " ".join([rest, *lines[i + 1 :]])
                break
    text = " ".join(text.split())
    return text.replace("pass on_error='skip'", "pass --on-error skip (or --episodes readable)")


def emit(args: argparse.Namespace, report: dict[str, Any], text: str) -> None:
    print(json.dumps(report, indent=2) if args.json else text)
