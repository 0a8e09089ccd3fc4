"""How a fingerprint mismatch is told: the likely cause first, in words, with the fix."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from ..index.plan import PLAN_DIGEST_PREFIX, Plan, plan_fingerprint

logger = logging.getLogger("robo_resume")

FIX = {
    "dataset": "the state belongs to another dataset (its episodes or features differ); pass "
    "the root of the dataset the run was trained on, or start a new run without resume_state",
    "total_frames": "the state belongs to another dataset or episode selection; pass the same "
    "root and episodes=[...] as the run that saved it",
    "episodes": "pass the same episodes= selection (indices, slice string, or a Split with the "
    "same fractions, index and seed) as the run that saved the state",
    "plan": "pass the same chunk_frames, episodes and StreamTuning(cut_at_keyframes=...) as the "
    "run that saved the state (with keyframe cuts, also the same camera delta_timestamps: the "
    "cuts follow the window's look-back)",
    "seed": "pass the same seed as the run that saved the state",
    "interleave_order": "pass the same StreamTuning(interleave_order=...) as the run that saved "
    "the state (a state without it was saved with the default, 'random')",
    "order": "pass the same StreamTuning(order=...) as the run that saved the state (a state "
    "without it was saved with the interleave order: StreamTuning.fast(); robo-resume train: "
    "the same --stream.* flags, or none: its checkpoints keep them)",
    "shuffle_frames": "pass the same StreamTuning(shuffle_frames=...) as the run that saved the "
    "state",
    "interleave": "pass the same StreamTuning(interleave=...) as the run that saved the state "
    "(robo-resume train: the same --stream.* flags, or none: its checkpoints keep them)",
    "batch_size": "pass the same batch_size as the run that saved the state (resume_step "
    "counts batches of that size); a resume_state may change it (elastic resume)",
}
FIX_DEFAULT = (
    "construct the dataset with the same root, episodes, chunk_frames, seed, batch_size and "
    "schedule options as the run that saved the state"
)
ESCAPE = (
    "; to resume anyway, accepting that frames may be replayed or lost, pass "
    "resume_strict=False to ChunkedEpisodeDataset (or MixedDataset): see "
    "docs/resume.md#when-a-resume-is-refused"
)
ABOUT = "about"
"""Fingerprint key of readable facts (episode ranges, chunk_frames, ...) used to say in words
what differs; never compared (the hashes beside it are)."""


_UNRECORDED = {
    "order": "interleave (not recorded: saved before robo_resume had the shuffle order)",
}
"""What a key a state does not record means (states written before the key existed)."""


def in_words(keys: list[str], want: Mapping[str, Any], got: Mapping[str, Any]) -> str:
    """``seed 1 vs 0; episodes 0-9 vs 0-7``: each differing key, this dataset's value first."""
    a, b = want.get(ABOUT) or {}, got.get(ABOUT) or {}
    out = []
    for k in keys:
        if k in a and a.get(k) == b.get(k):
            out.append(f"{k} ({a[k]} in both; it follows from the other differences)")
        elif k in a or k in b:
            theirs = b.get(k, _UNRECORDED.get(k, "(not recorded)"))
            out.append(f"{k} {a.get(k, '(not recorded)')} vs {theirs}")
        else:
            out.append(f"{k} {want.get(k)!r} vs {got.get(k)!r}")
    return "; ".join(out)


def value_hash(obj: Any) -> str:
    """16 hex digits of the SHA-256 of ``obj`` as sorted JSON: a fingerprint field for a value
    (an episode list, a key mapping) too large to keep in a state."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def plan_of_state(theirs: Any, plans: Mapping[str, Callable[[], Plan]]) -> str | None:
    """Which of ``plans`` (name -> a function making the plan) a state's fingerprint
    ``theirs`` was saved with: the first name whose plan has the state's ``"plan"`` value (a
    :func:`~robo_resume.index.plan.plan_digest`, or the older 16-digit text fingerprint), else
    None. Each plan is made only when the ones before it did not match."""
    old = theirs.get("plan") if isinstance(theirs, Mapping) else None
    if not isinstance(old, str):
        return None
    for name, make in plans.items():
        plan = make()
        if old.startswith(PLAN_DIGEST_PREFIX):
            if plan.digest() == old:
                return name
        elif plan_fingerprint(plan)[:16] == old:
            return name
    return None


def expected_for(fingerprint: Mapping[str, Any], theirs: Any, plan: Plan) -> dict[str, Any]:
    """``fingerprint`` (a dataset's) as a state whose fingerprint is ``theirs`` must match it.

    States written before :func:`~robo_resume.index.plan.plan_digest` carry the older text
    digest of the plan (16 hex digits, no ``"c1:"``): for them, that older value of ``plan`` is
    computed (seconds at 10^6 episodes, only then) and put in place of the new one, with an
    INFO line, so an old state still resumes the same plan and is still refused for another.
    """
    out = dict(fingerprint)
    old = theirs.get("plan") if isinstance(theirs, Mapping) else None
    if isinstance(old, str) and not old.startswith(PLAN_DIGEST_PREFIX):
        out["plan"] = plan_fingerprint(plan)[:16]
        logger.info(
            "The resume state carries the older plan fingerprint (%s, written before "
            "robo_resume hashed the plan's columns): checked against this plan's older value "
            "(%s); states saved from now on carry the new one (%s).",
            old,
            out["plan"],
            fingerprint.get("plan"),
        )
    return out
