"""Tests for the image processors (patchified pixel values): `NeuralInterpreterImageProcessor` (PIL backend) and
`NeuralInterpreterImageProcessorTorchvision` (torchvision backend; its tests skip where torchvision is not installed).

The `processor` fixture runs every behaviour test on both backends; the backend tests below check that the two give
the same values, errors and saved files, and that AutoImageProcessor picks the one transformers would."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import PIL.Image
import pytest
import torch
from transformers import AutoImageProcessor, BatchFeature
from transformers.utils import is_torchvision_available

from ni_hf.models.neural_interpreter.configuration_neural_interpreter import NeuralInterpreterConfig
from ni_hf.models.neural_interpreter.image_processing_neural_interpreter import (
    NeuralInterpreterImageProcessor,
    NeuralInterpreterImageProcessorTorchvision,
    patchify,
    unpatchify,
)

needs_torchvision = pytest.mark.skipif(not is_torchvision_available(), reason="torchvision is not installed")
BACKENDS = {"pil": NeuralInterpreterImageProcessor, "torchvision": NeuralInterpreterImageProcessorTorchvision}

RNG = np.random.default_rng(0)
RGB32 = RNG.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
GRAY32 = RNG.integers(0, 256, size=(32, 32), dtype=np.uint8)


@pytest.fixture(params=["pil", pytest.param("torchvision", marks=needs_torchvision)])
def processor(request: pytest.FixtureRequest) -> NeuralInterpreterImageProcessor:
    """Processor with the default settings, of each backend."""
    return BACKENDS[request.param]()


def reference_patchify(images: torch.Tensor, p: int) -> torch.Tensor:
    """einops `b c (h p1) (w p2) -> b (h w) (p1 p2 c)` written with reshape/permute."""
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(b, (h // p) * (w // p), p * p * c)


def loop_patchify(image: np.ndarray, p: int) -> np.ndarray:
    """Patchify a single (C, H, W) image element by element."""
    c, h, w = image.shape
    grid_w = w // p
    out = np.zeros(((h // p) * grid_w, p * p * c), dtype=image.dtype)
    for i in range(h // p):
        for j in range(grid_w):
            for r in range(p):
                for s in range(p):
                    for k in range(c):
                        out[i * grid_w + j, (r * p + s) * c + k] = image[k, i * p + r, j * p + s]
    return out


def expected_chw(hwc_uint8: np.ndarray) -> np.ndarray:
    """Default rescale + normalize of an already 32x32 uint8 HWC image, as (C, H, W)."""
    return ((hwc_uint8.astype(np.float64) / 255 - 0.5) / 0.5).transpose(2, 0, 1).astype(np.float32)


INPUTS = {
    "pil_rgb": lambda: PIL.Image.fromarray(RGB32),
    "pil_gray": lambda: PIL.Image.fromarray(GRAY32),
    "pil_rgba": lambda: PIL.Image.fromarray(np.dstack([RGB32, np.full((32, 32), 128, np.uint8)]), "RGBA"),
    "pil_palette": lambda: PIL.Image.fromarray(RGB32).convert("P"),
    "pil_binary": lambda: PIL.Image.fromarray(GRAY32).convert("1"),
    "np_hwc_uint8": lambda: RGB32,
    "np_chw_uint8": lambda: RGB32.transpose(2, 0, 1),
    "np_hwc_float": lambda: RGB32.astype(np.float32),
    "np_chw_float64": lambda: RGB32.transpose(2, 0, 1).astype(np.float64),
    "np_gray_2d": lambda: GRAY32,
    "np_gray_hw1": lambda: GRAY32[..., None],
    "np_gray_1hw": lambda: GRAY32[None],
    "torch_chw_uint8": lambda: torch.from_numpy(RGB32).permute(2, 0, 1),
    "torch_chw_float": lambda: torch.rand(3, 20, 28) * 255,
    "torch_bfloat16": lambda: (torch.rand(3, 32, 32) * 255).to(torch.bfloat16),
    "torch_gray_2d": lambda: torch.from_numpy(GRAY32),
    "np_small_rgb": lambda: RNG.integers(0, 256, size=(7, 9, 3), dtype=np.uint8),
    "pil_large": lambda: PIL.Image.fromarray(RNG.integers(0, 256, size=(100, 60, 3), dtype=np.uint8)),
}


@pytest.mark.parametrize("name", list(INPUTS))
def test_input_types_give_patch_tokens(processor: NeuralInterpreterImageProcessor, name: str) -> None:
    """Every supported input kind yields (1, 64, 48) float32 patch tokens within the normalized range."""
    out = processor(INPUTS[name](), return_tensors="pt")
    assert isinstance(out, BatchFeature)
    pixel_values = out["pixel_values"]
    assert isinstance(pixel_values, torch.Tensor)
    assert pixel_values.shape == (1, 64, 48)
    assert pixel_values.dtype == torch.float32
    assert torch.isfinite(pixel_values).all()
    assert pixel_values.min() >= -1.0 - 1e-6 and pixel_values.max() <= 1.0 + 1e-6


@pytest.mark.parametrize("name", ["pil_gray", "np_gray_2d", "np_gray_hw1", "np_gray_1hw", "torch_gray_2d"])
def test_gray_is_replicated_to_rgb(processor: NeuralInterpreterImageProcessor, name: str) -> None:
    """Gray inputs become 3 identical channels, equal to the RGB image of the same gray values."""
    out = processor(INPUTS[name](), return_tensors="pt")["pixel_values"]
    per_channel = out.reshape(1, 64, 16, 3)
    assert torch.equal(per_channel[..., 0], per_channel[..., 1])
    assert torch.equal(per_channel[..., 0], per_channel[..., 2])
    rgb = processor(np.repeat(GRAY32[..., None], 3, axis=-1), return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(out, rgb)


def test_equivalent_inputs_give_identical_outputs(processor: NeuralInterpreterImageProcessor) -> None:
    """PIL, numpy HWC/CHW, float and torch versions of one image agree exactly."""
    reference = processor(PIL.Image.fromarray(RGB32), return_tensors="pt")["pixel_values"]
    for name in ["np_hwc_uint8", "np_chw_uint8", "np_hwc_float", "np_chw_float64", "torch_chw_uint8"]:
        torch.testing.assert_close(processor(INPUTS[name](), return_tensors="pt")["pixel_values"], reference)


def test_batch_of_mixed_sizes_and_types(processor: NeuralInterpreterImageProcessor) -> None:
    """A list mixing sizes, gray/RGB and input types is stacked into one batch."""
    images = [
        INPUTS[name]()
        for name in ["pil_large", "np_small_rgb", "torch_gray_2d", "pil_palette", "np_hwc_float"]
    ]
    out = processor(images, return_tensors="pt")
    assert out["pixel_values"].shape == (5, 64, 48)
    assert out["pixel_values"].dtype == torch.float32
    single = processor(images[1], return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(out["pixel_values"][1:2], single)


def test_4d_batch_array(processor: NeuralInterpreterImageProcessor) -> None:
    """A 4-D (B, H, W, C) array is treated as a batch of images."""
    batch = np.stack([RGB32, RGB32[::-1]])
    out = processor(batch, return_tensors="pt")["pixel_values"]
    assert out.shape == (2, 64, 48)
    torch.testing.assert_close(out[1:], processor(RGB32[::-1].copy(), return_tensors="pt")["pixel_values"])


def test_return_tensors_none_gives_float32_numpy_list(processor: NeuralInterpreterImageProcessor) -> None:
    """Without return_tensors the output is a list of float32 arrays of the backend (numpy for PIL, torch else)."""
    out = processor([RGB32, GRAY32])["pixel_values"]
    assert isinstance(out, list) and len(out) == 2
    kind, dtype = (np.ndarray, np.float32) if processor.backend == "pil" else (torch.Tensor, torch.float32)
    assert all(isinstance(x, kind) and tuple(x.shape) == (64, 48) and x.dtype == dtype for x in out)


def test_image_files_are_read_as_rgb(processor: NeuralInterpreterImageProcessor, tmp_path: Path) -> None:
    """A path is decoded by PIL and converted to RGB, on both backends (so they read the same pixels)."""
    paths = {"gray.png": PIL.Image.fromarray(GRAY32), "rgb.jpg": PIL.Image.fromarray(RGB32)}
    for name, image in paths.items():
        image.save(tmp_path / name)
        expected = processor(PIL.Image.open(tmp_path / name).convert("RGB"), return_tensors="pt")[
            "pixel_values"
        ]
        torch.testing.assert_close(
            processor(str(tmp_path / name), return_tensors="pt")["pixel_values"], expected
        )
    batch = processor([str(tmp_path / name) for name in paths], return_tensors="pt")["pixel_values"]
    assert batch.shape == (2, 64, 48)


def test_patch_layout_matches_einops_reference(processor: NeuralInterpreterImageProcessor) -> None:
    """Patches are row-major over the grid and laid out (p1 p2 c) inside a patch."""
    out = processor(RGB32, return_tensors="pt")["pixel_values"]
    chw = expected_chw(RGB32)
    expected = reference_patchify(torch.from_numpy(chw)[None], 4)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out[0], torch.from_numpy(loop_patchify(chw, 4)))
    # Spot check: patch 1 is grid row 0, column 1; its first entry is channel 0 of pixel (0, 4).
    assert out[0, 1, 0].item() == pytest.approx(chw[0, 0, 4])
    # Patch 8 is grid row 1, column 0; entry (r=1, s=2, c=2) sits at (1 * 4 + 2) * 3 + 2 = 20.
    assert out[0, 8, 20].item() == pytest.approx(chw[2, 4 + 1, 0 + 2])


def test_patch_layout_non_square_and_other_patch_size() -> None:
    """Layout also holds for a non-square size and patch size 8."""
    proc = NeuralInterpreterImageProcessor(size={"height": 16, "width": 24}, patch_size=8)
    image = RNG.integers(0, 256, size=(16, 24, 3), dtype=np.uint8)
    out = proc(image, return_tensors="pt")["pixel_values"]
    assert out.shape == (1, 6, 192)
    torch.testing.assert_close(out[0], torch.from_numpy(loop_patchify(expected_chw(image), 8)))


def test_do_patchify_false_gives_images(processor: NeuralInterpreterImageProcessor) -> None:
    """With do_patchify=False pixel_values are (B, 3, H, W); patchifying them gives the default output."""
    images = [RGB32, INPUTS["pil_large"]()]
    plain = processor(images, do_patchify=False, return_tensors="pt")["pixel_values"]
    assert plain.shape == (2, 3, 32, 32)
    torch.testing.assert_close(plain[0], torch.from_numpy(expected_chw(RGB32)))
    patches = processor(images, return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(processor.patchify(plain), patches)
    torch.testing.assert_close(processor.unpatchify(patches), plain)
    plain_proc = NeuralInterpreterImageProcessor(do_patchify=False)
    assert plain_proc(RGB32, return_tensors="pt")["pixel_values"].shape == (1, 3, 32, 32)


@pytest.mark.parametrize(
    "shape,patch", [((2, 3, 32, 32), 4), ((3, 8, 12), 2), ((1, 5, 16, 8), 8), ((4, 4), 2)]
)
def test_unpatchify_inverts_patchify(shape: tuple[int, ...], patch: int) -> None:
    """unpatchify(patchify(x)) == x for numpy arrays and torch tensors."""
    if len(shape) == 2:
        with pytest.raises(ValueError, match="C, H, W"):
            patchify(np.zeros(shape), patch)
        return
    x = RNG.standard_normal(shape).astype(np.float32)
    h, w = shape[-2:]
    np.testing.assert_array_equal(unpatchify(patchify(x, patch), patch, h, w), x)
    t = torch.from_numpy(x)
    torch.testing.assert_close(unpatchify(patchify(t, patch), patch, h, w), t, rtol=0, atol=0)
    torch.testing.assert_close(patchify(t, patch), torch.from_numpy(patchify(x, patch)), rtol=0, atol=0)


def test_normalization_maths() -> None:
    """255 -> 1.0 and 0 -> -1.0 with the defaults; custom mean/std are applied per channel."""
    proc = NeuralInterpreterImageProcessor()
    white = proc(np.full((40, 30, 3), 255, np.uint8), return_tensors="pt")["pixel_values"]
    assert torch.equal(white, torch.ones(1, 64, 48))
    black = proc(PIL.Image.new("L", (10, 10), 0), return_tensors="pt")["pixel_values"]
    assert torch.equal(black, -torch.ones(1, 64, 48))
    transparent = proc(PIL.Image.new("RGBA", (32, 32), (0, 0, 0, 0)), return_tensors="pt")["pixel_values"]
    assert torch.equal(transparent, torch.ones(1, 64, 48))  # alpha is composited onto white

    custom = NeuralInterpreterImageProcessor(image_mean=[0.1, 0.2, 0.3], image_std=[0.5, 0.25, 2.0])
    value = np.full((32, 32, 3), 51, np.uint8)  # 51 / 255 = 0.2
    out = custom(value, return_tensors="pt")["pixel_values"].reshape(64, 16, 3)
    expected = torch.tensor([(0.2 - 0.1) / 0.5, (0.2 - 0.2) / 0.25, (0.2 - 0.3) / 2.0])
    torch.testing.assert_close(out, expected.expand(64, 16, 3))

    raw = NeuralInterpreterImageProcessor(do_rescale=False, do_normalize=False, do_patchify=False)
    assert torch.equal(raw(value, return_tensors="pt")["pixel_values"], torch.full((1, 3, 32, 32), 51.0))


def test_float_inputs_in_unit_range_with_do_rescale_false(processor: NeuralInterpreterImageProcessor) -> None:
    """Float images already in [0, 1] match the uint8 result when do_rescale=False."""
    unit = torch.from_numpy(RGB32).permute(2, 0, 1).float() / 255
    out = processor(unit, do_rescale=False, return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(out, processor(RGB32, return_tensors="pt")["pixel_values"])


def test_resize_float_close_to_uint8(processor: NeuralInterpreterImageProcessor) -> None:
    """Float images are resized in float precision, close to the uint8 PIL resize."""
    image = RNG.integers(0, 256, size=(64, 48, 3), dtype=np.uint8)
    as_uint8 = processor(image, return_tensors="pt")["pixel_values"]
    as_float = processor(image.astype(np.float32), return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(as_float, as_uint8, rtol=0, atol=2 / 255 * 2)
    constant = processor(np.full((50, 70), 255.0), return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(constant, torch.ones(1, 64, 48))


def test_call_time_overrides(processor: NeuralInterpreterImageProcessor) -> None:
    """size and patch_size can be overridden per call."""
    out = processor(RGB32, patch_size=8, return_tensors="pt")["pixel_values"]
    assert out.shape == (1, 16, 192)
    out = processor(RGB32, size={"height": 16, "width": 16}, return_tensors="pt")["pixel_values"]
    assert out.shape == (1, 16, 48)
    assert processor.patch_size == 4 and processor.size.height == 32


def test_int_size_means_square() -> None:
    """An int size is a square size."""
    proc = NeuralInterpreterImageProcessor(size=16, patch_size=2)
    assert proc(RGB32, return_tensors="pt")["pixel_values"].shape == (1, 64, 12)


def test_save_load_round_trip(tmp_path: Path) -> None:
    """All attributes persist in preprocessor_config.json and outputs are identical after reloading."""
    proc = NeuralInterpreterImageProcessor(
        size={"height": 24, "width": 16},
        patch_size=8,
        do_patchify=False,
        image_mean=[0.4, 0.5, 0.6],
        image_std=[0.2, 0.3, 0.4],
        resample=PIL.Image.Resampling.BICUBIC,
    )
    proc.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "preprocessor_config.json").read_text())
    assert saved["patch_size"] == 8 and saved["do_patchify"] is False
    assert saved["size"] == {"height": 24, "width": 16}
    assert saved["image_processor_type"] == "NeuralInterpreterImageProcessor"

    loaded = NeuralInterpreterImageProcessor.from_pretrained(tmp_path)
    assert loaded.to_dict() == proc.to_dict()
    images = [INPUTS["pil_large"](), GRAY32]
    torch.testing.assert_close(
        loaded(images, return_tensors="pt")["pixel_values"], proc(images, return_tensors="pt")["pixel_values"]
    )
    patched = loaded(images, do_patchify=True, return_tensors="pt")["pixel_values"]
    assert patched.shape == (2, 6, 192)


def test_auto_image_processor_after_register(tmp_path: Path) -> None:
    """AutoImageProcessor loads the processor once registered for NeuralInterpreterConfig."""
    AutoImageProcessor.register(
        NeuralInterpreterConfig,
        image_processor_classes={"pil": NeuralInterpreterImageProcessor},
        exist_ok=True,
    )
    NeuralInterpreterImageProcessor(patch_size=8).save_pretrained(tmp_path)
    loaded = AutoImageProcessor.from_pretrained(tmp_path, backend="pil")
    assert type(loaded) is NeuralInterpreterImageProcessor
    assert loaded.patch_size == 8


def test_remote_code_load_in_fresh_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With register_for_auto_class the saved folder loads with trust_remote_code=True without ni_hf."""
    monkeypatch.setattr(
        NeuralInterpreterImageProcessor, "_auto_class", NeuralInterpreterImageProcessor._auto_class
    )
    NeuralInterpreterImageProcessor.register_for_auto_class("AutoImageProcessor")
    save_dir = tmp_path / "ni_processor"
    proc = NeuralInterpreterImageProcessor(patch_size=8)
    proc.save_pretrained(save_dir)

    saved = json.loads((save_dir / "preprocessor_config.json").read_text())
    assert saved["auto_map"] == {
        "AutoImageProcessor": "image_processing_neural_interpreter.NeuralInterpreterImageProcessor"
    }
    assert (save_dir / "image_processing_neural_interpreter.py").is_file()
    expected = proc(RGB32, return_tensors="np")["pixel_values"]
    np.save(tmp_path / "image.npy", RGB32)

    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["ni_hf"] = None  # importing the package must be impossible here (it may be installed)
        import numpy as np
        from transformers import AutoImageProcessor

        proc = AutoImageProcessor.from_pretrained({str(save_dir)!r}, trust_remote_code=True)
        assert not [k for k, v in sys.modules.items() if k.startswith("ni_hf") and v is not None]
        assert type(proc).__name__ == "NeuralInterpreterImageProcessor", type(proc)
        assert type(proc).__module__.startswith("transformers_modules"), type(proc).__module__
        out = proc(np.load("image.npy"), return_tensors="np")["pixel_values"]
        np.save("out.npy", out)
        """
    )
    env = dict(os.environ, PYTHONPATH="", HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected)


@pytest.mark.parametrize(
    "images,match",
    [
        ([], "empty list"),
        ((), "empty list"),
        (np.zeros((32, 32, 2), np.uint8), "expected 1 \\(gray\\), 3 \\(RGB\\) or 4 \\(RGBA\\) channels"),
        (torch.zeros(5, 32, 32), "expected 1 \\(gray\\), 3 \\(RGB\\) or 4 \\(RGBA\\) channels"),
        (np.zeros(32, np.uint8), "rank 2 \\(H, W\\) or 3"),
        (torch.zeros(1, 1, 3, 32, 32), "rank 2 \\(H, W\\) or 3"),
        ([np.zeros(32, np.uint8)], "rank 2 \\(H, W\\) or 3"),
        ([RGB32, 3], "Unsupported image type int"),
    ],
)
def test_bad_inputs_raise(processor: NeuralInterpreterImageProcessor, images: object, match: str) -> None:
    """Unsupported inputs give a ValueError saying what was expected."""
    with pytest.raises(ValueError, match=match):
        processor(images)


def test_pil_needing_conversion_without_do_convert_rgb(processor: NeuralInterpreterImageProcessor) -> None:
    """A palette PIL image needs do_convert_rgb=True; an RGB one does not."""
    with pytest.raises(ValueError, match="mode 'P'.*do_convert_rgb=True"):
        processor(INPUTS["pil_palette"](), do_convert_rgb=False)
    out = processor(PIL.Image.fromarray(RGB32), do_convert_rgb=False, return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(out, processor(RGB32, return_tensors="pt")["pixel_values"])


def test_patch_size_must_divide_size(processor: NeuralInterpreterImageProcessor) -> None:
    """patch_size not dividing the size is rejected at construction, at call time and in patchify."""
    with pytest.raises(ValueError, match="patch_size=5 must divide"):
        NeuralInterpreterImageProcessor(patch_size=5)
    with pytest.raises(ValueError, match="patch_size=3 must divide"):
        NeuralInterpreterImageProcessor(size={"height": 30, "width": 32}, patch_size=3)
    with pytest.raises(ValueError, match="patch_size=5 must divide"):
        processor(RGB32, patch_size=5)
    with pytest.raises(ValueError, match="patch_size=4 must divide"):
        processor(RNG.integers(0, 256, size=(30, 32, 3), dtype=np.uint8), do_resize=False)
    with pytest.raises(ValueError, match="positive integer"):
        NeuralInterpreterImageProcessor(patch_size=0)
    # Without patchifying, any patch_size is accepted.
    plain_proc = NeuralInterpreterImageProcessor(patch_size=5, do_patchify=False)
    assert plain_proc(RGB32)["pixel_values"][0].shape == (3, 32, 32)


def test_boolean_array_reads_as_black_and_white_like_pil_mode_1(
    processor: NeuralInterpreterImageProcessor,
) -> None:
    mask = np.zeros((32, 32), dtype=bool)
    mask[:, 16:] = True
    as_pil = PIL.Image.fromarray(mask.astype(np.uint8) * 255).convert("1")
    expected = processor(images=as_pil, return_tensors="np")["pixel_values"]
    np.testing.assert_allclose(processor(images=mask, return_tensors="np")["pixel_values"], expected)
    assert expected.max() == 1.0 and expected.min() == -1.0


def test_mixed_sizes_without_resizing_name_the_way_out(processor: NeuralInterpreterImageProcessor) -> None:
    images = [np.zeros((32, 32, 3), dtype=np.uint8), np.zeros((16, 16, 3), dtype=np.uint8)]
    with pytest.raises(ValueError, match="do_resize=True"):
        processor(images=images, do_resize=False, return_tensors="pt")
    as_list = processor(images=images, do_resize=False, return_tensors=None, do_patchify=False)[
        "pixel_values"
    ]
    assert [tuple(image.shape) for image in as_list] == [(3, 32, 32), (3, 16, 16)]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_pixels_are_refused_naming_the_image(
    processor: NeuralInterpreterImageProcessor, bad
) -> None:
    images = [np.full((32, 32, 3), 128.0, dtype=np.float32) for _ in range(3)]
    images[2][5, 7, 1] = bad
    with pytest.raises(ValueError, match=r"Image 2 \(float32\) contains NaN or infinite values"):
        processor(images=images, return_tensors="pt")
    with pytest.raises(ValueError, match=r"Image 0 \(torch.float32\) contains NaN"):
        processor(images=torch.from_numpy(images[2]).permute(2, 0, 1), return_tensors="pt")


# ----------------------------------------------------------------------------------------------------------
# The two backends
# ----------------------------------------------------------------------------------------------------------

ONE_GREY_LEVEL = 1 / 255 / 0.5  # one uint8 step after the default rescale and normalization


def fallback_warnings(load) -> tuple[object, str]:
    """Run `load()` and return its result and what transformers' auto module logged (its warnings are once-only)."""
    from transformers.models.auto import image_processing_auto
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    image_processing_auto.logger.warning_once.cache_clear()
    with CaptureLogger(logging.get_logger(image_processing_auto.__name__)) as captured:
        result = load()
    return result, captured.out


