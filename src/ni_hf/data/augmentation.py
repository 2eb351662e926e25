"""Batched RandAugment for Neural Interpreter inputs, in pure torch (runs on whatever device the batch is on).

The paper augments the digits images with RandAugment: timm's ``rand-m<M>-n<N>`` (``timm/data/auto_augment.py``),
on single uint8 PIL images in data-loader workers. Here RandAugment runs on whole batches of tensors instead, so
that it can run on the accelerator inside the training step: :class:`BatchRandAugment` takes the model's
``pixel_values`` as the image processor produced them (normalized images ``(B, C, H, W)`` or patches
``(B, num_patches, patch_dim)``), undoes the normalization, augments the images in ``[0, 1]``, and normalizes
(and patchifies) them again, so its output has the same shape and scale as its input.

Sampling follows timm's ``RandAugment``: ``num_ops`` layers; in each, every image draws its own operation
uniformly from the policy (with replacement across layers), applies it with probability ``probability``
(timm: 0.5), and draws its own random sign for the signed operations. Random draws use torch's global (CPU)
generator, so ``transformers.set_seed`` makes them reproducible and a resumed ``Trainer`` (which restores the
RNG states of its checkpoints) replays them, as long as nothing else draws from that generator differently in a
resumed run (:class:`ni_hf.training.checkpoints.ExactResumeMixin` keeps the training DataLoader from doing so).

The operations work like PIL on uint8 images: an image an operation is applied to is put on the uint8 grid
(``round(255 x)``), the operation computes PIL's result, and the output is ``value / 255``; the functions of
this module (:func:`auto_contrast` ... :func:`translate_y`) take ``(b, C, H, W)`` float images in ``[0, 1]``
and per-image parameters (a number or a ``(b,)`` tensor). With ``m`` the magnitude (timm's 0-10 scale) and
``level = m / 10``:

========================  ==========================================================================================
``auto_contrast``         ``ImageOps.autocontrast(img)``: per channel, ``lut[i] = int(i * s - lo * s)``,
                          ``s = 255 / (hi - lo)`` over the channel's min ``lo`` and max ``hi``, clipped to 0-255
                          (identity for a constant channel).
``equalize``              ``ImageOps.equalize(img)``: per channel, ``step = (count - count of the top value) // 255``,
                          ``lut[i] = (step // 2 + pixels below i) // step`` (identity if ``step`` is 0).
``invert``                ``255 - x``.
``rotate``                ``img.rotate(±30 level)`` degrees (counter-clockwise for +), about the image centre.
``posterize``             keep the ``int(4 level)`` most significant bits (``x & ~(2**(8 - bits) - 1)``).
``solarize``              ``ImageOps.solarize(img, int(256 level))``: values ``>= threshold`` become ``255 - x``.
``solarize_add``          values ``< 128`` get ``+ int(110 level)``, clipped at 255.
``color``                 ``ImageEnhance.Color``: blend with the grayscale image
                          ``L = (19595 R + 38470 G + 7471 B + 32768) >> 16`` (identity for one channel).
``contrast``              ``ImageEnhance.Contrast``: blend with ``int(mean(L) + 0.5)``, one value per image.
``brightness``            ``ImageEnhance.Brightness``: blend with black, ``x * f``.
``sharpness``             ``ImageEnhance.Sharpness``: blend with the image smoothed by ``[[1,1,1],[1,5,1],[1,1,1]] / 13``
                          (rounded; border pixels kept).
``shear_x`` / ``shear_y``  PIL affine ``(1, ±0.3 level, 0, 0, 1, 0)`` / ``(1, 0, 0, ±0.3 level, 1, 0)``.
``translate_x`` / ``_y``  timm's ``TranslateXRel`` / ``TranslateYRel``: PIL affine shifting by ``±0.45 level`` of the
                          width / height (a positive value moves the content left / up).
========================  ==========================================================================================

The enhance operations use ``f = 1.8 level + 0.1`` and PIL's ``Image.blend(degenerate, img, f)``:
``trunc(degenerate + f * (img - degenerate))`` in float32, clipped to 0-255. The geometric operations map every
output pixel centre through PIL's affine matrix to a source point, sample it bilinearly as PIL does (in float64,
neighbours clamped at the border, truncated to uint8) and give pixels whose source point falls outside the image
the fill colour (default: the processor's mean, as timm's ``create_transform`` passes
``img_mean = round(255 * mean)``; 128 gray for mean 0.5).

The policy is a list of ``(name, low, high)`` triples (:data:`TIMM_RANDAUGMENT_POLICY`): an operation's argument
is ``level * (high - low) + low`` (enhance ``(0.1, 1.9)``, posterize bits ``(0, 4)``, solarize threshold
``(0, 256)``, solarize_add ``(0, 110)``; the integer ones truncated with ``int``), except for the signed geometric
operations, whose argument is ``± level * high`` with a random sign (rotate ``(-30, 30)`` degrees, shear
``(-0.3, 0.3)``, translate ``(-0.45, 0.45)`` of the image size; ``low`` must be ``-high``), and the operations
without argument (auto_contrast, equalize, invert), which ignore them.

Remaining differences from timm on PIL (checked against Pillow 12-13):

* timm's default hyper-parameters draw the resampling filter of each geometric operation at random between
  bilinear and bicubic, but ``create_transform`` (what the paper's training used) passes its ``interpolation``
  (bilinear): this module always uses bilinear (PIL's filter, reproduced in float64: equal to PIL on the tests'
  images; on a GPU, float64 arithmetic could in principle differ in the last bit and move a value by one level).
* ``posterize`` with 0 bits (``m < 2.5``) gives a black image (Pillow < 10 and TensorFlow); Pillow >= 10 raises.
* ``equalize`` follows Pillow >= 10 (``// 255``; older Pillow divided by 256).
* inputs are first put on the uint8 grid, as timm's images are uint8: an augmented image differs from its input by
  at most 1/510 even where the operation changes nothing. Images that get no operation are returned unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..models.neural_interpreter.image_processing_neural_interpreter import patchify, unpatchify

__all__ = [
    "OPERATION_NAMES",
    "select_operations",
    "BatchRandAugment",
    "TIMM_RANDAUGMENT_POLICY",
    "affine",
    "auto_contrast",
    "brightness",
    "color",
    "contrast",
    "equalize",
    "invert",
    "posterize",
    "rotate",
    "sharpness",
    "shear_x",
    "shear_y",
    "solarize",
    "solarize_add",
    "translate_x",
    "translate_y",
]

# timm's RandAugment operations (``_RAND_TRANSFORMS``) with their argument ranges (see the module docstring).
TIMM_RANDAUGMENT_POLICY: list[tuple[str, float, float]] = [
    ("auto_contrast", 0, 1),
    ("equalize", 0, 1),
    ("invert", 0, 1),
    ("rotate", -30.0, 30.0),
    ("posterize", 0, 4),
    ("solarize", 0, 256),
    ("solarize_add", 0, 110),
    ("color", 0.1, 1.9),
    ("contrast", 0.1, 1.9),
    ("brightness", 0.1, 1.9),
    ("sharpness", 0.1, 1.9),
    ("shear_x", -0.3, 0.3),
    ("shear_y", -0.3, 0.3),
    ("translate_x", -0.45, 0.45),
    ("translate_y", -0.45, 0.45),
]

_GRAY_WEIGHTS = (19595, 38470, 7471)  # PIL's RGB -> L: (19595 R + 38470 G + 7471 B + 0x8000) >> 16


# ------------------------------------------------------------------------------------------------ helpers


def _to_uint8_levels(images: torch.Tensor) -> torch.Tensor:
    """``[0, 1]`` floats to integer levels 0-255 (int64)."""
    return (images.float() * 255.0).round_().clamp_(0, 255).long()


def _from_levels(levels: torch.Tensor) -> torch.Tensor:
    return levels.float() / 255.0


def _per_image(
    value: torch.Tensor | float, batch: int, device: torch.device, dtype=torch.float32
) -> torch.Tensor:
    """A number or ``(b,)`` values as a ``(b,)`` tensor."""
    value = torch.as_tensor(value, dtype=dtype, device=device)
    return value.expand(batch) if value.ndim == 0 else value.reshape(batch)


def _apply_lut(levels: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """Map ``(b, C, H, W)`` levels through per-image, per-channel tables ``(b, C, 256)``."""
    b, c, h, w = levels.shape
    return torch.gather(lut, 2, levels.reshape(b, c, h * w)).reshape(b, c, h, w)


def _histogram(levels: torch.Tensor) -> torch.Tensor:
    """Per-image, per-channel 256-bin histograms ``(b, C, 256)`` of ``(b, C, H, W)`` levels."""
    b, c = levels.shape[:2]
    offsets = torch.arange(b * c, device=levels.device).reshape(b, c, 1, 1) * 256
    counts = torch.bincount((levels + offsets).flatten(), minlength=b * c * 256)
    return counts.reshape(b, c, 256)


def _blend(degenerate: torch.Tensor, levels: torch.Tensor, factor: torch.Tensor | float) -> torch.Tensor:
    """PIL's ``Image.blend(degenerate, image, factor)`` on uint8 levels: float32, truncated, clipped."""
    factor = _per_image(factor, levels.shape[0], levels.device).reshape(-1, 1, 1, 1)
    degenerate = degenerate.float()
    out = degenerate + factor * (levels.float() - degenerate)
    return out.trunc_().clamp_(0, 255).long()


