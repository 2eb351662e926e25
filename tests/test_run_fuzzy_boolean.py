"""Tests of examples/run_fuzzy_boolean.py: the quick protocol end to end, R^2, and adaptation freezing."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
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

from ni_hf import NeuralInterpreterConfig, NeuralInterpreterForSetRegression
from ni_hf.fuzzy_boolean import make_fuzzy_boolean_tensors

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
    """Run `--protocol quick` once in-process; return (returned results, output_dir)."""
    output_dir = tmp_path_factory.mktemp("fuzzy_boolean_quick")
    threads = torch.get_num_threads()
    try:
        results = script.main(
            ["--protocol", "quick", "--output_dir", str(output_dir), "--disable_tqdm", "true"]
        )
    finally:
        torch.set_num_threads(threads)
    return results, output_dir


def _state(path: Path) -> dict[str, torch.Tensor]:
    model = NeuralInterpreterForSetRegression.from_pretrained(str(path))
    return {name: p.detach().clone() for name, p in model.named_parameters()}


# --- R^2 ------------------------------------------------------------------------------------------------


def test_r2_hand_example(script: ModuleType) -> None:
    """R^2 = 1 - SSE/SST per column, by hand; constant targets give 1 (exact) or -inf."""
    targets = np.array([[1.0, 0.0, 2.0], [2.0, 1.0, 2.0], [3.0, 0.0, 2.0], [4.0, 1.0, 2.0]])
    predictions = np.array([[1.0, 0.5, 2.0], [2.0, 0.5, 2.0], [3.0, 0.5, 2.0], [5.0, 0.5, 2.0]])
    # Column 0: SSE = 1, mean 2.5, SST = 2.25 + 0.25 + 0.25 + 2.25 = 5 -> 0.8.
    # Column 1: predicting the mean -> 0. Column 2: constant target predicted exactly -> 1.
    r2 = script.r2_per_function(predictions, targets)
    np.testing.assert_allclose(r2, [0.8, 0.0, 1.0])
    assert script.r2_per_function(np.array([2.0, 2.5]), np.array([2.0, 2.0]))[0] == -np.inf
    # Agrees with scikit-learn on random data, and accepts tensors.
    from sklearn.metrics import r2_score

    rng = np.random.default_rng(0)
    y, p = rng.random((50, 4)), rng.random((50, 4))
    np.testing.assert_allclose(
        script.r2_per_function(torch.from_numpy(p), torch.from_numpy(y)),
        r2_score(y, p, multioutput="raw_values"),
    )


def test_whole_batch_dataset(script: ModuleType) -> None:
    """__getitems__ returns the batch in one index, and the collator passes it through unchanged."""
    x, y = torch.rand(10, 5), torch.rand(10, 3)
    ds = script.TensorBatchDataset(x, y)
    batch = script.batch_collator(ds.__getitems__([3, 1, 7]))
    torch.testing.assert_close(batch["inputs"], x[[3, 1, 7]])
    torch.testing.assert_close(batch["labels"], y[[3, 1, 7]])
    stacked = script.batch_collator([ds[3], ds[1]])
    torch.testing.assert_close(stacked["inputs"], x[[3, 1]])


# --- adaptation groups ----------------------------------------------------------------------------------


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
    with pytest.raises(ValueError, match="Unknown adaptation setting"):
        script.set_adaptation_trainable(model, "bogus")


def test_adapt_frozen_keeps_matching_parameters_frozen_in_every_setting(script: ModuleType) -> None:
    config = NeuralInterpreterConfig.from_paper("fuzzy_boolean", num_scripts=2, num_function_iterations=1)
    model = NeuralInterpreterForSetRegression(config)
    all_counts = script.set_adaptation_trainable(model, "all")
    counts = script.set_adaptation_trainable(model, "all", r"sigma$|^regressor\.")
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    assert {"neural_interpreter.scripts.0.sigma", "neural_interpreter.scripts.1.sigma"} <= frozen
    assert {"regressor.linear.weight", "regressor.norm.bias"} <= frozen
    assert model.neural_interpreter.scripts[0].codes.requires_grad
    regressor = sum(p.numel() for p in model.regressor.parameters())
    assert counts["other"] == all_counts["other"] - 2 - regressor
    assert counts["task_tokens"] == all_counts["task_tokens"]
    # A pattern that only matches parameters the setting leaves frozen anyway is a mistake: say so.
    with pytest.raises(ValueError, match="matches no trainable parameter of the 'cls_tokens' setting"):
        script.set_adaptation_trainable(model, "cls_tokens", "sigma$")


# --- the quick protocol end to end ----------------------------------------------------------------------


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
        assert (
            len(res["r2_per_function"]) == 10 and np.isfinite(res["r2_mean"]) and np.isfinite(res["r2_std"])
        )
        assert res["train_steps"] == 2
        assert res["r2_mean"] == pytest.approx(np.mean(res["r2_per_function"]))
        assert len(res["routing_density"]["per_iteration"]) == 4 and 0 <= res["routing_density"]["mean"] <= 1
    assert results["adaptation"]["cls_tokens"]["paper_r2_mean"] == 0.9202
    assert (
        results["timing"]["bare_step"]["median_s"] > 0 and results["timing"]["trainer_step"]["median_s"] > 0
    )
    assert returned["pretraining"]["r2_mean"] == pytest.approx(pre["r2_mean"])
    markdown = (output_dir / "fuzzy_boolean_results.md").read_text()
    assert "0.9983" in markdown and "0.9953" in markdown and "Finetuning CLS tokens" in markdown
    assert f"pre-trained {pre['routing_density']['mean']:.3f}, cls_tokens" in markdown
    assert results["environment"]["mixed_precision"] == "no" and "autocast" not in markdown
    assert "mixed precision: no" in (output_dir / "README.md").read_text()


def test_a_bf16_run_says_so_in_its_results_and_model_card(script: ModuleType, tmp_path: Path) -> None:
    """`--bf16 true --use_cpu true` (bf16 autocast on a CPU) is recorded, so that its R^2 are not read as float32's."""
    threads = torch.get_num_threads()
    try:
        script.main(
            [
                "--protocol",
                "quick",
                "--settings",
                "none",
                "--output_dir",
                str(tmp_path),
                "--disable_tqdm",
                "true",
            ]
            + ["--bf16", "true", "--use_cpu", "true"]
        )
    finally:
        torch.set_num_threads(threads)
    results = json.loads((tmp_path / "fuzzy_boolean_results.json").read_text())
    assert results["environment"]["mixed_precision"] == "bf16"
    assert "bf16 autocast" in (tmp_path / "fuzzy_boolean_results.md").read_text()
    assert "mixed precision: bf16" in (tmp_path / "README.md").read_text()