def test_auto_image_processor_maps_each_backend_to_its_processor() -> None:
    """Both configs register a PIL and a torchvision processor, as transformers' models do."""
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING

    from ni_hf import MultiTaskViTConfig

    for config_class in (NeuralInterpreterConfig, MultiTaskViTConfig):
        assert IMAGE_PROCESSOR_MAPPING[config_class] == BACKENDS


def test_auto_image_processor_picks_the_backend_transformers_would_without_a_fallback_warning(
    tmp_path: Path,
) -> None:
    """torchvision where it is installed, else PIL; the other backend on request, or an error naming torchvision."""
    NeuralInterpreterImageProcessor(patch_size=8).save_pretrained(tmp_path)
    loaded, logged = fallback_warnings(lambda: AutoImageProcessor.from_pretrained(tmp_path))
    expected = BACKENDS["torchvision" if is_torchvision_available() else "pil"]
    assert type(loaded) is expected and loaded.patch_size == 8
    assert "Falling back" not in logged
    if is_torchvision_available():
        pil = AutoImageProcessor.from_pretrained(tmp_path, backend="pil")
        assert type(pil) is NeuralInterpreterImageProcessor and pil.patch_size == 8
        return
    with pytest.raises(ImportError, match="needs torchvision.*NeuralInterpreterImageProcessor"):
        AutoImageProcessor.from_pretrained(tmp_path, backend="torchvision")
    with pytest.raises(ImportError, match="needs torchvision"):
        NeuralInterpreterImageProcessorTorchvision()


