"""Tests of examples/run_fuzzy_boolean.py: R^2, the adaptation settings, the quick preset end to end, resuming,
two processes, and the refusal of every bad argument before any work."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from _scripts import load_script, torchrun_command

import ni_hf.training.publishing
import ni_hf.training.run_setup
from ni_hf import (
    NeuralInterpreterConfig,
    NeuralInterpreterForImageClassification,
    NeuralInterpreterForSetRegression,
)
from ni_hf.data.fuzzy_boolean import TensorBatchDataset, batch_collator, make_fuzzy_boolean_tensors
from ni_hf.training.checkpoints import verify_weights_checksum
from ni_hf.training.evaluation import r2_per_function
from ni_hf.training.model_cards import FUZZY_BOOLEAN_ROUTING_POINTS, fuzzy_boolean_routing_section

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "run_fuzzy_boolean.py"
SETTINGS = ("cls_tokens", "type_inference", "all")


def _load_script() -> ModuleType:
    """Import the example script as a module (registered in sys.modules, as dataclasses need)."""
    return load_script(SCRIPT, "run_fuzzy_boolean")


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return _load_script()


@pytest.fixture(scope="module")
def quick_run(script: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """Run `--preset quick` once in-process; return (returned results, output_dir)."""
    output_dir = tmp_path_factory.mktemp("fuzzy_boolean_quick")
    results = script.main(["--preset", "quick", "--output_dir", str(output_dir), "--disable_tqdm", "true"])
    return results, output_dir


def _state(path: Path) -> dict[str, torch.Tensor]:
    model = NeuralInterpreterForSetRegression.from_pretrained(str(path))
    return {name: p.detach().clone() for name, p in model.named_parameters()}


# --- R^2 and data -----------------------------------------------------------------------------------------


def test_r2_hand_example() -> None:
    """R^2 = 1 - SSE/SST per column, by hand; constant targets give 1 (exact) or -inf."""
    targets = np.array([[1.0, 0.0, 2.0], [2.0, 1.0, 2.0], [3.0, 0.0, 2.0], [4.0, 1.0, 2.0]])
    predictions = np.array([[1.0, 0.5, 2.0], [2.0, 0.5, 2.0], [3.0, 0.5, 2.0], [5.0, 0.5, 2.0]])
    # Column 0: SSE = 1, mean 2.5, SST = 2.25 + 0.25 + 0.25 + 2.25 = 5 -> 0.8.
    # Column 1: predicting the mean -> 0. Column 2: constant target predicted exactly -> 1.
    r2 = r2_per_function(predictions, targets)
    np.testing.assert_allclose(r2, [0.8, 0.0, 1.0])
    assert r2_per_function(np.array([2.0, 2.5]), np.array([2.0, 2.0]))[0] == -np.inf
    # Agrees with scikit-learn on random data, and accepts tensors.
    from sklearn.metrics import r2_score

    rng = np.random.default_rng(0)
    y, p = rng.random((50, 4)), rng.random((50, 4))
    np.testing.assert_allclose(
        r2_per_function(torch.from_numpy(p), torch.from_numpy(y)),
        r2_score(y, p, multioutput="raw_values"),
    )


def test_whole_batch_dataset() -> None:
    """__getitems__ returns the batch in one index, and the collator passes it through unchanged."""
    x, y = torch.rand(10, 5), torch.rand(10, 3)
    ds = TensorBatchDataset(x, y)
    batch = batch_collator(ds.__getitems__([3, 1, 7]))
    torch.testing.assert_close(batch["inputs"], x[[3, 1, 7]])
    torch.testing.assert_close(batch["labels"], y[[3, 1, 7]])
    stacked = batch_collator([ds[3], ds[1]])
    torch.testing.assert_close(stacked["inputs"], x[[3, 1]])


# --- adaptation settings -----------------------------------------------------------------------------------


def test_set_adaptation_trainable_groups(script: ModuleType) -> None:
    """Each setting makes exactly its groups trainable; the groups partition the parameters."""
    config = NeuralInterpreterConfig.from_paper("fuzzy_boolean", num_scripts=2, num_function_iterations=1)
    model = NeuralInterpreterForSetRegression(config)
    groups = {name: script.parameter_group(name) for name, _ in model.named_parameters()}
    assert groups["neural_interpreter.task_tokens"] == "task_tokens"
    assert groups["neural_interpreter.scripts.1.signatures"] == "type_matching"
    assert groups["neural_interpreter.scripts.0.type_inference.layers.0.weight"] == "type_matching"
    assert groups["neural_interpreter.scripts.0.type_inference.norm.weight"] == "type_matching"
    assert groups["neural_interpreter.scripts.0.codes"] == "other"
    assert groups["neural_interpreter.scripts.0.sigma"] == "other"
    assert groups["input_projection.weight"] == groups["input_position_embeddings"] == "other"
    assert all(group == "other" for name, group in groups.items() if name.startswith("regressor."))
    expected = {
        "cls_tokens": {"task_tokens"},
        "type_inference": {"task_tokens", "type_matching"},
        "all": {"task_tokens", "type_matching", "other"},
    }
    for setting, trainable_groups in expected.items():
        counts = script.set_adaptation_trainable(model, setting)
        for name, param in model.named_parameters():
            assert param.requires_grad == (groups[name] in trainable_groups), (setting, name)
        assert sum(counts.values()) == sum(p.numel() for p in model.parameters() if p.requires_grad)


# --- the quick preset end to end ---------------------------------------------------------------------------


def test_quick_protocol_writes_results(quick_run: tuple[dict[str, Any], Path]) -> None:
    """The quick run writes the JSON (pre-training + three settings, paper values) and the Markdown table."""
    returned, output_dir = quick_run
    results = json.loads((output_dir / "fuzzy_boolean_results.json").read_text())
    assert results["protocol"]["protocol"] == "quick"
    pre = results["pretraining"]
    assert pre["num_functions"] == 20 and len(pre["r2_per_function"]) == 20
    assert np.isfinite(pre["r2_mean"]) and pre["paper_r2_mean"] == 0.9983
    assert pre["train_steps"] == 4
    assert set(results["adaptation"]) == set(SETTINGS)
    for setting in SETTINGS:
        res = results["adaptation"][setting]
        assert res["num_functions"] == len(res["r2_per_function"]) == 10
        assert np.isfinite(res["r2_mean"]) and np.isfinite(res["r2_std"])
        assert res["train_steps"] == 2
        assert res["r2_mean"] == pytest.approx(np.mean(res["r2_per_function"]))
        assert len(res["routing_density"]["per_iteration"]) == 4 and 0 <= res["routing_density"]["mean"] <= 1
    assert results["adaptation"]["cls_tokens"]["paper_r2_mean"] == 0.9202
    assert returned["pretraining"]["r2_mean"] == pytest.approx(pre["r2_mean"])
    markdown = (output_dir / "fuzzy_boolean_results.md").read_text()
    assert "0.9983" in markdown and "0.9953" in markdown and "Finetuning CLS tokens" in markdown
    assert f"pre-trained {pre['routing_density']['mean']:.3f}, cls_tokens" in markdown
    assert f"Pre-training steps: 4 in {pre['train_runtime_s']:.1f} s" in markdown
    assert results["environment"]["mixed_precision"] == "no" and "autocast" not in markdown
    assert "mixed precision: no" in (output_dir / "README.md").read_text()
    for folder in ["pretrain"] + [f"adapt-{setting}" for setting in SETTINGS]:  # each saved model's SHA-256
        assert verify_weights_checksum(output_dir / folder), folder


CARD_SNIPPET_CHECK = """
import sys
sys.modules["ni_hf"] = None  # the card promises that nothing needs the package
import numpy as np, torch
repo = sys.argv[1]
from transformers.dynamic_module_utils import get_class_from_dynamic_module
cls = get_class_from_dynamic_module("modeling_neural_interpreter.NeuralInterpreterForSetRegression", repo)
for folder in sys.argv[2:]:
    model = cls.from_pretrained(repo, subfolder=folder).eval()
    with torch.no_grad():
        predictions = model(inputs=torch.from_numpy(np.load(f"{repo}/_inputs.npy"))).predictions
    np.save(f"{repo}/_{folder}.npy", predictions.numpy())
