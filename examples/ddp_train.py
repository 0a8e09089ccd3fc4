"""DDP training with exact resume on CPU (gloo). Run with torchrun:

    torchrun --standalone --nproc_per_node=2 examples/ddp_train.py --workdir /tmp/d --stop-at-step 6
    torchrun --standalone --nproc_per_node=2 examples/ddp_train.py --workdir /tmp/d --resume

Several machines: one torchrun per node with ``--nnodes``, ``--node_rank`` and the address of
node 0, e.g. two nodes of 2 processes (4 ranks), each node reading its own copy of the dataset:

    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=2 --master_addr=HOST0 --master_port=29500 \
        examples/ddp_train.py --workdir /shared/d --root /local/dataset
    torchrun --nnodes=2 --node_rank=1 --nproc_per_node=2 --master_addr=HOST0 --master_port=29500 \
        examples/ddp_train.py --workdir /shared/d --root /local/dataset

Construct the dataset after ``init_process_group``: it takes rank and world size from
``torch.distributed``. ``tracker.state_dict()`` is a collective (it gathers every rank's cursors),
so every rank calls it; rank 0 writes the checkpoint.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from tiny_policy import TinyPolicy  # examples/tiny_policy.py: the examples' model

from robo_resume import ChunkedEpisodeDataset, load_checkpoint, make_dataset, save_checkpoint


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", required=True, help="checkpoint and logs (shared by all nodes)")
    p.add_argument("--root", help="this node's copy of the dataset (default: generate one)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--checkpoint-every", type=int, default=3)
    p.add_argument("--stop-at-step", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    a = p.parse_args(argv)

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    work = Path(a.workdir)
    root = Path(a.root) if a.root else work / "dataset"
    if rank == 0 and not a.root and not (root / "meta" / "info.json").exists():
        make_dataset(root, episode_lengths=(31, 44, 27, 38), num_cameras=1)
    dist.barrier()
    ckpt = load_checkpoint(work / "ckpt.pt") if a.resume else None
    ds = ChunkedEpisodeDataset(
        root,
        batch_size=a.batch_size,
        seed=0,
        chunk_frames=16,
        resume_state=ckpt["data"] if ckpt else None,
    )
    tracker = ds.tracker()
    model = torch.nn.parallel.DistributedDataParallel(TinyPolicy(4, 3, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = 0
    if ckpt:
        model.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        step = ckpt["step"]
    cam = ds.meta.camera_keys[0]
    loader = ds.dataloader(num_workers=a.num_workers)
    with open(work / f"consumed.rank{rank}.txt", "a") as log:
        for _epoch in loader.epochs(a.epochs):  # the epochs left, equal on every rank
            for batch in loader:
                batch = tracker.consume(batch)
                out = model(batch["observation.state"], [batch[cam]])
                loss = torch.nn.functional.mse_loss(out, batch["action"])
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                log.write(f"{step} {' '.join(map(str, batch['index'].tolist()))}\n")
                log.flush()
                if step % a.checkpoint_every == 0:
                    data = tracker.state_dict()  # collective: all ranks
                    if rank == 0:
                        save_checkpoint(
                            {
                                "model": model.module.state_dict(),
                                "optimizer": opt.state_dict(),
                                "step": step,
                                "data": data,
                            },
                            work / "ckpt.pt",
                        )
                if step == a.stop_at_step:
                    dist.barrier()
                    os._exit(1)
    dist.barrier()
    if rank == 0:
        print(f"finished at step {step} on {dist.get_world_size()} ranks")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
