"""The examples' model: a tiny policy, so that each example has something to train.

Not part of robo_resume: replace it with your policy. A strided conv per camera, pooled,
concatenated with the state, then a small MLP to the action.
"""

from __future__ import annotations

import torch
from torch import nn


class TinyPolicy(nn.Module):
    """``forward(state (B, S), images [(B, 3, H, W)] * cameras) -> action (B, A)``."""

    def __init__(self, state_dim: int, action_dim: int, cameras: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, kernel_size=4, stride=4)
        self.head = nn.Sequential(
            nn.Linear(state_dim + 8 * cameras, 64), nn.ReLU(), nn.Linear(64, action_dim)
        )

    def forward(self, state: torch.Tensor, images: list[torch.Tensor]) -> torch.Tensor:
        feats = [self.conv(img).relu().mean(dim=(2, 3)) for img in images]
        return self.head(torch.cat([state, *feats], dim=1))
