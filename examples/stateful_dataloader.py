"""Using torchdata's StatefulDataLoader instead of the tracker.

ChunkedEpisodeDataset implements ``state_dict()`` / ``load_state_dict()``, so StatefulDataLoader
saves and restores each worker's stream position itself (and the worker round-robin order).

    python examples/stateful_dataloader.py
"""

from __future__ import annotations

import tempfile

from torchdata.stateful_dataloader import StatefulDataLoader

from robo_resume import ChunkedEpisodeDataset, make_dataset, worker_context


def main() -> None:
    root = make_dataset(
        tempfile.mkdtemp() + "/ds", episode_lengths=(31, 44, 27), num_cameras=0
    ).root

    def loader():
        ds = ChunkedEpisodeDataset(root, batch_size=8, seed=0, chunk_frames=16)
        # any start method works (README "Worker start methods"); a forkserver that preloads
        # torch, robo_resume and pyarrow is shown here
        return StatefulDataLoader(
            ds, batch_size=8, num_workers=2, multiprocessing_context=worker_context()
        )

    full = [b["index"].tolist() for b in loader()]
    first = loader()
    before = []
    for batch in first:
        before.append(batch["index"].tolist())
        if len(before) == 5:
            state = first.state_dict()  # put this in your checkpoint
            break
    second = loader()
    second.load_state_dict(state)
    after = [b["index"].tolist() for b in second]
    print(
        f"{len(before)} batches before the crash, {len(after)} after; "
        f"identical to the uninterrupted run: {before + after == full}"
    )


if __name__ == "__main__":
    main()