@needs_torchvision
@pytest.mark.parametrize("name", list(INPUTS))
def test_torchvision_processor_gives_the_pil_processors_values(name: str) -> None:
    """Equal values where nothing is resized down; where it is, one grey level apart at most (rounding)."""
    image = INPUTS[name]()
    expected = NeuralInterpreterImageProcessor()(image, return_tensors="pt")["pixel_values"]
    got = NeuralInterpreterImageProcessorTorchvision()(image, return_tensors="pt")["pixel_values"]
    assert got.shape == expected.shape and got.dtype == expected.dtype
    downsampled = name in ("pil_large", "torch_chw_float")  # 100 x 60 and 20 x 28 images: antialiased
    torch.testing.assert_close(got, expected, rtol=0, atol=ONE_GREY_LEVEL * 1.001 if downsampled else 1e-6)


@needs_torchvision
def test_torchvision_processor_upsamples_digits_exactly_as_pil() -> None:
    """The digits sources, 8 x 8 (scikit-learn) and 28 x 28 (MNIST, MNIST-M) images resized up to 32 x 32, get the
    same uint8 values from both backends; only the rescale and normalization round differently (float32)."""
    raw = {"do_rescale": False, "do_normalize": False, "do_patchify": False, "return_tensors": "pt"}
    for size in [(8, 8), (28, 28), (28, 28, 3)]:
        image = RNG.integers(0, 256, size=size, dtype=np.uint8)
        expected = NeuralInterpreterImageProcessor()(image, **raw)["pixel_values"]
        got = NeuralInterpreterImageProcessorTorchvision()(image, **raw)["pixel_values"]
        assert expected.shape == (1, 3, 32, 32) and torch.equal(got, expected)