def _grayscale(levels: torch.Tensor) -> torch.Tensor:
    """PIL's ``convert("L")`` of RGB levels ``(b, 3, H, W)``; one channel is returned as it is. ``(b, 1, H, W)``."""
    if levels.shape[1] == 1:
        return levels
    if levels.shape[1] != 3:
        raise ValueError(f"Grayscale conversion needs 1 or 3 channels, got {levels.shape[1]}.")
    r, g, b = levels.unbind(1)
    return ((r * _GRAY_WEIGHTS[0] + g * _GRAY_WEIGHTS[1] + b * _GRAY_WEIGHTS[2] + 0x8000) >> 16).unsqueeze(1)


# --------------------------------------------------------------------------------------- point operations


def auto_contrast(images: torch.Tensor) -> torch.Tensor:
    """``ImageOps.autocontrast(img)`` (cutoff 0) per channel."""
    levels = _to_uint8_levels(images)
    flat = levels.flatten(2)
    lo = flat.amin(2, keepdim=True).double()
    hi = flat.amax(2, keepdim=True).double()
    scale = 255.0 / (hi - lo).clamp(min=1)
    offset = -lo * scale
    index = torch.arange(256, device=images.device, dtype=torch.float64)
    lut = (index * scale + offset).trunc().clamp(0, 255).long()
    lut = torch.where(hi > lo, lut, index.long().expand_as(lut))
    return _from_levels(_apply_lut(levels, lut))


