"""Checkpoints: safetensors round trips, Auto classes, pipeline, and remote code without the package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from conftest import NeuralInterpreterModelTester
from PIL import Image
from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoModel,
    AutoModelForImageClassification,
    pipeline,
)
from transformers.utils import is_torchvision_available

import ni_hf


def digit_image(seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (28, 28), dtype=np.uint8))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A saved classifier + processor, and the logits the saving process computed on two images."""
    path = tmp_path_factory.mktemp("ckpt")
    tester = NeuralInterpreterModelTester.digits_like()
    config = tester.get_config()
    torch.manual_seed(0)
    model = ni_hf.NeuralInterpreterForImageClassification(config).eval()
    processor = tester.get_image_processor(config)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    batch = processor(images=[digit_image(0), digit_image(1)], return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch, task_ids=torch.tensor([0, 1])).logits
    np.save(path / "expected_logits.npy", logits.numpy())
    return path, model, batch, logits


def test_checkpoint_holds_safetensors_config_code_and_processor(checkpoint):
    path, *_ = checkpoint
    files = set(os.listdir(path))
    assert {"model.safetensors", "config.json", "preprocessor_config.json"} <= files
    assert {
        "configuration_neural_interpreter.py",
        "modeling_neural_interpreter.py",
        "configuration_checks.py",
        "modeling_checks.py",
        "task_heads.py",
    } <= files
    assert "image_processing_neural_interpreter.py" in files
    assert not any(f.endswith(".bin") for f in files)
    auto_map = json.loads((path / "config.json").read_text())["auto_map"]
    assert auto_map["AutoConfig"] == "configuration_neural_interpreter.NeuralInterpreterConfig"
    assert auto_map["AutoModel"] == "modeling_neural_interpreter.NeuralInterpreterModel"
    assert auto_map["AutoModelForImageClassification"].endswith("NeuralInterpreterForImageClassification")
    processor_map = json.loads((path / "preprocessor_config.json").read_text())["auto_map"]
    assert processor_map["AutoImageProcessor"].endswith("NeuralInterpreterImageProcessor")


def assert_same_weights(loaded: torch.nn.Module, saved: torch.nn.Module) -> None:
    """Every tensor of the state dict round trips bit for bit."""
    expected = saved.state_dict()
    assert loaded.state_dict().keys() == expected.keys()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, expected[name]), name


def test_save_and_load_through_auto_classes_keep_every_weight_and_the_logits(checkpoint):
    """The weights come back bit for bit. The logits agree to float32 rounding only: loaded tensors sit in the
    safetensors file's memory, whose alignment can change which CPU matmul kernel (and summation order) runs."""
    path, model, batch, logits = checkpoint
    config = AutoConfig.from_pretrained(path)
    assert isinstance(config, ni_hf.NeuralInterpreterConfig) and config.task_names == ["mnist", "mnistm"]
    loaded = AutoModelForImageClassification.from_pretrained(path).eval()
    assert isinstance(loaded, ni_hf.NeuralInterpreterForImageClassification)
    assert_same_weights(loaded, model)
    with torch.no_grad():
        again = loaded(**batch, task_ids=torch.tensor([0, 1])).logits
    torch.testing.assert_close(again, logits, rtol=1e-5, atol=1e-6)
    assert not loaded.neural_interpreter.scripts[0].signatures.requires_grad  # freezing survives loading


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_loading_in_half_precision_gives_finite_logits_close_to_float32(checkpoint, dtype):
    """`from_pretrained(dtype=...)` (weights stored in that dtype, no autocast), as for inference and pipeline."""
    path, _, batch, logits = checkpoint
    loaded = AutoModelForImageClassification.from_pretrained(path, dtype=dtype).eval()
    assert {p.dtype for p in loaded.parameters()} == {dtype}
    with torch.no_grad():
        half = loaded(pixel_values=batch["pixel_values"].to(dtype), task_ids=torch.tensor([0, 1])).logits
    assert half.dtype == dtype and torch.isfinite(half).all()
    torch.testing.assert_close(half.float(), logits, atol=0.05, rtol=0.05)
    result = pipeline("image-classification", model=str(path), dtype=dtype, top_k=10)(digit_image(0))
    scores = torch.tensor([r["score"] for r in sorted(result, key=lambda r: int(r["label"]))])
    torch.testing.assert_close(scores, torch.softmax(logits[0], -1), atol=0.01, rtol=0)


