"""Picture of an overlap audit: how many times each frame was consumed across a crash.

Needs matplotlib (the ``plot`` extra: ``pip install robo_resume[plot]``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import numpy as np

__all__ = ["plot_consumption"]

CATEGORIES = (
    ("not scheduled this epoch (tail)", "#d0d0d0"),
    ("consumed once", "#2ca02c"),
    ("replayed (consumed twice or more)", "#ff7f0e"),
    ("lost (never consumed)", "#d62728"),
)


def plot_consumption(
    path: str | Path, expected: Counter, consumed: Mapping[str, Counter], *, title: str = ""
) -> Path:
    """Write a PNG: one row per scenario, one column per frame index, colored by outcome.

    ``expected`` counts each index in the uninterrupted run; ``consumed[scenario]`` counts it in
    the crashed-and-resumed run.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import ListedColormap
        from matplotlib.patches import Patch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ValueError(
            "--plot needs matplotlib; expected it installed, found none. "
            "Fix: pip install 'robo_resume[plot]'."
        ) from exc
    names = list(consumed)
    keys = set(expected)
    for c in consumed.values():
        keys |= set(c)
    n = max(keys) + 1 if keys else 1
    grid = np.zeros((len(names), n), dtype=np.int64)
    for r, name in enumerate(names):
        for i in range(n):
            want, got = expected.get(i, 0), consumed[name].get(i, 0)
            if want == 0 and got == 0:
                grid[r, i] = 0
            elif got == want:
                grid[r, i] = 1
            elif got > want:
                grid[r, i] = 2
            else:
                grid[r, i] = 3
    fig, ax = plt.subplots(figsize=(12, 0.6 + 0.55 * len(names)), dpi=110)
    cmap = ListedColormap([c for _, c in CATEGORIES])
    ax.imshow(grid, aspect="auto", cmap=cmap, vmin=0, vmax=3, interpolation="nearest")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(
        [
            f"{name}: {int((grid[r] == 2).sum())} replayed, {int((grid[r] == 3).sum())} lost"
            for r, name in enumerate(names)
        ]
    )
    ax.set_xlabel("frame index")
    ax.set_title(title, fontsize=10)
    ax.legend(
        handles=[Patch(color=c, label=label) for label, c in CATEGORIES],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.35 if len(names) > 2 else -0.6),
        ncol=4,
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
