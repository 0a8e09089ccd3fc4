"""Resume states with values no run can produce get a ResumeStateError naming the field, the
limit and the fix: positions past the end of their stream (checked against the plan), epochs,
batch counts and resume steps near 2^63, more workers than a stream table holds."""

from __future__ import annotations

import pytest

from robo_resume import ChunkedEpisodeDataset, ResumeStateError
from robo_resume.state import MAX_STATE_INT, MAX_WORKERS, ResumeState, StreamCursor

pytestmark = pytest.mark.timeout(60)

LENGTHS = (6, 9, 5)


@pytest.fixture(scope="module")
def root(factory):
    return factory(episode_lengths=LENGTHS, codec="h264", gop=4).root


def state(ds: ChunkedEpisodeDataset, *cursors, num_workers: int = 0, batches: int = 1) -> dict:
    return ResumeState(
        fingerprint=ds.fingerprint,
        world_size=1,
        num_workers=num_workers,
        batches=batches,
        cursors=tuple(StreamCursor(0, role, e, p) for role, (e, p) in enumerate(cursors)),
    ).to_dict()


@pytest.mark.parametrize("position", [21, 10**6, MAX_STATE_INT])
def test_cursor_past_the_end_of_its_stream_is_refused(root, position):
    ds = ChunkedEpisodeDataset(root, batch_size=4)
    q = ds.schedule(0).frames_per_stream
    assert q == sum(LENGTHS) and position > q
    resumed = ChunkedEpisodeDataset(root, batch_size=4, resume_state=state(ds, (0, position)))
    match = (
        rf"cursor stands past the end of its stream.*Expected position <= {q} \(the frames rank 0,"
        rf" role 0 emits in epoch 0.*Found position {position}.*Fix"
    )
    with pytest.raises(ResumeStateError, match=match):
        resumed.start_point(0)
    with pytest.raises(ResumeStateError, match=match):
        next(iter(resumed.dataloader()))
    with pytest.raises(ResumeStateError, match=match):  # elastic: re-partitioned over 2 workers
        resumed.start_point(2)


def test_cursor_at_the_end_of_its_stream_starts_the_next_epoch(root):
    ds = ChunkedEpisodeDataset(root, batch_size=4)
    q = ds.schedule(0).frames_per_stream
    resumed = ChunkedEpisodeDataset(root, batch_size=4, resume_state=state(ds, (0, q), batches=5))
    assert resumed.start_point(0)[1] == [(1, 0)]


def test_position_beyond_the_state_limit_is_refused(root):
    ds = ChunkedEpisodeDataset(root, batch_size=4)
    bad = state(ds, (0, 4))
    bad["cursors"][0][3] = 10**18
    with pytest.raises(
        ResumeStateError,
        match=rf"stream cursor field 'position'.*int in \[0, {MAX_STATE_INT}\].*Found {10**18}",
    ):
        ChunkedEpisodeDataset(root, batch_size=4, resume_state=bad)


@pytest.mark.parametrize("field", ["epoch", "batches"])
def test_values_near_2_63_are_refused(root, field):
    ds = ChunkedEpisodeDataset(root, batch_size=4)
    bad = state(ds, (0, 4))
    if field == "epoch":
        bad["cursors"][0][2] = 2**63 - 1
    else:
        bad["batches"] = 2**63 + 5
    with pytest.raises(ResumeStateError, match=rf"field '{field}'.*{MAX_STATE_INT}.*Found 9"):
        ChunkedEpisodeDataset(root, batch_size=4, resume_state=bad)


@pytest.mark.parametrize("step", [2**63 - 4, 2**62, 2**64])
def test_resume_step_near_2_63_is_refused(root, step):
    with pytest.raises(
        ResumeStateError, match=rf"resume_step is beyond.*<= {MAX_STATE_INT}.*resume_step={step}"
    ):
        ChunkedEpisodeDataset(root, batch_size=4, resume_step=step)


@pytest.mark.parametrize("where", ["top", "elastic"])
def test_too_many_workers_names_the_limit(root, where):
    ds = ChunkedEpisodeDataset(root, batch_size=4)
    bad = state(ds, (0, 4))
    if where == "top":
        bad["num_workers"] = 200
        field = "num_workers"
    else:
        level = {"world_size": 1, "num_workers": 200, "batch_size": 4, "epoch": None}
        bad["elastic"] = {"epoch": 0, "origin": [{**level, "cursors": []}]}
        field = "elastic.num_workers"
    with pytest.raises(
        ResumeStateError,
        match=rf"'{field}' is above the limit.*at most {MAX_WORKERS} DataLoader workers.*"
        rf"{field}=200.*Fix",
    ):
        ChunkedEpisodeDataset(root, batch_size=4, resume_state=bad)
