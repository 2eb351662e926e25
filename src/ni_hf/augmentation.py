"""RandAugment for batches of normalized ``pixel_values``, on whatever device they are: kornia's, on timm's scale.

The paper augments the digits with timm's ``rand-m9-n2`` (15 operations, each applied with probability 0.5).
:class:`BatchRandAugment` runs ``kornia.augmentation.auto.RandAugment`` (pure torch, batched) on the model's
inputs: it undoes the processor's normalization, augments the images in ``[0, 1]`` and normalizes them again.
Magnitudes are on timm's 0-10 scale (kornia's is 0-30); rotation, shear and translation get timm's strengths
(:data:`RANDAUGMENT_POLICY`). Random draws use torch's global generator, so ``transformers.set_seed`` makes them
reproducible and a resumed ``Trainer`` replays them.

Pixels that a geometric operation moves in from outside the image get the processor's mean (timm's fill; kornia's
would be black): those operations run on the images minus the mean, so that kornia's zero padding is the mean.
Differences from timm's PIL RandAugment: kornia draws one operation per layer for the whole batch (timm: per
image; every image still gets its own random sign and its own coin for ``probability``), and uses its own ranges
for the colour operations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from kornia.augmentation.auto import RandAugment
from torch import nn

__all__ = ["RANDAUGMENT_POLICY", "BatchRandAugment", "select_operations"]

# (name, low, high) as kornia's RandAugment reads them: argument = low + (high - low) * m / 30 (signed operations:
# +-high * m / 30). kornia's shear is in degrees (x 180); 0.3 / pi makes it timm's shear factor 0.3 * m / 10 (to
# within tan's curvature), and translate +-0.45 of the image size is timm's TranslateRel.
RANDAUGMENT_POLICY: list[tuple[str, float, float]] = [
    ("auto_contrast", 0, 1),
    ("equalize", 0, 1),
    ("invert", 0, 1),
    ("rotate", -30.0, 30.0),
    ("posterize", 4.0, 8.0),
    ("solarize", 0.0, 1.0),
    ("solarize_add", 0.0, 0.43),
    ("color", 0.1, 1.9),
    ("contrast", 0.1, 1.9),
    ("brightness", 0.1, 1.9),
    ("sharpness", 0.1, 1.9),
    ("shear_x", -0.3 / math.pi, 0.3 / math.pi),
    ("shear_y", -0.3 / math.pi, 0.3 / math.pi),
    ("translate_x", -0.45, 0.45),
    ("translate_y", -0.45, 0.45),
]
OPERATION_NAMES = [name for name, _, _ in RANDAUGMENT_POLICY]
GEOMETRIC_OPERATIONS = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")


def select_operations(names: Sequence[str] | None) -> list[tuple[str, float, float]]:
    """The policy entries of ``names`` (all of :data:`RANDAUGMENT_POLICY` for None or empty); unknown ones refused."""
    if not names:
        return list(RANDAUGMENT_POLICY)
    names = [name.strip() for item in names for name in item.split(",") if name.strip()]
    unknown = [name for name in names if name not in OPERATION_NAMES]
    if unknown:
        raise ValueError(f"RandAugment operations: unknown {unknown}; choose from {OPERATION_NAMES}.")
    return [entry for entry in RANDAUGMENT_POLICY if entry[0] in names]


class BatchRandAugment(nn.Module):
    """``num_ops`` RandAugment layers (kornia), each applied to an image with ``probability``, on normalized input."""

    def __init__(
        self,
        num_ops: int = 2,
        magnitude: float = 9.0,
        probability: float = 0.5,
        operations: Sequence[str] | None = None,
        image_mean: Sequence[float] = (0.5, 0.5, 0.5),
        image_std: Sequence[float] = (0.5, 0.5, 0.5),
    ) -> None:
        super().__init__()
        if num_ops < 1:
            raise ValueError(f"RandAugment needs num_ops >= 1, got {num_ops}.")
        if not 0 < magnitude < 10:
            raise ValueError(
                f"RandAugment magnitude is on timm's scale, strictly between 0 and 10; got {magnitude}."
            )
        if not 0 <= probability <= 1:
            raise ValueError(f"RandAugment probability must lie in [0, 1], got {probability}.")
        self.num_ops, self.magnitude, self.probability = num_ops, magnitude, probability
        self.policy = select_operations(operations)
        # Geometric and colour operations apart, so that the geometric ones can pad with the mean; a layer picks
        # a group with probability proportional to its size, which keeps the pick uniform over the policy.
        geometric = [[entry] for entry in self.policy if entry[0] in GEOMETRIC_OPERATIONS]
        colour = [[entry] for entry in self.policy if entry[0] not in GEOMETRIC_OPERATIONS]
        self.geometric = RandAugment(n=1, m=3 * magnitude, policy=geometric) if geometric else None
        self.colour = RandAugment(n=1, m=3 * magnitude, policy=colour) if colour else None
        self.geometric_share = len(geometric) / len(self.policy)
        self.register_buffer(
            "mean", torch.tensor(image_mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False
        )
        self.register_buffer(
            "std", torch.tensor(image_std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False
        )

    def extra_repr(self) -> str:
        names = " ".join(name for name, _, _ in self.policy)
        return f"n={self.num_ops}, m={self.magnitude:g} (timm's 0-10), p={self.probability:g}, operations: {names}"

    @torch.no_grad()
    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Augment ``(B, C, H, W)`` normalized images; same shape, dtype and normalization out."""
        if pixel_values.ndim != 4:
            raise ValueError(
                f"BatchRandAugment takes (B, C, H, W) images, got shape {tuple(pixel_values.shape)}."
            )
        images = (pixel_values.float() * self.std + self.mean).clamp(0, 1)
        for _ in range(self.num_ops):
            if self.colour is None or (self.geometric is not None and torch.rand(()) < self.geometric_share):
                augmented = self.geometric(images - self.mean) + self.mean
            else:
                augmented = self.colour(images)
            augmented = augmented.clamp(0, 1)
            applied = torch.rand(images.shape[0], 1, 1, 1, device=images.device) < self.probability
            images = torch.where(applied, augmented, images)
        return ((images - self.mean) / self.std).to(pixel_values.dtype)