@needs_torchvision
@pytest.mark.parametrize(
    "images,error",
    [
        (np.zeros((32, 32, 2), np.uint8), ValueError),
        (torch.zeros(5, 32, 32), ValueError),
        (torch.zeros(1, 1, 3, 32, 32), ValueError),
        ([RGB32, 3], ValueError),
        (np.full((32, 32, 3), np.nan, np.float32), ValueError),
        (PIL.Image.fromarray(RGB32).convert("P"), ValueError),
    ],
)
def test_torchvision_processor_raises_the_pil_processors_errors(images: object, error: type) -> None:
    kwargs = {"do_convert_rgb": False} if isinstance(images, PIL.Image.Image) else {}
    messages = []
    for backend in BACKENDS.values():
        with pytest.raises(error) as caught:
            backend()(images, **kwargs)
        messages.append(str(caught.value))
    assert messages[0] == messages[1]


@needs_torchvision
def test_torchvision_processor_saves_what_the_pil_processor_saves(tmp_path: Path) -> None:
    """Same preprocessor_config.json (type, auto_map, settings), so a folder loads with either backend anywhere."""
    settings = {"size": {"height": 24, "width": 16}, "patch_size": 8, "image_mean": [0.4, 0.5, 0.6]}
    NeuralInterpreterImageProcessor(**settings).save_pretrained(tmp_path / "pil")
    NeuralInterpreterImageProcessorTorchvision(**settings).save_pretrained(tmp_path / "torchvision")
    saved = [json.loads((tmp_path / b / "preprocessor_config.json").read_text()) for b in BACKENDS]
    assert saved[0] == saved[1]
    assert saved[1]["image_processor_type"] == "NeuralInterpreterImageProcessor"
    loaded = NeuralInterpreterImageProcessorTorchvision.from_pretrained(tmp_path / "torchvision")
    assert loaded.size.height == 24 and loaded.patch_size == 8 and list(loaded.image_mean) == [0.4, 0.5, 0.6]


