"""Spawn and forkserver workers map the dataset's large arrays from shared memory (issue 15).

A worker started with ``spawn`` or ``forkserver`` receives the dataset by pickle. The metadata
columns, the plan and the shared epoch layout now go through shared memory
(:mod:`robo_resume.stream.shared_arrays`): the worker's arrays are read-only views of pages the
training process also maps, not private copies. These tests check that (in process, with a
stand-in for a starting process, and in real forkserver workers), that any other pickling stays
self-contained, that the training process keeps one copy per array (flat across epochs), that
nothing is left in /dev/shm, and that the frames are the same as with fork workers.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import pickle
from multiprocessing import context
from multiprocessing.popen_spawn_posix import _DupFd
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch
from torch.utils.data import get_worker_info

from robo_resume import ChunkedEpisodeDataset, MixedDataset, MixSource
from robo_resume.audit import consume
from robo_resume.stream import shared_arrays
from robo_resume.stream.shared_arrays import SharedArrays, shared_mapping
from robo_resume.testing import make_dataset


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_dataset(
        tmp_path_factory.mktemp("shm") / "ds", episode_lengths=(23, 31, 17, 40, 29, 12)
    ).root


@pytest.fixture
def share_all(monkeypatch):
    """Share every read-only array, however small (the factory's are a few hundred bytes)."""
    monkeypatch.setattr(shared_arrays, "MIN_SHARED_BYTES", 1)


class _StartingPopen:
    """What a spawn Popen offers the pickler while it starts a process: the descriptors to
    hand over (duplicated here, so that this process can unpickle what it pickled)."""

    DupFd = _DupFd

    def duplicate_for_child(self, fd: int) -> int:
        return os.dup(fd)


@contextlib.contextmanager
def _starting_process():
    context.set_spawning_popen(_StartingPopen())
    try:
        yield
    finally:
        context.set_spawning_popen(None)


def _for_worker(obj):
    """``obj`` pickled as ``Process.start`` pickles a spawn worker's arguments, and unpickled."""
    with _starting_process():
        data = ForkingPickler.dumps(obj)
    return pickle.loads(data), len(data)


def _big_arrays(ds):
    cols = ds.meta.columns
    arrays = {
        "episode_index": cols.episode_index,
        "length": cols.length,
        "dataset_from_index": cols.dataset_from_index,
        "data_row_start": cols.data_row_start,
        "plan.start": ds.chunks.start,
        "plan.dataset_from_index": ds.chunks.dataset_from_index,
    }
    for cam, v in cols.videos.items():
        arrays[f"{cam}.from_timestamp"] = v.from_timestamp
    layout = ds.schedule(2)._layout
    if layout is not None:
        arrays["layout.perm"], arrays["layout.offsets"] = layout[1]
    return arrays


def test_a_worker_maps_the_arrays_instead_of_copying_them(root, share_all):
    ds = ChunkedEpisodeDataset(root, batch_size=4, seed=3, chunk_frames=8)
    ds.share_schedule(2)
    copy, _ = _for_worker(ds)
    want, got = _big_arrays(ds), _big_arrays(copy)
    assert set(got) == set(want) and "layout.perm" in got
    for name, a in got.items():
        assert shared_mapping(a) is not None, f"{name} is a private copy"
        assert not a.flags.writeable, name
        assert a.dtype == want[name].dtype and np.array_equal(a, want[name]), name
    assert shared_mapping(want["length"]) is None  # the training process keeps its own arrays
    g = 1
    assert np.array_equal(copy.schedule(2).frame_indices(0, g), ds.schedule(2).frame_indices(0, g))
    assert copy.fingerprint == ds.fingerprint


def test_any_other_pickling_is_self_contained(root, share_all):
    ds = ChunkedEpisodeDataset(root, batch_size=4, chunk_frames=8)
    ds.share_schedule(2)
    _for_worker(ds)  # shared once: a later plain pickle still carries the bytes
    data = pickle.dumps(ds)
    del ds
    gc.collect()
    copy = pickle.loads(data)
    fresh = ChunkedEpisodeDataset(root, batch_size=4, chunk_frames=8)
    fresh.share_schedule(2)
    for name, a in _big_arrays(copy).items():
        assert shared_mapping(a) is None, name
        assert np.array_equal(a, _big_arrays(fresh)[name]), name
    assert copy.fingerprint == fresh.fingerprint


def test_small_and_writable_arrays_are_pickled_as_bytes(monkeypatch):
    monkeypatch.setattr(shared_arrays, "MIN_SHARED_BYTES", 1024)
    big = np.arange(1000, dtype=np.int64)
    big.flags.writeable = False
    writable = np.arange(1000, dtype=np.int64)  # a write would reach every worker
    small = big[:10].copy()
    small.flags.writeable = False
    held = SharedArrays()
    with _starting_process():
        out = pickle.loads(held.dumps({"big": big, "writable": writable, "small": small}))
    assert shared_mapping(out["big"]) is not None and np.array_equal(out["big"], big)
    assert shared_mapping(out["writable"]) is None and out["writable"].flags.writeable
    assert shared_mapping(out["small"]) is None and np.array_equal(out["small"], small)


def test_one_copy_per_array_flat_across_epochs(root, share_all):
    ds = ChunkedEpisodeDataset(root, batch_size=4, seed=1, chunk_frames=8)
    held = []
    for epoch in range(3):
        ds.epochs.worker(0).playing(epoch - 1)  # the loader's next epoch
        ds.share_schedule(2)
        for _ in range(2):  # two workers start: one segment per array for both
            copy, _ = _for_worker(ds)
            assert copy.schedule(2)._layout[0] == epoch
        held.append(dict(ds._shared._held))
    assert len(held[0]) == len(held[1]) == len(held[2])
    assert sum(s.size for _, s in held[0].values()) == sum(s.size for _, s in held[2].values())
    length = id(ds.meta.columns.length)
    assert held[2][length][1] is held[0][length][1]  # reused, not copied again
    layout0 = [k for k in held[0] if k not in held[1]]
    assert len(layout0) == 2  # epoch 0's permutation and offsets were released


def test_no_shared_memory_falls_back_to_bytes(root, share_all, monkeypatch, caplog):
    def full(name, flags=0):
        raise OSError(24, "Too many open files")

    ds = ChunkedEpisodeDataset(root, batch_size=4, chunk_frames=8)
    monkeypatch.setattr(os, "memfd_create", full)
    with caplog.at_level(logging.WARNING, logger="robo_resume"):
        copy, _ = _for_worker(ds)
        _for_worker(ds)
    assert [r.message.count("no shared memory") for r in caplog.records] == [1]
    assert shared_mapping(copy.meta.columns.length) is None
    assert np.array_equal(copy.meta.columns.length, ds.meta.columns.length)


def _check_worker_arrays(worker_id):  # a worker_init_fn: runs in each forkserver worker
    ds = get_worker_info().dataset
    ds = getattr(ds, "dataset", ds)  # dataloader(): the batches of the dataset
    for name, a in _big_arrays(ds).items():
        if shared_mapping(a) is None:
            raise AssertionError(f"worker {worker_id}: {name} is a private copy")


def _shm_leftovers(before: set[str]) -> list[str]:
    """Files this process made in /dev/shm since ``before`` (torch names them
    ``torch_<pid>_...``; other processes on the machine may make their own meanwhile, so only
    this process's names count)."""
    new = set(os.listdir("/dev/shm")) - before
    return sorted(n for n in new if n.startswith((f"torch_{os.getpid()}_", "robo_resume")))


@pytest.mark.parametrize("strategy", ["file_descriptor", "file_system"])
def test_shared_arrays_have_no_name_in_dev_shm(root, share_all, strategy):
    """The memory files are anonymous whatever torch's sharing strategy: nothing to leave."""
    old = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy(strategy)
    try:
        ds = ChunkedEpisodeDataset(root, batch_size=4, chunk_frames=8)
        ds.share_schedule(2)
        before = set(os.listdir("/dev/shm"))
        copy, _ = _for_worker(ds)
        assert shared_mapping(copy.meta.columns.length) is not None
        assert set(os.listdir("/dev/shm")) - before == set()
    finally:
        torch.multiprocessing.set_sharing_strategy(old)


def test_forkserver_workers_map_the_arrays_and_leave_nothing_behind(root, share_all):
    before = set(os.listdir("/dev/shm"))

    def make(**k):
        return ChunkedEpisodeDataset(root, batch_size=4, seed=2, chunk_frames=8, **k)

    fork, _ = consume(make, num_workers=2, epochs=2)
    served, _ = consume(
        make,
        num_workers=2,
        epochs=2,
        loader_kwargs={
            "multiprocessing_context": "forkserver",
            "worker_init_fn": _check_worker_arrays,
        },
    )
    assert [b for _, b in served] == [b for _, b in fork]
    # a plain DataLoader (items, no shared layout) maps the metadata and the plan too
    ds = make()
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=4,
        num_workers=2,
        multiprocessing_context="forkserver",
        worker_init_fn=_check_worker_arrays,
    )
    got = sorted(i for b in loader for i in b["index"].tolist())
    want = np.concatenate([ds.schedule(2).frame_indices(0, g) for g in range(2)])
    assert got == sorted(want.tolist())
    del loader, ds
    gc.collect()
    assert _shm_leftovers(before) == []


def test_a_worker_keeps_its_mapping_when_the_training_process_drops_its_own(root, share_all):
    def run(method, drop):
        ds = ChunkedEpisodeDataset(root, batch_size=4, seed=4, chunk_frames=8)
        loader = ds.dataloader(
            num_workers=2, multiprocessing_context=method, persistent_workers=True
        )
        out = []
        for epoch in range(2):
            out += [b["index"].tolist() for b in loader]
            if drop and epoch == 0:  # the workers live on, with what they mapped
                assert ds._shared._held
                ds._shared._held.clear()
                gc.collect()
        return out

    assert run("forkserver", drop=True) == run("fork", drop=False)


def test_a_mix_sends_each_source_s_arrays_through_shared_memory(root, share_all):
    mix = MixedDataset([MixSource(root, 1.0), MixSource(root, 2.0)], batch_size=4)
    copy, _ = _for_worker(mix)
    for got, want in zip(copy.datasets, mix.datasets, strict=True):
        for name, a in _big_arrays(got).items():
            assert shared_mapping(a) is not None, name
            assert np.array_equal(a, _big_arrays(want)[name]), name
