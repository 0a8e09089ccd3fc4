"""torchdata's StatefulDataLoader (issue 13 item 8): the state carries the dataset fingerprint
and topology, is checked like ``resume_state``, and ``dataset.dataloader(stateful=True)``
resumes exactly over whole batches."""

from __future__ import annotations

import json

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from robo_resume import ChunkedEpisodeDataset, worker_context
from robo_resume.errors import ResumeStateError

LENGTHS = (31, 44, 27, 19)


@pytest.fixture(scope="module")
def root(factory):
    return factory(episode_lengths=LENGTHS, num_cameras=0).root


def make(root, **kw):
    return ChunkedEpisodeDataset(root, **{"batch_size": 7, "seed": 2, "chunk_frames": 8, **kw})


def saved_state(loader, steps):
    """(indices of the first ``steps`` batches, the JSON round-tripped state after them)."""
    before = []
    for batch in loader:
        before.append(batch["index"].tolist())
        if len(before) == steps:
            state = loader.state_dict()
            break
    return before, json.loads(json.dumps(state, default=lambda o: o.tolist()))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resumes_whole_batches_exactly(root, num_workers):
    full = [b["index"].tolist() for b in make(root).dataloader(num_workers=num_workers)]
    before, state = saved_state(make(root).dataloader(num_workers=num_workers, stateful=True), 5)
    again = make(root).dataloader(num_workers=num_workers, stateful=True)
    again.load_state_dict(state)
    after = [b["index"].tolist() for b in again]
    assert before + after == full


def test_plain_stateful_dataloader_refuses_another_seed_or_selection(root):
    _, state = saved_state(StatefulDataLoader(make(root), batch_size=7), 3)
    assert state["dataset_state"]["fingerprint"] == make(root).fingerprint
    with pytest.raises(
        ResumeStateError,
        match=r"different 'seed'.*Expected seed=3 .this dataset.*Found seed=2 .the state",
    ):
        loader = StatefulDataLoader(make(root, seed=3), batch_size=7)
        loader.load_state_dict(state)
        next(iter(loader))
    with pytest.raises(ResumeStateError, match=r"different 'episodes'.*episodes 0-1 vs 0-3"):
        loader = StatefulDataLoader(make(root, episodes=[0, 1]), batch_size=7)
        loader.load_state_dict(state)
        next(iter(loader))


def test_stateful_loader_checks_in_load_state_dict(root):
    _, state = saved_state(make(root).dataloader(num_workers=2, stateful=True), 3)
    # another seed: resume_state's own message, before any worker starts
    with pytest.raises(ResumeStateError, match=r"different 'seed'.*Expected seed=5"):
        make(root, seed=5).dataloader(num_workers=2, stateful=True).load_state_dict(state)
    # another num_workers: ours (torchdata would assert), naming both topologies and the fix
    for workers in (0, 3):
        loader = make(root).dataloader(num_workers=workers, stateful=True)
        with pytest.raises(
            ResumeStateError,
            match=rf"another topology.*Expected world_size=1, num_workers={workers} "
            r".this loader.*Found world_size=1, num_workers=2 .the state.*resume_state=",
        ):
            loader.load_state_dict(state)
    _, state0 = saved_state(make(root).dataloader(num_workers=0, stateful=True), 3)
    with pytest.raises(ResumeStateError, match=r"num_workers=0 .the state.*re-partitions"):
        make(root).dataloader(num_workers=2, stateful=True).load_state_dict(state0)


def test_plain_stateful_dataloader_other_workers_get_our_error(root):
    """2 workers saved, 1 loads: the dataset sees it in the worker, never a bare assert."""
    ctx = worker_context()
    _, state = saved_state(
        StatefulDataLoader(make(root), batch_size=7, num_workers=2, multiprocessing_context=ctx), 3
    )
    loader = StatefulDataLoader(
        make(root), batch_size=7, num_workers=1, multiprocessing_context=ctx
    )
    loader.load_state_dict(state)
    with pytest.raises(ResumeStateError, match=r"another topology.*num_workers=2 .the state"):
        next(iter(loader))


def test_stateful_with_a_collate_fn_is_refused_not_ignored(root):
    """stateful=True yields whole batches; a collate_fn beside it would be silently unused."""
    ds = ChunkedEpisodeDataset(root, batch_size=4)
    with pytest.raises(ValueError, match=r"stateful=True\) builds whole batches.*Fix: drop"):
        ds.dataloader(stateful=True, collate_fn=list)
