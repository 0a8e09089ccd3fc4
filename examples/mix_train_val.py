"""Train on a weighted mix of two LeRobot datasets (v3.0 + v2.1), validate, crash and resume.

The two datasets name their cameras differently: the v3.0 one has ``cam0``, the v2.1 one a
``cam0`` wrist camera the other lacks and a ``cam1`` top camera. ``MixSource(keys=...)`` maps
both top cameras to ``observation.images.top`` and drops the wrist camera, so every batch has
one layout. 80% of each dataset's episodes train (``Split((0.8, 0.2), index=0)``), the other
20% validate (``index=1``; a one-source mix per dataset with ``exhausted="stop"`` is one full
pass over it, in episode order). The mix cycles (step-based training); its state in the
checkpoint holds every source's own cursors, so ``--resume`` continues each dataset exactly.

    python examples/mix_train_val.py --workdir /tmp/mix --stop-at-step 9   # "crashes"
    python examples/mix_train_val.py --workdir /tmp/mix --resume           # continues
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from tiny_policy import TinyPolicy  # examples/tiny_policy.py: the examples' model

from robo_resume import (
    MixedDataset,
    MixSource,
    Split,
    StreamTuning,
    load_checkpoint,
    make_dataset,
    save_checkpoint,
)

TOP = "observation.images.top"
KEYS = (
    {"observation.images.cam0": TOP},  # v3.0: its only camera is the top camera
    {"observation.images.cam1": TOP, "observation.images.cam0": None},  # v2.1: drop the wrist
)
WEIGHTS = (1, 2)


def make_data(work: Path) -> tuple[Path, Path]:
    a, b = work / "data_v30", work / "data_v21"
    if not (a / "meta" / "info.json").exists():
        make_dataset(a, episode_lengths=(31, 44, 27, 38, 22), num_cameras=1, codec="h264", gop=8)
    if not (b / "meta" / "info.json").exists():
        make_dataset(
            b,
            version="v2.1",
            episode_lengths=(25, 36, 29, 33, 18),
            num_cameras=2,
            codec="h264",
            gop=8,
        )
    return a, b


def sources(roots, part: int) -> list[MixSource]:
    split = Split((0.8, 0.2), index=part, seed=0)  # part 0: train, part 1: validation
    return [
        MixSource(root, weight, keys=keys, episodes=split)
        for root, weight, keys in zip(roots, WEIGHTS, KEYS, strict=True)
    ]


def loss_of(model, batch) -> torch.Tensor:
    pred = model(batch["observation.state"], [batch[TOP]])
    return torch.nn.functional.mse_loss(pred, batch["action"])


@torch.no_grad()
def validate(model, val_sets) -> list[float]:
    """Mean loss over every validation frame of each source (one full pass each)."""
    out = []
    for ds in val_sets:
        tracker = ds.tracker()
        total, frames = 0.0, 0
        for batch in ds.dataloader(num_workers=0):
            batch = tracker.consume(batch)
            n = len(batch["index"])
            total += float(loss_of(model, batch)) * n
            frames += n
        out.append(total / frames)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--checkpoint-every", type=int, default=4)
    p.add_argument("--eval-every", type=int, default=8)
    p.add_argument("--stop-at-step", type=int, default=0, help="simulate a crash after this step")
    p.add_argument("--resume", action="store_true")
    a = p.parse_args(argv)

    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    roots = make_data(work)
    ckpt_path = work / "ckpt.pt"
    ckpt = load_checkpoint(ckpt_path) if a.resume else None

    # 1. The training mix: same arguments as the first run, plus the saved mix state.
    train = MixedDataset(
        sources(roots, 0),
        batch_size=a.batch_size,
        seed=0,
        chunk_frames=16,
        exhausted="cycle",  # a dataset that runs out starts its next epoch
        resume_state=ckpt["data"] if ckpt else None,
    )
    val_sets = [
        MixedDataset([src], batch_size=16, exhausted="stop", tuning=StreamTuning(shuffle=False))
        for src in sources(roots, 1)
    ]
    tracker = train.tracker()
    loader = train.dataloader(num_workers=a.num_workers)
    print(f"train: {train}; cameras {train.camera_keys}")

    # 2. Model and optimizer, restored from the same checkpoint.
    torch.manual_seed(0)
    model = TinyPolicy(4, 3, 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = 0
    if ckpt:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        step = ckpt["step"]

    # 3. The loop: one endless iteration over the cycling mix, stopped by the step count.
    with open(work / "consumed.txt", "a") as log:
        for batch in loader:
            if step >= a.steps:
                break
            batch = tracker.consume(batch)  # record mix and source cursors; strip them
            loss = loss_of(model, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            idx = " ".join(map(str, batch["index"].tolist()))
            log.write(f"{step} {tracker.last_source} {idx}\n")
            log.flush()
            if step % a.eval_every == 0:
                val = validate(model, val_sets)
                print(f"step {step}: val loss " + ", ".join(f"{v:.5f}" for v in val), flush=True)
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
