"""Checkpoints saved by earlier code load into today's classes and give the logits they gave then.

`tests/fixtures/checkpoint_687f283` holds two tiny checkpoints (an image classifier with the relative positional
bias and one token and head per task, and a set-regression model) saved by the code of commit 687f283, with the
inputs and the outputs that code computed. A renamed parameter, a changed config field or a changed equation fails
here.
"""

from pathlib import Path

import pytest
import torch

import ni_hf

FIXTURES = Path(__file__).parent / "fixtures" / "checkpoint_687f283"


@pytest.mark.parametrize("attn_implementation", [None, "eager", "sdpa"])
def test_image_classifier_saved_by_687f283_gives_its_logits(attn_implementation):
    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    model = ni_hf.NeuralInterpreterForImageClassification.from_pretrained(
        FIXTURES / "image_classifier", **kwargs
    ).eval()
    io = torch.load(FIXTURES / "image_classifier_io.pt")
    with torch.no_grad():
        logits = model(pixel_values=io["pixel_values"], task_ids=io["task_ids"]).logits
    torch.testing.assert_close(logits, io["logits"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attn_implementation", [None, "eager", "sdpa"])
def test_set_regression_saved_by_687f283_gives_its_predictions(attn_implementation):
    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    model = ni_hf.NeuralInterpreterForSetRegression.from_pretrained(
        FIXTURES / "set_regression", **kwargs
    ).eval()
    io = torch.load(FIXTURES / "set_regression_io.pt")
    with torch.no_grad():
        predictions = model(inputs=io["inputs"]).predictions
    torch.testing.assert_close(predictions, io["predictions"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attn_implementation", [None, "eager", "sdpa", "fast"])
def test_checkpoint_saved_by_687f283_keeps_every_parameter_name(attn_implementation):
    """Every saved tensor loads into a parameter of the same name, but the set model's patch embedding, which a set
    never read (the set-regression backbone is now built without one, and ignores it on load)."""
    from safetensors.torch import load_file

    unused = {"neural_interpreter.patch_embedding.weight", "neural_interpreter.patch_embedding.bias"}
    for name, cls, ignored in (
        ("image_classifier", ni_hf.NeuralInterpreterForImageClassification, set()),
        ("set_regression", ni_hf.NeuralInterpreterForSetRegression, unused),
    ):
        saved = set(load_file(FIXTURES / name / "model.safetensors"))
        kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
        model, info = cls.from_pretrained(FIXTURES / name, output_loading_info=True, **kwargs)
        assert set(model.state_dict()) == saved - ignored
        assert (
            not info["missing_keys"]
            and not info["mismatched_keys"]
            and set(info["unexpected_keys"]) <= ignored
        )
