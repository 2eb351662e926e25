"""Export for deployment: `torch.export`, ONNX (dynamo exporter, run by onnxruntime) and `torch.jit.trace` give the
eager model's outputs."""

from __future__ import annotations

import pytest
import torch
from conftest import NeuralInterpreterModelTester
from torch.export import Dim

from ni_hf import (
    NeuralInterpreterConfig,
    NeuralInterpreterForImageClassification,
    NeuralInterpreterForSetRegression,
)

BATCH = Dim("batch", min=1, max=1024)


def _image_model(form: str = "tester") -> NeuralInterpreterForImageClassification:
    """The tester's tiny config, or ("digits") the paper's digits sizes (64 patches, d = 192, relative positional
    bias) in one function iteration of two functions."""
    torch.manual_seed(0)
    if form == "digits":
        config = NeuralInterpreterConfig.from_paper(
            "digits", num_scripts=1, num_function_iterations=1, num_functions=2
        )
    else:
        config = NeuralInterpreterModelTester().get_config()
    return NeuralInterpreterForImageClassification(config).eval()


def _set_model() -> NeuralInterpreterForSetRegression:
    torch.manual_seed(0)
    return NeuralInterpreterForSetRegression(
        NeuralInterpreterModelTester().get_set_regression_config()
    ).eval()


def _images(config: NeuralInterpreterConfig, batch_size: int) -> torch.Tensor:
    return torch.randn(batch_size, config.num_patches, config.patch_dim)


@pytest.mark.parametrize("form", ["tester", "digits"])
def test_exported_image_classifier_matches_eager_at_batch_sizes_it_was_not_traced_with(form):
    model = _image_model(form)
    config = model.config
    example = {"pixel_values": _images(config, 4), "task_ids": torch.tensor([0, 1, 1, 0])}
    program = torch.export.export(
        model, (), example, dynamic_shapes={"pixel_values": {0: BATCH}, "task_ids": {0: BATCH}}
    )
    exported = program.module()
    for batch_size in (1, 7):
        pixels = _images(config, batch_size)
        task_ids = torch.arange(batch_size) % config.num_tasks
        with torch.no_grad():
            expected = model(pixel_values=pixels, task_ids=task_ids).logits
        got = exported(pixel_values=pixels, task_ids=task_ids).logits
        assert got.shape == (batch_size, config.num_labels)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_exported_image_classifier_keeps_the_routing_outputs():
    model = _image_model()
    pixels = _images(model.config, 3)
    exported = torch.export.export(model, (), {"pixel_values": pixels, "output_routing": True}).module()
    got = exported(pixel_values=pixels, output_routing=True)
    with torch.no_grad():
        expected = model(pixel_values=pixels, output_routing=True)
    assert (
        len(got.compatibilities) == len(expected.compatibilities) == sum(model.config.num_function_iterations)
    )
    for c_got, c_expected in zip(got.compatibilities, expected.compatibilities, strict=True):
        torch.testing.assert_close(c_got, c_expected, rtol=1e-5, atol=1e-6)


def test_exported_set_regression_matches_eager():
    model = _set_model()
    inputs = torch.rand(5, model.config.num_input_variables)
    exported = torch.export.export(
        model, (), {"inputs": inputs}, dynamic_shapes={"inputs": {0: BATCH}}
    ).module()
    other = torch.rand(9, model.config.num_input_variables)
    with torch.no_grad():
        expected = model(inputs=other).predictions
    torch.testing.assert_close(exported(inputs=other).predictions, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("which", ["image_classification", "image_classification_digits", "set_regression"])
def test_onnx_export_runs_in_onnxruntime_with_the_eager_outputs_at_any_batch_size(which, tmp_path):
    pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript")
    ort = pytest.importorskip("onnxruntime")
    if which.startswith("image_classification"):
        model, output = _image_model("digits" if which.endswith("digits") else "tester"), "logits"

        def make(batch_size: int) -> dict[str, torch.Tensor]:
            task_ids = torch.arange(batch_size) % model.config.num_tasks
            return {"pixel_values": _images(model.config, batch_size), "task_ids": task_ids}
    else:
        model, output = _set_model(), "predictions"

        def make(batch_size: int) -> dict[str, torch.Tensor]:
            return {"inputs": torch.rand(batch_size, model.config.num_input_variables)}

    example = make(4)
    path = tmp_path / "model.onnx"
    torch.onnx.export(
        model,
        (),
        str(path),
        kwargs=example,
        input_names=list(example),
        output_names=[output],
        dynamic_shapes={name: {0: BATCH} for name in example},
        dynamo=True,
        verbose=False,
    )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == list(example)
    for batch_size in (1, 6):
        inputs = make(batch_size)
        (got,) = session.run([output], {name: x.numpy() for name, x in inputs.items()})
        with torch.no_grad():
            expected = getattr(model(**inputs), output)
        torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("form", ["tester", "digits"])
def test_torch_jit_trace_gives_the_eager_outputs_on_inputs_it_was_not_traced_with(form):
    model = _image_model(form)
    example = _images(model.config, 4)
    with torch.no_grad():
        traced = torch.jit.trace(model, (example,), strict=False, check_trace=False)
        for pixels in (example, _images(model.config, 4)):
            expected = model(pixel_values=pixels).logits
            torch.testing.assert_close(traced(pixels)["logits"], expected, rtol=1e-5, atol=1e-6)
