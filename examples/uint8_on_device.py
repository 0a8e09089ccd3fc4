"""The float32 fast path: uint8 images through the loader, the float conversion on the device.

A float32 batch of images is 4x the bytes of its uint8 frames, and on a CPU the conversion
(``x / 255``) of a 480x640 frame costs about as much as decoding it. lerobot 0.6's trainer asks
its dataset for uint8 (``LeRobotDataset(..., return_uint8=True)``), so its workers send uint8,
and converts in the main process before moving the batch to the device (``robo-resume train``
keeps that order). Converting after the move takes that work off the CPU as well. In your own loop::

    ds = ChunkedEpisodeDataset(root, batch_size=32, image_dtype="uint8")
    loader = ds.dataloader(num_workers=2, pin_memory=device.type == "cuda")
    for batch in loader:
        batch = to_device(batch, ds.meta.visual_keys, device)  # uint8 crosses, float on the GPU

The values equal those of ``image_dtype="float32"`` (both are ``x / 255`` in float32): this
script checks that batch by batch and prints the bytes each way moves to the device. The gain is
on a GPU: a 4x smaller transfer, and the conversion leaves the CPU (and, with workers, the main
process, where ``ds.dataloader()`` converts float32 batches). On a CPU-only machine keep
``image_dtype="float32"``: its conversion writes into reused buffers.

    python examples/uint8_on_device.py                    # a generated dataset, CUDA if present
    python examples/uint8_on_device.py --root DATASET --num-workers 2 --batches 50
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Iterable
from pathlib import Path

import torch

from robo_resume import ChunkedEpisodeDataset, make_dataset


def to_device(batch: dict, image_keys: Iterable[str], device: torch.device) -> dict:
    """The batch on ``device``, its uint8 images as float32 in [0, 1] (``x / 255``)."""
    image_keys = set(image_keys)
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            value = value.to(device, non_blocking=True)
            if key in image_keys and value.dtype == torch.uint8:
                value = value.float().div_(255)
        out[key] = value
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", help="LeRobot dataset (default: generate one in --workdir)")
    p.add_argument("--workdir", default="/tmp/robo_resume_uint8_on_device")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--batches", type=int, default=20, help="batches compared")
    a = p.parse_args(argv)

    root = Path(a.root) if a.root else Path(a.workdir) / "dataset"
    if not a.root and not (root / "meta" / "info.json").exists():
        make_dataset(root, episode_lengths=(60, 45, 80, 70), num_cameras=2, height=96, width=128)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def loader(dtype: str):
        ds = ChunkedEpisodeDataset(
            root, batch_size=a.batch_size, image_dtype=dtype, seed=0, infinite=True
        )
        pin = device.type == "cuda"
        return ds, ds.dataloader(num_workers=a.num_workers, pin_memory=pin)

    ds, fast = loader("uint8")
    _, slow = loader("float32")
    images = ds.meta.visual_keys
    same = True
    for u8, f32 in itertools.islice(zip(fast, slow, strict=True), a.batches):
        got = to_device(u8, images, device)
        want = to_device(f32, images, device)
        same &= all(torch.equal(got[k], want[k]) for k in want if isinstance(want[k], torch.Tensor))
    print(f"device {device}; images {list(images)}")
    print(f"identical to image_dtype='float32': {same}")
    u8 = sum(u8[k].numel() for k in images)
    print(
        f"image bytes per batch to the device: {u8 / 2**20:.1f} MiB as uint8, "
        f"{4 * u8 / 2**20:.1f} MiB as float32"
    )


if __name__ == "__main__":
    main()