"""


def test_model_card_carries_the_measured_r2_and_its_snippet_loads_every_model_without_ni_hf(
    quick_run: tuple[dict[str, Any], Path],
) -> None:
    from huggingface_hub import ModelCard

    _, output_dir = quick_run
    results = json.loads((output_dir / "fuzzy_boolean_results.json").read_text())
    card = ModelCard.load(output_dir / "README.md")
    measured = [results["pretraining"]["r2_mean"]] + [results["adaptation"][s]["r2_mean"] for s in SETTINGS]
    assert [r.metric_value for r in card.data.eval_results] == [round(v, 6) for v in measured]
    assert [r.dataset_type for r in card.data.eval_results] == ["fuzzy-boolean-functions-pretraining"] + [
        "fuzzy-boolean-functions-new"
    ] * 3
    assert "This run used the `quick` protocol, not the paper's" in card.text
    assert "| `adapt-all/` |" in card.text and "--preset quick" in card.text
    assert "{{" not in card.text and "<built-in" not in card.text
    snippet = card.text.split("```python")[1].split("```")[0]
    assert 'subfolder="pretrain"' in snippet and "get_class_from_dynamic_module" in snippet
    x = torch.rand(6, 5)
    np.save(output_dir / "_inputs.npy", x.numpy())
    env = {
        **os.environ,
        "PYTHONPATH": "",
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(output_dir / "_modules"),
    }
    folders = ["pretrain"] + [f"adapt-{s}" for s in SETTINGS]
    proc = subprocess.run(
        [sys.executable, "-c", CARD_SNIPPET_CHECK, str(output_dir), *folders],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for folder in folders:
        with torch.no_grad():
            expected = NeuralInterpreterForSetRegression.from_pretrained(str(output_dir / folder))(inputs=x)
        np.testing.assert_allclose(
            np.load(output_dir / f"_{folder}.npy"), expected.predictions.numpy(), atol=1e-6
        )


def _card_section(text: str, folder: str) -> str:
    """The card's routing subsection of one saved model folder."""
    return text.split(f"### `{folder}/`")[1].split("\n### ")[0]