CARD_SNIPPET_CHECK = """
import sys
sys.modules["ni_hf"] = None  # the card promises that nothing needs the package
import numpy as np, torch
repo, folder = sys.argv[1], sys.argv[2]
from transformers.dynamic_module_utils import get_class_from_dynamic_module
cls = get_class_from_dynamic_module("modeling_neural_interpreter.NeuralInterpreterForSetRegression", repo)
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
    assert "| `adapt-all/` |" in card.text and "--protocol quick" in card.text
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
    for folder in ["pretrain"] + [f"adapt-{s}" for s in SETTINGS]:
        proc = subprocess.run(
            [sys.executable, "-c", CARD_SNIPPET_CHECK, str(output_dir), folder],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        with torch.no_grad():
            expected = NeuralInterpreterForSetRegression.from_pretrained(str(output_dir / folder))(inputs=x)
        np.testing.assert_allclose(
            np.load(output_dir / f"_{folder}.npy"), expected.predictions.numpy(), atol=1e-6
        )


def test_protocol_deviations_name_every_change_to_the_papers_protocol(script: ModuleType) -> None:
    exp, _ = script.parse_args(["--output_dir", "unused"])
    results = {"protocol": {**exp.resolved()}, "arguments": dataclasses.asdict(exp), "model_changes": {}}
    assert script.protocol_deviations(results) == []
    exp, _ = script.parse_args(
        ["--output_dir", "unused", "--batch_size", "256", "--adapt_pretrained_learning_rate", "0.006",
         "--adapt_head_learning_rate", "0.001"]
    )  # fmt: skip
    results = {
        "protocol": exp.resolved(),
        "arguments": dataclasses.asdict(exp),
        "model_changes": {"outer_residual": True},
    }
    assert script.protocol_deviations(results) == [
        "batch_size 256 (paper: 128)",
        "adapt_pretrained_learning_rate 0.006 (paper: not set)",
        "adapt_head_learning_rate 0.001 (paper: not set)",
        "model {'outer_residual': True} (paper: the fuzzy_boolean preset)",
    ]


def test_offline_push_fails_clearly_after_saving_everything(
    script: ModuleType, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    output_dir = tmp_path / "out"
    threads = torch.get_num_threads()
    try:
        with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as exit_info:
            script.main(
                ["--protocol", "quick", "--settings", "cls_tokens", "--output_dir", str(output_dir)]
                + ["--disable_tqdm", "true", "--push_to_hub", "--hub_model_id", "me/fuzzy-boolean"]
            )
    finally:
        torch.set_num_threads(threads)
    assert exit_info.value.code == 1
    failure = [r.getMessage() for r in caplog.records if "--push_to_hub failed" in r.getMessage()]
    assert failure and "HF_HUB_OFFLINE" in failure[0] and "hf upload me/fuzzy-boolean" in failure[0]
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
        script.r2_per_function(predictions, y),
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


def test_function_form_reaches_the_data_the_checkpoint_and_the_results(
    script: ModuleType, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """--function_form minimal trains and scores on minimal-form targets, is saved and recorded, and is checked."""
    common = [
        "--protocol",
        "quick",
        "--settings",
        "cls_tokens",
        "--overhead_steps",
        "0",
        "--disable_tqdm",
        "true",
    ]
    threads = torch.get_num_threads()
    try:
        results = script.main([*common, "--function_form", "minimal", "--output_dir", str(tmp_path)])
        with caplog.at_level("WARNING"):
            adapted = script.main(
                [
                    *common,
                    "--pretrained_model",
                    str(tmp_path / "pretrain"),
                    "--output_dir",
                    str(tmp_path / "c"),
                ]
            )
    finally:
        torch.set_num_threads(threads)
    assert results["arguments"]["function_form"] == results["pretraining"]["function_form"] == "minimal"
    model = NeuralInterpreterForSetRegression.from_pretrained(str(tmp_path / "pretrain")).eval()
    assert model.config.fuzzy_boolean_function_form == "minimal"
    points = results["protocol"]["points_per_function"]
    for form, matches in (("minimal", True), ("canonical", False)):
        x, y = make_fuzzy_boolean_tensors(points_per_function=points, seed=0, form=form)["pretrain"]["test"]
        with torch.no_grad():
            r2 = script.r2_per_function(model(inputs=x).predictions, y)
        assert np.allclose(r2, results["pretraining"]["r2_per_function"], rtol=1e-4, atol=1e-6) == matches
    assert "functions in minimal sum-of-products form" in (tmp_path / script.RESULTS_MD).read_text()
    # Adapting that model to canonical-form functions is allowed, but said.
    assert adapted["pretraining"]["function_form"] == "minimal"
    assert adapted["arguments"]["function_form"] == "canonical"
    assert "trained on minimal-form functions, but this run adapts to canonical-form ones" in caplog.text
    assert "sum-of-products form" not in (tmp_path / "c" / script.RESULTS_MD).read_text()


def test_phase_training_arguments_are_flagged(script: ModuleType) -> None:
    """Per-phase TrainingArguments the protocol overrides are reported, defaults are not."""
    _, args = script.parse_args(["--output_dir", "unused"])
    assert script.ignored_training_arguments(args) == []
    assert args.max_grad_norm == 0.0 and args.remove_unused_columns is False and args.save_strategy == "no"
    assert args.logging_nan_inf_filter is False  # a NaN loss shows in the log; no per-step sync on a GPU
    _, args = script.parse_args(
        ["--output_dir", "unused", "--learning_rate", "1e-3", "--lr_scheduler_type", "cosine"]
    )
    ignored = script.ignored_training_arguments(args)
    assert len(ignored) == 2 and "--pretrain_learning_rate" in ignored[0]


def test_adaptation_schedule_options_reach_the_phase_arguments(script: ModuleType) -> None:
    """The paper's constant schedule by default; a warm-up with "constant" becomes transformers' constant_with_warmup
    (plain "constant" would silently ignore it)."""
    exp, base = script.parse_args(["--output_dir", "unused"])
    assert (exp.adapt_lr_scheduler_type, exp.adapt_warmup, exp.adapt_straight_through) == (
        "constant",
        0.0,
        False,
    )

    def phase(scheduler: str, warmup: float) -> Any:
        return script.phase_arguments(base, Path("unused"), 5e-2, 128, 3.0, -1, scheduler, warmup)

    paper = phase("constant", 0.0)
    assert paper.lr_scheduler_type.value == "constant" and paper.warmup_steps == 0
    warm = phase("constant", 0.05)
    assert warm.lr_scheduler_type.value == "constant_with_warmup" and warm.warmup_steps == 0.05
    cosine = phase("cosine", 300)
    assert cosine.lr_scheduler_type.value == "cosine" and cosine.warmup_steps == 300
    assert script.describe_schedule("cosine", 0.05) == "cosine, warm-up 0.05 of the steps"
    assert script.describe_schedule("constant", 0.0) == "constant"


def test_pretraining_resumed_from_checkpoint_equals_uninterrupted(script: ModuleType, tmp_path: Path) -> None:
    """4 steps, then the same command continued to 6 steps, give the weights of 6 steps in one go.

    This is how the full protocol is run in pieces on a CPU: `--resume_from_checkpoint last` with periodic saves.
    """
    common = ["--protocol", "quick", "--settings", "none", "--overhead_steps", "0", "--disable_tqdm", "true"]
    pieces = ["--save_strategy", "steps", "--save_steps", "2", "--resume_from_checkpoint", "last"]
    threads = torch.get_num_threads()
    try:
        first = script.main([*common, *pieces, "--output_dir", str(tmp_path / "pieces")])
        assert first["pretraining"]["train_steps"] == 4
        assert (tmp_path / "pieces" / "pretrain" / "checkpoint-4").is_dir()
        second = script.main(
            [*common, *pieces, "--pretrain_max_steps", "6", "--output_dir", str(tmp_path / "pieces")]
        )
        straight = script.main(
            [*common, "--pretrain_max_steps", "6", "--output_dir", str(tmp_path / "straight")]
        )
    finally:
        torch.set_num_threads(threads)
    assert second["pretraining"]["train_steps"] == straight["pretraining"]["train_steps"] == 6
    assert second["pretraining"]["resumed_from"] == str(tmp_path / "pieces" / "pretrain" / "checkpoint-4")
    assert second["pretraining"]["step_time"]["steps_timed"] == 2  # continued, not restarted
    resumed, uninterrupted = (
        _state(tmp_path / "pieces" / "pretrain"),
        _state(tmp_path / "straight" / "pretrain"),
    )
    initial = _state(tmp_path / "pieces" / "pretrain" / "checkpoint-4")
    assert any(not torch.equal(initial[name], resumed[name]) for name in resumed)  # it did train on
    for name, value in uninterrupted.items():
        torch.testing.assert_close(resumed[name], value, rtol=1e-5, atol=1e-6, msg=name)
    np.testing.assert_allclose(
        second["pretraining"]["r2_per_function"], straight["pretraining"]["r2_per_function"], rtol=1e-4
    )


def test_resume_point(script: ModuleType, tmp_path: Path) -> None:
    """'last' picks the newest checkpoint or none yet; an explicit missing path is an error naming it."""
    assert script.pretraining_resume_point(None, tmp_path) is None
    assert script.pretraining_resume_point("last", tmp_path / "absent") is None
    for step in (2, 10):
        (tmp_path / f"checkpoint-{step}").mkdir()
    assert script.pretraining_resume_point("last", tmp_path) == str(tmp_path / "checkpoint-10")
    assert script.pretraining_resume_point(str(tmp_path / "checkpoint-2"), tmp_path) == str(
        tmp_path / "checkpoint-2"
    )
    with pytest.raises(FileNotFoundError, match="checkpoint-7"):
        script.pretraining_resume_point(str(tmp_path / "checkpoint-7"), tmp_path)


def test_config_overrides_change_the_pretrained_model_and_are_recorded(
    script: ModuleType, tmp_path: Path
) -> None:
    """--config_overrides reaches the saved config and the results; data-defined keys and misuse are refused."""
    common = ["--protocol", "quick", "--settings", "none", "--overhead_steps", "0", "--disable_tqdm", "true"]
    threads = torch.get_num_threads()
    try:
        results = script.main(
            [
                *common,
                "--config_overrides",
                "outer_residual=true,truncation_tau=1.8",
                "--output_dir",
                str(tmp_path),
            ]
        )
        with pytest.raises(ValueError, match="num_input_variables is set by the script"):
            script.main(
                [*common, "--config_overrides", "num_input_variables=3", "--output_dir", str(tmp_path / "x")]
            )
        with pytest.raises(ValueError, match="drop one of the two"):
            script.main(
                [
                    *common,
                    "--pretrained_model",
                    str(tmp_path / "pretrain"),
                    "--config_overrides",
                    "outer_residual=true",
                    "--output_dir",
                    str(tmp_path / "y"),
                ]
            )
    finally:
        torch.set_num_threads(threads)
    config = NeuralInterpreterConfig.from_pretrained(str(tmp_path / "pretrain"))
    assert (config.outer_residual, config.truncation_tau) == (True, 1.8)
    assert NeuralInterpreterConfig.from_paper("fuzzy_boolean").outer_residual is False
    assert results["arguments"]["config_overrides"] == "outer_residual=true,truncation_tau=1.8"
    assert results["model_changes"] == {"outer_residual": True, "truncation_tau": 1.8}
    table = (tmp_path / script.RESULTS_MD).read_text()
    assert "changed by `outer_residual=true,truncation_tau=1.8` (a deviation from the paper)" in table
    # An adaptation-only run from that checkpoint says so too, though it was given no override.
    threads = torch.get_num_threads()
    try:
        adapted = script.main(
            [
                *common[:2],
                "--settings",
                "cls_tokens",
                *common[4:],
                "--pretrained_model",
                str(tmp_path / "pretrain"),
                "--output_dir",
                str(tmp_path / "adapt"),
            ]
        )
    finally:
        torch.set_num_threads(threads)
    assert adapted["model_changes"] == {"outer_residual": True, "truncation_tau": 1.8}
    assert "changed by `outer_residual=true" in (tmp_path / "adapt" / script.RESULTS_MD).read_text()


def test_kept_pretraining_tokens_stay_in_the_set_and_only_the_new_tasks_are_scored(
    script: ModuleType, quick_run: tuple[dict[str, Any], Path], tmp_path: Path
) -> None:
    """--adapt_keep_pretrain_tokens: 20 + 10 task tokens; the 20 stay frozen but in 'all'; R^2 of the 10 new ones."""
    _, output_dir = quick_run
    pretrained = _state(output_dir / "pretrain")["neural_interpreter.task_tokens"]
    threads = torch.get_num_threads()
    try:
        results = script.main(
            [
                "--protocol", "quick", "--pretrained_model", str(output_dir / "pretrain"),
                "--settings", "cls_tokens,all", "--adapt_keep_pretrain_tokens", "true",
                "--output_dir", str(tmp_path), "--disable_tqdm", "true",
            ]
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    data = make_fuzzy_boolean_tensors(points_per_function=results["protocol"]["points_per_function"], seed=0)
    x, y = data["adapt"]["test"]
    for setting, old_rows_train in (("cls_tokens", False), ("all", True)):
        entry = results["adaptation"][setting]
        assert entry["kept_pretrain_tokens"] == 20 and len(entry["r2_per_function"]) == 10
        model = NeuralInterpreterForSetRegression.from_pretrained(str(tmp_path / f"adapt-{setting}")).eval()
        assert model.config.task_names == [f"f{i}" for i in range(30)]
        tokens = model.neural_interpreter.task_tokens.detach()
        assert torch.equal(tokens[:20], pretrained) != old_rows_train, setting
        with torch.no_grad():
            predictions = model(inputs=x).predictions
        assert predictions.shape == (len(x), 30)
        np.testing.assert_allclose(
            script.r2_per_function(predictions[:, 20:], y), entry["r2_per_function"], rtol=1e-4, atol=1e-6
        )
    assert results["adaptation"]["cls_tokens"]["trainable_parameters"]["task_tokens"] == 10 * tokens.shape[1]


def test_one_task_per_sample_trains_each_sample_on_one_drawn_function(
    script: ModuleType, tmp_path: Path
) -> None:
    """--one_task_per_sample: the training loss is the MSE of one drawn function per sample; evaluation scores all."""
    config = NeuralInterpreterConfig.from_paper(
        "fuzzy_boolean", hidden_size=16, code_dim=16, attention_head_size=8, type_inference_hidden_size=16,
        task_names=["a", "b", "c"],
    )  # fmt: skip
    model = NeuralInterpreterForSetRegression(config)
    x, y = torch.rand(8, 5), torch.rand(8, 3)
    dataset = script.TensorBatchDataset(x, y)
    args = script.TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    trainer, _ = script.make_trainer(model, args, dataset, dataset, 1e-3, one_task_per_sample=True)
    assert isinstance(trainer, script.SetRegressionTrainer)
    batch = {"inputs": x, "labels": y}
    model.train()
    torch.manual_seed(3)
    loss = trainer.compute_loss(model, batch)
    torch.manual_seed(3)
    tasks = torch.randint(3, (8,))
    with torch.no_grad():
        predictions = model(inputs=x).predictions
    expected = ((predictions[torch.arange(8), tasks] - y[torch.arange(8), tasks]) ** 2).mean()
    torch.testing.assert_close(loss.detach(), expected)
    assert not torch.allclose(loss.detach(), ((predictions - y) ** 2).mean())
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(trainer.compute_loss(model, batch), ((predictions - y) ** 2).mean())


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
    dataset = script.TensorBatchDataset(x, y)
    args = script.TrainingArguments(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, per_device_train_batch_size=8, max_steps=1,
        lr_scheduler_type="constant", max_grad_norm=0.0, save_strategy="no", remove_unused_columns=False,
    )  # fmt: skip
    trainer, _ = script.make_trainer(model, args, dataset, dataset, 5e-2, param_groups=groups)
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
    # Its groups carry no weight decay, so asking for both is refused rather than silently half-done.
    with pytest.raises(ValueError, match="--weight_decay 0.01 would be ignored"):
        script.main(
            ["--protocol", "quick", "--adapt_pretrained_learning_rate", "6e-3", "--weight_decay", "0.01",
             "--output_dir", str(tmp_path / "refused")]
        )  # fmt: skip


def test_adapt_head_learning_rate_gives_the_regression_head_its_own_rate(
    script: ModuleType, tmp_path: Path
) -> None:
    """--adapt_head_learning_rate: in the 'all' setting the regression head gets a third RAdam group; the other
    pre-trained parameters keep the tokens' rate unless --adapt_pretrained_learning_rate is given too."""
    config = NeuralInterpreterConfig.from_paper(
        "fuzzy_boolean", hidden_size=16, code_dim=16, attention_head_size=8, type_inference_hidden_size=16,
        task_names=["a", "b", "c"],
    )  # fmt: skip
    model = NeuralInterpreterForSetRegression(config)
    script.set_adaptation_trainable(model, "all")
    head = {id(p) for p in model.regressor.parameters()}
    groups = script.adaptation_param_groups(model, 5e-2, None, 6e-3)
    assert [group["lr"] for group in groups] == [5e-2, 5e-2, 6e-3]
    assert {id(p) for p in groups[2]["params"]} == head
    assert not head & {id(p) for p in groups[1]["params"]}
    grouped = [id(p) for group in groups for p in group["params"]]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters() if p.requires_grad)
    assert [g["lr"] for g in script.adaptation_param_groups(model, 5e-2, 1e-2, 6e-3)] == [5e-2, 1e-2, 6e-3]
    assert script.describe_other_rates({"adapt_head_learning_rate": 6e-3}) == " (regression head 0.006)"
    assert script.describe_other_rates({"adapt_pretrained_learning_rate": None}) == ""
    # Settings that leave the head frozen have no head group.
    script.set_adaptation_trainable(model, "type_inference")
    assert [g["lr"] for g in script.adaptation_param_groups(model, 5e-2, None, 6e-3)] == [5e-2, 5e-2]

    script.set_adaptation_trainable(model, "all")
    _one_radam_step(
        script, model, script.adaptation_param_groups(model, 5e-2, None, 6e-3), tmp_path,
        rate_of=lambda name: 6e-3 if name.startswith("regressor.") else 5e-2,
    )  # fmt: skip
    with pytest.raises(ValueError, match="--adapt_head_learning_rate builds its own RAdam parameter groups"):
        script.main(
            ["--protocol", "quick", "--adapt_head_learning_rate", "6e-3", "--weight_decay", "0.01",
             "--output_dir", str(tmp_path / "refused")]
        )  # fmt: skip


