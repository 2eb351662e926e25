"""demo/app.py without a browser: the digit preparation (framed as each task's training digits are, so that the upload
path reads the quickstart's own test digits as the pipeline does), and that the shown numbers are the model's own."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import NeuralInterpreterModelTester
from PIL import Image

import ni_hf
from ni_hf import visualization as vis

ROOT = Path(__file__).resolve().parents[1]


def load_app():
    """demo/app.py as a module (it is a script in the Spaces layout, not part of the package)."""
    spec = importlib.util.spec_from_file_location("ni_demo_app", ROOT / "demo" / "app.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["ni_demo_app"] = module
    spec.loader.exec_module(module)
    return module


app = load_app()
quickstart = sys.modules["quickstart"]  # demo/quickstart.py, imported by the app


TESTER = NeuralInterpreterModelTester.digits_like()  # 3 functions, 2 function iterations


def dark_on_light_digit() -> Image.Image:
    image = np.full((60, 80), 250, dtype=np.uint8)
    image[20:40, 30:36] = 10  # a "1", off centre
    return Image.fromarray(image)


def test_prepare_digit_inverts_and_crops_around_the_ink():
    digit = np.asarray(app.prepare_digit(dark_on_light_digit()))
    assert digit.shape[0] == digit.shape[1] == 28  # MNIST's framing: 1.4 times the 20-pixel-high stroke
    assert digit.max() >= 240 and np.median(digit) == 0  # light ink on a dark background
    ink = np.argwhere(digit > 128)
    centre = (ink.min(0) + ink.max(0)) / 2
    assert np.abs(centre - (digit.shape[0] - 1) / 2).max() <= 1.0
    # the same digit given light on dark comes out the same
    light = Image.fromarray(255 - np.asarray(dark_on_light_digit()))
    np.testing.assert_array_equal(np.asarray(app.prepare_digit(light)), digit)


def test_prepare_digit_reads_drawings_from_alpha():
    drawing = np.zeros((50, 50, 4), dtype=np.uint8)
    drawing[10:30, 20:25] = (0, 0, 0, 255)  # black strokes on a transparent canvas
    digit = np.asarray(app.prepare_digit(Image.fromarray(drawing, "RGBA")))
    assert digit.max() == 255 and np.median(digit) == 0


def test_demo_shows_the_models_prediction_and_path(tmp_path):
    ckpt = TESTER.save_image_classifier(tmp_path / "ckpt")
    demo = app.InterpreterDemo(str(ckpt))
    assert demo.task_names == ["mnist", "mnistm"] and demo.max_iterations == 2 and demo.num_functions == 3
    image = dark_on_light_digit()
    scores, picture, summary = demo.run(image, "mnistm", 1, ["function 2"])
    digit = app.prepare_digit(image, app.FRAMES["mnistm"])  # framed as the task's training digits
    assert digit.size == (32, 32)
    pixels = demo.processor(images=[digit], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        logits = demo.model(pixel_values=pixels, task_ids=torch.tensor([1]), num_function_iterations=1,
                            disabled_functions=[2]).logits[0]  # fmt: skip
    probabilities = logits.softmax(-1).numpy()
    np.testing.assert_allclose([scores[str(i)] for i in range(10)], probabilities, atol=1e-6)
    best = int(probabilities.argmax())
    assert summary == (
        f"Prediction: {best} (p = {probabilities[best]:.3f}) after 1 of 2 function iterations; functions off: 2"
    )
    trace = vis.trace_routing(demo.model, pixels, [1], num_function_iterations=1, disabled_functions=[2])
    expected = vis.figure_to_image(vis.plot_computational_path(trace, 0), dpi=80)
    np.testing.assert_array_equal(np.asarray(picture), np.asarray(expected))
    _, full, full_summary = demo.run(image, "mnistm", 2, [])
    assert full.height > picture.height  # one row of panels per function iteration
    assert full_summary.endswith("after 2 of 2 function iterations; functions off: none")


def test_the_demo_finds_the_model_of_the_readme_command():
    import re

    readme = (ROOT / "README.md").read_text()
    output_dir = re.search(r"run_digits\.py --preset quickstart --output_dir (\S+)", readme).group(1)
    assert app.README_QUICKSTART == ROOT / output_dir


def test_model_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("NI_DEMO_MODEL", "some/hub-id")
    assert app.resolve_model("local/ckpt") == ("local/ckpt", "Model: `local/ckpt`.")
    assert app.resolve_model(None)[0] == "some/hub-id"
    monkeypatch.delenv("NI_DEMO_MODEL")
    trained = TESTER.save_image_classifier(tmp_path / "quickstart")
    monkeypatch.setattr(app, "README_QUICKSTART", trained)
    path, note = app.resolve_model(None)
    assert path == str(trained) and "the README's quickstart model" in note
    runs = []
    monkeypatch.setattr(app, "README_QUICKSTART", tmp_path / "absent")
    monkeypatch.setattr(
        app,
        "train_quickstart_model",
        lambda out: runs.append(out) or {"train_seconds": 5, "test_accuracy": 0.9},
    )
    path, note = app.resolve_model(None)
    assert runs == [tmp_path / "absent"] and path == str(tmp_path / "absent")
    assert "trained the README's quickstart model just now" in note and "90.0%" in note


def test_the_demo_trains_with_the_readme_command():
    import re

    readme = (ROOT / "README.md").read_text()
    command = re.search(
        r"python (examples/run_digits\.py --preset quickstart --output_dir \S+)", readme
    ).group(1)
    script, *args = command.split()
    assert quickstart.quickstart_command(args[-1])[1:] == [str(ROOT / script), *args]


def test_the_demos_model_is_the_quickstart_presets(tmp_path):
    """A short run of the demo's training (2 steps): the config of README command 1's model, and its attention."""
    from ni_hf.training.presets import DIGITS_PRESETS

    preset = DIGITS_PRESETS["quickstart"]
    result = quickstart.train_quickstart_model(
        tmp_path / "quickstart", ["--max_steps", "2", "--max_eval_samples", "20"]
    )
    run = json.loads((tmp_path / "quickstart" / "all_results.json").read_text())
    assert result == {"test_accuracy": run["eval_accuracy"], "train_seconds": run["train_runtime"]}
    assert 0 <= result["test_accuracy"] <= 1 and result["train_seconds"] > 0
    assert json.loads((tmp_path / "quickstart" / "trainer_state.json").read_text())["global_step"] == 2
    config = ni_hf.NeuralInterpreterConfig.from_pretrained(tmp_path / "quickstart")
    assert {key: getattr(config, key) for key in preset.config} == dict(preset.config)
    assert config.hidden_dropout_prob == config.attention_probs_dropout_prob == 0
    card = (tmp_path / "quickstart" / "README.md").read_text()
    assert "--preset quickstart" in card


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda demo: demo.run(None, "mnist", 1, []), "image: expected a PIL image of a digit, got NoneType"),
        (
            lambda demo: demo.run(dark_on_light_digit(), "svhn", 1, []),
            r"task 'svhn': expected one of .*'mnist'",
        ),
        (lambda demo: demo.run(dark_on_light_digit(), "mnist", 3, []), "iterations: expected 1 to 2, got 3"),
        (
            lambda demo: demo.run(dark_on_light_digit(), "mnist", 1, ["function 7"]),
            r"switched_off: \['function 7'\]",
        ),
    ],
)
def test_the_demo_names_a_bad_input(tmp_path, call, error):
    demo = app.InterpreterDemo(str(TESTER.save_image_classifier(tmp_path / "ckpt")))
    with pytest.raises(ValueError, match=error):
        call(demo)


def test_app_builds(tmp_path):
    pytest.importorskip("gradio")
    demo = app.InterpreterDemo(str(TESTER.save_image_classifier(tmp_path / "ckpt")))
    blocks = app.build_app(demo, "note")
    ids = {getattr(block, "elem_id", None) for block in blocks.blocks.values()}
    assert {"upload", "sketch", "task", "iterations", "off", "summary", "prediction", "path"} <= ids


# ------------------------------------------------------------------------------------ framing and the upload path

SHARED_DATA = ROOT.parent / "shared" / "data"


def ink_box_scales(images) -> np.ndarray:
    """Each image's side over its ink box's longer side (the ink: pixels above a quarter of the brightest)."""
    scales = []
    for image in images:
        grey = np.asarray(image.convert("L"), dtype=np.float32)
        ink = np.argwhere(grey > 0.25 * grey.max())
        scales.append(grey.shape[0] / (ink.max(0) - ink.min(0) + 1).max())
    return np.array(scales)


def parquet_images(path: Path, count: int) -> list[Image.Image]:
    import io

    import pyarrow.parquet as pq

    column = pq.read_table(path, columns=["image"]).slice(0, count).column("image").to_pylist()
    return [Image.open(io.BytesIO(cell["bytes"])) for cell in column]


def test_each_tasks_frame_is_its_training_digits():
    from ni_hf.data.digits import load_digits_tasks

    raw, _ = load_digits_tasks(["sklearn_digits"], source="sklearn")
    images = list(raw["train"]["image"])
    assert {image.size for image in images} == {(8, 8)} == {(app.FRAMES["sklearn_digits"].size,) * 2}
    assert np.median(ink_box_scales(images)) == app.FRAMES["sklearn_digits"].scale == 1.0
    if not (SHARED_DATA / "mnist" / "train.parquet").is_file():
        pytest.skip(f"no MNIST copy at {SHARED_DATA}")
    mnist = parquet_images(SHARED_DATA / "mnist" / "train.parquet", 2000)
    assert {image.size for image in mnist} == {(app.FRAMES["mnist"].size,) * 2}
    assert np.median(ink_box_scales(mnist)) == pytest.approx(app.FRAMES["mnist"].scale)
    # MNIST-M blends MNIST's digits (in order) into 32-pixel textures: they sit there padded, not resized, to 32.
    mnistm = parquet_images(SHARED_DATA / "mnist_m" / "train.parquet", 300)
    padded, resized = [], []
    for digit, blended in zip(mnist, mnistm, strict=False):
        colour = np.asarray(blended.convert("RGB"), dtype=np.float32)
        ink = np.abs(colour - np.median(colour.reshape(-1, 3), 0)).sum(-1).ravel()
        pad = np.pad(np.asarray(digit, dtype=np.float32), 2).ravel()
        size = np.asarray(digit.resize((32, 32), Image.Resampling.BILINEAR), dtype=np.float32).ravel()
        padded.append(np.corrcoef(ink, pad)[0, 1])
        resized.append(np.corrcoef(ink, size)[0, 1])
    assert np.mean(padded) > np.mean(resized)
    assert app.FRAMES["mnistm"].size == 32
    assert app.FRAMES["mnistm"].scale == pytest.approx(app.FRAMES["mnist"].scale * 32 / 28)


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
    """(checkpoint, 40 test digits, their labels): a tiny model trained 300 steps on the quickstart's data
    (scikit-learn's digits, its training split), and the first 40 digits of its test split."""
    from ni_hf.data.digits import load_digits_tasks

    raw, _ = load_digits_tasks(["sklearn_digits"], source="sklearn")
    tester = NeuralInterpreterModelTester.digits_like(task_names=["sklearn_digits"])
    config = tester.get_config()
    processor = tester.get_image_processor(config)
    pixels = processor(images=list(raw["train"]["image"]), return_tensors="pt")["pixel_values"]
    labels = torch.tensor(raw["train"]["label"])
    torch.manual_seed(0)
    model = ni_hf.NeuralInterpreterForImageClassification(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        batch = torch.randint(0, len(labels), (64,), generator=generator)
        loss = model(pixel_values=pixels[batch], labels=labels[batch]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    path = tmp_path_factory.mktemp("digits_model")
    model.save_pretrained(path)
    processor.save_pretrained(path)
    test = raw["test"].select(range(40))
    return path, list(test["image"]), list(test["label"])


def test_the_upload_path_reads_the_quickstarts_test_digits_as_the_pipeline_does(digits_model):
    """The 8x8 test digits, and the same enlarged 16x (as a user would save one to upload), through the demo's
    upload path against transformers' pipeline on the digits themselves; MNIST's framing, for contrast, is far off."""
    from transformers import pipeline

    path, images, labels = digits_model
    classify = pipeline("image-classification", model=str(path))
    expected = [int(classify(image, top_k=1)[0]["label"]) for image in images]
    demo = app.InterpreterDemo(str(path))

    def upload(image: Image.Image) -> int:
        scores, _, _ = demo.run(image, "sklearn_digits", demo.max_iterations, [])
        return int(max(scores, key=scores.get))

    def framed(image: Image.Image, frame) -> int:
        pixels = demo.processor(images=[app.prepare_digit(image, frame)], return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            return int(demo.model(pixel_values=pixels).logits.argmax())

    def correct(predicted):
        return sum(p == y for p, y in zip(predicted, labels, strict=True))

    def agree(predicted):
        return sum(p == e for p, e in zip(predicted, expected, strict=True))

    uploads = [upload(image) for image in images]
    enlarged = [upload(image.resize((128, 128), Image.Resampling.NEAREST)) for image in images]
    mnist_framed = [framed(image, app.DEFAULT_FRAME) for image in images]
    assert correct(expected) >= 28  # the model has learned the task
    assert correct(uploads) >= correct(expected) - 3 and agree(uploads) >= 35
    assert correct(enlarged) >= correct(expected) - 5 and agree(enlarged) >= 33
    assert agree(mnist_framed) <= 20
