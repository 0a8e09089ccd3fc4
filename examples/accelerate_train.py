"""Hugging Face accelerate with ChunkedEpisodeDataset: prepare the model, not the DataLoader.

ChunkedEpisodeDataset already knows its rank (from torch.distributed). ``accelerator.prepare``
on its DataLoader breaks it either way: by default (``dispatch_batches=True`` for iterable
datasets) rank 0 reads every batch and scatters it, which fails on the ``task`` strings and
ignores the other ranks' streams; with ``dispatch_batches=False`` accelerate wraps it in
``IterableDatasetShard``, so each rank keeps only part of its own stream and frames are lost.
(``ds.dataloader()`` yields whole batches, ``batch_size=None``, which accelerate's shard
refuses with a TypeError; a plain item DataLoader over the dataset is silently re-sharded,
which ``--prepare-loader`` shows.) So: ``accelerator.prepare(model, optimizer)`` only, and
move batches with ``send_to_device``.

    torchrun --standalone --nproc_per_node=2 examples/accelerate_train.py --workdir /tmp/acc
    torchrun ... examples/accelerate_train.py --workdir /tmp/acc --prepare-loader   # the mistake
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import send_to_device
from tiny_policy import TinyPolicy  # examples/tiny_policy.py: the examples' model

from robo_resume import ChunkedEpisodeDataset, make_dataset


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", required=True)
    p.add_argument("--prepare-loader", action="store_true", help="show the wrong setting")
    a = p.parse_args(argv)

    config = DataLoaderConfiguration(dispatch_batches=False)  # only matters with --prepare-loader
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    work = Path(a.workdir)
    root = work / "dataset"
    if accelerator.is_main_process and not (root / "meta" / "info.json").exists():
        make_dataset(root, episode_lengths=(31, 44, 27, 38), num_cameras=1)
    accelerator.wait_for_everyone()

    ds = ChunkedEpisodeDataset(root, batch_size=4, seed=0, chunk_frames=16)  # rank-aware
    if a.prepare_loader:  # a plain item DataLoader, as a user might build it
        loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=1)
    else:
        loader = ds.dataloader(num_workers=1)
    model = TinyPolicy(4, 3, 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, opt = accelerator.prepare(model, opt)  # NOT the loader
    if a.prepare_loader:
        loader = accelerator.prepare(loader)  # re-shards the rank-aware stream: frames lost
    tracker = ds.tracker()
    cam = ds.meta.camera_keys[0]
    rank = accelerator.process_index
    with open(
        work / f"consumed.{'prepared' if a.prepare_loader else 'plain'}.rank{rank}.txt", "w"
    ) as log:
        for batch in loader:
            if not a.prepare_loader:
                batch = tracker.consume(batch)
            batch = send_to_device(batch, accelerator.device)
            out = model(batch["observation.state"], [batch[cam]])
            loss = torch.nn.functional.mse_loss(out, batch["action"])
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            log.write(" ".join(map(str, batch["index"].tolist())) + "\n")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print("done")


if __name__ == "__main__":
    main()