@needs_torchvision
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_torchvision_processor_works_on_the_gpu() -> None:
    """`device="cuda"`: the batch is processed and returned there, with the values of the CPU."""
    images = [INPUTS["pil_large"](), RGB32, GRAY32]
    processor = NeuralInterpreterImageProcessorTorchvision()
    on_gpu = processor(images, device="cuda", return_tensors="pt")["pixel_values"]
    assert on_gpu.device.type == "cuda"
    on_cpu = processor(images, return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, rtol=0, atol=ONE_GREY_LEVEL * 1.001)


# ----------------------------------------------------------------------------------------------------------
# High bit depths, RGBA arrays and do_convert_rgb=False
# ----------------------------------------------------------------------------------------------------------

PLAIN = {"do_patchify": False, "do_normalize": False, "return_tensors": "np"}  # (C, H, W) in [0, 1]
GRADIENT_12_BIT = (np.arange(32 * 32).reshape(32, 32) * 4).astype(np.uint16)  # 0..4092


def pil_image(array: np.ndarray, mode: str) -> PIL.Image.Image:
    """A PIL image of a high-depth mode ("I;16", "I" or "F") holding `array`."""
    if mode == "I;16":
        return PIL.Image.frombytes("I;16", array.shape[::-1], array.astype("<u2").tobytes())
    return PIL.Image.fromarray(array.astype(np.int32 if mode == "I" else np.float32))


