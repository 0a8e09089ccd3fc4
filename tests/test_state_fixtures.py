"""Resume states written by older robo_resume versions load and resume exactly.

The files in tests/fixtures/states/ were written by tests/fixtures/states/make_states.py with the
code of the commit that added them (dataset states of format version 3, mix states of
``robo_resume.mix_state`` version 1) and are never regenerated. Each test rebuilds the same
datasets, replays the run up to the crash with today's code, resumes from the *old file*, and
checks that the frames equal the uninterrupted run's, batch for batch. A format change that
cannot read an old state, or reads it into another position, fails here.

The states were saved with the interleave order, the only one then: the runs before and
without the crash use it (``StreamTuning.fast()``), and the resumed run is built with today's
defaults, as after an upgrade, so it must adopt the state's order by itself.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from robo_resume import ChunkedEpisodeDataset, StreamTuning
from robo_resume.audit import consume

FAST = StreamTuning.fast()  # the order the states were saved with

HERE = Path(__file__).resolve().parent / "fixtures" / "states"
sys.path.insert(0, str(HERE))
import make_states as M  # noqa: E402

sys.path.remove(str(HERE))


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    """The fixtures' datasets, rebuilt under the same folder names (``a`` and ``b``)."""
    return M.roots(tmp_path_factory.mktemp("fixture_states"))


def load(name: str) -> dict:
    return json.loads((HERE / name).read_text())


def indices(batches) -> list[list[int]]:
    return [list(b) for _, b in batches]


@pytest.mark.parametrize("name", sorted(M.CASES))
def test_dataset_state_resumes_exactly(roots, name):
    a, _ = roots
    ds_kw, run = M.CASES[name]

    def make(**k):
        return ChunkedEpisodeDataset(a, **ds_kw, **k)

    workers = run["num_workers"]
    full, _ = consume(make, epochs=2, num_workers=workers, tuning=FAST)
    before, _ = consume(make, epochs=2, **run, tuning=FAST)
    left = len(full) - len(before)
    after, _ = consume(
        make, epochs=2, num_workers=workers, stop_after=left, resume_state=load(name)
    )
    got = indices(before) + indices(after)
    assert got == indices(full), f"{name}: the old state resumed other frames"


@pytest.mark.parametrize("name", sorted(M.MIX_CASES))
def test_mix_state_resumes_exactly(roots, name):
    a, b = roots
    mix_kw, run = M.MIX_CASES[name]

    def make(**k):
        return M.make_mix(a, b, **mix_kw, **k)

    workers = run["num_workers"]
    total = run["stop_after"] + 40
    full, _ = consume(make, num_workers=workers, stop_after=total, tuning=FAST)
    before, _ = consume(make, **run, tuning=FAST)
    after, _ = consume(
        make, num_workers=workers, stop_after=total - len(before), resume_state=load(name)
    )
    assert indices(before) + indices(after) == indices(full), f"{name}: other frames"


def test_elastic_state_resumes_every_frame_once(roots):
    """A state saved in a remainder epoch (2 workers, then 3): the epoch completes exactly once,
    and the old file resumes the same batches as a state written by today's code."""
    a, _ = roots
    kw = dict(batch_size=4, seed=3)

    def make(**k):
        return ChunkedEpisodeDataset(a, **kw, **k)

    first, s1 = consume(make, epochs=1, num_workers=2, stop_after=9, tuning=FAST)
    second, s2 = consume(make, epochs=1, num_workers=3, stop_after=4, resume_state=s1, tuning=FAST)
    rest_old, _ = consume(make, epochs=1, num_workers=3, resume_state=load(M.ELASTIC_CASE))
    rest_new, _ = consume(make, epochs=1, num_workers=3, resume_state=s2)
    assert indices(rest_old) == indices(rest_new)
    seen = Counter(i for part in (first, second, rest_old) for _, b in part for i in b)
    epoch, _ = consume(make, epochs=1, num_workers=2, tuning=FAST)
    want = Counter(i for _, b in epoch for i in b)
    assert seen == want, "the elastic resume from the old state lost or replayed frames"


def test_old_states_migrate_to_one_format(caplog):
    """Both old formats load as version 4 of one format: kind 'dataset' or 'mix' (the mix nests
    its sources' dataset states), each migration logged once at INFO."""
    from robo_resume.state import STATE_VERSION, ResumeState
    from robo_resume.state.mix import MixState

    caplog.set_level("INFO", logger="robo_resume")
    single = ResumeState.from_dict(load("dataset_v3_w2.json")).to_dict()
    assert (single["format"], single["version"], single["kind"]) == (
        "robo_resume.state",
        STATE_VERSION,
        "dataset",
    )
    assert "migrated a resume state from format version 3 to 4" in caplog.text
    mix = MixState.from_dict(load("mix_v1_w2.json")).to_dict()
    assert (mix["format"], mix["version"], mix["kind"]) == ("robo_resume.state", 4, "mix")
    assert [s["kind"] for s in mix["sources"]] == ["dataset", "dataset"]
    assert "migrated a mix state from format 'robo_resume.mix_state' version 1" in caplog.text
    assert MixState.from_dict(mix).to_dict() == mix  # the new format reads back unchanged


def test_a_state_of_the_other_kind_names_the_right_class(roots):
    from robo_resume.errors import ResumeStateError

    a, b = roots
    mix_state = load("mix_v1_w0.json")
    with pytest.raises(
        ResumeStateError,
        match=r"state of a MixedDataset, not of one dataset.*"
        r"Fix: resume the MixedDataset it was saved from",
    ):
        ChunkedEpisodeDataset(a, batch_size=4, seed=3, resume_state=mix_state)
    with pytest.raises(
        ResumeStateError,
        match=r"state of one dataset, not of a MixedDataset.*"
        r"Fix: resume the ChunkedEpisodeDataset it was saved from",
    ):
        M.make_mix(a, b, seed=5, exhausted="cycle", resume_state=load("dataset_v3_w0.json"))
