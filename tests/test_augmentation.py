"""ni_hf.data.augmentation against PIL, called as timm's auto_augment.py calls it (tiny random uint8 images)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageOps

from ni_hf.data import augmentation as aug
from ni_hf.data.augmentation import TIMM_RANDAUGMENT_POLICY, BatchRandAugment
from ni_hf.models.neural_interpreter.image_processing_neural_interpreter import patchify

FILL = (128, 128, 128)


def random_arrays(mode: str, seed: int, size=(9, 11)) -> list[np.ndarray]:
    """A few uint8 images (H, W, C): random, low-contrast, and constant ones."""
    rng = np.random.default_rng(seed)
    c = 3 if mode == "RGB" else 1
    h, w = size
    return [
        rng.integers(0, 256, (h, w, c), dtype=np.uint8),
        rng.integers(40, 90, (h, w, c), dtype=np.uint8),
        rng.integers(0, 256, (h, w, c), dtype=np.uint8) // 64 * 64 + 3,
        np.full((h, w, c), 77, dtype=np.uint8),
    ]


def to_pil(array: np.ndarray, mode: str) -> Image.Image:
    return Image.fromarray(array[..., 0] if mode == "L" else array, mode)


def to_batch(arrays: list[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255


def from_pil(image: Image.Image) -> torch.Tensor:
    array = np.asarray(image)
    if array.ndim == 2:
        array = array[..., None]
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float()


def levels(images: torch.Tensor) -> torch.Tensor:
    return (images * 255).round()


def timm_solarize_add(img: Image.Image, add: int, thresh: int = 128) -> Image.Image:
    lut = [min(255, i + add) if i < thresh else i for i in range(256)]
    return img.point(lut * (3 if img.mode == "RGB" else 1))


LEVEL = 0.9  # m = 9
ENHANCE = LEVEL * 1.8 + 0.1
POINT_CASES = [
    ("auto_contrast", lambda im, _: ImageOps.autocontrast(im), lambda x, _: aug.auto_contrast(x), [None]),
    ("equalize", lambda im, _: ImageOps.equalize(im), lambda x, _: aug.equalize(x), [None]),
    ("invert", lambda im, _: ImageOps.invert(im), lambda x, _: aug.invert(x), [None]),
    ("posterize", ImageOps.posterize, aug.posterize, [1, 3, 4, 7, 8]),
    ("solarize", ImageOps.solarize, aug.solarize, [0, 100, int(LEVEL * 256), 256]),
    ("solarize_add", timm_solarize_add, aug.solarize_add, [0, int(LEVEL * 110), 110]),
    ("color", lambda im, f: ImageEnhance.Color(im).enhance(f), aug.color, [0.1, 0.55, 1.0, ENHANCE, 1.9]),
    (
        "contrast",
        lambda im, f: ImageEnhance.Contrast(im).enhance(f),
        aug.contrast,
        [0.1, 0.55, 1.0, ENHANCE, 1.9],
    ),
    (
        "brightness",
        lambda im, f: ImageEnhance.Brightness(im).enhance(f),
        aug.brightness,
        [0.1, 0.55, 1.0, ENHANCE, 1.9],
    ),
    (
        "sharpness",
        lambda im, f: ImageEnhance.Sharpness(im).enhance(f),
        aug.sharpness,
        [0.1, 0.55, 1.0, ENHANCE, 1.9],
    ),
]


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("name, pil_op, torch_op, arguments", POINT_CASES, ids=[c[0] for c in POINT_CASES])
def test_point_operations_equal_pil(mode, name, pil_op, torch_op, arguments):
    arrays = random_arrays(mode, seed=len(name))
    batch = to_batch(arrays)
    for argument in arguments:
        expected = torch.stack([from_pil(pil_op(to_pil(a, mode), argument)) for a in arrays])
        got = torch_op(batch, argument)
        assert got.shape == batch.shape and got.dtype == torch.float32
        torch.testing.assert_close(levels(got), expected, atol=0, rtol=0, msg=f"{name}({argument})")


def test_point_operations_take_per_image_arguments():
    arrays = random_arrays("RGB", seed=1)
    batch = to_batch(arrays)
    factors = torch.tensor([0.1, 0.7, 1.3, 1.9])
    got = aug.contrast(batch, factors)
    expected = torch.stack(
        [
            from_pil(ImageEnhance.Contrast(to_pil(a, "RGB")).enhance(float(f)))
            for a, f in zip(arrays, factors, strict=True)
        ]
    )
    torch.testing.assert_close(levels(got), expected, atol=0, rtol=0)
    got = aug.posterize(batch, torch.tensor([0, 1, 3, 8]))
    assert levels(got)[0].eq(0).all()  # 0 bits: black (Pillow >= 10 refuses 0 bits)
    torch.testing.assert_close(levels(got)[2], from_pil(ImageOps.posterize(to_pil(arrays[2], "RGB"), 3)))


GEOMETRIC_CASES = [
    (
        "rotate",
        lambda im, v: im.rotate(v, resample=Image.BILINEAR, fillcolor=FILL[: len(im.getbands())]),
        aug.rotate,
    ),
    (
        "shear_x",
        lambda im, v: im.transform(
            im.size, Image.AFFINE, (1, v, 0, 0, 1, 0), Image.BILINEAR, fillcolor=FILL[: len(im.getbands())]
        ),
        aug.shear_x,
    ),
    (
        "shear_y",
        lambda im, v: im.transform(
            im.size, Image.AFFINE, (1, 0, 0, v, 1, 0), Image.BILINEAR, fillcolor=FILL[: len(im.getbands())]
        ),
        aug.shear_y,
    ),
    (
        "translate_x",
        lambda im, v: im.transform(
            im.size,
            Image.AFFINE,
            (1, 0, v * im.size[0], 0, 1, 0),
            Image.BILINEAR,
            fillcolor=FILL[: len(im.getbands())],
        ),
        aug.translate_x,
    ),
    (
        "translate_y",
        lambda im, v: im.transform(
            im.size,
            Image.AFFINE,
            (1, 0, 0, 0, 1, v * im.size[1]),
            Image.BILINEAR,
            fillcolor=FILL[: len(im.getbands())],
        ),
        aug.translate_y,
    ),
]
GEOMETRIC_VALUES = {
    "rotate": [-27.0, -13.5, 9.0, 27.0, 90.0, -300.5],
    "shear_x": [-0.27, 0.135, 0.27],
    "shear_y": [-0.27, 0.135, 0.27],
    "translate_x": [-0.405, 0.2, 0.405],
    "translate_y": [-0.405, 0.2, 0.405],
}


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("name, pil_op, torch_op", GEOMETRIC_CASES, ids=[c[0] for c in GEOMETRIC_CASES])
def test_geometric_operations_match_pil(mode, name, pil_op, torch_op):
    arrays = random_arrays(mode, seed=3, size=(16, 20))
    batch = to_batch(arrays)
    for value in GEOMETRIC_VALUES[name]:
        expected = torch.stack([from_pil(pil_op(to_pil(a, mode), value)) for a in arrays])
        got = levels(torch_op(batch, value, fill=0.5))
        # PIL's bilinear filter is reproduced exactly (float64, truncation); allow one level on a few pixels.
        diff = (got - expected).abs()
        assert diff.max() <= 1 and diff.mean() < 0.01, (name, value, diff.mean())
        assert (expected == 128).all(1).any()  # some fill


def test_translation_and_rotation_amounts_and_fill():
    image = torch.zeros(1, 3, 10, 20)
    image[..., 4:6, 8:10] = 1.0  # white square, columns 8-9
    moved = aug.translate_x(image, 0.2, fill=(0.0, 1.0, 0.5))  # 4 pixels: content moves left
    assert moved[0, :, 4:6, 4:6].eq(1).all() and moved[0, :, 4:6, 8:10].eq(0).all()
    fill = moved[0, :, :, -4:].permute(1, 2, 0).reshape(-1, 3)
    torch.testing.assert_close(fill, torch.tensor([0.0, 1.0, 128 / 255]).expand_as(fill))
    assert moved[0, :, :, :-4].eq(image[0, :, :, 4:]).all()
    down = aug.translate_y(image, -0.2, fill=0.5)  # 2 pixels down
    assert down[0, :, 6:8, 8:10].eq(1).all() and down[0, :, :2].eq(128 / 255).all()
    # rotate 90 degrees counter-clockwise, as PIL: a pixel right of the centre goes above it.
    square = torch.zeros(1, 1, 8, 8)
    square[..., 3, 6] = 1.0
    turned = aug.rotate(square, 90.0)
    assert turned[0, 0, 1, 3] == 1.0 and turned.sum() == 1.0
    expected = from_pil(
        Image.fromarray((square[0, 0].numpy() * 255).astype(np.uint8)).rotate(90, Image.BILINEAR)
    )
    torch.testing.assert_close(levels(turned)[0], expected)


def policy_arguments(magnitude: float) -> dict[str, float]:
    augment = BatchRandAugment(magnitude=magnitude, image_mean=None, image_std=None)
    signs = torch.ones(1)
    return {
        name: (None if (a := augment._argument(name, low, high, signs)) is None else float(a[0]))
        for name, low, high in augment.policy
    }


def test_policy_arguments_follow_timm_level_to_arg():
    for m in (0, 5, 9, 10):
        level = m / 10
        args = policy_arguments(m)
        assert args["rotate"] == level * 30 and args["shear_x"] == level * 0.3
        assert args["translate_y"] == level * 0.45
        assert args["posterize"] == int(level * 4) and args["solarize"] == int(level * 256)
        assert args["solarize_add"] == int(level * 110)
        for name in ("color", "contrast", "brightness", "sharpness"):
            assert args[name] == level * 1.8 + 0.1
        assert args["invert"] is None
    assert policy_arguments(9)["solarize_add"] == 99 and policy_arguments(9)["posterize"] == 3
    assert [name for name, _, _ in TIMM_RANDAUGMENT_POLICY] == (
        "auto_contrast equalize invert rotate posterize solarize solarize_add color contrast brightness "
        "sharpness shear_x shear_y translate_x translate_y"
    ).split()


def test_batch_augment_draws_per_image_is_seeded_and_keeps_shape_scale_dtype():
    torch.manual_seed(1)
    images = torch.rand(16, 3, 12, 12) * 2 - 1
    augment = BatchRandAugment(num_ops=2, magnitude=9, probability=1.0, image_size=12, patch_size=4)
    torch.manual_seed(0)
    out = augment(images)
    assert out.shape == images.shape and out.dtype == images.dtype and torch.isfinite(out).all()
    assert out.min() >= -1 and out.max() <= 1
    # Per-image draws: the change differs between images of a batch of identical images.
    same = images[:1].expand(16, -1, -1, -1).contiguous()
    torch.manual_seed(2)
    out_same = augment(same)
    assert len({tuple(o.flatten()[:50].tolist()) for o in out_same}) > 4
    torch.manual_seed(0)
    torch.testing.assert_close(augment(images), out)
    torch.manual_seed(0)
    torch.testing.assert_close(augment(patchify(images, 4)), patchify(out, 4))
    half = augment(images.to(torch.bfloat16))
    assert half.dtype == torch.bfloat16 and half.shape == images.shape and torch.isfinite(half.float()).all()


def test_every_operation_runs_batched_without_nan():
    images = torch.rand(5, 3, 8, 8) * 2 - 1
    for name, low, high in TIMM_RANDAUGMENT_POLICY:
        for m in (0, 10):
            augment = BatchRandAugment(magnitude=m, probability=1.0, policy=[(name, low, high)], num_ops=1)
            out = augment(images)
            assert torch.isfinite(out).all() and out.min() >= -1 and out.max() <= 1, name


def test_probability_zero_is_identity():
    images = torch.randn(4, 3, 8, 8)
    augment = BatchRandAugment(probability=0.0)
    assert torch.equal(augment(images), images)
    gray = torch.rand(4, 1, 8, 8)
    assert torch.equal(BatchRandAugment(probability=0.0, image_mean=None, image_std=None)(gray), gray)


def test_single_channel_images_with_one_value_normalization():
    gray = torch.rand(6, 1, 8, 8) * 2 - 1
    augment = BatchRandAugment(
        probability=1.0, image_mean=(0.5,), image_std=(0.5,), image_size=8, patch_size=4
    )
    torch.manual_seed(0)
    out = augment(gray)
    assert out.shape == gray.shape and torch.isfinite(out).all()
    torch.manual_seed(0)
    torch.testing.assert_close(augment(patchify(gray, 4)), patchify(out, 4))


def test_fill_defaults_to_image_mean():
    augment = BatchRandAugment(
        num_ops=1,
        magnitude=10,
        probability=1.0,
        policy=[("translate_x", -0.45, 0.45)],
        image_mean=(0.2, 0.4, 0.6),
        image_std=(1.0, 1.0, 1.0),
    )
    images = torch.zeros(3, 3, 10, 10)
    out = augment(images)
    corner = out[:, :, :, [0, -1]]  # one of the two sides is filled, depending on the sign
    fill = (torch.tensor([0.2, 0.4, 0.6]) * 255).round() / 255 - torch.tensor([0.2, 0.4, 0.6])
    filled = (corner - fill.reshape(1, 3, 1, 1)).abs().amax((1, 2)) < 1e-6
    assert filled.any(1).all()
    assert BatchRandAugment(image_mean=None, image_std=None).fill == (0.5,)
    assert BatchRandAugment(fill=0.0).fill == (0.0,)


def test_invalid_arguments_raise():
    with pytest.raises(ValueError, match="image_mean.*3 values.*1 channels"):
        BatchRandAugment()(torch.rand(2, 1, 8, 8))
    with pytest.raises(ValueError, match="image_mean.*2 values"):
        BatchRandAugment(image_mean=(0.5, 0.5), image_std=(0.5, 0.5))(torch.rand(2, 3, 8, 8))
    with pytest.raises(ValueError, match="empty"):
        BatchRandAugment(policy=[])
    with pytest.raises(ValueError, match="Unknown.*blur.*valid names.*translate_y"):
        BatchRandAugment(policy=[("blur", 0, 1)])
    with pytest.raises(ValueError, match="image_std"):
        BatchRandAugment(image_std=(0.5, 0.0, 0.5))
    with pytest.raises(ValueError, match="floating-point"):
        BatchRandAugment()(torch.zeros(2, 3, 8, 8, dtype=torch.uint8))
    for bad in (-0.5, 10.5, math.nan):
        with pytest.raises(ValueError, match="magnitude"):
            BatchRandAugment(magnitude=bad)
    BatchRandAugment(magnitude=0)
    BatchRandAugment(magnitude=10)
    with pytest.raises(ValueError, match="fill"):
        BatchRandAugment(fill=(0.5, 0.5))(torch.rand(2, 3, 8, 8))
    with pytest.raises(ValueError, match="symmetric"):
        BatchRandAugment(policy=[("rotate", 0, 30)])