@pytest.mark.parametrize("mode", ["I;16", "I"])
def test_sixteen_bit_pil_images_are_scaled_by_their_bit_depth_not_clipped(processor, mode: str) -> None:
    """A 12-bit gradient in a 16-bit image keeps its gradient (PIL's RGB conversion turned 91% of it white)."""
    image = pil_image(GRADIENT_12_BIT, mode)
    assert image.mode == mode
    out = processor(image, **PLAIN)["pixel_values"][0]
    assert out.shape == (3, 32, 32)
    np.testing.assert_allclose(out[0], GRADIENT_12_BIT / 4095, atol=1e-6)
    assert (out >= 0.999).mean() < 0.01


def test_sixteen_bit_pil_image_of_8_bit_values_reads_as_8_bit(processor) -> None:
    image = pil_image(GRAY32.astype(np.uint16), "I;16")
    expected = processor(PIL.Image.fromarray(GRAY32), **PLAIN)["pixel_values"]
    np.testing.assert_allclose(processor(image, **PLAIN)["pixel_values"], expected, atol=1e-6)


def test_full_16_bit_range_maps_to_the_full_8_bit_range(processor) -> None:
    array = np.zeros((32, 32), np.uint16)
    array[:, 16:] = 65535
    out = processor(pil_image(array, "I;16"), **PLAIN)["pixel_values"][0]
    assert out.min() == 0.0 and out.max() == pytest.approx(1.0)


@pytest.mark.parametrize("high", [1.0, 255.0])
def test_float_pil_images_stay_continuous(processor, high: float) -> None:
    """A mode "F" image in [0, 1] (or 0..255) keeps its 1024 levels (PIL's RGB conversion left two)."""
    values = np.arange(32 * 32).reshape(32, 32) / 1023 * high
    out = processor(pil_image(values, "F"), **PLAIN)["pixel_values"][0]
    assert len(np.unique(out[0].round(6))) == 1024
    np.testing.assert_allclose(out[1], values / high, atol=1e-6)


def test_high_depth_pil_images_keep_one_channel_without_convert_rgb(processor) -> None:
    out = processor(pil_image(GRADIENT_12_BIT, "I;16"), do_convert_rgb=False, **PLAIN)["pixel_values"][0]
    np.testing.assert_allclose(out, (GRADIENT_12_BIT / 4095)[None], atol=1e-6)


@pytest.mark.parametrize("layout", ["hwc", "chw"])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_rgba_arrays_are_composited_onto_white_like_transformers(processor, layout: str, kind: str) -> None:
    """4-channel arrays get transformers' RGB conversion, as a PIL image in mode RGBA does."""
    rgba = RNG.integers(0, 256, size=(32, 32, 4), dtype=np.uint8)
    image = rgba if layout == "hwc" else rgba.transpose(2, 0, 1)
    image = torch.from_numpy(np.ascontiguousarray(image)) if kind == "torch" else image
    expected = processor(PIL.Image.fromarray(rgba, "RGBA"), **PLAIN)["pixel_values"]
    np.testing.assert_allclose(processor(image, **PLAIN)["pixel_values"], expected, atol=1 / 255 + 1e-6)