# --- several processes ----------------------------------------------------------------------------------


def _torchrun(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "HF_HOME": str(tmp_path / "hf_home")}
    command = torchrun_command(SCRIPT, "--use_cpu", "true", "--disable_tqdm", "true", *args)
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_two_processes_keep_the_protocol_global_batch_and_write_results_once(tmp_path: Path) -> None:
    """torchrun, 2 CPU ranks: each takes half of the batch (same steps per epoch), R^2 counts each point once."""
    output_dir = tmp_path / "ddp"
    args = [
        "--protocol",
        "quick",
        "--pretrain_max_steps",
        "0",
        "--pretrain_epochs",
        "1",
        "--output_dir",
        str(output_dir),
    ]
    proc = _torchrun(args, tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "Process 0 of world size 2" in log and "Process 1 of world size 2" in log
    assert log.count("Results written to") == 1  # only the main process tells the story
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
        _load_script().r2_per_function(predictions, y),
        results["pretraining"]["r2_per_function"],
        rtol=1e-4,
        atol=1e-6,
    )
    for setting in SETTINGS:
        assert results["adaptation"][setting]["train_steps"] == 2
        assert (output_dir / f"adapt-{setting}" / "model.safetensors").is_file()


def test_a_global_batch_that_the_processes_cannot_share_is_refused(tmp_path: Path) -> None:
    proc = _torchrun(
        ["--protocol", "quick", "--batch_size", "31", "--output_dir", str(tmp_path / "odd")], tmp_path
    )
    assert proc.returncode != 0
    assert "--batch_size 31 is the global batch" in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--adapt_lr_scheduler_type", "cosin"], "is not a schedule"),
        (["--adapt_frozen", "("], "is not a regular expression"),
        (["--optim", "sgd"], "both phases use RAdam"),
        (["--quick", "--protocol", "full"], "conflicts with --protocol full"),
        (["--pretrained_model", "/tmp/no/such/checkpoint"], "no such directory"),
        (["--model_card_template", "/tmp/no/such/template.md"], "template.md does not exist"),
    ],
)
def test_bad_options_fail_before_pretraining(
    script: ModuleType, tmp_path: Path, caplog: pytest.LogCaptureFixture, extra: list[str], match: str
) -> None:
    """Options that used to fail (or be ignored) only after the whole pre-training are refused up front."""
    args = ["--output_dir", str(tmp_path), "--disable_tqdm", "true", *extra]
    if "--quick" not in extra:
        args = ["--protocol", "quick", *args]
    with caplog.at_level(logging.INFO), pytest.raises(ValueError, match=match):
        script.main(args)
    assert "Pre-training" not in caplog.text and not (tmp_path / "pretrain").exists()