def test_model_card_links_each_saved_models_routing_pictures_and_its_usage_is_that_models_own_C(
    quick_run: tuple[dict[str, Any], Path],
) -> None:
    """Every saved model's card section links PNGs that exist in the folder; its table and JSON are the mean C
    (Eq. 4) of the model's own routing output on the held-out points, per (script, iteration) and per task's CLS
    token, each row summing to at most 1 with "none" the rest."""
    from huggingface_hub import ModelCard
    from PIL import Image

    results, output_dir = quick_run
    card = ModelCard.load(output_dir / "README.md").text
    assert "## Routing" in card
    data = make_fuzzy_boolean_tensors(points_per_function=results["protocol"]["points_per_function"], seed=0)
    for folder, group in [("pretrain", "pretrain")] + [(f"adapt-{s}", "adapt") for s in SETTINGS]:
        section = _card_section(card, folder)
        for picture in (f"routing_{folder}_path.png", f"routing_{folder}_usage.png"):
            assert f"]({picture})" in section
            with Image.open(output_dir / picture) as image:
                assert image.format == "PNG" and image.width > 300
        usage = json.loads((output_dir / f"routing_{folder}_usage.json").read_text())
        model = NeuralInterpreterForSetRegression.from_pretrained(str(output_dir / folder)).eval()
        x = data[group]["test"][0][:FUZZY_BOOLEAN_ROUTING_POINTS]
        with torch.no_grad():
            c = (
                torch.stack(model(inputs=x, output_routing=True).compatibilities).double().numpy()
            )  # (K, B, U, N)
        num_tasks = model.config.num_task_tokens
        assert c.shape == (4, len(x), 4, num_tasks + 5) and usage["num_samples"] == len(x)
        assert (c.sum(axis=2) <= 1 + 1e-6).all()  # Eq. 4: C over the functions sums to at most 1 per token
        np.testing.assert_allclose(usage["by_iteration"], c.mean(axis=(1, 3)), atol=1e-6)
        by_task = c[..., :num_tasks].mean(axis=(0, 1)).T  # (T, U): C of each task's own CLS token
        np.testing.assert_allclose(usage["by_task"], by_task, atol=1e-6)
        assert usage["iterations"] == [f"script {s}, iteration {k}" for s in (1, 2) for k in (1, 2)]
        assert usage["tasks"] == model.config.task_names and usage["task_source"] == "cls_token"
        rows = [line for line in section.splitlines() if line.startswith("| ") and "function 0" not in line]
        expected = list(zip(usage["iterations"], c.mean(axis=(1, 3)), strict=True))
        expected += [(f"CLS token of {t}", v) for t, v in zip(usage["tasks"], by_task, strict=True)]
        assert len(rows) == len(expected)
        for row, (name, values) in zip(rows, expected, strict=True):
            cells = row.split("|")[1:-1]
            assert cells[0].strip() == name
            shares = [float(v) for v in cells[1:]]
            np.testing.assert_allclose(shares[:4], values, atol=5e-4 + 1e-9)
            assert shares[4] == pytest.approx(
                1.0 - values.sum(), abs=1e-3
            )  # "none": the share no function takes


