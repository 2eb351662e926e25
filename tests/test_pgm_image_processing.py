"""Tests for `NeuralInterpreterPanelProcessor`: PGM puzzles (16 panels) to `pixel_values` (B, 16, 1, 80, 80)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import PIL.Image
import PIL.ImageDraw
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoImageProcessor

from ni_hf.models.neural_interpreter.image_processing_neural_interpreter import (
    NeuralInterpreterImageProcessor,
    NeuralInterpreterPanelProcessor,
)

RNG = np.random.default_rng(0)
PUZZLE = RNG.integers(0, 256, size=(16, 24, 24), dtype=np.uint8)  # (panels, H, W)
RAW = {"do_normalize": False, "return_tensors": "pt"}  # panels in [0, 1]


def drawn_panel() -> np.ndarray:
    """A 160 x 160 panel as DeepMind's look: black outlines, lines and a grey shape on white."""
    image = PIL.Image.new("L", (160, 160), 255)
    draw = PIL.ImageDraw.Draw(image)
    draw.line([(0, 53), (159, 53)], fill=0, width=2)
    draw.line([(0, 106), (159, 106)], fill=0, width=2)
    draw.ellipse([20, 20, 60, 60], outline=0, width=2)
    draw.regular_polygon((110, 40, 22), 3, fill=80)
    draw.rectangle([30, 120, 70, 150], outline=0, width=1)
    return np.asarray(image)


def pixel_values(images: object, **kwargs: object) -> torch.Tensor:
    return NeuralInterpreterPanelProcessor()(images, return_tensors="pt", **kwargs)["pixel_values"]


def test_a_puzzle_becomes_16_gray_panels_of_80x80_in_minus_one_to_one() -> None:
    out = NeuralInterpreterPanelProcessor()(np.stack([PUZZLE, PUZZLE]), return_tensors="pt")
    values = out["pixel_values"]
    assert isinstance(values, torch.Tensor)
    assert values.shape == (2, 16, 1, 80, 80) and values.dtype == torch.float32
    assert values.min() >= -1.0 and values.max() <= 1.0
    as_numpy = NeuralInterpreterPanelProcessor()(PUZZLE, return_tensors="np")["pixel_values"]
    assert isinstance(as_numpy, np.ndarray) and as_numpy.shape == (1, 16, 1, 80, 80)


def test_white_panels_are_one_and_black_panels_minus_one() -> None:
    """Rescaled to [0, 1], then normalised with mean 0.5 and std 0.5."""
    puzzle = np.zeros((16, 160, 160), np.uint8)
    puzzle[8:] = 255  # black context panels, white candidates
    values = pixel_values(puzzle)[0]
    assert torch.equal(values[:8], -torch.ones(8, 1, 80, 80))
    assert torch.equal(values[8:], torch.ones(8, 1, 80, 80))