def equalize(images: torch.Tensor) -> torch.Tensor:
    """``ImageOps.equalize(img)`` per channel (Pillow >= 10: ``step = (count - count of the top value) // 255``)."""
    levels = _to_uint8_levels(images)
    hist = _histogram(levels)
    total = hist.sum(2, keepdim=True)
    index = torch.arange(256, device=images.device)
    top = torch.where(hist > 0, index, -1).amax(2, keepdim=True)
    top_count = torch.gather(hist, 2, top)
    step = (total - top_count) // 255
    below = hist.cumsum(2) - hist  # pixels with a smaller value
    lut = (step // 2 + below) // step.clamp(min=1)
    lut = torch.where(step > 0, lut.clamp(0, 255), index.expand_as(lut))
    return _from_levels(_apply_lut(levels, lut))


def invert(images: torch.Tensor) -> torch.Tensor:
    """``ImageOps.invert(img)``."""
    return _from_levels(255 - _to_uint8_levels(images))


def posterize(images: torch.Tensor, bits: torch.Tensor | int) -> torch.Tensor:
    """Keep the ``bits`` (0-8, per image) most significant bits; 0 bits gives black."""
    levels = _to_uint8_levels(images)
    bits = _per_image(bits, levels.shape[0], levels.device, torch.long).clamp(0, 8).reshape(-1, 1, 1, 1)
    mask = 255 - ((1 << (8 - bits)) - 1)
    return _from_levels(levels & mask)


def solarize(images: torch.Tensor, threshold: torch.Tensor | int) -> torch.Tensor:
    """``ImageOps.solarize(img, threshold)``: values ``>= threshold`` (0-256, per image) are inverted."""
    levels = _to_uint8_levels(images)
    threshold = _per_image(threshold, levels.shape[0], levels.device, torch.long).reshape(-1, 1, 1, 1)
    return _from_levels(torch.where(levels >= threshold, 255 - levels, levels))


def solarize_add(images: torch.Tensor, add: torch.Tensor | int, threshold: int = 128) -> torch.Tensor:
    """timm's ``solarize_add``: values ``< threshold`` get ``+ add`` (per image), clipped at 255."""
    levels = _to_uint8_levels(images)
    add = _per_image(add, levels.shape[0], levels.device, torch.long).reshape(-1, 1, 1, 1)
    return _from_levels(torch.where(levels < threshold, (levels + add).clamp(0, 255), levels))


def color(images: torch.Tensor, factor: torch.Tensor | float) -> torch.Tensor:
    """``ImageEnhance.Color(img).enhance(factor)``: blend with the grayscale image."""
    levels = _to_uint8_levels(images)
    return _from_levels(_blend(_grayscale(levels).expand_as(levels), levels, factor))


def contrast(images: torch.Tensor, factor: torch.Tensor | float) -> torch.Tensor:
    """``ImageEnhance.Contrast(img).enhance(factor)``: blend with the rounded mean of the grayscale image."""
    levels = _to_uint8_levels(images)
    gray = _grayscale(levels).flatten(1)
    mean = (gray.sum(1).double() / gray.shape[1] + 0.5).floor().reshape(-1, 1, 1, 1)
    return _from_levels(_blend(mean.float().expand_as(levels), levels, factor))


def brightness(images: torch.Tensor, factor: torch.Tensor | float) -> torch.Tensor:
    """``ImageEnhance.Brightness(img).enhance(factor)``: blend with black."""
    levels = _to_uint8_levels(images)
    return _from_levels(_blend(torch.zeros_like(levels), levels, factor))


def sharpness(images: torch.Tensor, factor: torch.Tensor | float) -> torch.Tensor:
    """``ImageEnhance.Sharpness(img).enhance(factor)``: blend with PIL's SMOOTH filter (border pixels kept)."""
    levels = _to_uint8_levels(images)
    b, c, h, w = levels.shape
    smooth = levels.clone()
    if h > 2 and w > 2:
        kernel = torch.ones(1, 1, 3, 3, dtype=torch.float64, device=levels.device)
        kernel[..., 1, 1] = 5
        # Sums of integers are exact in float64; n / 13 is never within rounding error of a half-integer.
        filtered = nn.functional.conv2d(levels.double().reshape(b * c, 1, h, w), kernel)
        smooth[..., 1:-1, 1:-1] = (filtered.reshape(b, c, h - 2, w - 2) / 13 + 0.5).floor().long()
    return _from_levels(_blend(smooth, levels, factor))


# ---------------------------------------------------------------------------------- geometric operations


def _fill_levels(
    fill: Sequence[float] | float | torch.Tensor, channels: int, device: torch.device
) -> torch.Tensor:
    fill = torch.as_tensor(fill, dtype=torch.float32, device=device).flatten()
    if fill.numel() not in (1, channels):
        raise ValueError(
            f"`fill` has {fill.numel()} values; the images have {channels} channels (give 1 or {channels})."
        )
    return (fill * 255).round().clamp(0, 255).expand(channels).reshape(1, channels, 1, 1)


def affine(
    images: torch.Tensor, matrix: torch.Tensor, fill: Sequence[float] | float | torch.Tensor = 0.5
) -> torch.Tensor:
    """PIL's ``img.transform(img.size, Image.AFFINE, matrix, resample=BILINEAR, fillcolor=fill)``, per image.

    ``matrix``: ``(b, 6)`` (or ``(6,)``) PIL affine data ``(a, b, c, d, e, f)``: the output pixel with centre
    ``(x, y)`` (pixel ``i`` spans ``[i, i + 1]``) samples the input at ``(a x + b y + c, d x + e y + f)``.
    ``fill``: colour in ``[0, 1]`` (1 or C values) of pixels whose source point lies outside the image.
    """
    levels = _to_uint8_levels(images)
    bsz, channels, h, w = levels.shape
    matrix = torch.as_tensor(matrix, dtype=torch.float64, device=images.device).reshape(-1, 6).expand(bsz, 6)
    ys, xs = torch.meshgrid(
        torch.arange(h, dtype=torch.float64, device=images.device) + 0.5,
        torch.arange(w, dtype=torch.float64, device=images.device) + 0.5,
        indexing="ij",
    )
    a, b_, c, d, e, f = (matrix[:, i].reshape(-1, 1, 1) for i in range(6))
    src_x = a * xs + b_ * ys + c
    src_y = d * xs + e * ys + f
    inside = (src_x >= 0) & (src_x < w) & (src_y >= 0) & (src_y < h)
    # PIL's bilinear filter in float64: neighbours clamped at the border, the result truncated to uint8.
    src_x = src_x - 0.5
    src_y = src_y - 0.5
    x0 = src_x.floor()
    y0 = src_y.floor()
    dx = (src_x - x0).unsqueeze(1)
    dy = (src_y - y0).unsqueeze(1)
    x0 = x0.long()
    y0 = y0.long()
    flat = levels.double().flatten(2)

    def pixels(ys: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
        index = (ys.clamp(0, h - 1) * w + xs.clamp(0, w - 1)).flatten(1).unsqueeze(1).expand(-1, channels, -1)
        return torch.gather(flat, 2, index).reshape(bsz, channels, h, w)

    top = pixels(y0, x0)
    top = top + (pixels(y0, x0 + 1) - top) * dx
    bottom = pixels(y0 + 1, x0)
    bottom = bottom + (pixels(y0 + 1, x0 + 1) - bottom) * dx
    sampled = (top + (bottom - top) * dy).trunc().clamp(0, 255).long()
    out = torch.where(inside.unsqueeze(1), sampled, _fill_levels(fill, channels, images.device).long())
    return _from_levels(out)


def rotate(images: torch.Tensor, degrees: torch.Tensor | float, fill=0.5) -> torch.Tensor:
    """``img.rotate(degrees, resample=BILINEAR, fillcolor=fill)`` per image (counter-clockwise for positive)."""
    _, _, h, w = images.shape
    cx, cy = w / 2, h / 2
    matrices = []
    for value in _per_image(degrees, images.shape[0], torch.device("cpu"), torch.float64).tolist():
        # As Image.rotate computes it (in Python floats).
        angle = -math.radians(value % 360.0)
        a, b = round(math.cos(angle), 15), round(math.sin(angle), 15)
        d, e = round(-math.sin(angle), 15), round(math.cos(angle), 15)
        c = a * -cx + b * -cy + 0.0 + cx
        f = d * -cx + e * -cy + 0.0 + cy
        matrices.append((a, b, c, d, e, f))
    matrix = torch.tensor(matrices, dtype=torch.float64, device=images.device)
    return affine(images, matrix, fill)


def _unit_affine(images: torch.Tensor, index: int, value: torch.Tensor | float, fill) -> torch.Tensor:
    bsz = images.shape[0]
    matrix = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64, device=images.device).repeat(
        bsz, 1
    )
    matrix[:, index] = _per_image(value, bsz, images.device, torch.float64)
    return affine(images, matrix, fill)


def shear_x(images: torch.Tensor, factor: torch.Tensor | float, fill=0.5) -> torch.Tensor:
    """timm's ``shear_x``: affine ``(1, factor, 0, 0, 1, 0)``."""
    return _unit_affine(images, 1, factor, fill)


def shear_y(images: torch.Tensor, factor: torch.Tensor | float, fill=0.5) -> torch.Tensor:
    """timm's ``shear_y``: affine ``(1, 0, 0, factor, 1, 0)``."""
    return _unit_affine(images, 3, factor, fill)


def translate_x(images: torch.Tensor, fraction: torch.Tensor | float, fill=0.5) -> torch.Tensor:
    """timm's ``translate_x_rel``: affine ``(1, 0, fraction * width, 0, 1, 0)`` (positive moves content left)."""
    pixels = _per_image(fraction, images.shape[0], images.device, torch.float64) * images.shape[3]
    return _unit_affine(images, 2, pixels, fill)


def translate_y(images: torch.Tensor, fraction: torch.Tensor | float, fill=0.5) -> torch.Tensor:
    """timm's ``translate_y_rel``: affine ``(1, 0, 0, 0, 1, fraction * height)`` (positive moves content up)."""
    pixels = _per_image(fraction, images.shape[0], images.device, torch.float64) * images.shape[2]
    return _unit_affine(images, 5, pixels, fill)


# name -> (function, argument kind, geometric): kind "none" takes no argument, "signed" ± level * high,
# "int" int(level * (high - low) + low), "float" level * (high - low) + low; geometric ones also take the fill.
_OPERATIONS: dict[str, tuple[Callable[..., torch.Tensor], str, bool]] = {
    "auto_contrast": (auto_contrast, "none", False),
    "equalize": (equalize, "none", False),
    "invert": (invert, "none", False),
    "rotate": (rotate, "signed", True),
    "posterize": (posterize, "int", False),
    "solarize": (solarize, "int", False),
    "solarize_add": (solarize_add, "int", False),
    "color": (color, "float", False),
    "contrast": (contrast, "float", False),
    "brightness": (brightness, "float", False),
    "sharpness": (sharpness, "float", False),
    "shear_x": (shear_x, "signed", True),
    "shear_y": (shear_y, "signed", True),
    "translate_x": (translate_x, "signed", True),
    "translate_y": (translate_y, "signed", True),
}


def _as_values(value: Sequence[float] | float | None, name: str) -> tuple[float, ...] | None:
    if value is None:
        return None
    values = tuple(float(v) for v in torch.as_tensor(value, dtype=torch.float64).flatten().tolist())
    if not values:
        raise ValueError(f"`{name}` is empty.")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"`{name}` must be finite, got {values}.")
    return values


