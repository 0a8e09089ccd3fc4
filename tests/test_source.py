"""DataSource: one options object for where data comes from and which of it, for both datasets.

A DataSource and its keyword shorthand build the same dataset (fingerprint and batches); renamed
features appear under their new names in items and batches, values unchanged, with and without
workers, windows named by the new name; bad combinations are refused with the fix.
"""

from __future__ import annotations

import pytest
import torch

from robo_resume import ChunkedEpisodeDataset, DataSource, MixedDataset, MixSource
from robo_resume.keys import CURSOR_KEY

CAM0, CAM1 = "observation.images.cam0", "observation.images.cam1"
FRONT = "observation.images.front"


@pytest.fixture(scope="module")
def root(factory):
    return factory(episode_lengths=(9, 14, 6, 11), num_cameras=2).root


def _batches(ds, num_workers=0):
    return list(ds.dataloader(num_workers=num_workers))


def test_a_datasource_and_its_shorthand_build_the_same_dataset(root):
    a = ChunkedEpisodeDataset(
        DataSource(root, episodes=[0, 2, 3], chunk_frames=5), batch_size=4, seed=3
    )
    b = ChunkedEpisodeDataset(root, episodes=[0, 2, 3], chunk_frames=5, batch_size=4, seed=3)
    c = ChunkedEpisodeDataset(root=root, episodes=[0, 2, 3], chunk_frames=5, batch_size=4, seed=3)
    assert a.fingerprint == b.fingerprint == c.fingerprint
    assert a.source == b.source == c.source
    ia = [x["index"].tolist() for x in _batches(a)]
    assert ia == [x["index"].tolist() for x in _batches(b)]
    assert sorted(i for batch in ia for i in batch) == sorted(
        i for e in (0, 2, 3) for i in range(*_span(a, e))
    )


def _span(ds, e):
    ep = ds.meta.episode(e)
    return ep.dataset_from_index, ep.dataset_from_index + ep.length


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("image_dtype", ["float32", "uint8"])
def test_renamed_features_hold_the_same_values_under_the_new_name(root, num_workers, image_dtype):
    kw = dict(batch_size=4, seed=1, image_dtype=image_dtype)
    want = _batches(ChunkedEpisodeDataset(root, **kw), num_workers)
    got = _batches(
        ChunkedEpisodeDataset(DataSource(root, features={CAM0: FRONT, CAM1: None}), **kw),
        num_workers,
    )
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        assert FRONT in g and CAM0 not in g and CAM1 not in g
        assert set(g) == (set(w) - {CAM0, CAM1}) | {FRONT}
        assert g[FRONT].dtype == w[CAM0].dtype  # float conversion found the renamed camera
        assert torch.equal(g[FRONT], w[CAM0])
        assert torch.equal(g[CURSOR_KEY], w[CURSOR_KEY])


def test_windows_and_pad_masks_follow_the_new_name(root):
    dt = {"action": [0.0, 0.1, 0.2]}
    want = _batches(
        ChunkedEpisodeDataset(root, batch_size=4, seed=2, delta_timestamps={**dt, CAM0: [-0.1, 0]})
    )
    ds = ChunkedEpisodeDataset(
        DataSource(root, features={CAM0: FRONT, "action": "act"}),
        batch_size=4,
        seed=2,
        delta_timestamps={"act": dt["action"], FRONT: [-0.1, 0]},
    )
    got = _batches(ds)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g["act"], w["action"]) and torch.equal(
            g["act_is_pad"], w["action_is_pad"]
        )
        assert torch.equal(g[FRONT], w[CAM0])
        assert torch.equal(g[f"{FRONT}_is_pad"], w[f"{CAM0}_is_pad"])
        assert "action" not in g and "action_is_pad" not in g


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_plain_dataloader_gets_renamed_items(root, num_workers):
    """Held batches keep their values (a worker's ring buffers are found by the new name)."""
    ds = ChunkedEpisodeDataset(DataSource(root, features={CAM0: FRONT}), batch_size=2, seed=1)
    plain = list(torch.utils.data.DataLoader(ds, batch_size=2, num_workers=num_workers))
    want = _batches(ChunkedEpisodeDataset(root, batch_size=2, seed=1), num_workers)
    assert len(want) > 8  # more batches per worker than its ring holds
    assert [b["index"].tolist() for b in plain] == [b["index"].tolist() for b in want]
    for g, w in zip(plain, want, strict=True):
        assert torch.equal(g[FRONT], w[CAM0]) and CAM0 not in g


def test_a_mix_source_takes_a_datasource(root):
    src = DataSource(root, episodes=[0, 1], features={CAM1: None})
    kw = dict(batch_size=4, seed=5, exhausted="stop")
    a = MixedDataset(
        [MixSource(src, 2.0), MixSource(root, episodes=[2, 3], keys={CAM1: None})], **kw
    )
    b = MixedDataset(
        [
            MixSource(root, 2.0, episodes=[0, 1], keys={CAM1: None}),
            MixSource(DataSource(root, episodes=[2, 3], features={CAM1: None})),
        ],
        **kw,
    )
    assert a.fingerprint == b.fingerprint
    ba, bb = _batches(a), _batches(b)
    assert [x["index"].tolist() for x in ba] == [x["index"].tolist() for x in bb]
    assert all(CAM1 not in x and CAM0 in x for x in ba)
    assert a.sources[0].episodes == [0, 1] and a.sources[1].keys == {CAM1: None}


@pytest.mark.parametrize(
    "call,error,pattern",
    [
        (
            lambda r: ChunkedEpisodeDataset(DataSource(r), episodes=[0], batch_size=4),
            ValueError,
            r"got a DataSource and DataSource fields as keywords.*Fix: put episodes into",
        ),
        (
            lambda r: ChunkedEpisodeDataset(r, root=r, batch_size=4),
            ValueError,
            r"got the dataset root twice",
        ),
        (
            lambda r: ChunkedEpisodeDataset(r, episode=[0], batch_size=4),
            TypeError,
            r"unexpected keyword argument 'episode'.*root, repo_id, revision, episodes",
        ),
        (
            lambda r: ChunkedEpisodeDataset(batch_size=4),
            ValueError,
            r"A DataSource needs a root or a repo_id.*Found neither",
        ),
        (
            lambda r: ChunkedEpisodeDataset(7, batch_size=4),
            TypeError,
            r"Expected a dataset folder \(str or Path\) or a DataSource.*Found int: 7",
        ),
        (
            lambda r: DataSource(r, chunk_frames=0),
            ValueError,
            r"chunk_frames must be a positive int.*Found 0",
        ),
        (
            lambda r: DataSource(r, features={CAM0: "x", CAM1: "x"}),
            ValueError,
            r"gives two features the same name.*\['x'\]",
        ),
        (
            lambda r: ChunkedEpisodeDataset(DataSource(r, features={"nope": "x"}), batch_size=4),
            ValueError,
            r"renames keys the dataset does not have.*Found \['nope'\]",
        ),
        (
            lambda r: ChunkedEpisodeDataset(
                DataSource(r, features={"action": "act"}),
                batch_size=4,
                delta_timestamps={"action": [0.0]},
            ),
            ValueError,
            r"delta_timestamps names a feature by its old name.*\['act'\]",
        ),
        (
            lambda r: MixSource(DataSource(r), keys={CAM1: None}),
            ValueError,
            r"MixSource got keys= and features",
        ),
        (lambda r: MixSource(r, 0), ValueError, r"weight must be a positive number"),
    ],
)
def test_bad_sources_are_refused_with_the_fix(root, call, error, pattern):
    with pytest.raises(error, match=pattern):
        call(root)