def test_bare_step_runs_on_the_models_device_and_compiles_like_the_trainer(script: ModuleType) -> None:
    """The bare step moves the batch to the model's device (meta stands in for a GPU) and uses the compile backend."""
    config = NeuralInterpreterConfig.from_paper(
        "fuzzy_boolean", hidden_size=16, code_dim=16, attention_head_size=8, type_inference_hidden_size=16,
        task_names=["a", "b", "c"],
    )  # fmt: skip
    batch = {"inputs": torch.rand(4, 5), "labels": torch.rand(4, 3)}
    timing = script.bare_step_time(
        NeuralInterpreterForSetRegression(config).to("meta"), batch, torch.optim.RAdam, {"lr": 1e-3}, 2
    )
    assert timing["steps_timed"] == 2 and timing["median_s"] > 0
    compiled_graphs = []

    def recording_backend(graph_module: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        compiled_graphs.append(graph_module)
        return graph_module.forward

    timing = script.bare_step_time(
        NeuralInterpreterForSetRegression(config), batch, torch.optim.RAdam, {"lr": 1e-3}, 2,
        {"backend": recording_backend},
    )  # fmt: skip
    assert timing["steps_timed"] == 2 and compiled_graphs


def test_set_norm_monitor_measures_the_set_at_logging_steps_without_changing_the_training(
    script: ModuleType, tmp_path: Path
) -> None:
    """--monitor_set_norm: at every logging step the RMS token norm after each function iteration and the share of it
    that varies over the probe inputs (0 for identical inputs); the trained weights equal a run without it."""
    config = NeuralInterpreterConfig.from_paper(
        "fuzzy_boolean", hidden_size=16, code_dim=16, attention_head_size=8, type_inference_hidden_size=16,
        task_names=["a", "b", "c"],
    )  # fmt: skip
    x, y = torch.rand(32, 5), torch.rand(32, 3)
    dataset = script.TensorBatchDataset(x, y)
    args = script.TrainingArguments(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, per_device_train_batch_size=8, max_steps=4,
        logging_steps=2, lr_scheduler_type="constant", max_grad_norm=0.0, save_strategy="no",
        remove_unused_columns=False, seed=0,
    )  # fmt: skip
    weights = []
    for monitored in (False, True):
        torch.manual_seed(0)
        model = NeuralInterpreterForSetRegression(config)
        monitor = script.SetNormMonitor(x[:16]) if monitored else None
        trainer, _ = script.make_trainer(model, args, dataset, dataset, 1e-2, monitor=monitor)
        trainer.train()
        weights.append({name: p.detach().clone() for name, p in model.named_parameters()})
    for name, value in weights[0].items():
        torch.testing.assert_close(weights[1][name], value, rtol=0, atol=0, msg=name)

    assert [entry["step"] for entry in monitor.history] == [2, 4]
    last = monitor.history[-1]
    assert len(last["norm"]) == len(last["input_share"]) == sum(config.iterations_per_script) == 4
    with torch.no_grad():
        hidden = model(inputs=x[:16], output_hidden_states=True).hidden_states[1:]
    expected = [h.pow(2).sum(-1).mean().sqrt().item() for h in hidden]
    assert last["norm"] == pytest.approx(expected, rel=1e-4)
    assert all(0 < share < 1 for share in last["input_share"])
    assert model.training  # the measurement restores the training mode
    same_input = script.SetNormMonitor(x[:1].expand(16, 5)).measure(model)
    assert same_input["input_share"] == pytest.approx([0.0] * len(expected), abs=1e-6)


def test_a_cpu_run_logs_the_hint_about_mkl_on_amd_cpus(
    script: ModuleType, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(script, "slow_mkl_hint", lambda: "MKL HINT")
    args = ["--protocol", "quick", "--output_dir", str(tmp_path), "--settings", "nope"]
    with caplog.at_level(logging.WARNING), pytest.raises(ValueError):
        script.main(args)
    assert "MKL HINT" in caplog.text and not (tmp_path / "pretrain").exists()