class BatchRandAugment(nn.Module):
    """RandAugment with a draw per image, on a batch of normalized images or patches (same shape and scale out).

    Args:
        num_ops: operation layers applied to each image (RandAugment's ``n``).
        magnitude: magnitude of every operation on timm's scale, in ``[0, 10]`` (RandAugment's ``m``).
        probability: probability that an image's drawn operation is applied in a layer (timm: 0.5).
        image_mean / image_std: the normalization the image processor applied (``pixel = (x - mean) / std``
            with ``x`` in ``[0, 1]``; 1 or C values); ``None`` means the inputs are already in ``[0, 1]``.
        image_size: ``(height, width)`` of the images, needed only for patchified inputs.
        patch_size: patch side length, needed only for patchified inputs.
        policy: ``(operation name, low, high)`` triples; defaults to :data:`TIMM_RANDAUGMENT_POLICY`.
        fill: colour in ``[0, 1]`` (1 or C values) of the pixels the geometric operations uncover; defaults to
            ``image_mean`` when given (as timm's ``create_transform``), else 0.5.
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
        fill: Sequence[float] | float | None = None,
    ) -> None:
        super().__init__()
        if not 0 <= magnitude <= 10:
            raise ValueError(f"`magnitude` must lie in [0, 10] (timm's RandAugment scale), got {magnitude}.")
        if num_ops < 1:
            raise ValueError(f"`num_ops` must be >= 1, got {num_ops}.")
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"`probability` must lie in [0, 1], got {probability}.")
        if (image_mean is None) != (image_std is None):
            raise ValueError("Pass both `image_mean` and `image_std`, or neither.")
        mean = _as_values(image_mean, "image_mean")
        std = _as_values(image_std, "image_std")
        if std is not None and any(s <= 0 for s in std):
            raise ValueError(f"`image_std` must be positive, got {std}.")
        fill_values = _as_values(fill, "fill") or mean or (0.5,)
        if not all(0 <= v <= 1 for v in fill_values):
            raise ValueError(f"`fill` must lie in [0, 1] (images in [0, 1]), got {fill_values}.")
        self.num_ops = int(num_ops)
        self.magnitude = float(magnitude)
        self.probability = float(probability)
        entries = TIMM_RANDAUGMENT_POLICY if policy is None else policy
        self.policy = [(str(name), float(low), float(high)) for name, low, high in entries]
        valid = list(_OPERATIONS)
        if not self.policy:
            raise ValueError(f"`policy` is empty; give operations among {valid}.")
        unknown = [name for name, _, _ in self.policy if name not in _OPERATIONS]
        if unknown:
            raise ValueError(f"Unknown RandAugment operations {unknown}; valid names: {valid}.")
        for name, low, high in self.policy:
            if _OPERATIONS[name][1] == "signed" and low != -high:
                raise ValueError(
                    f"Operation {name!r} takes a symmetric range (-a, a), got ({low:g}, {high:g})."
                )
        self.normalized = mean is not None
        self.register_buffer("mean", torch.tensor(mean or (0.0,)).reshape(-1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std or (1.0,)).reshape(-1, 1, 1), persistent=False)
        self.fill = fill_values
        if isinstance(image_size, int):
            image_size = (image_size, image_size)
        self.image_size = image_size
        self.patch_size = patch_size

    def extra_repr(self) -> str:
        return (
            f"num_ops={self.num_ops}, magnitude={self.magnitude:g} (timm scale), probability={self.probability:g}, "
            f"operations={[name for name, _, _ in self.policy]}"
        )

    def _argument(self, name: str, low: float, high: float, signs: torch.Tensor) -> torch.Tensor | None:
        """The operation's per-image arguments (float64, CPU) at this magnitude, as timm's level_to_arg."""
        level = self.magnitude / 10.0
        kind = _OPERATIONS[name][1]
        if kind == "none":
            return None
        if kind == "signed":
            return signs.double() * (level * high)
        value = level * round(high - low, 12) + low  # round: 1.9 - 0.1 is 1.7999999999999998
        return torch.full_like(signs, int(value) if kind == "int" else value, dtype=torch.float64)

    def augment_images(self, images: torch.Tensor) -> torch.Tensor:
        """RandAugment ``(B, C, H, W)`` images in ``[0, 1]``: per layer, one operation drawn per image."""
        batch = images.shape[0]
        fill = self._check_channels(self.fill, images.shape[1], "fill")
        num_choices = len(self.policy)
        for _ in range(self.num_ops):
            choice = torch.randint(num_choices, (batch,))
            applied = torch.rand(batch) < self.probability
            signs = torch.where(torch.rand(batch) < 0.5, -1.0, 1.0)
            choice[~applied] = num_choices  # identity
            out = images.clone()
            for index, (name, low, high) in enumerate(self.policy):
                rows = (choice == index).nonzero().flatten()
                if not rows.numel():
                    continue
                function, _, geometric = _OPERATIONS[name]
                argument = self._argument(name, low, high, signs[rows])
                args = () if argument is None else (argument,)  # on the CPU: the functions move it
                kwargs = {"fill": fill} if geometric else {}
                rows = rows.to(images.device)
                out[rows] = function(images[rows], *args, **kwargs).to(images.dtype)
            images = out
        return images

    @staticmethod
    def _check_channels(values: tuple[float, ...], channels: int, name: str) -> tuple[float, ...]:
        if len(values) not in (1, channels):
            raise ValueError(
                f"`{name}` has {len(values)} values but the images have {channels} channels: give 1 or {channels} "
                f"values (e.g. image_mean=image_std=(0.5,) for single-channel images)."
            )
        return values

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Augment ``(B, C, H, W)`` images or ``(B, num_patches, patch_dim)`` patches; same shape and scale out."""
        if not torch.is_floating_point(pixel_values):
            raise ValueError(
                f"Expected floating-point pixel_values (the image processor's normalized output), got "
                f"{pixel_values.dtype}."
            )
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
        channels = images.shape[1]
        if self.normalized:
            self._check_channels(tuple(self.mean.flatten().tolist()), channels, "image_mean")
            self._check_channels(tuple(self.std.flatten().tolist()), channels, "image_std")
        dtype = images.dtype
        mean = self.mean.to(images.device)
        std = self.std.to(images.device)
        unit = (images.float() * std + mean).clamp_(0.0, 1.0)
        augmented = self.augment_images(unit)
        # Images that got no operation (or one that changed nothing) are returned exactly as they came.
        changed = (augmented != unit).flatten(1).any(1).reshape(-1, 1, 1, 1)
        images = torch.where(changed, ((augmented - mean) / std).to(dtype), images)
        return patchify(images, self.patch_size).contiguous() if patched else images.contiguous()


OPERATION_NAMES = [name for name, _, _ in TIMM_RANDAUGMENT_POLICY]


def select_operations(names: Sequence[str] | None) -> list[tuple[str, float, float]]:
    """The policy entries of ``names`` (all of timm's for None or empty; "a,b" counts as two); unknown ones refused."""
    if not names:
        return list(TIMM_RANDAUGMENT_POLICY)
    names = [name.strip() for item in names for name in item.split(",") if name.strip()]
    unknown = [name for name in names if name not in OPERATION_NAMES]
    if unknown:
        raise ValueError(f"RandAugment operations: unknown {unknown}; choose from {OPERATION_NAMES}.")
    return [entry for entry in TIMM_RANDAUGMENT_POLICY if entry[0] in names]