def test_auto_model_loads_the_backbone_of_a_classifier_checkpoint(checkpoint):
    path, model, batch, _ = checkpoint
    backbone = AutoModel.from_pretrained(path).eval()
    assert isinstance(backbone, ni_hf.NeuralInterpreterModel)
    with torch.no_grad():
        torch.testing.assert_close(
            backbone(pixel_values=batch["pixel_values"]).last_hidden_state,
            model.neural_interpreter(pixel_values=batch["pixel_values"]).last_hidden_state,
        )


def test_auto_image_processor_round_trip(checkpoint):
    path, _, batch, _ = checkpoint
    processor = AutoImageProcessor.from_pretrained(path)
    # transformers' choice of backend: torchvision where it is installed
    backends = (ni_hf.NeuralInterpreterImageProcessor, ni_hf.NeuralInterpreterImageProcessorTorchvision)
    assert type(processor) is backends[is_torchvision_available()]
    again = processor(images=[digit_image(0), digit_image(1)], return_tensors="pt")
    torch.testing.assert_close(again["pixel_values"], batch["pixel_values"])


def test_pipeline_image_classification_after_import(checkpoint):
    path, model, batch, logits = checkpoint
    classify = pipeline("image-classification", model=str(path), trust_remote_code=True, top_k=3)
    result = classify(digit_image(0))
    assert len(result) == 3 and {"label", "score"} <= set(result[0])
    expected = torch.softmax(logits[0], -1)  # pipeline uses the default task (0)
    assert result[0]["label"] == str(int(expected.argmax()))
    assert abs(result[0]["score"] - float(expected.max())) < 1e-5


def test_pipeline_after_import_needs_no_trust_remote_code_and_never_prompts(checkpoint, monkeypatch):
    path, _, _, logits = checkpoint
    prompts = []

    def no_input(prompt=""):
        prompts.append(prompt)
        raise AssertionError("pipeline() asked on stdin")

    monkeypatch.setattr("builtins.input", no_input)
    result = pipeline("image-classification", model=str(path))(digit_image(0))
    assert prompts == []
    assert result[0]["label"] == str(int(logits[0].argmax()))


def test_set_regression_model_saves_and_reloads(tester, tmp_path):
    config = tester.get_set_regression_config()
    model = ni_hf.NeuralInterpreterForSetRegression(config).eval()
    x = torch.rand(4, config.num_input_variables)
    model.save_pretrained(tmp_path)
    loaded = ni_hf.NeuralInterpreterForSetRegression.from_pretrained(tmp_path).eval()
    assert_same_weights(loaded, model)
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(inputs=x).predictions, model(inputs=x).predictions, rtol=1e-5, atol=1e-6
        )


