"""Every link between the README and the docs/ pages resolves, and so does every README or docs/
page (and heading) that a log or error message of robo_resume/ points users at.

A link is ``[text](target)`` outside code; its target is a file relative to the page, optionally
with ``#anchor``, which must be a heading of the target page as GitHub makes anchors from
headings. A message reference is ``docs/PAGE.md`` or ``README.md``, optionally with ``#anchor``,
inside a string of robo_resume/ that is not a docstring; a message that mentions the README in
any other way (``the README, 'Some heading'``) is reported, since nothing can check it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]
FROM_OTHER_BRANCH = {"docs/design-decisions.md", "benchmarks/README.md"}
"""Written by the benchmarks triage on its own branch: a link to one is accepted while the file is
absent (its anchors are checked once it exists)."""

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
HTML_ID = re.compile(r"""\bid=["']([^"']+)["']""")
MESSAGE_REF = re.compile(r"\b((?:docs/[\w.-]+\.md|README\.md)(?:#[\w-]+)?)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of a markdown page (headings outside code blocks, with GitHub's ``-1``,
    ``-2`` suffixes for repeated headings, and explicit ``id=`` attributes)."""
    text = FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    out = set(HTML_ID.findall(text))
    for heading in HEADING.findall(text):
        s = slug(heading)
        out.add(f"{s}-{seen[s]}" if s in seen else s)
        seen[s] = seen.get(s, 0) + 1
    return out


def target_problem(base: Path, target: str, where: str) -> str | None:
    """Why ``target`` (a path relative to ``base``, optionally ``#anchor``) does not resolve."""
    path, _, anchor = target.partition("#")
    file = (base / path).resolve() if path else None
    if file is None:
        return f"{where}: a link needs a page ({target!r})"
    rel = file.relative_to(REPO).as_posix() if file.is_relative_to(REPO) else str(file)
    if not file.exists():
        if rel in FROM_OTHER_BRANCH:
            return None
        return f"{where}: {target!r}: no file {rel}"
    if anchor and file.suffix == ".md" and anchor not in anchors(file):
        return f"{where}: {target!r}: {rel} has no heading with the anchor #{anchor}"
    return None


def link_problems(page: Path, text: str | None = None) -> list[str]:
    """Broken links of one page (``text`` instead of the page's own, for the self-test)."""
    text = FENCE.sub("", page.read_text() if text is None else text)
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    problems = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        if target.startswith("#"):
            target = page.name + target
        problem = target_problem(page.parent, target, page.relative_to(REPO).as_posix())
        if problem:
            problems.append(problem)
    return problems


def docstring_nodes(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (of modules, classes, functions, and the
    attribute docstrings after assignments): text for readers of the code, not messages."""
    out = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            out.add(id(node.value))
    return out


def message_strings(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every string constant of ``source`` that is not a docstring; implicit
    concatenations come as one string, f-strings as their literal parts."""
    tree = ast.parse(source)
    skip = docstring_nodes(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
    ]


def message_problems(source: str, where: str) -> tuple[list[str], int]:
    """(problems, number of references checked) of the docs references in ``source``."""
    problems, checked = [], 0
    for line, text in message_strings(source):
        refs = MESSAGE_REF.findall(text)
        for ref in refs:
            checked += 1
            problem = target_problem(REPO, ref, f"{where}:{line}")
            if problem:
                problems.append(problem)
        if "README" in text.replace("README.md", ""):
            problems.append(
                f"{where}:{line}: a message names the README without a checkable target "
                f"(write README.md#anchor or docs/PAGE.md#anchor): {text[:120]!r}"
            )
    return problems, checked


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(REPO).as_posix() for p in PAGES])
def test_links_between_pages_resolve(page):
    assert not link_problems(page), "\n".join(link_problems(page))


def test_the_readme_links_every_docs_page():
    """The README's table of contents leaves no docs page out."""
    linked = {
        Path(t.partition("#")[0]).name for t in LINK.findall((REPO / "README.md").read_text())
    }
    missing = [p.name for p in sorted((REPO / "docs").glob("*.md")) if p.name not in linked]
    index = {
        Path(t.partition("#")[0]).name for t in LINK.findall((REPO / "docs/index.md").read_text())
    }
    missing = [name for name in missing if name not in index]
    assert not missing, f"docs pages linked from neither README.md nor docs/index.md: {missing}"


def test_messages_point_at_pages_and_headings_that_exist():
    problems, checked = [], 0
    for path in sorted((REPO / "robo_resume").rglob("*.py")):
        got, n = message_problems(path.read_text(), path.relative_to(REPO).as_posix())
        problems += got
        checked += n
    assert not problems, "\n".join(problems)
    assert checked >= 4, "the scan found almost no docs references: is MESSAGE_REF still right?"


def test_the_checks_find_broken_targets():
    """The checkers report what they should (else the tests above would pass on nothing)."""
    bad = (
        "A = \"see the README, 'A plain DataLoader'\"\n"
        'B = "see docs/no-such-page.md"\n'
        'C = "see docs/resume.md#no-such-heading"\n'
        'D = "see docs/resume.md#when-a-resume-is-refused and docs/tuning.md"\n'
        'def f():\n    """Docstrings may say README."""\n'
    )
    problems, checked = message_problems(bad, "x.py")
    assert checked == 4
    assert [p.split(":")[1] for p in problems] == ["1", "2", "3"], problems
    page = REPO / "docs" / "index.md"
    text = "[a](resume.md#guarantees-and-assumptions) [b](nope.md) [c](resume.md#nope) [d](#nope)"
    got = link_problems(page, text)
    assert len(got) == 3 and all("docs/index.md" in p for p in got), got
    assert slug("Datasets on the Hugging Face Hub") == "datasets-on-the-hugging-face-hub"
    assert slug("Training with lerobot-train: `robo-resume train`") == (
        "training-with-lerobot-train-robo-resume-train"
    )