def test_without_matplotlib_the_card_keeps_the_usage_table_and_the_log_says_the_pictures_were_skipped(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = NeuralInterpreterConfig.from_paper("fuzzy_boolean", task_names=["f0", "f1"])
    torch.manual_seed(0)
    NeuralInterpreterForSetRegression(config).save_pretrained(tmp_path / "pretrain")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with caplog.at_level(logging.INFO):
        markdown = fuzzy_boolean_routing_section(
            tmp_path, {"pretrain": torch.rand(8, 5), "adapt-all": torch.rand(8, 5)}
        )
    assert any("No routing pictures" in r.getMessage() for r in caplog.records)
    assert "![" not in markdown and "| CLS token of f1 |" in markdown and "adapt-all" not in markdown
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pretrain", "routing_pretrain_usage.json"]


def test_a_failed_push_says_how_to_upload_later_after_saving_everything(
    script: ModuleType, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upload comes last: when the Hub cannot be reached then, everything is saved and the log says how to
    upload it later; the script exits with status 1."""

    def unreachable(*args: Any, **kwargs: Any) -> str:
        raise ConnectionError("the network is unreachable")

    monkeypatch.setenv("HF_TOKEN", "hf_test")
    monkeypatch.setattr(ni_hf.training.publishing, "push_folder", unreachable)
    output_dir = tmp_path / "out"
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as exit_info:
        script.main(
            ["--preset", "quick", "--settings", "cls_tokens", "--output_dir", str(output_dir)]
            + ["--disable_tqdm", "true", "--push_to_hub", "--hub_model_id", "me/fuzzy-boolean"]
        )
    assert exit_info.value.code == 1
    failure = [r.getMessage() for r in caplog.records if "--push_to_hub failed" in r.getMessage()]
    assert failure and "network is unreachable" in failure[0] and "hf upload me/fuzzy-boolean" in failure[0]
    for name in ("README.md", "fuzzy_boolean_results.json", "modeling_neural_interpreter.py"):
        assert (output_dir / name).is_file(), name
    assert (output_dir / "adapt-cls_tokens" / "model.safetensors").is_file()
    assert not (output_dir / "adapt-all").exists()


def test_pretrained_checkpoint_reloads(quick_run: tuple[dict[str, Any], Path]) -> None:
    """The saved pre-trained checkpoint reloads and reproduces the reported pre-training R^2."""
    results, output_dir = quick_run
    model = NeuralInterpreterForSetRegression.from_pretrained(str(output_dir / "pretrain")).eval()
    assert model.config.task_names == [f"f{i}" for i in range(20)]
    data = make_fuzzy_boolean_tensors(points_per_function=results["protocol"]["points_per_function"], seed=0)
    x, y = data["pretrain"]["test"]
    with torch.no_grad():
        predictions = model(inputs=x).predictions
    script = _load_script()
    np.testing.assert_allclose(
        r2_per_function(predictions, y),
        results["pretraining"]["r2_per_function"],
        rtol=1e-4,
        atol=1e-6,
    )
    # The recorded routing density is the fraction of (function, token) pairs with C > 0 on the test points.
    with torch.no_grad():
        compat = model(inputs=x[: script.DENSITY_POINTS], output_routing=True).compatibilities
    density = results["pretraining"]["routing_density"]
    assert density["num_samples"] == min(len(x), script.DENSITY_POINTS)
    np.testing.assert_allclose(density["per_iteration"], [(c > 0).float().mean().item() for c in compat])


def test_adaptation_freezing(quick_run: tuple[dict[str, Any], Path]) -> None:
    """(a) only CLS tokens change; (b) also type inference + signatures; (c) every parameter that gets a gradient."""
    _, output_dir = quick_run
    script = _load_script()
    pretrained = _state(output_dir / "pretrain")
    unused = {"neural_interpreter.patch_embedding.weight", "neural_interpreter.patch_embedding.bias"}
    for setting in SETTINGS:
        adapted = _state(output_dir / f"adapt-{setting}")
        assert set(adapted) == set(pretrained)
        assert adapted["neural_interpreter.task_tokens"].shape[0] == 10
        for name, before in pretrained.items():
            if name == "neural_interpreter.task_tokens":
                continue
            group = script.parameter_group(name)
            changed = not torch.equal(before, adapted[name])
            should_change = group in script.SETTING_GROUPS[setting] and name not in unused
            assert changed == should_change, (setting, name, group, changed)


def test_protocol_deviations_name_every_change_to_the_papers_protocol(script: ModuleType) -> None:
    def deviations(*args: str) -> list[str]:
        exp, _ = script.parse_args(["--output_dir", "unused", *args])
        return script.protocol_deviations({"protocol": {}, "arguments": vars(exp)})

    assert deviations() == []
    assert deviations("--batch_size", "256", "--adapt_pretrained_learning_rate", "0.006") == [
        "batch_size 256 (paper: 128)",
        "adapt_pretrained_learning_rate 0.006 (paper: not set)",
    ]
    assert deviations("--preset", "quick")[:2] == [
        "points_per_function 320 (paper: 163840)",
        "batch_size 32 (paper: 128)",
    ]


def _one_radam_step(
    script: ModuleType,
    model: NeuralInterpreterForSetRegression,
    groups: list[dict],
    tmp_path: Path,
    rate_of: Callable[[str], float],
):
    """One Trainer step with RAdam ``groups``; RAdam's first step is lr x gradient, so every trainable parameter
    must have moved by ``rate_of(name)`` times its gradient. Returns the trainer."""
    x, y = torch.rand(8, 5), torch.rand(8, 3)
    dataset = TensorBatchDataset(x, y)
    args = script.TrainingArguments(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, per_device_train_batch_size=8, max_steps=1,
        lr_scheduler_type="constant", max_grad_norm=0.0, save_strategy="no", remove_unused_columns=False,
    )  # fmt: skip
    trainer = script.make_trainer(model, args, dataset, dataset, param_groups=groups)
    before = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    model.train()
    model.zero_grad()
    trainer.compute_loss(model, {"inputs": x, "labels": y}).backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    trainer.train()
    for name, param in model.named_parameters():
        if name in before:
            torch.testing.assert_close(param.detach(), before[name] - rate_of(name) * grads[name], msg=name)
    return trainer


def test_adapt_pretrained_learning_rate_gives_the_pretrained_parameters_their_own_rate(
    script: ModuleType, tmp_path: Path
) -> None:
    """--adapt_pretrained_learning_rate: RAdam steps the CLS tokens at one rate and the adapted pre-trained
    parameters at another (RAdam's first step is lr x gradient, so each parameter's move shows its rate)."""
    config = NeuralInterpreterConfig.from_paper(
        "fuzzy_boolean", hidden_size=16, code_dim=16, attention_head_size=8, type_inference_hidden_size=16,
        task_names=["a", "b", "c"],
    )  # fmt: skip
    model = NeuralInterpreterForSetRegression(config)
    script.set_adaptation_trainable(model, "type_inference")
    groups = script.adaptation_param_groups(model, 5e-2, 6e-3)
    assert [group["lr"] for group in groups] == [5e-2, 6e-3]
    assert groups[0]["params"] == [model.neural_interpreter.task_tokens]
    grouped = [id(p) for group in groups for p in group["params"]]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters() if p.requires_grad)
    script.set_adaptation_trainable(model, "cls_tokens")
    assert len(script.adaptation_param_groups(model, 5e-2, 6e-3)) == 1

    script.set_adaptation_trainable(model, "type_inference")
    trainer = _one_radam_step(
        script, model, script.adaptation_param_groups(model, 5e-2, 6e-3), tmp_path,
        rate_of=lambda name: 5e-2 if name == "neural_interpreter.task_tokens" else 6e-3,
    )  # fmt: skip
    assert [group["lr"] for group in trainer.optimizer.param_groups] == [5e-2, 6e-3]


def test_two_rates_reach_the_adaptation_and_its_results(script: ModuleType, tmp_path: Path) -> None:
    results = script.main(
        ["--preset", "quick", "--settings", "type_inference", "--adapt_pretrained_learning_rate", "0.006",
         "--disable_tqdm", "true", "--output_dir", str(tmp_path)]
    )  # fmt: skip
    assert results["protocol"]["adapt_pretrained_learning_rate"] == 0.006
    assert (
        "RAdam 0.006 / 0.05 (pre-trained parameters 0.006)"
        in (tmp_path / "fuzzy_boolean_results.md").read_text()
    )
    card = (tmp_path / "README.md").read_text()
    assert "RAdam lr 0.05 (pre-trained parameters 0.006)" in card


# --- resuming ---------------------------------------------------------------------------------------------


def test_pretraining_resumed_from_checkpoint_equals_uninterrupted(
    script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """4 steps, then the same command continued to 6 steps, give the weights and the train_loss (the mean over all
    6 steps) of 6 steps in one go; the finished run of 4 steps is not resumed (it would train past its end).

    This is how the full protocol is run in pieces on a CPU: `--resume_from_checkpoint last` with periodic saves.
    """
    common = ["--preset", "quick", "--settings", "none", "--disable_tqdm", "true"]
    pieces = ["--save_strategy", "steps", "--save_steps", "2", "--resume_from_checkpoint", "last"]
    first = script.main([*common, *pieces, "--output_dir", str(tmp_path / "pieces")])
    assert first["pretraining"]["train_steps"] == 4 and first["pretraining"]["resumed_from"] is None
    assert (tmp_path / "pieces" / "pretrain" / "checkpoint-4").is_dir()
    err = refusal(script, [*common, *pieces, "--output_dir", str(tmp_path / "pieces")], capsys)
    assert "checkpoint-4 is step 4, and this run ends at step 4" in err
    assert (
        f"pass --pretrained_model {tmp_path / 'pieces' / 'pretrain'} instead of --resume_from_checkpoint"
        in err
    )
    initial = _state(tmp_path / "pieces" / "pretrain" / "checkpoint-4")
    second = script.main(
        [*common, *pieces, "--pretrain_max_steps", "6", "--output_dir", str(tmp_path / "pieces")]
    )
    straight = script.main([*common, "--pretrain_max_steps", "6", "--output_dir", str(tmp_path / "straight")])
    assert second["pretraining"]["train_steps"] == straight["pretraining"]["train_steps"] == 6
    assert second["pretraining"]["resumed_from"] == str(tmp_path / "pieces" / "pretrain" / "checkpoint-4")
    resumed, uninterrupted = (
        _state(tmp_path / "pieces" / "pretrain"),
        _state(tmp_path / "straight" / "pretrain"),
    )
    assert any(not torch.equal(initial[name], resumed[name]) for name in resumed)  # it did train on
    for name, value in uninterrupted.items():
        torch.testing.assert_close(resumed[name], value, rtol=1e-5, atol=1e-6, msg=name)
    np.testing.assert_allclose(
        second["pretraining"]["r2_per_function"], straight["pretraining"]["r2_per_function"], rtol=1e-4
    )
    assert second["pretraining"]["final_train_loss"] == pytest.approx(
        straight["pretraining"]["final_train_loss"], rel=1e-5
    )


def test_resume_point(script: ModuleType, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """'last' picks the newest complete checkpoint (one killed while saving has no trainer_state.json of its step
    and is skipped, with a warning), or none yet, so that one command starts and continues; a path is checked."""
    assert script.pretraining_resume_point(None, tmp_path) is None
    with caplog.at_level(logging.INFO):
        assert script.pretraining_resume_point("last", tmp_path / "absent") is None
    assert "pre-training starts from scratch" in caplog.text
    for step in (2, 10, 12):
        (tmp_path / f"checkpoint-{step}").mkdir()
        if step != 12:
            (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(
                json.dumps({"global_step": step})
            )
    with caplog.at_level(logging.WARNING):
        assert script.pretraining_resume_point("last", tmp_path) == str(tmp_path / "checkpoint-10")
    assert f"Skipping {tmp_path / 'checkpoint-12'}: no readable trainer_state.json" in caplog.text
    assert script.pretraining_resume_point("true", tmp_path) == str(tmp_path / "checkpoint-10")
    assert script.pretraining_resume_point(str(tmp_path / "checkpoint-2"), tmp_path) == str(
        tmp_path / "checkpoint-2"
    )
    with pytest.raises(ValueError, match="checkpoint-12: no trainer_state.json"):
        script.pretraining_resume_point(str(tmp_path / "checkpoint-12"), tmp_path)


# --- several processes ------------------------------------------------------------------------------------


@pytest.mark.slow  # multi-process training
def test_two_processes_keep_the_protocol_global_batch_and_write_results_once(tmp_path: Path) -> None:
    """torchrun, 2 CPU ranks: each takes half of the batch (same steps per epoch), R^2 counts each point once."""
    output_dir = tmp_path / "ddp"
    args = ["--preset", "quick", "--pretrain_max_steps", "-1", "--settings", "cls_tokens",
            "--output_dir", str(output_dir)]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "HF_HOME": str(tmp_path / "hf_home")}
    command = torchrun_command(SCRIPT, "--use_cpu", "true", "--disable_tqdm", "true", *args)
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "Process 0 of world size 2" in log and "Process 1 of world size 2" in log
    assert log.count("Results written to") == 1  # only the main process writes
    results = json.loads((output_dir / "fuzzy_boolean_results.json").read_text())
    protocol = results["protocol"]
    assert (protocol["world_size"], protocol["batch_size"], protocol["per_device_batch_size"]) == (2, 32, 16)
    assert (
        results["pretraining"]["train_steps"] == 256 // 32
    )  # one epoch of the global batch, as on one process
    assert "batch 32 (2 processes x 16)" in (output_dir / "fuzzy_boolean_results.md").read_text()
    # The R^2 gathered from both ranks is the R^2 of the saved model on the whole test split.
    model = NeuralInterpreterForSetRegression.from_pretrained(str(output_dir / "pretrain")).eval()
    x, y = make_fuzzy_boolean_tensors(points_per_function=320, seed=0)["pretrain"]["test"]
    with torch.no_grad():
        predictions = model(inputs=x).predictions
    np.testing.assert_allclose(
        r2_per_function(predictions, y),
        results["pretraining"]["r2_per_function"],
        rtol=1e-4,
        atol=1e-6,
    )
    assert results["adaptation"]["cls_tokens"]["train_steps"] == 2


# --- every argument checked before any work -----------------------------------------------------------------

NO_SUCH = "/nonexistent/fuzzy_boolean"
BAD_ARGUMENTS = [
    (["--preset", "fast"], "--preset given 2 times; a run starts from one preset"),
    (
        ["--learning_rate", "0.1"],
        "--learning_rate 0.1: the protocol sets it for each phase; use --pretrain_learning_rate",
    ),
    (["--num_train_epochs", "0"], "--num_train_epochs 0.0: the protocol sets it"),
    (["--max_steps", "5"], "--max_steps 5: the protocol sets it"),
    (["--per_device_train_batch_size", "4"], "--per_device_train_batch_size 4: .* use --batch_size"),
    (["--gradient_accumulation_steps", "2"], "--gradient_accumulation_steps 2: .* use --batch_size"),
    (["--lr_scheduler_type", "cosine"], "--lr_scheduler_type cosine: .* constant"),
    (["--warmup_steps", "10"], "--warmup_steps 10"),
    (["--optim", "sgd"], "--optim sgd: .* RAdam"),
    (["--radam", "false"], "--radam False: the protocol sets it .* both phases use RAdam"),
    (["--do_train", "false"], "--do_train False: .* use --pretrained_model .* or --settings none"),
    (["--do_eval", "false"], "--do_eval False: .* every phase is evaluated"),
    (
        ["--max_train_minutes", "5"],
        "--max_train_minutes: the protocol's phases run for their epochs or steps",
    ),
    (["--points_per_function", "0"], "--points_per_function must be at least 1, got 0"),
    (
        ["--points_per_function", "5"],
        "--points_per_function 5 with --test_fraction 0.2 leaves 4 training and 1 test",
    ),
    (["--batch_size", "0"], "--batch_size must be at least 1, got 0"),
    (["--per_device_eval_batch_size", "0"], "--per_device_eval_batch_size must be at least 1, got 0"),
    (["--num_pretrain_functions", "0"], "--num_pretrain_functions must be at least 1"),
    (["--num_adapt_functions", "0"], "--num_adapt_functions must be at least 1"),
    (["--dataset_seed", "-1"], "--dataset_seed must be >= 0"),
    (["--adapt_dataset_seed", "-3"], "--adapt_dataset_seed must be >= 0"),
    (["--seed", "-1"], "--seed must be between 0 and 2\\*\\*32 - 1"),
    (["--dataloader_num_workers", "-1"], "--dataloader_num_workers must be at least 0, got -1"),
    (["--logging_steps", "-5"], "--logging_steps must be a positive number, got -5"),
    (["--save_strategy", "steps", "--save_steps", "0"], "--save_steps must be a positive number, got 0"),
    (["--adam_beta2", "1.5"], "--adam_beta2 must lie in \\[0, 1\\), got 1.5"),
    (["--test_fraction", "1.0"], "--test_fraction must lie strictly between 0 and 1"),
    (["--test_fraction", "0"], "--test_fraction must lie strictly between 0 and 1"),
    (["--pretrain_max_steps", "0"], "--pretrain_max_steps must be -1 .* or at least 1, got 0"),
    (["--adapt_max_steps", "-2"], "--adapt_max_steps must be -1 .* or at least 1, got -2"),
    (["--pretrain_max_steps", "-1", "--pretrain_epochs", "0"], "--pretrain_epochs must be a positive number"),
    (["--pretrain_epochs", "-1"], "--pretrain_epochs must be a positive number, got -1.0"),
    (
        ["--adapt_max_steps", "-1", "--adapt_epochs", "nan"],
        "--adapt_epochs must be a positive number, got nan",
    ),
    (["--pretrain_learning_rate", "0"], "--pretrain_learning_rate must be a positive number, got 0.0"),
    (["--adapt_learning_rate", "-0.05"], "--adapt_learning_rate must be a positive number, got -0.05"),
    (["--adapt_learning_rate", "inf"], "--adapt_learning_rate must be a positive number, got inf"),
    (["--adapt_pretrained_learning_rate", "0"], "--adapt_pretrained_learning_rate must be a positive number"),
    (
        ["--adapt_pretrained_learning_rate", "6e-3", "--weight_decay", "0.01"],
        "--weight_decay 0.01 would be ignored",
    ),
    (["--settings", "cls_tokens,cls"], "--settings 'cls_tokens,cls': expected distinct names"),
    (["--settings", "all,all"], "--settings 'all,all': expected distinct names"),
    (
        ["--model_card_template", f"{NO_SUCH}/template.md"],
        "--model_card_template .*template.md does not exist",
    ),
    (["--pretrained_model", f"{NO_SUCH}/pretrain"], "--pretrained_model .*: no such directory"),
    (
        ["--resume_from_checkpoint", f"{NO_SUCH}/checkpoint-7"],
        "--resume_from_checkpoint .*checkpoint-7: no such folder",
    ),
    (
        ["--torch_compile_backend", "inductr"],
        "--torch_compile_backend 'inductr' is not a backend of torch.compile",
    ),
    (
        ["--num_adapt_functions", "1000000000"],
        "--points_per_function 320 with .* --num_adapt_functions 1000000000 need at least .* GiB for the data",
    ),
    (
        ["--points_per_function", "1000000000000"],
        "--points_per_function 1000000000000 with .* need at least .* GiB for the data",
    ),
    (
        ["--num_adapt_functions", "100000"],
        "--num_adapt_functions 100000 \\(sets of up to 100005 tokens\\) need at least 149.0 GiB for one sample's "
        "attention weights .*; cpu has 64.0 GiB",
    ),
]


@pytest.fixture
def no_work(script: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Making the data is the first work of a run: fail the test if it starts."""

    def started(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the run started its work")

    monkeypatch.setattr(script, "make_fuzzy_boolean_tensors", started)


def refusal(script: ModuleType, argv: list[str], capsys: pytest.CaptureFixture) -> str:
    """Run the script on ``argv``; it must exit with status 2 (a bad argument); return its stderr."""
    with pytest.raises(SystemExit) as exit_info:
        script.main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(("extra", "match"), BAD_ARGUMENTS, ids=[" ".join(a) for a, _ in BAD_ARGUMENTS])
def test_a_bad_argument_is_refused_before_any_work_naming_the_option(
    script: ModuleType,
    tmp_path: Path,
    no_work: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    extra: list[str],
    match: str,
) -> None:
    """Exit status 2 and a message on stderr that names the flag; nothing written (the machine has 64 GiB)."""
    monkeypatch.setattr(ni_hf.training.run_setup, "total_memory", lambda device: 64 * 2**30)
    output_dir = tmp_path / "out"
    err = refusal(script, ["--preset", "quick", "--output_dir", str(output_dir), *extra], capsys)
    assert "run_fuzzy_boolean.py: error: " in err and re.search(match, err), err
    assert not output_dir.exists()


def test_an_unknown_preset_is_refused_naming_the_presets(
    script: ModuleType, tmp_path: Path, no_work: None, capsys: pytest.CaptureFixture
) -> None:
    err = refusal(script, ["--preset", "fast", "--output_dir", str(tmp_path / "o")], capsys)
    assert "--preset 'fast': expected one of ['full', 'reduced', 'quick']" in err


def test_a_batch_that_does_not_fit_the_device_is_refused(
    script: ModuleType,
    tmp_path: Path,
    no_work: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """The set of one batch (5 + functions tokens of width 128) must fit: 10**6 new functions at batch 32 need
    about 32 GiB; on a device of 8 GiB that is refused, with the numbers."""
    exp, _ = script.parse_args(["--preset", "quick", "--num_adapt_functions", "1000000"])
    needed = script.memory_needed(exp, eval_batch=1024)
    assert (
        needed["model"] == 4 * 4 * 10**6 * 128 + 4 * 64 * (5 + 10**6) * 128
    )  # the 64 test points are one batch
    assert needed["attention"] == 4 * 4 * 1 * (5 + 10**6) ** 2  # Eq. 6: 4 functions, 1 head, N^2 pairs
    monkeypatch.setattr(ni_hf.training.run_setup, "total_memory", lambda device: 8 * 2**30)
    argv = ["--preset", "quick", "--num_adapt_functions", "1000000", "--output_dir", str(tmp_path / "o")]
    assert re.search(
        r"--batch_size 32 .* --num_adapt_functions 1000000 need at least 32.\d GiB for one batch; cpu has 8.0 GiB",
        refusal(script, argv, capsys),
    )


def test_a_global_batch_that_the_processes_cannot_share_is_refused(
    script: ModuleType,
    tmp_path: Path,
    no_work: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    monkeypatch.setattr(script.FuzzyBooleanTrainingArguments, "world_size", property(lambda self: 2))
    argv = ["--preset", "quick", "--batch_size", "31", "--output_dir", str(tmp_path / "o")]
    assert re.search(
        "--batch_size 31 is the global batch; .* processes \\(2\\)", refusal(script, argv, capsys)
    )


def test_a_pretrained_model_of_other_functions_is_refused(
    script: ModuleType,
    quick_run: tuple[dict[str, Any], Path],
    tmp_path: Path,
    no_work: None,
    capsys: pytest.CaptureFixture,
) -> None:
    pretrained = str(quick_run[1] / "pretrain")
    common = ["--preset", "quick", "--pretrained_model", pretrained, "--output_dir", str(tmp_path / "o")]
    err = refusal(script, [*common, "--num_pretrain_functions", "5"], capsys)
    assert "regresses 20 functions; pass --num_pretrain_functions 20" in err
    err = refusal(script, [*common, "--resume_from_checkpoint", "last"], capsys)
    assert "--pretrained_model skips it: drop one" in err


def test_a_digits_checkpoint_is_refused_as_the_pretrained_model_naming_its_config(
    script: ModuleType, tester, tmp_path: Path, no_work: None, capsys: pytest.CaptureFixture
) -> None:
    digits = tmp_path / "digits"
    NeuralInterpreterForImageClassification(tester.get_config()).save_pretrained(digits)
    err = refusal(script, ["--preset", "quick", "--pretrained_model", str(digits)], capsys)
    assert (
        f"--pretrained_model {digits}: its config.json describes a NeuralInterpreterForImageClassification"
        in err
    )
    assert "expected the NeuralInterpreterForSetRegression" in err and "--num_pretrain_functions" not in err


def test_weights_that_do_not_fit_the_pretrained_model_are_refused_naming_the_file(
    script: ModuleType,
    quick_run: tuple[dict[str, Any], Path],
    tester,
    tmp_path: Path,
    no_work: None,
    capsys: pytest.CaptureFixture,
) -> None:
    """A fuzzy-Boolean folder whose model.safetensors is a digits classifier's: refused, naming the file and the
    flag that would load it anyway."""
    folder = tmp_path / "pretrain"
    shutil.copytree(quick_run[1] / "pretrain", folder)
    digits = tmp_path / "digits"
    NeuralInterpreterForImageClassification(tester.get_config()).save_pretrained(digits)
    shutil.copyfile(digits / "model.safetensors", folder / "model.safetensors")
    # The run recorded its weights' SHA-256: a replaced file is refused as changed first.
    err = refusal(script, ["--preset", "quick", "--pretrained_model", str(folder)], capsys)
    assert f"{folder / 'model.safetensors'} has SHA-256" in err and "weights_sha256.json records" in err
    (folder / "weights_sha256.json").unlink()  # replaced on purpose, as that error says to do
    err = refusal(script, ["--preset", "quick", "--pretrained_model", str(folder)], capsys)
    assert f"{folder / 'model.safetensors'} does not fit NeuralInterpreterForSetRegression" in err
    assert "--allow_mismatched_weights" in err
    with pytest.raises(AssertionError, match="the run started its work"):  # the flag lets the run go on
        script.main(
            ["--preset", "quick", "--pretrained_model", str(folder), "--allow_mismatched_weights", "true"]
            + ["--output_dir", str(tmp_path / "o")]
        )


def test_resuming_a_finished_pretraining_without_checkpoints_is_refused(
    script: ModuleType,
    quick_run: tuple[dict[str, Any], Path],
    no_work: None,
    capsys: pytest.CaptureFixture,
) -> None:
    """`--resume_from_checkpoint last` on a folder whose pre-training finished and kept no checkpoint would train
    anew over the final model: refused, pointing to --pretrained_model."""
    output_dir = quick_run[1]
    argv = ["--preset", "quick", "--resume_from_checkpoint", "last", "--output_dir", str(output_dir)]
    err = refusal(script, argv, capsys)
    assert f"{output_dir / 'pretrain'} holds the model of a finished pre-training" in err
    assert f"pass --pretrained_model {output_dir / 'pretrain'} instead" in err


def test_an_incomplete_checkpoint_is_refused(
    script: ModuleType, tmp_path: Path, no_work: None, capsys: pytest.CaptureFixture
) -> None:
    checkpoint = tmp_path / "checkpoint-8"
    checkpoint.mkdir()  # weights may be there, but trainer_state.json (written last) is not
    argv = [
        "--preset",
        "quick",
        "--resume_from_checkpoint",
        str(checkpoint),
        "--output_dir",
        str(tmp_path / "o"),
    ]
    assert re.search(
        "--resume_from_checkpoint .*checkpoint-8: no trainer_state.json, so not a finished checkpoint",
        refusal(script, argv, capsys),
    )


def test_a_model_card_template_that_does_not_parse_is_refused(
    script: ModuleType, tmp_path: Path, no_work: None, capsys: pytest.CaptureFixture
) -> None:
    template = tmp_path / "card.md"
    template.write_text("# {{ model_name }\n")
    argv = ["--preset", "quick", "--model_card_template", str(template), "--output_dir", str(tmp_path / "o")]
    assert re.search(r"--model_card_template .*card.md: .*\(line 1\)", refusal(script, argv, capsys))


@pytest.mark.parametrize(
    ("offline", "token", "repo_id", "match"),
    [
        (True, "hf_test", "me/fb", "--push_to_hub: HF_HUB_OFFLINE is set"),
        (False, None, "me/fb", "--push_to_hub needs a write token"),
        (False, "hf_test", "me/fb/extra", "--hub_model_id 'me/fb/extra' is not a Hub repo id"),
    ],
)
def test_a_push_that_cannot_work_is_refused_before_any_work(
    script: ModuleType,
    tmp_path: Path,
    no_work: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    offline: bool,
    token: str | None,
    repo_id: str,
    match: str,
) -> None:
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: token)
    argv = [
        "--preset",
        "quick",
        "--push_to_hub",
        "--hub_model_id",
        repo_id,
        "--output_dir",
        str(tmp_path / "o"),
    ]
    assert match in refusal(script, argv, capsys)
