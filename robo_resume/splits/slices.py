"""HF-style slice strings (``"train[:90%]"``): parsing and resolving to episode indices.

The rules are in the docstring of :mod:`robo_resume.splits`. Pure arithmetic on indices.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from ..errors import describe

if TYPE_CHECKING:
    pass
from .seeded import Split

__all__ = ["EpisodeSlice", "parse_selection", "resolve_selection"]

_SLICE_EXAMPLES = "'train[:90%]', 'train[90%:]', '[10:20]', 'train[:10%]+train[-10%:]'"
_NUM = r"-?\d+(?:\.\d*)?"
_PART_RE = re.compile(
    rf"""^\s*
    (?P<name>\w+(?:\.\w+)*)?\s*
    (?:\[\s*
        (?:(?P<start>{_NUM})\s*(?P<start_pct>%)?)?\s*
        :\s*
        (?:(?P<stop>{_NUM})\s*(?P<stop_pct>%)?)?\s*
    \])?\s*
    (?:\((?P<rounding>[^)]*)\))?
    \s*$""",
    re.VERBOSE,
)


# --------------------------------------------------------------------------- slice strings


@dataclass(frozen=True)
class EpisodeSlice:
    """One ``name[start:stop]`` term of a slice string (bounds in episodes or percent)."""

    name: str
    start: Fraction | None
    stop: Fraction | None
    percent: bool

    def bounds(self, n: int) -> tuple[int, int]:
        """Absolute ``[from, to)`` positions in a split of ``n`` episodes (HF's rules)."""

        def absolute(b: Fraction | None, default: int) -> int:
            if b is None:
                return default
            v = round(b * n / 100) if self.percent else int(b)
            if v < 0:
                v = max(n + v, 0)
            return min(v, n)

        return absolute(self.start, 0), absolute(self.stop, n)


def _bad_syntax(spec: str, found: str | None = None) -> ValueError:
    return ValueError(
        describe(
            "episodes= is not a valid slice string",
            expected=f"split[start:stop] with optional %, e.g. {_SLICE_EXAMPLES}",
            found=found or repr(spec),
            fix="write bounds as integers (episode positions) or percentages, both of one kind, "
            "or pass a list of episode indices or a Split(...)",
        )
    )


def parse_selection(spec: str) -> tuple[EpisodeSlice, ...]:
    """Parse a slice string (see the module docstring) into its ``+``-joined terms."""
    if not isinstance(spec, str) or not spec.strip():
        raise _bad_syntax(str(spec), found=f"{spec!r} (empty)")
    out = []
    for term in spec.split("+"):
        m = _PART_RE.match(term)
        if m is None or not term.strip() or (m["name"] is None and "[" not in term):
            raise _bad_syntax(
                spec, found=repr(spec) if term == spec else f"{term.strip()!r} in {spec!r}"
            )
        rounding = m["rounding"]
        if rounding is not None and rounding.strip() != "closest":
            raise ValueError(
                describe(
                    "Unsupported rounding in an episodes= slice string",
                    expected="no suffix or '(closest)' (nearest episode, ties to even)",
                    found=f"({rounding}) in {spec!r}",
                    fix="drop the suffix; HF's pct1_dropremainder is not supported",
                )
            )
        start, stop = m["start"], m["stop"]
        given = [b for b in (start, stop) if b is not None]
        if (m["start_pct"] and stop is not None and not m["stop_pct"]) or (
            m["stop_pct"] and start is not None and not m["start_pct"]
        ):
            raise ValueError(
                describe(
                    "An episodes= slice mixes a percentage and an absolute bound",
                    expected="both bounds in % or both in episodes, e.g. 'train[10%:50%]'",
                    found=repr(term.strip()),
                    fix="add or remove the % on the other bound",
                )
            )
        percent = m["start_pct"] is not None or m["stop_pct"] is not None
        if percent and any(abs(Fraction(b)) > 100 for b in given):
            raise ValueError(
                describe(
                    "An episodes= percentage is out of range",
                    expected="percentages between -100% and 100%",
                    found=repr(term.strip()),
                    fix="use e.g. 'train[:100%]' for everything, 'train[-10%:]' for the last 10%",
                )
            )
        if not percent and any("." in b for b in given):
            raise _bad_syntax(spec, found=f"fractional episode position in {term.strip()!r}")
        out.append(
            EpisodeSlice(
                name=m["name"] or "",
                start=Fraction(start) if start is not None else None,
                stop=Fraction(stop) if stop is not None else None,
                percent=percent,
            )
        )
    return tuple(out)


def _split_members(
    name: str, episodes: Sequence[int], splits: Mapping[str, Any] | None, spec: str
) -> list[int]:
    if name == "" or (name == "train" and not splits):
        return list(episodes)
    if not splits or name not in splits:
        known = sorted(splits or {"train": None})
        raise ValueError(
            describe(
                f"episodes={spec!r} names an unknown split",
                expected=f"one of {known} (meta/info.json 'splits'), or no name for all episodes",
                found=repr(name),
                fix=f"write e.g. '{known[0]}[:90%]', or '[:90%]' for all episodes",
            )
        )
    rng = splits[name]
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", str(rng))
    if m is None:
        raise ValueError(
            describe(
                f"meta/info.json's split {name!r} is not an episode range",
                expected="'start:stop' episode indices, e.g. '0:50'",
                found=repr(rng),
                fix="fix 'splits' in meta/info.json, or select with '[...]' (all episodes)",
            )
        )
    lo, hi = int(m[1]), int(m[2])
    return [e for e in episodes if lo <= e < hi]


def resolve_selection(
    spec: str | Split,
    episodes: Sequence[int],
    *,
    splits: Mapping[str, Any] | None = None,
) -> tuple[int, ...]:
    """Resolve a slice string or a :class:`Split` against the dataset's sorted episode indices.

    ``splits`` is ``meta/info.json``'s ``"splits"`` mapping (name -> "start:stop"). Returns the
    selected episode indices, sorted; raises ValueError (with the fix) when nothing is selected.
    """
    episodes = sorted(int(e) for e in episodes)
    if isinstance(spec, Split):
        return spec.select(episodes)
    if not isinstance(spec, str):
        raise ValueError(
            describe(
                "Unsupported episodes= value",
                expected="None, episode indices, a slice string like 'train[:90%]', or a Split",
                found=type(spec).__name__,
            )
        )
    chosen: set[int] = set()
    described = []
    for part in parse_selection(spec):
        members = _split_members(part.name, episodes, splits, spec)
        a, b = part.bounds(len(members))
        chosen.update(members[a:b])
        described.append(f"{part.name or 'all'}: positions {a}:{b} of {len(members)}")
    if not chosen:
        raise ValueError(
            describe(
                f"episodes={spec!r} selects no episodes",
                expected="at least one episode",
                found="; ".join(described),
                fix="widen the slice (a percentage rounds to whole episodes: round(pct * n / 100))",
            )
        )
    return tuple(sorted(chosen))