def run_without_ni_hf(script: str, path, tmp_path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": "",
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
    }
    return subprocess.run(
        [sys.executable, "-c", script, str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


REMOTE_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["ni_hf"] = None  # importing the package must be impossible here
    try:
        import ni_hf  # noqa: F401
        raise SystemExit("ni_hf was importable")
    except ImportError:
        pass
    import numpy as np, torch
    from PIL import Image
    from transformers import AutoConfig, AutoImageProcessor, AutoModel, AutoModelForImageClassification, pipeline

    path = sys.argv[1]
    config = AutoConfig.from_pretrained(path, trust_remote_code=True)
    assert type(config).__module__.startswith("transformers_modules"), type(config).__module__
    model = AutoModelForImageClassification.from_pretrained(path, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    processor = AutoImageProcessor.from_pretrained(path, trust_remote_code=True)
    images = [Image.fromarray(np.random.default_rng(s).integers(0, 256, (28, 28), dtype=np.uint8)) for s in (0, 1)]
    batch = processor(images=images, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch, task_ids=torch.tensor([0, 1])).logits
    expected = torch.from_numpy(np.load(f"{path}/expected_logits.npy"))
    torch.testing.assert_close(logits, expected, rtol=1e-6, atol=1e-6)
    backbone = AutoModel.from_pretrained(path, trust_remote_code=True)
    assert type(backbone).__name__ == "NeuralInterpreterModel"
    classify = pipeline("image-classification", model=path, trust_remote_code=True, top_k=config.num_labels)
    result = classify(images[0])
    scores = torch.tensor([r["score"] for r in sorted(result, key=lambda r: int(r["label"]))])
    torch.testing.assert_close(scores, torch.softmax(expected[0], -1), rtol=1e-5, atol=1e-6)  # the default task
    print("REMOTE_OK", sorted(k for k, v in sys.modules.items() if k.startswith("ni_hf") and v is not None))
    """
)


def test_remote_code_loads_in_a_process_that_cannot_import_ni_hf(checkpoint, tmp_path):
    path, *_ = checkpoint
    proc = run_without_ni_hf(REMOTE_SCRIPT, path, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REMOTE_OK []" in proc.stdout


EVERY_MODEL_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.modules["ni_hf"] = None  # importing the package must be impossible here
    import torch
    import transformers
    from transformers import AutoConfig, AutoModel
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    for path, entry in json.load(open(sys.argv[1])).items():
        config = AutoConfig.from_pretrained(path, trust_remote_code=True)
        assert type(config).__module__.startswith("transformers_modules"), type(config).__module__
        if entry["auto_class"] is None:  # a head without an Auto class of its own: its class from the copied code
            (architecture,) = config.architectures
            module = config.auto_map["AutoConfig"].split(".")[0].replace("configuration_", "modeling_")
            model = get_class_from_dynamic_module(f"{module}.{architecture}", path).from_pretrained(path)
        else:
            model = getattr(transformers, entry["auto_class"]).from_pretrained(path, trust_remote_code=True)
        assert type(model).__name__ == entry["class"], (type(model), entry)
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        io = torch.load(f"{path}/io.pt")
        with torch.no_grad():
            output = model.eval()(**io["inputs"])[entry["output"]]
        torch.testing.assert_close(output, io["expected"], rtol=1e-5, atol=1e-6)
        if "AutoModel" in config.auto_map:  # every model with a backbone names it for AutoModel
            backbone = AutoModel.from_pretrained(path, trust_remote_code=True)
            assert type(backbone).__module__.startswith("transformers_modules"), type(backbone).__module__
        print("REMOTE_OK", entry["class"])
    """
)


def every_model(
    tester: NeuralInterpreterModelTester,
) -> dict[str, tuple[torch.nn.Module, dict, str, str | None]]:
    """Each model class of the package: the model, inputs, the output compared, and the Auto class that loads it."""
    ni, vit = tester.get_config(), tester.get_vit_config()
    pgm = tester.get_pgm_config()
    vit_pgm = tester.get_vit_config(
        task_names=["pgm"], num_labels=1, panel_size=16, panel_cnn_channels=4, panel_cnn_layers=2
    )
    set_inputs = {"inputs": torch.rand(tester.batch_size, 5)}
    image_inputs = {k: v for k, v in tester.prepare_inputs(ni).items() if k != "labels"}
    panel_inputs = {"pixel_values": tester.prepare_pgm_inputs(pgm)["pixel_values"]}
    torch.manual_seed(0)
    return {
        "ni_image": (
            ni_hf.NeuralInterpreterForImageClassification(ni),
            image_inputs,
            "logits",
            "AutoModelForImageClassification",
        ),
        "ni_set": (
            ni_hf.NeuralInterpreterForSetRegression(tester.get_set_regression_config()),
            set_inputs,
            "predictions",
            None,
        ),
        "ni_pgm": (
            ni_hf.NeuralInterpreterForMultipleChoice(pgm),
            panel_inputs,
            "logits",
            "AutoModelForMultipleChoice",
        ),
        "vit_image": (
            ni_hf.MultiTaskViTForImageClassification(vit),
            image_inputs,
            "logits",
            "AutoModelForImageClassification",
        ),
        "vit_pgm": (
            ni_hf.MultiTaskViTForMultipleChoice(vit_pgm),
            panel_inputs,
            "logits",
            "AutoModelForMultipleChoice",
        ),
        "context_blind": (
            ni_hf.ContextBlindForMultipleChoice(ni_hf.ContextBlindConfig.from_panel_config(pgm)),
            panel_inputs,
            "logits",
            "AutoModelForMultipleChoice",
        ),
    }


def test_every_model_loads_with_remote_code_in_a_process_that_cannot_import_ni_hf(tester, tmp_path):
    """Each model's checkpoint carries its code (the shared files as copies): it loads by its Auto class (or, for a
    head without one, by its class in the copied code) and gives the outputs of the saving process."""
    manifest = {}
    for name, (model, inputs, output, auto_class) in every_model(tester).items():
        path = tmp_path / name
        model.eval().save_pretrained(path)
        with torch.no_grad():
            expected = model(**inputs)[output]
        torch.save({"inputs": inputs, "expected": expected}, path / "io.pt")
        assert not any(f.is_symlink() for f in path.iterdir())
        manifest[str(path)] = {"class": type(model).__name__, "output": output, "auto_class": auto_class}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    proc = run_without_ni_hf(EVERY_MODEL_SCRIPT, tmp_path / "manifest.json", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("REMOTE_OK") == len(manifest), proc.stdout
