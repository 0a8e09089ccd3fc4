"""The pattern to copy: a plain PyTorch training loop that checkpoints and resumes exactly.

Every ``--checkpoint-every`` steps it saves model, optimizer, step and the data state in one
atomic checkpoint. Start it again with ``--resume`` after a crash and it continues with exactly
the batches the crashed run had not trained on.

    python examples/train_policy.py --workdir /tmp/run --stop-at-step 7   # "crashes" at step 7
    python examples/train_policy.py --workdir /tmp/run --resume           # continues from step 5
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from tiny_policy import TinyPolicy  # examples/tiny_policy.py: the examples' model

from robo_resume import ChunkedEpisodeDataset, load_checkpoint, make_dataset, save_checkpoint


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--root", help="LeRobot dataset (default: generate one in workdir)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--checkpoint-every", type=int, default=5)
    p.add_argument("--stop-at-step", type=int, default=0, help="simulate a crash after this step")
    p.add_argument("--resume", action="store_true")
    a = p.parse_args(argv)

    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    root = Path(a.root) if a.root else work / "dataset"
    if not a.root and not (root / "meta" / "info.json").exists():
        make_dataset(root, episode_lengths=(31, 44, 27, 38), num_cameras=1)
    ckpt_path = work / "ckpt.pt"
    ckpt = load_checkpoint(ckpt_path) if a.resume else None

    # 1. The dataset: same arguments as the first run, plus the saved data state.
    ds = ChunkedEpisodeDataset(
        root,
        batch_size=a.batch_size,
        seed=0,
        chunk_frames=16,
        resume_state=ckpt["data"] if ckpt else None,
    )
    tracker = ds.tracker()
    loader = ds.dataloader(num_workers=a.num_workers)

    # 2. Model and optimizer, restored from the same checkpoint.
    cam = ds.meta.camera_keys[0]
    model = TinyPolicy(4, 3, 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = 0
    if ckpt:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        step = ckpt["step"]

    # 3. The loop: each iter() is one epoch; the first one after a resume is the rest of it.
    #    loader.epochs(n) yields the epochs still to train (from the checkpoint's epoch on,
    #    whatever num_workers it was saved with), so the run always ends after epoch n - 1.
    with open(work / "consumed.txt", "a") as log:
        for _epoch in loader.epochs(a.epochs):
            for batch in loader:
                batch = tracker.consume(batch)  # record cursors; strip the cursor key
                loss = torch.nn.functional.mse_loss(
                    model(batch["observation.state"], [batch[cam]]), batch["action"]
                )
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                log.write(f"{step} {' '.join(map(str, batch['index'].tolist()))}\n")
                log.flush()
                if step % a.checkpoint_every == 0:
                    save_checkpoint(
                        {
                            "model": model.state_dict(),
                            "optimizer": opt.state_dict(),
                            "step": step,
                            "data": tracker.state_dict(),
                        },
                        ckpt_path,
                    )
                if step == a.stop_at_step:
                    print(
                        f"crashing after step {step} (last checkpoint: step "
                        f"{step - step % a.checkpoint_every})",
                        flush=True,
                    )
                    os._exit(1)  # no cleanup, like a killed job
    print(f"finished at step {step}")


if __name__ == "__main__":
    main()
