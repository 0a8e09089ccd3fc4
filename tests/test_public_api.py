"""The public API is what ``robo_resume.__all__`` lists; the README, docs/ and examples use only it.

Users copy the README, the docs pages and the examples; whatever they import there is the API we
promise to keep. So every name they import comes from the package itself
(``from robo_resume import ...``), is in the sorted ``__all__``, and has a docstring. The
examples' model is their own (``examples/tiny_policy.py``), not the library's.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
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
    for page in [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))]:
        text = page.read_text()
        name = page.relative_to(ROOT).as_posix()
        for k, block in enumerate(re.findall(FENCE + r"(?:python|py)\n(.*?)" + FENCE, text, re.S)):
            out.append((f"{name} python block {k}", block))
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


# -- docstring sections ---------------------------------------------------------------------
# One convention, Google style (ruff's ``D`` rules with ``convention = "google"`` check the
# layout of these modules' docstrings, pyproject.toml). Ruff cannot see whether a docstring
# has the sections its code calls for, so this does: every parameter in ``Args:`` (a class's
# constructor parameters in the class docstring; a dataclass may list its fields under
# ``Attributes:``), ``Returns:`` when the body returns a value, ``Yields:`` for a generator and
# ``Raises:`` naming every exception the body raises itself.

SECTION = re.compile(r"^(\w[\w ]*):\s*$")
ENTRY = re.compile(r"^(\*{0,2}\w+)\s*(\([^)]*\))?:")


def _sections(doc: str) -> dict[str, list[str]]:
    """``{section title: its lines, dedented}`` of a Google-style docstring."""
    lines = inspect.cleandoc(doc).splitlines()
    out: dict[str, list[str]] = {}
    title = None
    for line in lines:
        m = SECTION.match(line)
        if m and m.group(1) in {
            "Args",
            "Attributes",
            "Returns",
            "Yields",
            "Raises",
            "Example",
            "Examples",
            "Note",
            "Notes",
            "Warning",
        }:
            title = m.group(1)
            out[title] = []
        elif title is not None:
            if line and not line.startswith(" "):
                title = None  # text after the sections
            else:
                out[title].append(line[4:] if line.startswith("    ") else line.strip())
    return out


def _entries(lines: list[str]) -> set[str]:
    """The names an ``Args:``/``Raises:`` section documents (its unindented entries)."""
    return {m.group(1).lstrip("*") for x in lines if (m := ENTRY.match(x))}


def _body_facts(func) -> tuple[bool, bool, set[str]]:
    """(returns a value, yields, names of exceptions raised) of ``func``'s own body.

    A raise inside a ``try`` whose handler catches that exception is control flow, not an
    exception the caller sees, and does not count.
    """
    try:
        source = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError):
        return False, False, set()
    facts = {"returns": False, "yields": False}
    raised: set[str] = set()

    def visit(node: ast.AST, caught: frozenset[str]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            return  # a nested function's returns are not this one's
        if isinstance(node, ast.Return) and node.value is not None:
            if not (isinstance(node.value, ast.Constant) and node.value.value is None):
                facts["returns"] = True
        elif isinstance(node, ast.Yield | ast.YieldFrom):
            facts["yields"] = True
        elif isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name | ast.Attribute):
                name = exc.id if isinstance(exc, ast.Name) else exc.attr
                if name[:1].isupper() and name not in caught:  # a class, not an error factory
                    raised.add(name)
        elif isinstance(node, ast.Try):
            names = set()
            for handler in node.handlers:
                types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
                names |= {t.id for t in types if isinstance(t, ast.Name)}
            for child in node.body:
                visit(child, caught | names)
            for child in node.handlers + node.orelse + node.finalbody:
                visit(child, caught)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, caught)

    for child in ast.iter_child_nodes(ast.parse(source).body[0]):
        visit(child, frozenset())
    return facts["returns"], facts["yields"], raised


def _params(func, skip_first: bool) -> list[str]:
    names = list(inspect.signature(func).parameters)
    return names[1:] if skip_first else names


def docstring_problems(name: str, obj) -> list[str]:
    """What the docstring of function or class ``obj`` lacks, one line per problem."""
    doc = obj.__doc__ or ""
    if not doc.strip():
        return [f"{name} has no docstring"]
    sections = _sections(doc)
    problems = []
    if inspect.isclass(obj):
        if obj.__init__ is object.__init__ or issubclass(obj, BaseException):
            return problems  # no constructor of its own to document
        documented = _entries(sections.get("Args", []))
        if dataclasses.is_dataclass(obj):
            documented |= _entries(sections.get("Attributes", []))
        missing = [p for p in _params(obj.__init__, True) if p not in documented]
        if missing:
            problems.append(f"{name}: constructor argument(s) {missing} not in Args:")
        return problems
    func = inspect.unwrap(obj)
    params = _params(func, skip_first=isinstance(obj, _Method))
    missing = [p for p in params if p not in _entries(sections.get("Args", []))]
    if missing:
        problems.append(f"{name}: argument(s) {missing} not in Args:")
    returns, yields, raised = _body_facts(func)
    if yields and "Yields" not in sections:
        problems.append(f"{name} is a generator: no Yields:")
    elif returns and not yields and "Returns" not in sections:
        problems.append(f"{name} returns a value: no Returns:")
    undocumented = sorted(raised - _entries(sections.get("Raises", [])))
    if undocumented:
        problems.append(f"{name} raises {undocumented}: not in Raises:")
    return problems


class _Method:
    """A method looked up on its class: its first parameter is ``self`` or ``cls``."""

    def __init__(self, func):
        self.__wrapped__ = func
        self.__doc__ = func.__doc__


def _public_api() -> list[tuple[str, object]]:
    """Every public function and class, and the public methods those classes define."""
    import robo_resume.mix

    out, seen = [], set()
    for module in (robo_resume, robo_resume.mix):
        for name in module.__all__:
            obj = getattr(module, name)
            if id(obj) in seen or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            seen.add(id(obj))
            out.append((f"{module.__name__}.{name}", obj))
            if not inspect.isclass(obj) or issubclass(obj, BaseException):
                continue
            for attr, value in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if isinstance(value, property):
                    out.append((f"{name}.{attr}", value))
                elif isinstance(value, staticmethod):
                    out.append((f"{name}.{attr}", value.__func__))
                elif isinstance(value, classmethod) or inspect.isfunction(value):
                    out.append((f"{name}.{attr}", _Method(getattr(value, "__func__", value))))
    return out


def test_every_public_name_has_the_docstring_sections_its_code_calls_for():
    problems = []
    for name, obj in _public_api():
        if isinstance(obj, property):  # documented as an attribute: a docstring, no sections
            problems += [] if (obj.__doc__ or "").strip() else [f"{name} has no docstring"]
        else:
            problems += docstring_problems(name, obj)
    assert not problems, "Google-style docstring sections missing:\n" + "\n".join(problems)


def test_the_docstring_check_finds_what_is_missing():
    """The check above reports each kind of gap (else it would pass on anything)."""

    def bare(path, *, strict=False):
        """Load a thing."""
        if strict:
            raise ValueError(path)
        try:
            raise KeyError(path)  # caught: control flow, not documented
        except (KeyError, TypeError):
            pass
        return path

    def stream(n):
        """Count.

        Args:
            n: how far.

        Returns:
            Numbers.
        """
        yield from range(n)

    def good(path, *, strict=False, **extra):
        """Load a thing.

        Args:
            path: where it is.
            strict: raise on an empty thing.
            **extra: ignored.

        Returns:
            The thing.

        Raises:
            ValueError: ``strict`` and the thing is empty.
        """
        if strict:
            raise ValueError(path)
        return path

    class Thing:
        """A thing.

        Args:
            a: the first.
        """

        def __init__(self, a, b):
            self.a, self.b = a, b

    assert docstring_problems("bare", bare) == [
        "bare: argument(s) ['path', 'strict'] not in Args:",
        "bare returns a value: no Returns:",
        "bare raises ['ValueError']: not in Raises:",
    ]
    assert docstring_problems("stream", stream) == ["stream is a generator: no Yields:"]
    assert docstring_problems("good", good) == []
    assert docstring_problems("Thing", Thing) == [
        "Thing: constructor argument(s) ['b'] not in Args:"
    ]
    assert docstring_problems("undocumented", lambda: None) == ["undocumented has no docstring"]
    assert len(_public_api()) >= 100  # classes' methods are checked too
