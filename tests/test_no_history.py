"""Library code holds no process history: no dates, issue numbers, run logs or commit hashes.

Comments and docstrings in ``robo_resume/`` state contracts and keep a one-clause reason; the
measurements behind a default live in ``docs/performance.md`` and the benchmarks, where they can
be re-measured. This test reads every ``robo_resume/**/*.py`` as text (code, comments, docstrings
and strings alike) and names the file and line of each trace of history it finds.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "robo_resume"

_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_YEAR = r"(?:19|20)\d{2}"

PATTERNS: dict[str, re.Pattern[str]] = {
    "a date": re.compile(
        rf"\b{_YEAR}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b"  # 2026-12-02
        rf"|\b{_YEAR}/(?:0[1-9]|1[0-2])/(?:0[1-9]|[12]\d|3[01])\b"  # 2026/12/02
        rf"|\b{_MONTH}\.?\s+(?:\d{{1,2}}(?:st|nd|rd|th)?,?\s+)?{_YEAR}\b"  # Dec 2026, Dec 2, 2026
        rf"|\b\d{{1,2}}\s+{_MONTH}\.?,?\s+{_YEAR}\b",  # 2 Dec 2026
        re.IGNORECASE,
    ),
    "a clock time": re.compile(
        r"\b\d{1,2}:\d{2}(?::\d{2})?\s*(?:UTC|GMT)\b|\b\d{2}:\d{2}:\d{2}Z\b", re.IGNORECASE
    ),
    "an issue number": re.compile(r"\bissues?\s*(?:#|no\.?|number)?\s*\d+", re.IGNORECASE),
    "a run condition ('quiet machine')": re.compile(r"\bquiet\s+machine", re.IGNORECASE),
    "a /tmp path": re.compile(r"(?<![\w.])/tmp\b"),
    "a size justification": re.compile(r"\b(?:over|about|under)\s+\d{3,}\s+lines\b", re.IGNORECASE),
    # A commit hash as git abbreviates it (7-12 hex digits) or in full (40): a standalone word
    # of hex digits that holds both a digit and a letter, so words like "added" or "1000000"
    # stay out.
    "a commit-hash-like hex word": re.compile(
        r"(?<![\w.])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])(?:[0-9a-f]{7,12}|[0-9a-f]{40})(?![\w.])",
        re.IGNORECASE,
    ),
}

ALLOWED: set[tuple[str, str]] = set()
"""(file relative to the repository, matched text) pairs that look like history but are not.

Empty: nothing in ``robo_resume/`` needs an exception today. An entry needs a comment saying
what the text really is (e.g. a format's magic number).
"""


def history_hits(text: str) -> list[tuple[int, str, str]]:
    """Every trace of history in ``text``: (1-based line, what kind, the matched text)."""
    hits = []
    for kind, pattern in PATTERNS.items():
        for m in pattern.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            hits.append((line, kind, " ".join(m.group(0).split())))
    return sorted(hits)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("# measured 2026-11-27 on two cores", "a date"),
        ("(Dec 2026)", "a date"),
        ("run on December 2, 2026", "a date"),
        ("seen 2 Dec 2026", "a date"),
        ("started 18:15 UTC", "a clock time"),
        ("at 09:41:07Z", "a clock time"),
        ("a worker never outlives training (issue 13 item 7)", "an issue number"),
        ("see Issue #36", "an issue number"),
        ("paired on a quiet\n    machine, median of 3", "a run condition ('quiet machine')"),
        ("(/tmp scripts)", "a /tmp path"),
        ("python /tmp/bench_x.py", "a /tmp path"),
        ("Why this module is over 400 lines: it is one object.", "a size justification"),
        ("against the commit c472cb6", "a commit-hash-like hex word"),
        ("at 9b4252a3e1f0", "a commit-hash-like hex word"),
        ("c472cb6a0e9b8d7c6f5e4d3c2b1a0f9e8d7c6b5a", "a commit-hash-like hex word"),
    ],
)
def test_the_patterns_find_history(text, kind):
    assert kind in {k for _, k, _ in history_hits(text)}, f"{kind!r} not found in {text!r}"


@pytest.mark.parametrize(
    "text",
    [
        'episodes="train[:90%]"',  # a slice string, no date
        "the mask 0x7fffffff and 1000000000 ns",  # hex literal and a decimal number
        "decade accede defaced",  # hex letters only: English words
        "fps=30, tolerance 1e-4 s, 96x96 frames",  # units and sizes, not history
        "see the issues page",  # the word issue without a number
        "a 1-2 MB decoder; 250/30 s",  # figures without a date
        "version 4 of the state; _version.py",  # dotted and prefixed words
    ],
)
def test_the_patterns_leave_ordinary_text_alone(text):
    assert history_hits(text) == []


def test_library_code_holds_no_process_history():
    files = sorted(LIBRARY.rglob("*.py"))
    assert len(files) > 50, f"expected the robo_resume/ package under {LIBRARY}, found {files}"
    found = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        for line, kind, text in history_hits(path.read_text(encoding="utf-8")):
            if (rel, text) not in ALLOWED:
                found.append(f"{rel}:{line}: {kind}: {text!r}")
    assert not found, (
        f"expected no process history in library code, found {len(found)}:\n"
        + "\n".join(found)
        + "\nfix: keep a one-clause reason in the comment or docstring; the numbers go to "
        "docs/performance.md (or a benchmark's output), the history to git and the CHANGELOG"
    )
