"""Batched, seeded data augmentation on tensors.

Augmentation parameters are drawn once per client epoch (``draw``) and applied to any subset of
that epoch's samples (``apply``), so a teacher and its student see the same view whether the
view is computed per batch (reference path) or for the whole epoch at once (fast path).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

AugParams = dict[str, torch.Tensor]


def _draw_none(n: int, shape, gen: torch.Generator) -> AugParams:
    return {}


def _apply_none(x: torch.Tensor, params: AugParams) -> torch.Tensor:
    return x


CROP_PAD = 4


def _draw_crop_flip(n: int, shape, gen: torch.Generator) -> AugParams:
    return {
        "dy": torch.randint(0, 2 * CROP_PAD + 1, (n,), generator=gen),
        "dx": torch.randint(0, 2 * CROP_PAD + 1, (n,), generator=gen),
        "hflip": torch.rand(n, generator=gen) < 0.5,
    }


def _apply_crop_flip(x: torch.Tensor, params: AugParams) -> torch.Tensor:
    """Random crop with zero padding 4, then horizontal flip: one gather for the whole batch."""
    b, _, h, w = x.shape
    dev = x.device
    padded = F.pad(x, (CROP_PAD,) * 4)
    rows = params["dy"].to(dev)[:, None] + torch.arange(h, device=dev)  # [B, H]
    cols = params["dx"].to(dev)[:, None] + torch.arange(w, device=dev)  # [B, W]
    flip = params["hflip"].to(dev)[:, None]
    cols = torch.where(flip, cols.flip(1), cols)
    batch = torch.arange(b, device=dev)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]  # [B, H, W, C]
    return out.permute(0, 3, 1, 2).contiguous()


def _draw_flips(n: int, shape, gen: torch.Generator) -> AugParams:
    return {"hflip": torch.rand(n, generator=gen) < 0.5, "vflip": torch.rand(n, generator=gen) < 0.5}


def _apply_flips(x: torch.Tensor, params: AugParams) -> torch.Tensor:
    h = params["hflip"].to(x.device).view(-1, 1, 1, 1)
    v = params["vflip"].to(x.device).view(-1, 1, 1, 1)
    x = torch.where(h, x.flip(3), x)
    return torch.where(v, x.flip(2), x)


AUGMENTATIONS: dict[str, tuple[Callable, Callable]] = {
    "none": (_draw_none, _apply_none),
    "crop-flip": (_draw_crop_flip, _apply_crop_flip),
    "flips": (_draw_flips, _apply_flips),
}


def draw(name: str, n: int, shape, gen: torch.Generator) -> AugParams:
    return AUGMENTATIONS[name][0](n, shape, gen)


def apply(name: str, x: torch.Tensor, params: AugParams) -> torch.Tensor:
    return AUGMENTATIONS[name][1](x, params)
