"""Batched RandAugment for Neural Interpreter inputs, with kornia (runs on whatever device the batch is on).

The paper augments the digits images with RandAugment (timm's implementation, on single PIL images in
data-loader workers). Here RandAugment runs on whole batches of tensors instead, with kornia's operations,
so that it can run on the accelerator inside the training step: :class:`BatchRandAugment` takes the model's
``pixel_values`` as the image processor produced them (normalized images ``(B, C, H, W)`` or patches
``(B, num_patches, patch_dim)``), undoes the normalization, augments the images in ``[0, 1]``, and
normalizes (and patchifies) them again, so its output has the same shape and scale as its input.

Semantics follow timm's ``rand-m<M>-n<N>`` (what the paper used), not kornia's ``RandAugment`` module:

* every image draws its own operations (kornia's ``RandAugment`` draws one set per call, i.e. per batch:
  a whole batch would be inverted or solarized at once);
* ``num_ops`` layers; in each, an image gets one operation drawn uniformly (with replacement across
  layers) from timm's list (auto-contrast, equalize, invert, rotate, posterize, solarize, solarize-add,
  color, contrast, brightness, sharpness, shear x/y, translate x/y), applied with probability
  ``probability`` (timm: 0.5);
* ``magnitude`` is on timm's 0-10 scale: each operation at ``magnitude / 10`` of its range (kornia's
  ``m`` is three times that).

Random draws use torch's global generator, so ``transformers.set_seed`` makes them reproducible and a
resumed ``Trainer`` (which restores the RNG states of its checkpoints) replays them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .image_processing_neural_interpreter import patchify, unpatchify

__all__ = ["BatchRandAugment", "TIMM_RANDAUGMENT_POLICY"]

# timm's RandAugment operations with their ranges, as kornia names them (kornia's default policy).
TIMM_RANDAUGMENT_POLICY: list[tuple[str, float, float]] = [
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
    ("shear_x", -0.3, 0.3),
    ("shear_y", -0.3, 0.3),
    ("translate_x", -0.1, 0.1),
    ("translate_y", -0.1, 0.1),
]


class BatchRandAugment(nn.Module):
    """RandAugment with a draw per image, on a batch of normalized images or patches (same shape and scale out).

    Args:
        num_ops: operation layers applied to each image (RandAugment's ``n``).
        magnitude: magnitude of every operation on timm's scale, in ``(0, 10)`` (RandAugment's ``m``).
        probability: probability that an image's drawn operation is applied in a layer (timm: 0.5).
        image_mean / image_std: the normalization the image processor applied (``pixel = (x - mean) / std``
            with ``x`` in ``[0, 1]``); ``None`` means the inputs are already in ``[0, 1]``.
        image_size: ``(height, width)`` of the images, needed only for patchified inputs.
        patch_size: patch side length, needed only for patchified inputs.
        policy: ``(kornia operation name, low, high)`` triples; defaults to :data:`TIMM_RANDAUGMENT_POLICY`.
    """

    def __init__(
        self,
        num_ops: int = 2,
        magnitude: float = 9.0,
        probability: float = 0.5,
        image_mean: Sequence[float] | float | None = (0.5, 0.5, 0.5),
        image_std: Sequence[float] | float | None = (0.5, 0.5, 0.5),
        image_size: tuple[int, int] | int | None = None,
        patch_size: int | None = None,
        policy: Sequence[tuple[str, float, float]] | None = None,
    ) -> None:
        super().__init__()
        from kornia.augmentation.auto import RandAugment

        if not 0 < magnitude < 10:
            raise ValueError(f"`magnitude` must lie in (0, 10) (timm's RandAugment scale), got {magnitude}.")
        if num_ops < 1:
            raise ValueError(f"`num_ops` must be >= 1, got {num_ops}.")
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"`probability` must lie in [0, 1], got {probability}.")
        if (image_mean is None) != (image_std is None):
            raise ValueError("Pass both `image_mean` and `image_std`, or neither.")
        self.num_ops = int(num_ops)
        self.magnitude = float(magnitude)
        self.probability = float(probability)
        self.policy = list(TIMM_RANDAUGMENT_POLICY if policy is None else policy)
        # One single-operation kornia module per operation: each applies its operation to every image it gets.
        self.operations = nn.ModuleList(
            RandAugment(n=1, m=3.0 * self.magnitude, policy=[[entry]]) for entry in self.policy
        )
        self.normalized = image_mean is not None
        mean = torch.as_tensor(0.0 if image_mean is None else image_mean, dtype=torch.float32)
        std = torch.as_tensor(1.0 if image_std is None else image_std, dtype=torch.float32)
        self.register_buffer("mean", mean.reshape(-1, 1, 1) if mean.ndim else mean, persistent=False)
        self.register_buffer("std", std.reshape(-1, 1, 1) if std.ndim else std, persistent=False)
        if isinstance(image_size, int):
            image_size = (image_size, image_size)
        self.image_size = image_size
        self.patch_size = patch_size

    def extra_repr(self) -> str:
        return (
            f"num_ops={self.num_ops}, magnitude={self.magnitude:g} (timm scale), probability={self.probability:g}, "
            f"operations={[name for name, _, _ in self.policy]}"
        )

    def augment_images(self, images: torch.Tensor) -> torch.Tensor:
        """RandAugment ``(B, C, H, W)`` images in ``[0, 1]``: per layer, one operation drawn per image."""
        batch = images.shape[0]
        num_choices = len(self.operations)
        for _ in range(self.num_ops):
            choice = torch.randint(num_choices, (batch,))
            applied = torch.rand(batch) < self.probability
            choice[~applied] = num_choices  # identity
            out = images.clone()
            for index, operation in enumerate(self.operations):
                rows = (choice == index).nonzero().flatten()
                if rows.numel():
                    rows = rows.to(images.device)
                    out[rows] = operation(images[rows]).clamp_(0.0, 1.0)
            images = out
        return images

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Augment ``(B, C, H, W)`` images or ``(B, num_patches, patch_dim)`` patches; same shape and scale out."""
        patched = pixel_values.dim() == 3
        if patched:
            if self.image_size is None or self.patch_size is None:
                raise ValueError("Patchified inputs need `image_size` and `patch_size` to be set.")
            images = unpatchify(pixel_values, self.patch_size, *self.image_size)
        elif pixel_values.dim() == 4:
            images = pixel_values
        else:
            raise ValueError(
                f"Expected images (B, C, H, W) or patches (B, N, D), got shape {tuple(pixel_values.shape)}."
            )
        dtype = images.dtype
        mean = self.mean.to(images.device)
        std = self.std.to(images.device)
        images = (images.float() * std + mean).clamp_(0.0, 1.0)
        images = self.augment_images(images)
        images = ((images - mean) / std).to(dtype)
        return patchify(images, self.patch_size).contiguous() if patched else images.contiguous()
