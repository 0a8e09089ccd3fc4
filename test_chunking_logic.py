"""The overlap suite: does a crashed and resumed run see every frame exactly once?

Run it as a script to print the tables (real DataLoaders with workers, on a generated dataset
or on ``--root PATH``)::

    python test_chunking_logic.py
    python test_chunking_logic.py --root ../shared/datasets/open50 --episodes 0,3,4 --num-workers 2

pytest collects the same file and asserts that robo_resume's arithmetic and cursor resumes
replay 0 frames, lose 0 frames and keep the uninterrupted order, and that the two baselines do
not (so the suite can tell a broken resume from a working one).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from robo_resume.audit import SCENARIOS, audit, consume
from robo_resume.dataset import ChunkedEpisodeDataset
from robo_resume.testing import make_dataset

LENGTHS = (37, 52, 29, 61, 44, 33, 18)


def _dataset(tmp: Path) -> Path:
    root = tmp / "overlap_ds"
    if not (root / "meta" / "info.json").is_file():
        make_dataset(root, episode_lengths=LENGTHS, num_cameras=1, overwrite=True)
    return root


def per_worker_orders(root, *, num_workers, batch_size, seed, **kw):
    """index values each worker role produced, in order, over one epoch of a real DataLoader."""
    batches, _ = consume(
        lambda **k: ChunkedEpisodeDataset(root, batch_size=batch_size, seed=seed, **kw, **k),
        num_workers=num_workers,
    )
    orders: dict[int, list[int]] = {}
    for role, idx in batches:
        orders.setdefault(role, []).extend(idx)
    return orders


# ---------------------------------------------------------------------------------------------
# pytest
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return _dataset(tmp_path_factory.mktemp("overlap"))


@pytest.mark.parametrize(
    ("num_workers", "batch_size", "crash_at"),
    [(2, 8, 3), (2, 8, 4), (3, 7, 5), (0, 8, 5), (2, 32, 1)],
)
def test_resume_is_exact(root, num_workers, batch_size, crash_at):
    _, results = audit(
        root, num_workers=num_workers, batch_size=batch_size, crash_at=crash_at, chunk_frames=16
    )
    by = {r.scenario: r for r in results}
    for name in ("arithmetic", "cursor"):
        r = by[name]
        assert (r.replayed, r.lost, r.same_order) == (0, 0, True), r
    assert by["restart"].replayed == crash_at * batch_size
    if num_workers > 1 and crash_at % num_workers:
        naive = by["naive"]
        assert naive.replayed > 0 and naive.lost > 0, naive
        assert not naive.same_order


def test_shuffle_is_deterministic_per_worker(root):
    a = per_worker_orders(root, num_workers=2, batch_size=8, seed=3, chunk_frames=16)
    b = per_worker_orders(root, num_workers=2, batch_size=8, seed=3, chunk_frames=16)
    c = per_worker_orders(root, num_workers=2, batch_size=8, seed=4, chunk_frames=16)
    assert a == b
    assert a != c
    assert a[0] != a[1]
    assert not set(a[0]) & set(a[1])  # workers never share a frame within an epoch


# ---------------------------------------------------------------------------------------------
# script
# ---------------------------------------------------------------------------------------------
def _table(rows, header):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", help="LeRobot dataset (default: generate one)")
    p.add_argument("--episodes", help="comma-separated episode indices")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--chunk-frames", type=int, default=16)
    p.add_argument("--crash-at", default="1,4,5,11", help="comma-separated steps")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    root = Path(a.root) if a.root else _dataset(Path(tempfile.mkdtemp(prefix="overlap_")))
    kw = dict(chunk_frames=a.chunk_frames)
    if a.episodes:
        kw["episodes"] = [int(x) for x in a.episodes.split(",")]
    W, B = a.num_workers, a.batch_size
    print(f"dataset: {root}")
    print(f"DataLoader: num_workers={W}, batch_size={B}, chunk_frames={a.chunk_frames}\n")

    print("1. Deterministic shuffling per worker (two runs per seed, real DataLoaders)")
    rows = []
    runs = {
        s: per_worker_orders(root, num_workers=W, batch_size=B, seed=s, **kw)
        for s in (a.seed, a.seed + 1)
    }
    again = per_worker_orders(root, num_workers=W, batch_size=B, seed=a.seed, **kw)
    for s, orders in runs.items():
        for role, order in sorted(orders.items()):
            rows.append(
                (
                    s,
                    role,
                    " ".join(map(str, order[:8])) + " ...",
                    "yes" if s != a.seed or again[role] == order else "NO",
                )
            )
    _table(rows, ("seed", "worker", "first indices", "same on rerun"))

    print(f"\n2. How frames spread over workers (one epoch, seed {a.seed})")
    ds = ChunkedEpisodeDataset(root, batch_size=B, seed=a.seed, **kw)
    ep_of = {}
    for e in ds.episodes:
        info = ds.meta.episode(e)
        for i in range(info.dataset_from_index, info.dataset_to_index):
            ep_of[i] = e
    rows = []
    orders = runs[a.seed]
    for role, order in sorted(orders.items()):
        eps = Counter(ep_of[i] for i in order)
        rows.append(
            (
                role,
                len(order),
                len(set(order)),
                len(eps),
                " ".join(f"{e}:{n}" for e, n in sorted(eps.items())),
            )
        )
    total = sum(len(o) for o in orders.values())
    _table(rows, ("worker", "frames", "unique", "episodes", "episode:frames"))
    print(
        f"dataset frames {ds.fingerprint['total_frames']}, delivered {total} "
        f"(tail dropped so every stream has equal length: "
        f"{ds.fingerprint['total_frames'] - total})"
    )

    print("\n3. Crash at step s, resume, compare with the uninterrupted run")
    rows = []
    ok = True
    for s in (int(x) for x in a.crash_at.split(",")):
        _, results = audit(root, num_workers=W, batch_size=B, crash_at=s, seed=a.seed, **kw)
        for r in results:
            rows.append(
                (
                    s,
                    s % max(W, 1),
                    s * B,
                    r.scenario,
                    r.consumed,
                    r.replayed,
                    r.lost,
                    "yes" if r.same_order else "no",
                )
            )
            if r.scenario in ("arithmetic", "cursor"):
                ok &= r.replayed == 0 and r.lost == 0 and r.same_order
    _table(
        rows,
        ("step", "s%W", "pre-crash", "scenario", "consumed", "replayed", "lost", "same order"),
    )
    print("\nscenarios: " + ", ".join(SCENARIOS))
    print("robo_resume resume exact: " + ("yes" if ok else "NO"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
