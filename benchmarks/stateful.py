"""StatefulDataLoader paths against ``ds.dataloader()`` on the same data (issue 13 item 8).

Three loaders over one ChunkedEpisodeDataset, frames/s after a warm-up, median of repeats:

- ``dataloader``: ``ds.dataloader(num_workers=W)`` (the reference);
- ``stateful``: ``ds.dataloader(num_workers=W, stateful=True)`` (torchdata's StatefulDataLoader
  over whole batches, robo_resume's checks);
- ``plain stateful``: ``StatefulDataLoader(ds, batch_size=B, num_workers=W)`` as torchdata's
  documentation builds it (items one by one, ``default_collate``).

    python benchmarks/stateful.py                  # open50 (../shared/datasets), 480x640
    python benchmarks/stateful.py --root DIR --workers 0,2 --dtype uint8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from _common import describe_machine, print_table

REPO = Path(__file__).resolve().parents[1]
OPEN50 = REPO.parent / "shared" / "datasets" / "open50"
OPEN50_WITH_VIDEO = [0, 3, 4, 5, 6, 8]


def _rate(loader, warmup: int, batches: int) -> float:
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    frames, t0 = 0, time.perf_counter()
    for _ in range(batches):
        frames += len(next(it)["index"])
    rate = frames / (time.perf_counter() - t0)
    del it
    return rate


def measure(args) -> list[dict]:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from robo_resume import ChunkedEpisodeDataset

    episodes = OPEN50_WITH_VIDEO if args.root == OPEN50 else None
    rows = []
    for w in [int(x) for x in args.workers.split(",")]:

        def dataset():
            return ChunkedEpisodeDataset(
                args.root,
                batch_size=args.batch_size,
                episodes=episodes,
                image_dtype=args.dtype,
                infinite=True,
            )

        makers = {
            "dataloader": lambda w=w: dataset().dataloader(num_workers=w),
            "stateful": lambda w=w: dataset().dataloader(num_workers=w, stateful=True),
            "plain stateful": lambda w=w: StatefulDataLoader(
                dataset(), batch_size=args.batch_size, num_workers=w
            ),
        }
        rates = {
            name: statistics.median(
                _rate(make(), args.warmup, args.batches) for _ in range(args.repeats)
            )
            for name, make in makers.items()
        }
        ref = rates["dataloader"]
        rows.append(
            {
                "workers": w,
                "dtype": args.dtype,
                **{f"{k} fr/s": f"{v:.0f}" for k, v in rates.items()},
                "stateful/dataloader": f"{rates['stateful'] / ref:.2f}x",
                "plain/dataloader": f"{rates['plain stateful'] / ref:.2f}x",
            }
        )
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=OPEN50)
    p.add_argument("--workers", default="0,2")
    p.add_argument("--dtype", default="float32", choices=["float32", "uint8"])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    print(describe_machine())
    rows = measure(args)
    print_table(list(rows[0]), [list(r.values()) for r in rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
