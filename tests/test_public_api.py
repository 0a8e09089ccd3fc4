"""The public API is what ``robo_resume.__all__`` lists, and the README and examples use only it.

Users copy the README and the examples; whatever they import there is the API we promise to keep.
So every name they import comes from the package itself (``from robo_resume import ...``), is in
the sorted ``__all__``, and has a docstring. The examples' model is their own
(``examples/tiny_policy.py``), not the library's.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import robo_resume

ROOT = Path(__file__).resolve().parents[1]
TOOL_IMPORTS: dict[str, set[str]] = {}
"""Imports allowed from submodules: tools used by the examples, not library API."""
FENCE = "`" * 3


def _sources() -> list[tuple[str, str]]:
    out = [
        (p.relative_to(ROOT).as_posix(), p.read_text()) for p in sorted(ROOT.glob("examples/*.py"))
    ]
    readme = (ROOT / "README.md").read_text()
    for k, block in enumerate(re.findall(FENCE + r"(?:python|py)\n(.*?)" + FENCE, readme, re.S)):
        out.append((f"README.md python block {k}", block))
    return out


def _imports(source: str) -> list[tuple[str, str]]:
    """(module, name) of every ``from robo_resume... import name`` and ``import robo_resume...``."""
    found = []
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a ``py`` sketch with ``...`` in it: parse its import lines alone
        lines = [x for x in source.splitlines() if re.match(r"\s*(from|import) robo_resume", x)]
        tree = ast.parse("\n".join(x.strip() for x in lines))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("robo_resume"):
            found += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.startswith("robo_resume")]
    return found


def test_all_is_sorted_and_every_name_resolves_with_a_docstring():
    names = robo_resume.__all__
    assert names == sorted(names), "keep robo_resume.__all__ sorted"
    for name in names:
        obj = getattr(robo_resume, name)  # raises if the name is not there
        if callable(obj):
            assert (obj.__doc__ or "").strip(), f"robo_resume.{name} has no docstring"


@pytest.mark.parametrize("where,source", _sources(), ids=[w for w, _ in _sources()])
def test_readme_and_examples_import_only_the_public_api(where, source):
    for module, name in _imports(source):
        if module == "robo_resume":
            assert name in robo_resume.__all__, (
                f"{where} imports {name} from robo_resume, which is not in robo_resume.__all__"
            )
        else:
            assert name in TOOL_IMPORTS.get(module, ()), (
                f"{where} imports {name or module} from {module}: import it from robo_resume "
                "(add it to robo_resume.__all__ if users need it)"
            )


def test_the_check_sees_the_imports_it_checks():
    """The parser finds both import forms (else the test above would pass on nothing)."""
    got = _imports("from robo_resume.mix import MixedDataset\nimport robo_resume.state\n")
    assert got == [("robo_resume.mix", "MixedDataset"), ("robo_resume.state", "")]
    assert sum(len(_imports(s)) for _, s in _sources()) >= 20
