"""ni_hf.augmentation: kornia's RandAugment on normalized batches, with timm's magnitudes and per-image coin."""

from __future__ import annotations

import math

import pytest
import torch

from ni_hf.augmentation import OPERATION_NAMES, RANDAUGMENT_POLICY, BatchRandAugment, select_operations


def normalized(batch: int = 8, seed: int = 0) -> torch.Tensor:
    """Random images normalized with mean = std = 0.5, i.e. in [-1, 1]."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(batch, 3, 32, 32, generator=generator) * 2 - 1


def bar_images(batch: int = 4) -> torch.Tensor:
    """Black images with a white vertical bar in columns 15-16, rows 8-23, normalized."""
    images = torch.zeros(batch, 3, 32, 32)
    images[:, :, 8:24, 15:17] = 1
    return images * 2 - 1


def test_every_operation_keeps_shape_dtype_and_scale_and_changes_the_images():
    for name in OPERATION_NAMES:
        torch.manual_seed(0)
        augment = BatchRandAugment(num_ops=1, magnitude=9, probability=1.0, operations=[name])
        images = normalized()
        out = augment(images)
        assert out.shape == images.shape and out.dtype == images.dtype, name
        assert torch.isfinite(out).all() and out.min() >= -1 - 1e-6 and out.max() <= 1 + 1e-6, name
        assert not torch.equal(out, images), name


def test_draws_follow_the_global_seed():
    augment = BatchRandAugment()
    images = normalized()
    torch.manual_seed(3)
    first = augment(images)
    torch.manual_seed(3)
    assert torch.equal(augment(images), first)
    assert not torch.equal(augment(images), first)


def test_probability_zero_is_the_identity_and_one_changes_every_image():
    images = normalized(16)
    assert torch.equal(BatchRandAugment(num_ops=2, probability=0.0)(images), images)
    torch.manual_seed(0)
    out = BatchRandAugment(num_ops=1, magnitude=9, probability=1.0, operations=["rotate"])(images)
    assert (out != images).flatten(1).any(1).all()


def test_half_of_the_images_are_augmented_at_probability_one_half():
    torch.manual_seed(0)
    images = normalized(512)
    out = BatchRandAugment(num_ops=1, magnitude=9, probability=0.5, operations=["invert"])(images)
    changed = (out != images).flatten(1).any(1).float().mean().item()
    assert 0.4 < changed < 0.6, changed


@pytest.mark.parametrize("magnitude", [5.0, 9.0])
def test_translation_moves_by_timms_fraction_of_the_image(magnitude):
    """timm's TranslateRel moves by 0.45 m / 10 of the size: 7.2 pixels of 32 at m = 5, either way."""
    torch.manual_seed(0)
    out = BatchRandAugment(num_ops=1, magnitude=magnitude, probability=1.0, operations=["translate_x"])(
        bar_images(8)
    )
    columns = [(image[0] > 0).nonzero()[:, 1].float().mean().item() for image in out]
    expected = 0.45 * magnitude / 10 * 32
    for column in columns:
        assert abs(abs(column - 15.5) - expected) <= 1.0, (columns, expected)


def test_shear_is_timms_shear_factor_and_rotation_timms_degrees():
    torch.manual_seed(0)
    sheared = BatchRandAugment(num_ops=1, magnitude=5, probability=1.0, operations=["shear_x"])(bar_images())
    for image in sheared:
        rows = (image[0] > 0).nonzero()
        top = rows[rows[:, 0] == rows[:, 0].min(), 1].float().mean()
        bottom = rows[rows[:, 0] == rows[:, 0].max(), 1].float().mean()
        slope = abs((bottom - top) / (rows[:, 0].max() - rows[:, 0].min())).item()
        assert abs(slope - 0.15) < 0.05, slope  # timm: 0.3 * m / 10
    torch.manual_seed(0)
    rotated = BatchRandAugment(num_ops=1, magnitude=5, probability=1.0, operations=["rotate"])(bar_images())
    for image in rotated:
        rows = (image[0] > 0).nonzero().float()
        slope = (
            torch.linalg.lstsq(torch.stack([rows[:, 0], torch.ones(len(rows))], 1), rows[:, 1:2])
            .solution[0]
            .abs()
        )
        assert abs(math.degrees(math.atan(slope.item())) - 15) < 3  # timm: 30 * m / 10 degrees


def test_operations_are_selected_by_name_and_unknown_ones_refused():
    assert [name for name, _, _ in select_operations(["rotate,shear_x", "translate_y"])] == [
        "rotate",
        "shear_x",
        "translate_y",
    ]
    assert select_operations(None) == RANDAUGMENT_POLICY
    with pytest.raises(ValueError, match=r"unknown \['warp'\]"):
        select_operations(["rotate", "warp"])


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"num_ops": 0}, "num_ops >= 1"),
        ({"magnitude": 10}, "strictly between 0 and 10"),
        ({"magnitude": 0}, "strictly between 0 and 10"),
        ({"probability": 1.5}, r"\[0, 1\]"),
    ],
)
def test_invalid_arguments_are_refused(kwargs, error):
    with pytest.raises(ValueError, match=error):
        BatchRandAugment(**kwargs)


def test_patches_are_refused():
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        BatchRandAugment()(torch.zeros(2, 64, 48))


def test_other_normalizations_round_trip():
    """Images normalized with another mean and std come back in that normalization."""
    mean, std = (0.2, 0.3, 0.4), (0.5, 0.6, 0.7)
    raw = torch.rand(4, 3, 32, 32)
    images = (raw - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    augment = BatchRandAugment(num_ops=1, probability=0.0, image_mean=mean, image_std=std)
    torch.testing.assert_close(augment(images), images)


def test_geometric_operations_fill_with_the_mean_like_timm():
    """A black image translated: the columns moved in from outside are the mean (0 once normalized), not black."""
    torch.manual_seed(0)
    black = -torch.ones(4, 3, 32, 32)
    out = BatchRandAugment(num_ops=1, magnitude=5, probability=1.0, operations=["translate_x"])(black)
    filled = (out.abs() < 1e-5).all(dim=(1, 2))  # (B, W): columns that are the mean in every row and channel
    assert (filled.sum(dim=1) >= 6).all(), filled.sum(dim=1)
    assert ((out + 1).abs() < 1e-5).any()  # the image itself stays black
