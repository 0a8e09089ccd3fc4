"""The plan's column digest (``plan_digest``) and the resume of states that carry the older one.

Dataset fingerprints carry ``plan_digest`` (a hash of the plan's column bytes, about 0.2 s at 10^6
episodes) instead of the text digest ``plan_fingerprint`` (5 to 20 s there). A state written
before carries the older value: it must still resume the same plan, and still be refused for
another plan.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

from robo_resume import ChunkedEpisodeDataset, ResumeStateError
from robo_resume.audit import consume
from robo_resume.index.plan import (
    PLAN_DIGEST_PREFIX,
    EpisodeSpan,
    Plan,
    make_chunks,
    plan_digest,
    plan_fingerprint,
)

HERE = Path(__file__).resolve().parent / "fixtures" / "states"
sys.path.insert(0, str(HERE))
import make_states as M  # noqa: E402

sys.path.remove(str(HERE))


def _plan(**change) -> Plan:
    cols = {
        "episode_index": np.array([0, 0, 2, 5]),
        "start": np.array([0, 4, 0, 0]),
        "stop": np.array([4, 7, 3, 9]),
        "dataset_from_index": np.array([0, 4, 7, 10]),
    }
    for k, (i, v) in change.items():
        cols[k] = cols[k].copy()
        cols[k][i] = v
    return Plan(cols["episode_index"], cols["start"], cols["stop"], cols["dataset_from_index"])


def test_digest_is_stable_and_changes_with_any_value():
    base = plan_digest(_plan())
    assert base.startswith(PLAN_DIGEST_PREFIX) and len(base) == len(PLAN_DIGEST_PREFIX) + 32
    assert plan_digest(_plan()) == base  # a new, equal plan
    assert plan_digest(tuple(_plan())) == base  # a tuple of Chunks
    seen = {base}
    for col in ("episode_index", "start", "stop", "dataset_from_index"):
        for i in range(4):
            d = plan_digest(_plan(**{col: (i, 100 + i)}))
            assert d not in seen, (col, i)
            seen.add(d)
    # a value past int32 (its column hashed as int64) and the same value in int32 range
    assert plan_digest(_plan(dataset_from_index=(3, 2**31))) not in seen
    assert plan_digest(_plan(dataset_from_index=(3, 2**31))) != plan_digest(
        _plan(dataset_from_index=(3, 2**31 - 1))
    )
    # rows moved between columns or plans of other lengths
    assert plan_digest(_plan()[:3]) not in seen
    assert plan_digest(make_chunks([EpisodeSpan(0, 0, 7)], 4)) != plan_digest(
        make_chunks([EpisodeSpan(0, 0, 7)], 3)
    )


def test_dataset_fingerprint_carries_the_digest(factory):
    ds = ChunkedEpisodeDataset(factory().root, batch_size=4)
    assert ds.fingerprint["plan"] == plan_digest(ds.chunks)


@pytest.fixture(scope="module")
def root_a(tmp_path_factory):
    return M.roots(tmp_path_factory.mktemp("digest_states"))[0]


def _old_state() -> dict:
    return json.loads((HERE / "dataset_v3_w0.json").read_text())


def test_old_state_resumes_with_an_info_line(root_a, caplog):
    state = _old_state()
    assert not state["fingerprint"]["plan"].startswith(PLAN_DIGEST_PREFIX)  # the older digest
    ds_kw, _ = M.CASES["dataset_v3_w0.json"]
    with caplog.at_level(logging.INFO, logger="robo_resume"):
        ds = ChunkedEpisodeDataset(root_a, **ds_kw, resume_state=state)
    assert plan_fingerprint(ds.chunks)[:16] == state["fingerprint"]["plan"]
    lines = [r.getMessage() for r in caplog.records if "older plan fingerprint" in r.getMessage()]
    assert len(lines) == 1 and state["fingerprint"]["plan"] in lines[0]
    assert ds.fingerprint["plan"] in lines[0]
    # states saved by the resumed run carry the new digest
    _, new = consume(
        lambda **k: ChunkedEpisodeDataset(root_a, **ds_kw, resume_state=state, **k),
        epochs=2,
        num_workers=0,
        stop_after=2,
    )
    assert new["fingerprint"]["plan"] == plan_digest(ds.chunks)


def test_old_state_of_another_plan_is_refused(root_a):
    ds_kw, _ = M.CASES["dataset_v3_w0.json"]
    with pytest.raises(ResumeStateError, match=r"different 'plan'"):
        ChunkedEpisodeDataset(root_a, **ds_kw, chunk_frames=8, resume_state=_old_state())
    state = _old_state()
    state["fingerprint"]["plan"] = "0123456789abcdef"
    with pytest.raises(ResumeStateError, match=r"different 'plan'"):
        ChunkedEpisodeDataset(root_a, **ds_kw, resume_state=state)


def test_new_state_of_another_plan_is_refused(root_a):
    ds_kw, _ = M.CASES["dataset_v3_w0.json"]
    _, state = consume(
        lambda **k: ChunkedEpisodeDataset(root_a, **ds_kw, **k),
        epochs=1,
        num_workers=0,
        stop_after=3,
    )
    assert state["fingerprint"]["plan"].startswith(PLAN_DIGEST_PREFIX)
    ChunkedEpisodeDataset(root_a, **ds_kw, resume_state=state)  # the same plan: accepted
    with pytest.raises(ResumeStateError, match=r"different 'plan'"):
        ChunkedEpisodeDataset(root_a, **ds_kw, chunk_frames=8, resume_state=state)
