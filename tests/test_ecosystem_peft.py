"""PEFT on a Neural Interpreter: which layers LoRA adapts, the heads and scripts it trains whole, saving and
reloading the adapter with `AutoPeftModel`, and what it refuses (ModLin, Eq. 5) and why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import NeuralInterpreterModelTester
from torch import nn
from transformers import AutoModelForImageClassification

import ni_hf

peft = pytest.importorskip("peft", reason="PEFT is optional: pip install 'ni_hf[dev]' or pip install peft")
from peft import AutoPeftModel, LoraConfig, get_peft_model  # noqa: E402
from peft.tuners.lora import LoraLayer  # noqa: E402
from peft.utils import ModulesToSaveWrapper  # noqa: E402

TESTER = NeuralInterpreterModelTester(batch_size=6)
HEADS = [f"classifier.{i}" for i in range(TESTER.get_config().num_tasks)]  # one head per task


def lora_config(**overrides) -> LoraConfig:
    """LoRA on every nn.Linear, each task head trained whole: what docs/ecosystem.md recommends."""
    settings = dict(r=4, lora_alpha=8, target_modules="all-linear", modules_to_save=HEADS)
    return LoraConfig(**{**settings, **overrides})


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return TESTER.save_image_classifier(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture
def base_model(checkpoint) -> ni_hf.NeuralInterpreterForImageClassification:
    return AutoModelForImageClassification.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def inputs() -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    return TESTER.prepare_inputs(TESTER.get_config())


def logits(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(pixel_values=inputs["pixel_values"], task_ids=inputs["task_ids"]).logits


def train(model: nn.Module, inputs: dict[str, torch.Tensor], steps: int = 6) -> list[float]:
    """A few AdamW steps on the trainable parameters; the losses."""
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_all_linear_adapts_every_linear_layer_and_the_code_projections_not_modlin(base_model):
    linear_names = {
        name
        for name, module in base_model.named_modules()
        if isinstance(module, nn.Linear) and not name.startswith("classifier.")
    }
    assert any(name.endswith("query.code_proj") for name in linear_names)  # W_c of Eq. 5 is an nn.Linear
    model = get_peft_model(base_model, lora_config())
    inner = model.base_model.model
    adapted = {name for name, module in inner.named_modules() if isinstance(module, LoraLayer)}
    assert adapted == linear_names
    modlins = [module for module in inner.modules() if type(module).__name__ == "ModLin"]
    assert modlins and not any(isinstance(module, LoraLayer) for module in modlins)
    assert all(isinstance(inner.get_submodule(head), ModulesToSaveWrapper) for head in HEADS)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert all(".lora_" in name or ".modules_to_save." in name for name in trainable)
    assert not any("codes" in name or "signatures" in name for name in trainable)


def test_lora_trains_saves_and_reloads_with_autopeftmodel(base_model, inputs, checkpoint, tmp_path):
    model = get_peft_model(base_model, lora_config())
    before = logits(model, inputs)
    torch.testing.assert_close(
        before, logits(AutoModelForImageClassification.from_pretrained(checkpoint), inputs)
    )
    losses = train(model, inputs)
    assert losses[-1] < losses[0]
    trained = logits(model, inputs)
    assert not torch.allclose(trained, before)
    model.save_pretrained(tmp_path / "adapter")

    adapter_config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(checkpoint)
    assert adapter_config["auto_mapping"]["base_model_class"] == "NeuralInterpreterForImageClassification"
    assert adapter_config["auto_mapping"]["parent_library"].startswith("ni_hf.")
    with pytest.raises(ValueError, match="import_allowlist"):
        AutoPeftModel.from_pretrained(tmp_path / "adapter")
    reloaded = AutoPeftModel.from_pretrained(tmp_path / "adapter", import_allowlist=["ni_hf"])
    torch.testing.assert_close(logits(reloaded, inputs), trained)

    merged = reloaded.merge_and_unload()
    assert isinstance(merged, ni_hf.NeuralInterpreterForImageClassification)
    merged.save_pretrained(tmp_path / "merged")
    plain = AutoModelForImageClassification.from_pretrained(tmp_path / "merged")
    torch.testing.assert_close(logits(plain, inputs), trained, atol=1e-5, rtol=1e-4)


def test_codes_and_signatures_train_through_modules_to_save_of_their_script(base_model, inputs, tmp_path):
    """The codes and signatures are parameters of their script: `modules_to_save` trains a copy of that script."""
    model = get_peft_model(base_model, lora_config(modules_to_save=[*HEADS, "scripts.0"]))
    script = model.base_model.model.neural_interpreter.scripts[0]
    assert isinstance(script, ModulesToSaveWrapper)
    original_codes = script.original_module.codes.detach().clone()
    train(model, inputs)
    trained_codes = script.modules_to_save["default"].codes
    assert not torch.allclose(trained_codes, original_codes)
    torch.testing.assert_close(script.original_module.codes, original_codes)
    trained = logits(model, inputs)
    model.save_pretrained(tmp_path)
    reloaded = AutoPeftModel.from_pretrained(tmp_path, import_allowlist=["ni_hf"])
    torch.testing.assert_close(logits(reloaded, inputs), trained)


@pytest.mark.parametrize(
    "settings, refusal",
    [
        # ModLin (Eq. 5) is neither an nn.Linear nor another layer type LoRA knows.
        (dict(target_modules=["query", "value"]), r"(?s)Target module ModLin\(.*\) is not supported"),
        # PEFT's image-classification guide (ViT): the heads are an nn.ModuleList, which modules_to_save refuses.
        (
            dict(target_modules=["code_proj"], modules_to_save=["classifier"]),
            "cannot be applied to modules of type",
        ),
    ],
)
def test_peft_refuses_modlin_and_the_head_list_with_its_reason(base_model, settings, refusal):
    with pytest.raises((ValueError, TypeError), match=refusal):
        get_peft_model(base_model, lora_config(**settings))


@pytest.mark.xfail(
    strict=True,
    raises=AttributeError,
    reason="LoRA on ModLin's W through target_parameters: PEFT's ParamWrapper replaces the ModLin and adds the "
    "low-rank update only inside the wrapper's forward, while LineOfCode.function_weights calls "
    "ModLin.function_weights (W diag(LayerNorm(W_c c)), Eq. 5) outside any ModLin forward: "
    "'ParamWrapper' object has no attribute 'function_weights'",
)
def test_lora_on_modlin_weights_through_target_parameters(base_model, inputs):
    weights = [f"{name}.weight" for name in ("query", "key", "value", "output", "fc1", "fc2")]
    model = get_peft_model(base_model, lora_config(target_modules=[], target_parameters=weights))
    before = logits(model, inputs)
    train(model, inputs)
    assert not torch.allclose(logits(model, inputs), before)
