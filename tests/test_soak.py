"""Long-run soak: many epochs with periodic crash and resume, exactly once, stable memory.

In-process, with real DataLoaders with 2 workers over a factory dataset with a camera: every
epoch is cut at a random batch (seeded) by abandoning the loader (its workers are shut down) and
a fresh dataset resumes from the tracker's state, the way a restarted job does. Checks that
every epoch consumed each frame exactly once and in the uninterrupted order, and that the main
process's RSS (``VmRSS`` in /proc/self/status) stays within a bound after warm-up. Prints the
numbers.

Short form by default (CI): ``SOAK_EPOCHS=6``, well under a minute. Long form:

    SOAK_EPOCHS=200 SOAK_RSS_MB=64 .venv/bin/python -m pytest tests/test_soak.py -s

(``SOAK_SEED`` picks the crash points, ``SOAK_RSS_MB`` the allowed growth after warm-up.)
"""

from __future__ import annotations

import gc
import os
import random
import time
from collections import Counter

import pytest

from robo_resume import CURSOR_KEY, ChunkedEpisodeDataset
from robo_resume.audit import consume

EPOCHS = int(os.environ.get("SOAK_EPOCHS", "6"))
SEED = int(os.environ.get("SOAK_SEED", "7"))
RSS_BOUND_MB = float(os.environ.get("SOAK_RSS_MB", "48"))
WARMUP = 2  # epochs before the RSS baseline (allocator pools, imports, first decoders)
LENGTHS = (31, 26, 40, 22, 35, 28)  # 182 frames: even, so two streams drop nothing


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


@pytest.mark.slow
@pytest.mark.timeout(max(120, 20 * EPOCHS))
def test_soak_crash_resume_many_epochs(factory):
    root = factory(episode_lengths=LENGTHS, num_cameras=1, codec="h264", gop=8).root
    total = sum(LENGTHS)

    def make(**kw):
        return ChunkedEpisodeDataset(root, batch_size=8, seed=SEED, chunk_frames=12, **kw)

    # the uninterrupted order of the first two epochs (the schedule of every later epoch is
    # checked for exactly-once; its order is a pure function checked by test_resume)
    reference, _ = consume(make, num_workers=2, epochs=2)
    per_epoch = make().batches_per_epoch(2)
    ref = [x for _, x in reference]
    ref_epochs = [ref[:per_epoch], ref[per_epoch : 2 * per_epoch]]

    rng = random.Random(SEED)
    state = None
    consumed: dict[int, list[list[int]]] = {}
    rss: list[float] = []
    crashes = 0
    t0 = time.perf_counter()
    epoch = 0
    while epoch < EPOCHS:
        # one "process lifetime": resume, run until the crash point (inside this epoch), crash
        ds = make(resume_state=state) if state else make()
        tracker = ds.tracker()
        loader = ds.dataloader(num_workers=2)
        crash_at = rng.randint(1, per_epoch - 1) if crashes <= epoch else None
        it = iter(loader)
        n = 0
        for batch in it:
            e = int(batch[CURSOR_KEY][-1, 3])
            batch = tracker.consume(batch)
            consumed.setdefault(e, []).append(batch["index"].tolist())
            n += 1
            if crash_at is not None and n == crash_at and len(consumed[e]) < per_epoch:
                break
        it._shutdown_workers()  # the crash: the loader and its workers are gone
        del it, loader, batch
        state = tracker.state_dict()
        if crash_at is not None and n == crash_at and len(consumed[epoch]) < per_epoch:
            crashes += 1
            continue  # resume inside the same epoch
        assert len(consumed[epoch]) == per_epoch, f"epoch {epoch} ended early"
        frames = [i for b in consumed[epoch] for i in b]
        assert Counter(frames) == Counter(range(total)), f"epoch {epoch}: not exactly once"
        if epoch < 2:
            assert consumed[epoch] == ref_epochs[epoch], f"epoch {epoch}: order differs"
        del consumed[epoch]
        gc.collect()
        rss.append(rss_mb())
        epoch += 1
        # the next epoch starts in a new process too (resume_state at an epoch end)
    wall = time.perf_counter() - t0
    base = rss[min(WARMUP, len(rss) - 1)]
    growth = max(rss[WARMUP:], default=base) - base
    print(
        f"\nsoak: {EPOCHS} epochs, {crashes} crash/resume cycles inside epochs, "
        f"{EPOCHS * per_epoch} batches in {wall:.1f}s; main-process RSS per epoch (MB): "
        + ", ".join(f"{x:.1f}" for x in rss)
        + f"; growth after warm-up {growth:+.1f} MB (bound {RSS_BOUND_MB} MB)"
    )
    assert growth <= RSS_BOUND_MB, f"RSS grew by {growth:.1f} MB after warm-up: {rss}"