def test_float_rgba_arrays_are_composited_on_their_own_scale(processor) -> None:
    rgba = RNG.integers(0, 256, size=(32, 32, 4), dtype=np.uint8)
    expected = processor(rgba, **PLAIN)["pixel_values"]
    as_255 = processor(rgba.astype(np.float32), **PLAIN)["pixel_values"]
    as_unit = processor(rgba.astype(np.float32) / 255, do_rescale=False, **PLAIN)["pixel_values"]
    np.testing.assert_allclose(as_255, expected, atol=1 / 255 + 1e-6)
    np.testing.assert_allclose(as_unit, expected, atol=1 / 255 + 1e-6)


@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("kind", ["numpy", "torch", "pil"])
def test_do_convert_rgb_false_keeps_the_channels(processor, channels: int, kind: str) -> None:
    """As transformers' processors do: no conversion, the image's own channels (patch_dim = p * p * C)."""
    array = RNG.integers(0, 256, size=(32, 32, channels), dtype=np.uint8)
    if kind == "pil":
        image = PIL.Image.fromarray(array[..., 0] if channels == 1 else array)
    else:
        image = torch.from_numpy(array) if kind == "torch" else array
    stats = {"image_mean": [0.5] * channels, "image_std": [0.5] * channels}
    out = processor(image, do_convert_rgb=False, return_tensors="np", **stats)["pixel_values"]
    assert out.shape == (1, 64, 4 * 4 * channels)
    plain = processor(image, do_convert_rgb=False, **PLAIN, **stats)["pixel_values"][0]
    np.testing.assert_allclose(plain, array.transpose(2, 0, 1) / 255, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------
# Arrays of every dtype: as the equivalent PIL image, or refused by name
# ----------------------------------------------------------------------------------------------------------

UNIT = (np.arange(20 * 28).reshape(20, 28) / 1024).astype(np.float32)  # in [0, 0.55), exact in float32
GRADIENT_16_BIT = (np.arange(20 * 28).reshape(20, 28) * 117).astype(np.uint16)  # 0..65403


def pil_from(array: np.ndarray) -> PIL.Image.Image:
    """The PIL image of a 2-D array's values: "1" for bool, "L" for uint8, "I;16" for uint16, "I", or "F"."""
    if array.dtype == np.bool_:
        return PIL.Image.fromarray(array.astype(np.uint8) * 255).convert("1")
    if array.dtype == np.uint8:
        return PIL.Image.fromarray(array, "L")
    if array.dtype == np.uint16:
        return pil_image(array, "I;16")
    return pil_image(array, "F" if np.issubdtype(array.dtype, np.floating) else "I")


# (array, the values of its PIL equivalent): 20 x 28 images, so that resizing to 32 x 32 runs too.
ARRAYS_AND_THEIR_PIL_IMAGES = {
    "bool": (GRAY32[:20, :28] > 127, GRAY32[:20, :28] > 127),
    "uint8": (GRAY32[:20, :28], GRAY32[:20, :28]),
    "uint16 of 12 bits": (GRADIENT_12_BIT[:20, :28], GRADIENT_12_BIT[:20, :28]),
    "uint16 of 16 bits": (GRADIENT_16_BIT, GRADIENT_16_BIT),
    "uint16 of 8 bits": (GRAY32[:20, :28].astype(np.uint16), GRAY32[:20, :28]),
    "int32 of 12 bits": (
        GRADIENT_12_BIT[:20, :28].astype(np.int32),
        GRADIENT_12_BIT[:20, :28].astype(np.int32),
    ),
    "int64 of 8 bits": (GRAY32[:20, :28].astype(np.int64), GRAY32[:20, :28]),
    "int16 of 12 bits": (
        GRADIENT_12_BIT[:20, :28].astype(np.int16),
        GRADIENT_12_BIT[:20, :28].astype(np.int32),
    ),
    "uint32 of 16 bits": (GRADIENT_16_BIT.astype(np.uint32), GRADIENT_16_BIT),
    "float32 in [0, 1]": (UNIT, UNIT),
    "float32 of 8-bit levels": (UNIT * 255, UNIT * 255),
    "float32 of 16-bit range": (UNIT * 65535, UNIT * 65535),
    "float64 in [0, 1]": (UNIT.astype(np.float64), UNIT),
    "float16 of 8-bit levels": (
        (UNIT * 255).astype(np.float16),
        (UNIT * 255).astype(np.float16).astype(np.float32),
    ),
    "torch bool": (torch.from_numpy(GRAY32[:20, :28] > 127), GRAY32[:20, :28] > 127),
    "torch uint16": (torch.from_numpy(GRADIENT_12_BIT[:20, :28].copy()), GRADIENT_12_BIT[:20, :28]),
    "torch int32": (torch.from_numpy(GRADIENT_12_BIT[:20, :28].astype(np.int32)), GRADIENT_12_BIT[:20, :28]),
    "torch float32 in [0, 1]": (torch.from_numpy(UNIT), UNIT),
    "torch bfloat16 of 8-bit levels": (
        torch.from_numpy(GRAY32[:20, :28].astype(np.float32)).to(torch.bfloat16),  # exact: 8 significant bits
        GRAY32[:20, :28].astype(np.float32),
    ),
}


@pytest.mark.parametrize("name", list(ARRAYS_AND_THEIR_PIL_IMAGES))
def test_arrays_give_the_pixel_values_of_their_pil_image(processor, name: str) -> None:
    array, pil_values = ARRAYS_AND_THEIR_PIL_IMAGES[name]
    expected = processor(pil_from(np.asarray(pil_values)), return_tensors="np")["pixel_values"]
    np.testing.assert_array_equal(processor(array, return_tensors="np")["pixel_values"], expected)


def test_an_rgb_array_of_16_bit_levels_reads_on_its_range() -> None:
    """No PIL mode holds 16-bit RGB: the brightest channel sets the range, as for one channel."""
    rgb = np.stack([GRADIENT_16_BIT, GRADIENT_16_BIT // 2, GRADIENT_16_BIT // 4], axis=-1)
    out = NeuralInterpreterImageProcessor()(rgb, do_resize=False, **PLAIN)["pixel_values"][0]
    np.testing.assert_allclose(out, rgb.transpose(2, 0, 1) / 65535, atol=1e-6)


REFUSED_ARRAYS = {
    "negative int32": (
        np.full((28, 28, 3), -50, np.int32),
        r"Image 0 \(int32\) has values in \[-50.0, -50.0\]: ",
    ),
    "int8": (
        np.full((28, 28), 3, np.int8),
        r"Image 0 \(int8\) has values in \[3.0, 3.0\]: int8 is not a pixel",
    ),
    "negative torch int32": (
        torch.full((3, 28, 28), -50, dtype=torch.int32),
        r"Image 0 \(torch.int32\) has values in \[-50.0, -50.0\]: expected values from 0",
    ),
    "torch int8": (
        torch.zeros(28, 28, dtype=torch.int8),
        r"Image 0 \(torch.int8\) .*int8 is not a pixel type",
    ),
    "complex": (np.ones((28, 28), np.complex64), r"Image 0 \(complex64\) has no real pixel values"),
    "torch complex": (
        torch.ones(28, 28, dtype=torch.complex64),
        r"\(torch.complex64\) has no real pixel values",
    ),
    "object": (np.full((28, 28), None, object), r"Image 0 \(object\) has no real pixel values"),
    "negative floats": (
        np.full((28, 28), -1.0, np.float32),
        r"\(float32\) has values in \[-1.0, -1.0\].*do_rescale=False",
    ),
    "uint64 above 32 bits": (
        np.full((28, 28), 2**40, np.uint64),
        r"\(uint64\) has values in .*at most 4294967295",
    ),
    "NaN among images": ([GRAY32, np.full((28, 28), np.nan)], r"Image 1 \(float64\) contains NaN"),
    "negative 32-bit PIL image": (
        pil_image(np.full((8, 8), -5), "I"),
        r"PIL image 0 in mode 'I' has values in",
    ),
}


@pytest.mark.parametrize("name", list(REFUSED_ARRAYS))
def test_arrays_without_a_pil_image_are_refused_naming_their_dtype_and_range(processor, name: str) -> None:
    images, match = REFUSED_ARRAYS[name]
    with pytest.raises(ValueError, match=match):
        processor(images)


def test_do_rescale_false_takes_floats_as_they_are_but_still_refuses_negative_integers(processor) -> None:
    """Values already on the model's scale, negative included; integers below 0 are no pixels either way."""
    out = processor(
        np.full((32, 32), -0.5, np.float32), do_rescale=False, do_normalize=False, do_patchify=False
    )
    np.testing.assert_array_equal(out["pixel_values"][0], np.full((3, 32, 32), -0.5, np.float32))
    with pytest.raises(ValueError, match=r"\(int32\) has values in \[-5.0, -5.0\]"):
        processor(np.full((32, 32), -5, np.int32), do_rescale=False)


BAD_SIZES = [{"height": 0, "width": 0}, {"height": -4, "width": 32}, {"height": 32.5, "width": 32}, 0, -8]


@pytest.mark.parametrize("size", BAD_SIZES + [{"shortest_edge": 32}], ids=str)
def test_a_size_without_positive_integer_sides_is_refused_at_construction(size: object) -> None:
    with pytest.raises(ValueError, match="`size` must be a dict of positive integers 'height' and 'width'"):
        NeuralInterpreterImageProcessor(size=size)


@pytest.mark.parametrize("size", BAD_SIZES, ids=str)
def test_a_size_without_positive_integer_sides_is_refused_at_call(processor, size: object) -> None:
    from huggingface_hub.errors import StrictDataclassFieldValidationError

    # transformers refuses a non-integer at call time itself, naming the field.
    with pytest.raises((ValueError, StrictDataclassFieldValidationError), match="size"):
        processor(RGB32, size=size)


def test_patchify_of_a_tensor_carries_gradients_and_refuses_a_size_it_does_not_divide() -> None:
    images = torch.randn(2, 3, 8, 12, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: patchify(x, 4), (images,))
    assert torch.autograd.gradcheck(
        lambda x: unpatchify(x, 4, 8, 12), (patchify(images, 4).detach().requires_grad_(),)
    )
    with pytest.raises(ValueError, match="patch_size=4 must divide the image height and width.*30x32"):
        patchify(torch.zeros(1, 3, 30, 32), 4)


def test_patchify_exports_as_reshape_and_permute_for_any_batch_size() -> None:
    """torch.export traces it with a dynamic batch into reshape, permute, reshape: nothing else, no guard on B."""

    class Patchify(torch.nn.Module):
        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return patchify(images, 4)

    batch = torch.export.Dim("batch")
    exported = torch.export.export(
        Patchify(), (torch.randn(2, 3, 8, 8),), dynamic_shapes={"images": {0: batch}}
    )
    ops = [node.target for node in exported.graph.nodes if node.op == "call_function"]
    assert {str(op) for op in ops} <= {"aten.reshape.default", "aten.permute.default", "aten.sym_size.int"}
    images = torch.randn(5, 3, 8, 8)
    torch.testing.assert_close(exported.module()(images), reference_patchify(images, 4), rtol=0, atol=0)