LAYOUTS = {
    "numpy (16, H, W)": lambda: PUZZLE,
    "torch (16, H, W)": lambda: torch.from_numpy(PUZZLE),
    "DeepMind's stored (H, W, 16)": lambda: PUZZLE.reshape(24, 24, 16),
    "torch, DeepMind's stored (H, W, 16)": lambda: torch.from_numpy(PUZZLE.reshape(24, 24, 16)),
    "RGB (16, H, W, 3)": lambda: np.repeat(PUZZLE[..., None], 3, axis=-1),
    "16 PIL images": lambda: [PIL.Image.fromarray(panel) for panel in PUZZLE],
    "16 RGB PIL images": lambda: [PIL.Image.fromarray(panel).convert("RGB") for panel in PUZZLE],
    "16 2-D arrays": lambda: list(PUZZLE),
    "16 bit with 8-bit values": lambda: PUZZLE.astype(np.uint16),
    "int64 with 8-bit values": lambda: PUZZLE.astype(np.int64),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_of_a_puzzle_gives_the_same_pixel_values(layout: str) -> None:
    expected = pixel_values(PUZZLE)
    torch.testing.assert_close(pixel_values(LAYOUTS[layout]()), expected, rtol=0, atol=0)


def test_a_cube_of_16_panels_of_16_x_16_follows_input_data_format() -> None:
    """(16, 16, 16) reads as (panels, H, W), which is also how DeepMind's stored arrays read, unless
    `input_data_format` says the panels truly lie along the last axis."""
    cube = RNG.integers(0, 256, size=(16, 16, 16), dtype=np.uint8)
    torch.testing.assert_close(pixel_values(cube), pixel_values(list(cube)))
    torch.testing.assert_close(pixel_values(cube), pixel_values(list(cube.reshape(16, 16, 16))))
    panels_last = pixel_values(cube, input_data_format="channels_last")
    torch.testing.assert_close(panels_last, pixel_values(list(cube.transpose(2, 0, 1))))


def test_panels_stacked_along_the_last_axis_read_with_input_data_format() -> None:
    stacked = np.stack(list(PUZZLE), axis=-1)  # (H, W, 16), panel p at [..., p]
    torch.testing.assert_close(
        pixel_values(stacked, input_data_format="channels_last"), pixel_values(PUZZLE), rtol=0, atol=0
    )
    torch.testing.assert_close(
        pixel_values(torch.from_numpy(PUZZLE).permute(1, 2, 0), input_data_format="channels_last"),
        pixel_values(PUZZLE),
        rtol=0,
        atol=0,
    )


def test_deepmind_s_stored_image_reads_as_ni_hf_data_pgm_reads_its_file(tmp_path) -> None:
    """DeepMind's .npz holds `image` of shape (160, 160, 16), panel after panel: the processor reshapes it as the
    package's loader does, so both give the same panels (moving the last axis would scramble every one)."""
    panels = np.random.default_rng(1).integers(0, 256, size=(16, 160, 160), dtype=np.uint8)
    path = tmp_path / "PGM_neutral_train_0.npz"
    pgm = pytest.importorskip("ni_hf.data.pgm")
    read = getattr(pgm, "read_deepmind_npz", None)
    if read is None:
        pytest.skip("ni_hf.data.pgm has no read_deepmind_npz")
    row = np.isin(pgm.META_TARGET_NAMES, ("shape", "color", "progression")).astype(np.uint8)  # one triple
    structure = np.zeros((4, 12), np.uint8)
    structure[0] = row
    np.savez(
        path,
        image=panels.reshape(160, 160, 16),
        target=np.int64(3),
        meta_target=row,
        relation_structure_encoded=structure,
    )
    stored = np.load(path)["image"]
    assert stored.shape == (160, 160, 16)
    from_file = pixel_values(stored)
    torch.testing.assert_close(from_file, pixel_values(panels), rtol=0, atol=0)
    loaded = read(path)
    assert np.array_equal(loaded["panels"], panels)
    torch.testing.assert_close(from_file, pixel_values(loaded["panels"]), rtol=0, atol=0)


ONE_GREY_LEVEL = 1 / 255 / 0.5  # after the default rescale and normalisation


@pytest.mark.parametrize(
    "floats",
    [
        lambda: torch.from_numpy(PUZZLE).to(torch.bfloat16),
        lambda: PUZZLE.astype(np.float32) / 255,
        lambda: PUZZLE.astype(np.float64),
    ],
    ids=["bfloat16 0..255", "float32 in [0, 1]", "float64 0..255"],
)
def test_float_puzzles_are_read_on_their_scale_and_resized_in_float(floats) -> None:
    """Within a grey level of the uint8 puzzle: the uint8 one is resized to whole levels, floats are not rounded."""
    torch.testing.assert_close(
        pixel_values(floats()), pixel_values(PUZZLE), rtol=0, atol=ONE_GREY_LEVEL * 1.001
    )
    torch.testing.assert_close(
        pixel_values(floats(), do_resize=False), pixel_values(PUZZLE, do_resize=False), rtol=0, atol=1e-6
    )


def test_colour_panels_are_made_gray_as_pil_makes_them() -> None:
    rgb = RNG.integers(0, 256, size=(16, 24, 24, 3), dtype=np.uint8)
    as_pil = [PIL.Image.fromarray(panel).convert("L") for panel in rgb]
    torch.testing.assert_close(pixel_values(rgb), pixel_values(as_pil), rtol=0, atol=0)
    # Float panels are weighted in float (PIL rounds to a whole level).
    as_float = pixel_values(rgb.astype(np.float32), do_resize=False)
    torch.testing.assert_close(as_float, pixel_values(rgb, do_resize=False), rtol=0, atol=ONE_GREY_LEVEL / 2)


@pytest.mark.parametrize(
    "batch",
    [
        lambda puzzles: np.stack(puzzles),
        lambda puzzles: torch.from_numpy(np.stack(puzzles)),
        lambda puzzles: list(puzzles),
        lambda puzzles: [[PIL.Image.fromarray(panel) for panel in puzzle] for puzzle in puzzles],
        lambda puzzles: np.stack([p.reshape(24, 24, 16) for p in puzzles]),
    ],
    ids=[
        "(B, 16, H, W)",
        "torch (B, 16, H, W)",
        "list of arrays",
        "list of lists of PIL",
        "DeepMind's (B, H, W, 16)",
    ],
)
def test_a_batch_is_its_puzzles_stacked(batch) -> None:
    puzzles = [PUZZLE, PUZZLE[::-1].copy(), 255 - PUZZLE]
    expected = torch.cat([pixel_values(puzzle) for puzzle in puzzles])
    torch.testing.assert_close(pixel_values(batch(puzzles)), expected, rtol=0, atol=0)


def test_resizing_160_to_80_is_bilinear_with_antialias() -> None:
    """A drawn panel at DeepMind's 160 x 160 lands within one grey level of torch's antialiased bilinear 80 x 80,
    far from bilinear without antialias (thin lines vanish) and from dropping every other pixel."""
    panel = drawn_panel()
    out = NeuralInterpreterPanelProcessor()(np.stack([panel] * 16), **RAW)["pixel_values"][0, 0, 0] * 255
    source = torch.from_numpy(panel.copy()).float()[None, None]
    antialiased = F.interpolate(source, size=(80, 80), mode="bilinear", antialias=True)[0, 0]
    aliased = F.interpolate(source, size=(80, 80), mode="bilinear", antialias=False)[0, 0]
    assert (out - antialiased).abs().max() <= 1.0
    assert (out - aliased).abs().max() > 40 and (out - source[0, 0, ::2, ::2]).abs().max() > 100


def test_any_panel_size_is_resized_to_size() -> None:
    puzzle = RNG.integers(0, 256, size=(16, 100, 120), dtype=np.uint8)
    assert pixel_values(puzzle).shape == (1, 16, 1, 80, 80)
    assert pixel_values(puzzle, size={"height": 40, "width": 48}).shape == (1, 16, 1, 40, 48)
    small = NeuralInterpreterPanelProcessor(size=32)
    assert small(puzzle, return_tensors="pt")["pixel_values"].shape == (1, 16, 1, 32, 32)


def test_num_panels_sets_the_panels_per_puzzle() -> None:
    four = NeuralInterpreterPanelProcessor(num_panels=4)
    assert four(PUZZLE[:4], return_tensors="pt")["pixel_values"].shape == (1, 4, 1, 80, 80)
    with pytest.raises(ValueError, match="PGM puzzles have 4 panels"):
        four(PUZZLE)


def test_without_return_tensors_the_output_is_a_list_of_puzzles() -> None:
    out = NeuralInterpreterPanelProcessor()([PUZZLE, PUZZLE])["pixel_values"]
    assert isinstance(out, list) and len(out) == 2
    assert all(
        isinstance(p, np.ndarray) and p.shape == (16, 1, 80, 80) and p.dtype == np.float32 for p in out
    )


BAD_INPUTS = {
    "15 panels": (PUZZLE[:15], r"PGM puzzles have 16 panels \(8 context, 8 candidates\), got 15"),
    "15 panels last": (
        np.zeros((160, 160, 15), np.uint8),
        r"PGM puzzles have 16 panels \(8 context, 8 candidates\), got 15",
    ),
    "15 PIL images": (
        [PIL.Image.fromarray(panel) for panel in PUZZLE[:15]],
        r"PGM puzzles have 16 panels \(8 context, 8 candidates\), got 15",
    ),
    "one of two puzzles with 17 panels": ([PUZZLE, np.zeros((17, 8, 8), np.uint8)], r"got 17 \(puzzle 1"),
    "one panel": (PUZZLE[0], r"Expected one puzzle \(16, H, W\).*got an array of shape \(24, 24\)"),
    "one PIL image": (PIL.Image.fromarray(PUZZLE[0]), r"got one PIL image \(a panel\)"),
    "rank 6": (np.zeros((1, 2, 16, 8, 8, 3), np.uint8), r"Expected one puzzle.*shape \(1, 2, 16, 8, 8, 3\)"),
    "RGBA puzzle": (
        np.zeros((16, 8, 8, 4), np.uint8),
        r"expected \(16, H, W\), \(H, W, 16\) or \(16, H, W, 3\)",
    ),
    "empty batch": (np.zeros((0, 16, 80, 80), np.uint8), r"empty batch of shape \(0, 16, 80, 80\)"),
    "empty list": ([], r"empty list: expected at least one puzzle"),
    "panels of two sizes": (
        [np.zeros((8, 8), np.uint8)] * 15 + [np.zeros((8, 9), np.uint8)],
        r"Puzzle 0: expected 16 2-D panels of one size",
    ),
    "panels without pixels": (np.zeros((16, 0, 8), np.uint8), r"expected panels of at least 1 x 1 pixels"),
    "NaN": (np.full((16, 8, 8), np.nan, np.float32), r"Puzzle 0 \(float32\) contains NaN"),
    "negative": (np.full((16, 8, 8), -3, np.int32), r"Puzzle 0 \(int32\) has values in \[-3.0, -3.0\]"),
    "a string": ("puzzle.npz", r"Expected one puzzle.*got str"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_puzzles_are_refused_naming_what_was_expected(name: str) -> None:
    images, match = BAD_INPUTS[name]
    with pytest.raises(ValueError, match=match):
        NeuralInterpreterPanelProcessor()(images)


@pytest.mark.parametrize(
    "settings,match",
    [
        ({"num_panels": 0}, "`num_panels` must be a positive integer"),
        ({"size": {"height": 0, "width": 0}}, "`size` must be a dict of positive integers"),
        ({"image_std": [0.0]}, "`image_std` must be non-zero"),
    ],
)
def test_bad_settings_are_refused_at_construction_and_at_call(settings: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        NeuralInterpreterPanelProcessor(**settings)
    with pytest.raises(ValueError, match=match):
        NeuralInterpreterPanelProcessor()(PUZZLE, **settings)


def test_puzzles_of_different_sizes_are_not_stacked_without_resizing() -> None:
    puzzles = [PUZZLE, np.zeros((16, 8, 8), np.uint8)]
    with pytest.raises(ValueError, match="cannot be stacked.*do_resize=True"):
        NeuralInterpreterPanelProcessor()(puzzles, do_resize=False, return_tensors="pt")
    listed = NeuralInterpreterPanelProcessor()(puzzles, do_resize=False)["pixel_values"]
    assert [p.shape for p in listed] == [(16, 1, 24, 24), (16, 1, 8, 8)]


def save_pgm_checkpoint(path: Path, config) -> NeuralInterpreterPanelProcessor:
    """A PGM checkpoint's two files: its NeuralInterpreterConfig and the panel processor."""
    config.save_pretrained(path)
    processor = NeuralInterpreterPanelProcessor(size={"height": 40, "width": 40})
    processor.save_pretrained(path)
    return processor


def test_a_saved_panel_processor_loads_through_auto_image_processor(tmp_path: Path, tester) -> None:
    """Next to a NeuralInterpreterConfig, whose registered image processor is the patch one, the saved
    `image_processor_type` still loads the panel processor; the patch processor's folders are unchanged."""
    processor = save_pgm_checkpoint(tmp_path / "pgm", tester.get_config())
    saved = json.loads((tmp_path / "pgm" / "preprocessor_config.json").read_text())
    assert saved["image_processor_type"] == "NeuralInterpreterPanelProcessor"
    assert saved["num_panels"] == 16 and saved["size"] == {"height": 40, "width": 40}
    assert saved["auto_map"]["AutoImageProcessor"].endswith("NeuralInterpreterPanelProcessor")

    loaded = AutoImageProcessor.from_pretrained(tmp_path / "pgm")
    assert type(loaded) is NeuralInterpreterPanelProcessor
    assert loaded.to_dict() == processor.to_dict()
    torch.testing.assert_close(
        loaded(PUZZLE, return_tensors="pt")["pixel_values"],
        processor(PUZZLE, return_tensors="pt")["pixel_values"],
    )
    NeuralInterpreterImageProcessor().save_pretrained(tmp_path / "digits")
    assert type(AutoImageProcessor.from_pretrained(tmp_path / "digits", backend="pil")).__name__ == (
        "NeuralInterpreterImageProcessor"
    )


def test_a_saved_panel_processor_loads_with_remote_code_where_ni_hf_is_not_importable(
    tmp_path: Path, tester
) -> None:
    processor = save_pgm_checkpoint(tmp_path / "pgm", tester.get_config())
    assert (tmp_path / "pgm" / "image_processing_neural_interpreter.py").is_file()
    np.save(tmp_path / "puzzle.npy", PUZZLE)
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["ni_hf"] = None  # importing the package must be impossible here (it may be installed)
        import numpy as np
        from transformers import AutoImageProcessor

        processor = AutoImageProcessor.from_pretrained({str(tmp_path / "pgm")!r}, trust_remote_code=True)
        assert type(processor).__name__ == "NeuralInterpreterPanelProcessor", type(processor)
        assert type(processor).__module__.startswith("transformers_modules"), type(processor).__module__
        np.save("out.npy", processor(np.load("puzzle.npy"), return_tensors="np")["pixel_values"])
        """
    )
    env = dict(os.environ, PYTHONPATH="", HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr
    expected = processor(PUZZLE, return_tensors="np")["pixel_values"]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected)
