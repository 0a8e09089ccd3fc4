"""Train a lerobot ACT policy on ChunkedEpisodeDataset batches, with lerobot's own processors.

The items are LeRobotDataset items, so lerobot's pre-processor (normalisation) and the policy's
``forward`` take the batches as they are; only the cursor key is removed by the tracker.

    python examples/lerobot_policy.py                 # generates a small dataset
    python examples/lerobot_policy.py --root PATH --steps 50
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from robo_resume import ChunkedEpisodeDataset, make_dataset


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", help="LeRobot dataset (default: generate one)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--num-workers", type=int, default=2)
    a = p.parse_args(argv)

    from lerobot.configs.types import FeatureType
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.utils.feature_utils import dataset_to_policy_features  # lerobot >= 0.6

    root = (
        a.root or make_dataset(tempfile.mkdtemp() + "/ds", num_cameras=1, height=96, width=96).root
    )
    chunk = 10
    probe = ChunkedEpisodeDataset(root, batch_size=a.batch_size)
    meta = probe.meta
    features = dataset_to_policy_features(dict(meta.features))
    outputs = {k: f for k, f in features.items() if f.type is FeatureType.ACTION}
    inputs = {k: f for k, f in features.items() if k not in outputs}
    cfg = ACTConfig(
        input_features=inputs,
        output_features=outputs,
        chunk_size=chunk,
        n_action_steps=chunk,
        dim_model=64,
        n_heads=2,
        dim_feedforward=128,
        n_encoder_layers=1,
        n_decoder_layers=1,
        n_vae_encoder_layers=1,
        pretrained_backbone_weights=None,
        device="cpu",
    )
    action_key = next(iter(outputs))
    fps = meta.fps
    ds = ChunkedEpisodeDataset(
        root,
        batch_size=a.batch_size,
        seed=0,
        infinite=True,
        delta_timestamps={action_key: [k / fps for k in range(chunk)]},
    )
    stats = {
        k: {s: torch.as_tensor(v, dtype=torch.float32) for s, v in d.items()}
        for k, d in meta.stats.items()
    }
    policy = ACTPolicy(cfg)
    preprocessor, _ = make_pre_post_processors(cfg, dataset_stats=stats)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    tracker = ds.tracker()
    policy.train()
    for step, batch in enumerate(ds.dataloader(num_workers=a.num_workers), start=1):
        batch = preprocessor(tracker.consume(batch))
        loss, info = policy.forward(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 5 == 0 or step == a.steps:
            print(f"step {step}: loss {loss.item():.4f} {info}")
        if step == a.steps:
            break
    print(
        f"trained ACT for {a.steps} steps; data state for a checkpoint: "
        f"{tracker.state_dict()['batches']} batches consumed"
    )


if __name__ == "__main__":
    main()
