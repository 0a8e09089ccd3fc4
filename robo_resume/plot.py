"""Picture of an overlap audit: how many times each frame was consumed across a crash.

One panel per crash step, one row per scenario, one column per frame index of the dataset,
colored by outcome. A replayed or lost frame is also marked with a triangle above its column,
so that 4 lost frames among 5,700 stay visible (a column is narrower than a pixel there).
Frames of episodes left out with ``--episodes`` are colored as excluded, not as the epoch's tail.

Needs matplotlib (the ``plot`` extra: ``pip install robo_resume[plot]``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import describe

__all__ = ["CATEGORIES", "Panel", "consumption_grid", "plot_consumption"]

EXCLUDED, TAIL, ONCE, REPLAYED, LOST = range(5)
CATEGORIES = (
    ("excluded (episode not selected)", "#7f7f7f"),
    ("not scheduled this epoch (tail)", "#d0d0d0"),
    ("consumed once", "#2ca02c"),
    ("replayed (consumed twice or more)", "#ff7f0e"),
    ("lost (never consumed)", "#d62728"),
)
"""(label, color) of each grid value, in value order."""


@dataclass(frozen=True)
class Panel:
    """One crash step: ``expected`` counts each index in the uninterrupted run,
    ``consumed[scenario]`` counts it in the crashed-and-resumed run."""

    title: str
    expected: Counter
    consumed: Mapping[str, Counter]


def _counts(c: Counter, n: int) -> np.ndarray:
    out = np.zeros(n, dtype=np.int64)
    for i, k in c.items():
        out[int(i)] = k
    return out


def consumption_grid(
    panel: Panel, num_frames: int, excluded: Iterable[tuple[int, int]] = ()
) -> np.ndarray:
    """``(scenarios, num_frames)`` grid of category values (:data:`CATEGORIES`) of a panel.

    ``excluded`` are ``[start, stop)`` index ranges of episodes not selected; a frame there is
    EXCLUDED unless some run consumed it.
    """
    want = _counts(panel.expected, num_frames)
    grid = np.full((len(panel.consumed), num_frames), TAIL, dtype=np.int64)
    out = np.zeros(num_frames, dtype=bool)
    for a, b in excluded:
        out[a:b] = True
    for r, c in enumerate(panel.consumed.values()):
        got = _counts(c, num_frames)
        row = grid[r]
        row[out] = EXCLUDED
        row[(got == want) & (want > 0)] = ONCE
        row[got > want] = REPLAYED
        row[got < want] = LOST
    return grid


def plot_consumption(
    path: str | Path,
    panels: Sequence[Panel],
    *,
    title: str = "",
    num_frames: int | None = None,
    excluded: Iterable[tuple[int, int]] = (),
) -> Any:
    """Write a PNG with one panel per crash step (see the module docstring); return the figure.

    ``num_frames``: the dataset's frame count (default: the largest index seen + 1).
    ``excluded``: ``[start, stop)`` index ranges of the episodes not selected.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import ListedColormap
        from matplotlib.patches import Patch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ValueError(
            describe(
                "--plot needs matplotlib",
                expected="matplotlib installed",
                found="none",
                fix="pip install 'robo_resume[plot]'",
            )
        ) from exc
    if not panels:
        raise ValueError(describe("Nothing to plot", expected="at least one crash step"))
    excluded = list(excluded)
    if num_frames is None:
        keys = [int(i) for p in panels for c in (p.expected, *p.consumed.values()) for i in c]
        num_frames = max(keys, default=0) + 1
    rows = max(len(p.consumed) for p in panels)
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(12, 0.9 + len(panels) * (0.9 + 0.55 * rows)),
        dpi=110,
        squeeze=False,
    )
    cmap = ListedColormap([c for _, c in CATEGORIES])
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        grid = consumption_grid(panel, num_frames, excluded)
        ax.imshow(
            grid,
            aspect="auto",
            cmap=cmap,
            vmin=0,
            vmax=len(CATEGORIES) - 1,
            interpolation="nearest",
            extent=(-0.5, num_frames - 0.5, len(grid) - 0.5, -0.5),
        )
        for value, marker in ((REPLAYED, "v"), (LOST, "v")):
            r, x = np.nonzero(grid == value)
            # a marker of fixed size in points: visible however many frames share a pixel
            ax.plot(
                x,
                r - 0.3,
                linestyle="none",
                marker=marker,
                markersize=6,
                markeredgewidth=0.5,
                markeredgecolor="black",
                color=CATEGORIES[value][1],
                clip_on=False,
            )
        ax.set_yticks(range(len(grid)))
        ax.set_yticklabels(
            [
                f"{name}: {int((grid[r] == REPLAYED).sum())} replayed, "
                f"{int((grid[r] == LOST).sum())} lost"
                for r, name in enumerate(panel.consumed)
            ]
        )
        ax.set_xlim(-0.5, num_frames - 0.5)
        ax.set_title(panel.title, fontsize=9)
    axes[-1, 0].set_xlabel("frame index")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.legend(
        handles=[Patch(color=c, label=label) for label, c in CATEGORIES],
        loc="lower center",
        ncol=len(CATEGORIES),
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return fig
