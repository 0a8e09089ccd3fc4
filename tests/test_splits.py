"""Episode selection: HF-style slice strings and seeded splits (robo_resume.splits)."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from robo_resume import ChunkedEpisodeDataset, LeRobotReader, ResumeStateError, load_metadata
from robo_resume.audit import consume
from robo_resume.reader import select_episodes
from robo_resume.splits import (
    Split,
    parse_selection,
    resolve_selection,
    split_episodes,
    split_sizes,
)

LENGTHS = (7, 5, 9, 4, 6, 8, 5, 3, 6, 7)  # 10 episodes, 60 frames


@pytest.fixture(scope="module")
def tab(factory):
    return factory(episode_lengths=LENGTHS, num_cameras=0)


@pytest.fixture(scope="module")
def meta(tab):
    return load_metadata(tab.root)


# --------------------------------------------------------------------------- slice strings


def test_slice_strings_select_by_position(meta):
    assert select_episodes(meta, "train[:90%]") == tuple(range(9))
    assert select_episodes(meta, "train[90%:]") == (9,)
    assert select_episodes(meta, "[:90%]") == tuple(range(9))
    assert select_episodes(meta, "[2:5]") == (2, 3, 4)
    assert select_episodes(meta, "train[-3:]") == (7, 8, 9)
    assert select_episodes(meta, "train") == tuple(range(10))
    assert select_episodes(meta, "train[:20%]+train[-20%:]") == (0, 1, 8, 9)
    assert select_episodes(meta, " train [ 10% : 30% ] (closest)") == (1, 2)
    assert select_episodes(meta, "[:12.5%]") == (0,)  # round(1.25) = 1
    assert select_episodes(meta, "[5:100]") == (5, 6, 7, 8, 9)  # clamped like Python slices


def test_positions_are_ranks_not_episode_indices(meta):
    assert resolve_selection("[1:3]", [4, 10, 20, 30]) == (10, 20)
    assert resolve_selection("[50%:]", [30, 4, 20, 10]) == (20, 30)


def test_named_splits_come_from_info_json(meta):
    meta2 = dataclasses.replace(
        meta, info={**meta.info, "splits": {"train": "0:8", "test": "8:10"}}
    )
    assert select_episodes(meta2, "train") == tuple(range(8))
    assert select_episodes(meta2, "test") == (8, 9)
    assert select_episodes(meta2, "train[:50%]") == (0, 1, 2, 3)
    assert select_episodes(meta2, "[:50%]") == (0, 1, 2, 3, 4)  # no name: all episodes
    with pytest.raises(ValueError, match=r"unknown split.*one of \['test', 'train'\].*'val'"):
        select_episodes(meta2, "val[:10%]")
    bad = dataclasses.replace(meta, info={**meta.info, "splits": {"train": "all"}})
    with pytest.raises(ValueError, match=r"split 'train' is not an episode range.*'start:stop'"):
        select_episodes(bad, "train[:5]")


SPECS = [
    "train",
    "train[:90%]",
    "train[90%:]",
    "train[10:20]",
    "train[-5:]",
    "train[:-5]",
    "train[-33%:-10%]",
    "train[25%:75%]",
    "train[50%:]",
    "train[:1%]",
    "train[3:3]",
    "train[99%:]",
    "train[-150:7]",
]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 10, 33, 101, 250])
def test_slices_equal_hf_datasets_read_instruction(spec, n):
    """HF datasets (installed with lerobot) is the oracle of the position arithmetic."""
    arrow_reader = pytest.importorskip("datasets.arrow_reader")
    (want,) = arrow_reader.ReadInstruction.from_spec(spec).to_absolute({"train": n})
    (part,) = parse_selection(spec)
    assert part.bounds(n) == (want.from_, want.to)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 500),
    start=st.none() | st.integers(-120, 120),
    stop=st.none() | st.integers(-120, 120),
    pct=st.booleans(),
)
def test_slices_equal_hf_datasets_property(n, start, stop, pct):
    arrow_reader = pytest.importorskip("datasets.arrow_reader")
    unit = "%" if pct and (start is not None or stop is not None) else ""
    if unit:  # HF (and robo_resume) refuse percentages beyond 100
        start, stop = (None if b is None else max(-100, min(100, b)) for b in (start, stop))
    spec = "train[{}:{}]".format(
        "" if start is None else f"{start}{unit}", "" if stop is None else f"{stop}{unit}"
    )
    (want,) = arrow_reader.ReadInstruction.from_spec(spec).to_absolute({"train": n})
    (part,) = parse_selection(spec)
    assert part.bounds(n) == (want.from_, want.to)


@pytest.mark.parametrize("n", [1, 2, 3, 9, 10, 11, 47, 500])
def test_complementary_percent_slices_are_disjoint_and_cover(n):
    ids = list(range(n))
    for p in range(1, 100):
        a = b = ()
        try:
            a = resolve_selection(f"train[:{p}%]", ids)
        except ValueError:
            pass
        try:
            b = resolve_selection(f"train[{p}%:]", ids)
        except ValueError:
            pass
        assert not set(a) & set(b)
        assert sorted(a + b) == ids


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("", r"not a valid slice string.*Found '' \(empty\)"),
        ("   ", r"not a valid slice string"),
        (
            "train[a:b]",
            r"not a valid slice string.*Expected split\[start:stop\].*Found 'train\[a:b\]'",
        ),
        ("train[:90%", r"not a valid slice string"),
        ("train[:90%]+", r"not a valid slice string.*Found '' in 'train\[:90%\]\+'"),
        ("train[:150%]", r"percentage is out of range.*Found 'train\[:150%\]'"),
        ("train[1.5:3]", r"fractional episode position in 'train\[1.5:3\]'"),
        ("tr ain", r"not a valid slice string.*Fix: write bounds as integers"),
        ("train[10:50%]", r"mixes a percentage and an absolute bound.*add or remove the %"),
        ("train[:50%](pct1_dropremainder)", r"Unsupported rounding.*pct1_dropremainder"),
        ("train[:1%]", r"selects no episodes.*positions 0:0 of 10.*widen the slice"),
        ("[10:]", r"selects no episodes"),
        ("test[:5]", r"unknown split.*one of \['train'\].*Found 'test'"),
    ],
)
def test_bad_slice_strings_say_what_and_how_to_fix(meta, spec, match):
    with pytest.raises(ValueError, match=match):
        select_episodes(meta, spec)


# --------------------------------------------------------------------------- seeded splits


def test_split_sizes_largest_remainder():
    assert split_sizes(10, (0.9, 0.1)) == (9, 1)
    assert split_sizes(10, (1 / 3, 1 / 3, 1 / 3)) == (4, 3, 3)  # ties go to the earlier part
    assert split_sizes(5, (0.5, 0.5)) == (3, 2)
    assert split_sizes(10, (0.7, 0.2, 0.1)) == (7, 2, 1)  # no float noise: 0.1 is 1/10
    assert split_sizes(7, (0.5, 0.25, 0.25)) == (3, 2, 2)  # remainders .5, .75, .75
    assert split_sizes(0, (0.5, 0.5)) == (0, 0)
    assert split_sizes(3, (1.0,)) == (3,)


def fraction_tuples():
    return st.lists(st.integers(1, 1000), min_size=1, max_size=6).map(
        lambda w: tuple(x / sum(w) for x in w)
    )


@settings(max_examples=400, deadline=None)
@given(n=st.integers(1, 500), fractions=fraction_tuples(), seed=st.integers(0, 2**32))
def test_split_parts_are_disjoint_and_cover_property(n, fractions, seed):
    ids = list(range(3, 3 + 2 * n, 2))  # any sorted indices, not only 0..n-1
    sizes = split_sizes(n, fractions)
    assert sum(sizes) == n
    exact = [Fraction(f).limit_denominator(1_000_000) for f in fractions]
    for size, f in zip(sizes, exact, strict=True):
        assert abs(size - n * f / sum(exact)) < 1
    parts = split_episodes(ids, fractions, seed=seed, allow_empty=True)
    assert tuple(len(p) for p in parts) == sizes
    assert sorted(e for p in parts for e in p) == ids  # cover, and disjoint (no duplicates)
    assert all(list(p) == sorted(p) for p in parts)
    if 0 in sizes:
        with pytest.raises(ValueError, match="empty"):
            split_episodes(ids, fractions, seed=seed)
    else:
        assert split_episodes(ids, fractions, seed=seed) == parts
        for i in range(len(fractions)):
            assert Split(fractions, index=i, seed=seed).select(ids) == parts[i]


SPLIT_SCRIPT = """
import json
from robo_resume.splits import split_episodes
print(json.dumps([split_episodes(range(200), (0.8, 0.1, 0.1), seed=s) for s in (7, 8)]))
"""


def test_split_is_deterministic_across_processes():
    here = [split_episodes(range(200), (0.8, 0.1, 0.1), seed=s) for s in (7, 8)]
    out = subprocess.run(
        [sys.executable, "-c", SPLIT_SCRIPT],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "random"},
    )
    there = [tuple(tuple(p) for p in parts) for parts in json.loads(out.stdout)]
    assert there == here and here[0] != here[1]


def _reference_split(ids, sizes, seed):
    """The documented algorithm in plain Python ints: sort by splitmix64(salt + e), cut."""
    import numpy as np

    salt = int(
        np.random.SeedSequence(entropy=seed, spawn_key=(0x53504C54,)).generate_state(
            1, dtype=np.uint64
        )[0]
    )
    mask = (1 << 64) - 1

    def key(e):
        x = (salt + e) & mask
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        return x ^ (x >> 31)

    order = sorted(ids, key=key)
    out, a = [], 0
    for size in sizes:
        out.append(tuple(sorted(order[a : a + size])))
        a += size
    return tuple(out)


def test_split_is_pinned():
    """The same split on every machine and numpy version (SeedSequence hash + splitmix64)."""
    assert split_episodes(range(10), (0.7, 0.3), seed=0) == ((0, 2, 3, 4, 7, 8, 9), (1, 5, 6))
    assert split_episodes(range(10), (0.7, 0.3), seed=1) == ((0, 2, 4, 6, 7, 8, 9), (1, 3, 5))
    for seed in (0, 1, 2**40):
        ids = list(range(5, 305, 3))
        sizes = split_sizes(len(ids), (0.6, 0.3, 0.1))
        assert split_episodes(ids, (0.6, 0.3, 0.1), seed=seed) == _reference_split(ids, sizes, seed)


def test_split_depends_on_seed_and_shuffle():
    ids = range(100)
    a = split_episodes(ids, (0.9, 0.1), seed=0)
    b = split_episodes(ids, (0.9, 0.1), seed=1)
    assert a != b
    assert split_episodes(ids, (0.9, 0.1), seed=0, shuffle=False) == (
        tuple(range(90)),
        tuple(range(90, 100)),
    )
    assert a[1] != tuple(range(90, 100))  # seeded splits shuffle, slice strings do not


def test_split_of_meta_reader_and_indices_agree(tab, meta):
    parts = split_episodes(meta, (0.8, 0.2), seed=3)
    assert parts == split_episodes(range(10), (0.8, 0.2), seed=3)
    assert select_episodes(meta, Split((0.8, 0.2), index=1, seed=3)) == parts[1]
    train = LeRobotReader(tab.root, episodes=Split((0.8, 0.2), index=0, seed=3))
    val = LeRobotReader(tab.root, episodes=Split((0.8, 0.2), index=1, seed=3))
    assert train.episodes == parts[0] and val.episodes == parts[1]
    assert len(train) + len(val) == sum(LENGTHS)
    assert split_episodes(train, (0.5, 0.5), seed=0) == split_episodes(parts[0], (0.5, 0.5))
    assert {int(val[i]["episode_index"]) for i in range(len(val))} == set(parts[1])


def test_split_is_a_small_picklable_value():
    s = Split((0.9, 0.1), index=1, seed=5)
    assert pickle.loads(pickle.dumps(s)) == s
    assert repr(s) == "Split(fractions=(0.9, 0.1), index=1, seed=5, shuffle=True)"
    assert Split([0.5, 0.5]).fractions == (0.5, 0.5)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Split((0.9, 0.2)), r"do not sum to 1.*summing to 1\.1.*Fix: scale them"),
        (lambda: Split((90, 10)), r"do not sum to 1.*write \(0\.9, 0\.1\), not \(90, 10\)"),
        (lambda: Split(()), r"must be positive numbers"),
        (lambda: Split((1.0, 0.0)), r"must be positive numbers.*invalid: \[0\.0\]"),
        (lambda: Split((0.5, float("nan"))), r"must be positive numbers"),
        (lambda: Split("0.5,0.5"), r"must be a sequence of numbers"),
        (lambda: Split((0.5, 0.5), index=2), r"index is not one of the parts.*0\.\.1.*Found 2"),
        (lambda: Split((0.5, 0.5), seed=-1), r"non-negative int.*Found -1"),
        (
            lambda: split_episodes([1, 2, 3], (0.9, 0.1)),
            r"Splitting 3 episodes by \(0\.9, 0\.1\) leaves part\(s\) \[1\] empty"
            r".*sizes \(3, 0\).*split 10 or more episodes",
        ),
        (lambda: split_episodes([], (0.5, 0.5)), r"no episodes to split"),
        (lambda: split_episodes("abc", (0.5, 0.5)), r"needs episodes to split"),
    ],
)
def test_bad_splits_say_what_and_how_to_fix(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_empty_split_of_a_dataset_is_refused(tab):
    with pytest.raises(ValueError, match=r"Splitting 10 episodes by \(0\.99, 0\.01\)"):
        LeRobotReader(tab.root, episodes=Split((0.99, 0.01), index=0))


# --------------------------------------------------------------------------- resume


def _make(root, episodes):
    def make(**kw):
        return ChunkedEpisodeDataset(root, batch_size=4, seed=1, episodes=episodes, **kw)

    return make


def flat(batches):
    return [b for _, b in batches]


@pytest.mark.parametrize(
    ("same", "other"),
    [
        (Split((0.7, 0.3), index=0, seed=0), Split((0.7, 0.3), index=0, seed=1)),
        (Split((0.7, 0.3), index=0, seed=0), Split((0.7, 0.3), index=1, seed=0)),
        ("train[:70%]", "train[:80%]"),
    ],
)
def test_resume_refuses_another_split_and_continues_the_same(tab, same, other):
    make = _make(tab.root, same)
    full, _ = consume(make, num_workers=0)
    before, state = consume(make, num_workers=0, stop_after=3)
    assert state["fingerprint"]["episodes"] == make().fingerprint["episodes"]
    with pytest.raises(ResumeStateError, match="different 'episodes'"):
        _make(tab.root, other)(resume_state=state)
    after, _ = consume(make, num_workers=0, resume_state=state)
    assert flat(before) + flat(after) == flat(full)  # exact order, not sorted
    chosen = set(select_episodes(load_metadata(tab.root), same))
    starts = [sum(LENGTHS[:e]) for e in range(len(LENGTHS) + 1)]
    allowed = {i for e in chosen for i in range(starts[e], starts[e + 1])}
    assert {i for b in flat(full) for i in b} <= allowed
