"""Tests of the multi-task ViT baseline (paper, Figure 4a): model, checkpoints, and the digits example scripts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _scripts import load_script
from PIL import Image
from transformers import AutoConfig, AutoModel, AutoModelForImageClassification, pipeline

import ni_hf
from ni_hf import MultiTaskViTConfig, MultiTaskViTForImageClassification, MultiTaskViTModel
from ni_hf.models.neural_interpreter.image_processing_neural_interpreter import patchify

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


class MultiTaskViTModelTester:
    """Tiny configs and `create_and_check_*` methods, as in transformers' test suite."""

    def __init__(self, batch_size: int = 4, **overrides) -> None:
        self.batch_size = batch_size
        self.settings = dict(
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=24,
            image_size=8,
            patch_size=2,
            num_channels=3,
            task_names=["a", "b", "c"],
            num_labels=5,
        )
        self.settings.update(overrides)

    def get_config(self, **overrides) -> MultiTaskViTConfig:
        return MultiTaskViTConfig(**{**self.settings, **overrides})

    def prepare_inputs(self, config: MultiTaskViTConfig) -> dict[str, torch.Tensor]:
        b = self.batch_size
        return {
            "pixel_values": torch.randn(b, config.num_channels, config.image_size, config.image_size),
            "task_ids": torch.arange(b) % config.num_tasks,
            "labels": torch.arange(b) % config.num_labels,
        }

    def create_and_check_model(self, config: MultiTaskViTConfig) -> None:
        model = MultiTaskViTModel(config).eval()
        out = model(pixel_values=self.prepare_inputs(config)["pixel_values"], output_hidden_states=True)
        n = config.num_tasks + config.num_patches
        assert out.last_hidden_state.shape == (self.batch_size, n, config.hidden_size)
        assert out.pooler_output.shape == (self.batch_size, config.num_tasks, config.hidden_size)
        assert len(out.hidden_states) == config.num_hidden_layers + 1
        torch.testing.assert_close(out.pooler_output, out.last_hidden_state[:, : config.num_tasks])

    def create_and_check_for_image_classification(self, config: MultiTaskViTConfig) -> None:
        model = MultiTaskViTForImageClassification(config).eval()
        inputs = self.prepare_inputs(config)
        out = model(**inputs)
        assert out.logits.shape == (self.batch_size, config.num_labels)
        torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, inputs["labels"]))


@pytest.fixture
def tester() -> MultiTaskViTModelTester:
    torch.manual_seed(0)
    return MultiTaskViTModelTester()


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and a shared machine makes two threads very slow."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- model --------------------------------------------------------------------------------------------


def test_model_output_shapes(tester):
    tester.create_and_check_model(tester.get_config())


def test_image_classification_output_shapes_and_loss(tester):
    tester.create_and_check_for_image_classification(tester.get_config())


def test_config_is_a_vit_config_with_tasks():
    config = MultiTaskViTConfig(task_names=["x", "y"], default_task=1)
    assert isinstance(config, ni_hf.MultiTaskViTConfig) and config.model_type == "ni_multitask_vit"
    assert config.num_tasks == 2 and MultiTaskViTConfig().task_names == ["default"]
    for bad in (dict(task_names=["x", "x"]), dict(task_names=["x"], default_task=1), dict(patch_size=5)):
        with pytest.raises(ValueError, match="task_names|default_task|patch_size"):
            MultiTaskViTConfig(image_size=32, **bad)


def test_images_and_patches_give_the_same_output(tester):
    """The image processor's patches (row, col, channel) meet the convolution's kernel in the right order."""
    config = tester.get_config()
    model = MultiTaskViTModel(config).eval()
    images = torch.randn(2, config.num_channels, config.image_size, config.image_size)
    from_images = model(pixel_values=images).last_hidden_state
    from_patches = model(pixel_values=patchify(images, config.patch_size)).last_hidden_state
    torch.testing.assert_close(from_images, from_patches)
    with pytest.raises(ValueError, match="patches"):
        model(pixel_values=torch.randn(2, config.num_patches, config.patch_dim + 1))


def test_each_sample_reads_its_own_task_token_through_its_own_head(tester):
    """Logits of sample i = head[t_i](output of task token t_i); other tasks' heads and ids do not matter.

    Every sample carries all task tokens (as the reference's MultiViT and the Neural Interpreter), which attend to
    each other, so another task's token does change a sample's logits; what the task id picks is token and head.
    """
    config = tester.get_config()
    model = MultiTaskViTForImageClassification(config).eval()
    x = torch.randn(3, config.num_channels, config.image_size, config.image_size)
    task_ids = torch.tensor([2, 0, 1])
    with torch.no_grad():
        logits = model(pixel_values=x, task_ids=task_ids).logits
        pooled = model.vit(pixel_values=x).pooler_output
        expected = torch.stack([model.classifier[t](pooled[i, t]) for i, t in enumerate(task_ids.tolist())])
        torch.testing.assert_close(logits, expected)
        # another sample's task id changes nothing for sample 0
        torch.testing.assert_close(
            model(pixel_values=x, task_ids=torch.tensor([2, 2, 2])).logits[0], logits[0]
        )
        # a change of task 1's head reaches only the sample of task 1
        model.classifier[1].linear.bias.add_(1.0)
        changed = model(pixel_values=x, task_ids=task_ids).logits
    torch.testing.assert_close(changed[[0, 1]], logits[[0, 1]])
    torch.testing.assert_close(changed[2], logits[2] + 1.0)


def test_default_task_is_used_without_task_ids(tester):
    config = tester.get_config(default_task=1)
    model = MultiTaskViTForImageClassification(config).eval()
    x = tester.prepare_inputs(config)["pixel_values"]
    with torch.no_grad():
        torch.testing.assert_close(
            model(pixel_values=x).logits,
            model(pixel_values=x, task_ids=torch.ones(4, dtype=torch.long)).logits,
        )
        torch.testing.assert_close(
            model(pixel_values=x, task_ids=torch.tensor(2)).logits,
            model(pixel_values=x, task_ids=torch.full((4,), 2)).logits,
        )


def test_bad_task_ids_and_labels_give_clear_errors(tester):
    config = tester.get_config()
    model = MultiTaskViTForImageClassification(config).eval()
    x = tester.prepare_inputs(config)["pixel_values"]
    with pytest.raises(
        ValueError, match=r"`task_ids` must lie in 0..2 \(tasks \['a', 'b', 'c'\]\), got \[0, 1, 3, 0\]"
    ):
        model(pixel_values=x, task_ids=torch.tensor([0, 1, 3, 0]))
    with pytest.raises(ValueError, match=r"`task_ids` must lie in 0..2"):
        model(pixel_values=x, task_ids=torch.tensor([0, -1, 0, 0]))
    with pytest.raises(
        ValueError,
        match=r"`task_ids` must be one task index, or a 1-D tensor with one per sample \(4\), got shape \(2,\)",
    ):
        model(pixel_values=x, task_ids=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"`labels` must have one entry per sample \(4\), got shape \(3,\)"):
        model(pixel_values=x, task_ids=torch.zeros(4, dtype=torch.long), labels=torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="Images must have shape"):
        model(pixel_values=torch.randn(4, 3, 16, 16))


def test_reset_and_add_tasks_give_fresh_tokens_and_heads_and_keep_the_rest(tester, tmp_path):
    config = tester.get_config()
    model = MultiTaskViTForImageClassification(config).eval()
    layers_before = {k: v.clone() for k, v in model.state_dict().items() if ".layers." in k}
    model.reset_tasks(["kmnist"], num_labels=4)
    assert model.vit.task_tokens.shape == (1, config.hidden_size) and len(model.classifier) == 1
    assert model.config.task_names == ["kmnist"] and model.config.default_task == 0
    assert model.classifier[0].linear.out_features == 4
    for k, v in layers_before.items():
        torch.testing.assert_close(model.state_dict()[k], v)
    first = model.vit.task_tokens.detach().clone()
    assert model.add_tasks(["fashion", "emnist"]) == [1, 2]
    assert model.vit.task_tokens.shape == (3, config.hidden_size) and len(model.classifier) == 3
    torch.testing.assert_close(model.vit.task_tokens[:1].detach(), first)
    with pytest.raises(ValueError, match="new, distinct names"):
        model.vit.add_task_tokens(["kmnist"])
    x = torch.randn(2, config.num_channels, config.image_size, config.image_size)
    assert model(pixel_values=x, task_ids=torch.tensor([2, 0])).logits.shape == (2, 4)
    model.save_pretrained(tmp_path)
    again = MultiTaskViTForImageClassification.from_pretrained(tmp_path).eval()
    assert again.config.task_names == ["kmnist", "fashion", "emnist"] and again.config.num_labels == 4
    with torch.no_grad():
        torch.testing.assert_close(
            again(pixel_values=x, task_ids=torch.tensor([2, 1])).logits,
            model(pixel_values=x, task_ids=torch.tensor([2, 1])).logits,
        )


def test_every_parameter_gets_a_gradient(tester):
    config = tester.get_config()
    model = MultiTaskViTForImageClassification(config)
    inputs = tester.prepare_inputs(config)
    inputs["task_ids"] = torch.tensor([0, 1, 2, 0])
    model(**inputs).loss.backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing


def test_multitask_training_forward_with_task_ids_and_labels_has_no_graph_breaks(tester):
    """The forward run_digits.py compiles for the baseline: one graph, the task-id range check included."""
    import torch._dynamo as dynamo

    model = MultiTaskViTForImageClassification(tester.get_config()).train()
    explanation = dynamo.explain(model)(**tester.prepare_inputs(model.config))
    assert explanation.graph_break_count == 0, [b.reason for b in explanation.break_reasons]
    assert explanation.graph_count == 1


def test_paper_digits_preset_parameter_count():
    """8 layers of 223,104 (bias-free q/k/v), 4x4 patches of 32x32 RGB, 3 CLS tokens and heads: 1.81M (paper: 1.80M)."""
    config = MultiTaskViTConfig.from_paper("digits")
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (8, 192, 3)
    assert config.intermediate_size == 192 and config.task_names == ["mnist", "mnistm", "svhn"]
    model = MultiTaskViTForImageClassification(config)
    assert model.vit.layers[0].attention.head_dim == 64
    layer = 3 * 192 * 192 + (192 * 192 + 192) + 2 * 192 * 192 + 192 + 192 + 2 * 2 * 192
    embeddings = (48 * 192 + 192) + 64 * 192 + 3 * 192
    heads = 3 * (2 * 192 + 192 * 10 + 10)
    assert sum(p.numel() for p in model.parameters()) == 8 * layer + embeddings + heads == 1_809_438
    with pytest.raises(ValueError, match="Unknown preset"):
        MultiTaskViTConfig.from_paper("fuzzy_boolean")


# --- checkpoints and Auto classes ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, torch.Tensor]:
    """A saved tiny classifier with the image processor, and the logits computed before saving."""
    path = tmp_path_factory.mktemp("vit_ckpt")
    torch.manual_seed(0)
    config = MultiTaskViTModelTester().get_config(
        image_size=32, patch_size=8, task_names=["mnist", "mnistm"], num_labels=10
    )
    model = MultiTaskViTForImageClassification(config).eval()
    model.save_pretrained(path)
    ni_hf.NeuralInterpreterImageProcessor(patch_size=8).save_pretrained(path)
    x = torch.randn(2, 3, 32, 32)
    np.save(path / "inputs.npy", x.numpy())
    with torch.no_grad():
        logits = model(pixel_values=x, task_ids=torch.tensor([0, 1])).logits
    np.save(path / "expected_logits.npy", logits.numpy())
    return path, logits


def test_checkpoint_holds_code_and_auto_map(checkpoint):
    path, _ = checkpoint
    saved = json.loads((path / "config.json").read_text())
    assert saved["model_type"] == "ni_multitask_vit" and saved["task_names"] == ["mnist", "mnistm"]
    assert saved["auto_map"] == {
        "AutoConfig": "configuration_multitask_vit.MultiTaskViTConfig",
        "AutoModel": "modeling_multitask_vit.MultiTaskViTModel",
        "AutoModelForImageClassification": "modeling_multitask_vit.MultiTaskViTForImageClassification",
    }
    copied = ("configuration_checks.py", "modeling_checks.py", "task_heads.py")
    for name in ("modeling_multitask_vit.py", "configuration_multitask_vit.py", *copied):
        assert (path / name).is_file(), name
    assert (path / "model.safetensors").is_file()


def test_auto_classes_and_pipeline_after_import(checkpoint):
    path, logits = checkpoint
    assert type(AutoConfig.from_pretrained(path)) is MultiTaskViTConfig
    model = AutoModelForImageClassification.from_pretrained(path).eval()
    assert type(model) is MultiTaskViTForImageClassification
    x = torch.from_numpy(np.load(path / "inputs.npy"))
    with torch.no_grad():
        torch.testing.assert_close(model(pixel_values=x, task_ids=torch.tensor([0, 1])).logits, logits)
    assert type(AutoModel.from_pretrained(path)) is MultiTaskViTModel
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (28, 28), dtype=np.uint8))
    result = pipeline("image-classification", model=str(path), top_k=3)(image)
    assert len(result) == 3 and {"label", "score"} <= set(result[0])


# --- examples/run_digits.py --architecture vit and examples/run_digits_adaptation.py ------------------

TINY_VIT = "hidden_size=16,num_hidden_layers=1,num_attention_heads=2,intermediate_size=16,patch_size=8"


@pytest.fixture(scope="module")
def run_digits():
    return load_script(EXAMPLES / "run_digits.py", "run_digits")


@pytest.fixture(scope="module")
def run_digits_adaptation():
    return load_script(EXAMPLES / "run_digits_adaptation.py", "run_digits_adaptation")


def test_run_digits_builds_a_vit_config_from_overrides(run_digits):
    model_args = run_digits.ModelArguments(
        architecture="vit", config_overrides="num_hidden_layers=2,intermediate_size=32,hidden_size=48"
    )
    config = run_digits.build_config(model_args, ["mnist", "svhn"])
    assert isinstance(config, MultiTaskViTConfig)
    assert (config.num_hidden_layers, config.intermediate_size, config.hidden_size) == (2, 32, 48)
    assert config.task_names == ["mnist", "svhn"] and config.num_labels == 10 and config.patch_size == 4
    with pytest.raises(ValueError, match="MultiTaskViTConfig accepts"):
        run_digits.build_config(
            run_digits.ModelArguments(architecture="vit", config_overrides="num_functions=2"), ["a"]
        )
    default = run_digits.build_config(run_digits.ModelArguments(), ["mnist"])
    assert isinstance(default, ni_hf.NeuralInterpreterConfig)


@pytest.fixture(scope="module")
def vit_run(run_digits, tmp_path_factory) -> tuple[Path, dict]:
    """run_digits.py --architecture vit on scikit-learn's digits: a tiny ViT, a few steps."""
    output_dir = tmp_path_factory.mktemp("vit_run")
    home = tmp_path_factory.mktemp("hf_home")
    args = ["--architecture", "vit", "--dataset_source", "sklearn", "--output_dir", str(output_dir)]
    args += ["--config_overrides", TINY_VIT, "--max_train_samples", "64", "--max_eval_samples", "40"]
    args += ["--per_device_train_batch_size", "16", "--max_steps", "3", "--save_strategy", "no"]
    args += ["--eval_strategy", "no", "--report_to", "none", "--disable_tqdm", "true", "--use_cpu", "true"]
    import evaluate.config

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HOME", str(home))
        patch.setattr(evaluate.config, "HF_MODULES_CACHE", home / "modules")
        patch.setattr(evaluate.config, "HF_EVALUATE_CACHE", home / "evaluate")
        patch.setattr(evaluate.config, "HF_METRICS_CACHE", home / "metrics")
        patch.setattr(sys, "path", [str(home / "modules"), *sys.path])
        try:
            results = run_digits.main(args)
        finally:
            torch.set_num_threads(before)
    return output_dir, results


def test_run_digits_trains_and_saves_a_multitask_vit(vit_run):
    output_dir, results = vit_run
    assert results["architecture"] == "vit" and results["global_step"] == 3
    assert 0.0 <= results["eval_accuracy"] <= 1.0 and results["eval_num_samples"] == 40
    saved = json.loads((output_dir / "config.json").read_text())
    assert saved["architectures"] == ["MultiTaskViTForImageClassification"]
    assert saved["task_names"] == ["sklearn_digits"] and saved["num_hidden_layers"] == 1
    assert json.loads((output_dir / "all_results.json").read_text())["architecture"] == "vit"
    card = (output_dir / "README.md").read_text()
    assert "multi-task Vision Transformer" in card and "`MultiTaskViTForImageClassification`" in card
    assert "A **Neural Interpreter**" not in card and "| `num_hidden_layers` | 1 |" in card
    assert "--architecture vit" in card
    model = AutoModelForImageClassification.from_pretrained(output_dir)
    assert type(model) is MultiTaskViTForImageClassification


def adaptation_args(checkpoint: Path, output_dir: Path, *extra: str) -> list[str]:
    args = [
        "--model_name_or_path",
        str(checkpoint),
        "--new_task",
        "sklearn_digits",
        "--dataset_source",
        "sklearn",
    ]
    args += [
        "--num_train_samples",
        "32",
        "--adaptation_seeds",
        "0",
        "--adapt_epochs",
        "1",
        "--batch_size",
        "16",
    ]
    args += ["--max_eval_samples", "40", "--adapt_learning_rate", "0.03", "--output_dir", str(output_dir)]
    return [*args, "--report_to", "none", "--use_cpu", "true", *extra]


def test_fast_adaptation_of_the_vit_checkpoint(vit_run, run_digits_adaptation, tmp_path, caplog):
    checkpoint, _ = vit_run
    output_dir = tmp_path / "adapt"
    with caplog.at_level("INFO"):
        results = run_digits_adaptation.main(adaptation_args(checkpoint, output_dir))
    assert "running fast_adaptation only" in caplog.text and "need a Neural Interpreter" in caplog.text
    saved = json.loads((output_dir / "adaptation_results.json").read_text())
    assert saved["architecture"] == "vit" and saved["studies"] == ["fast_adaptation"]
    assert set(saved) & set(run_digits_adaptation.FUNCTION_STUDIES) == set()
    entry = saved["fast_adaptation"]["32"]
    assert entry["runs"] == 1 and entry["details"][0]["train_steps"] == 2  # 32 samples, batch 16, one epoch
    assert 0.0 <= entry["mean"] <= 1.0 and results["fast_adaptation"] == saved["fast_adaptation"]
    # all parameters are trained: the whole model, a fresh CLS token and head included
    model = MultiTaskViTForImageClassification.from_pretrained(checkpoint)
    assert entry["details"][0]["trainable_parameters"] == sum(p.numel() for p in model.parameters())
    markdown = (output_dir / "adaptation_results.md").read_text()
    assert "multi-task ViT" in markdown and "| 32 | " in markdown and "functions" not in markdown


def test_prepared_vit_has_a_fresh_token_and_head_and_the_pretrained_layers(vit_run, run_digits_adaptation):
    checkpoint, _ = vit_run
    pretrained = MultiTaskViTForImageClassification.from_pretrained(checkpoint)
    model = run_digits_adaptation.prepare_model(str(checkpoint), "mnist", 10, seed=0)
    assert type(model) is MultiTaskViTForImageClassification and model.config.task_names == ["mnist"]
    assert not torch.equal(model.vit.task_tokens, pretrained.vit.task_tokens)
    for name, value in pretrained.state_dict().items():
        if ".layers." in name or "patch_embeddings" in name:
            torch.testing.assert_close(model.state_dict()[name], value)
    with pytest.raises(ValueError, match="no functions"):
        run_digits_adaptation.prepare_model(str(checkpoint), "mnist", 10, seed=0, new_functions=1)


@pytest.mark.parametrize(
    "studies", ["reinitialized_functions", "fast_adaptation,dropped_functions", "capacity_extension"]
)
def test_function_studies_refuse_a_vit_checkpoint(vit_run, run_digits_adaptation, tmp_path, capsys, studies):
    checkpoint, _ = vit_run
    with pytest.raises(SystemExit) as exit_info:
        run_digits_adaptation.main(adaptation_args(checkpoint, tmp_path / "x", "--studies", studies))
    assert exit_info.value.code == 2
    assert "is a multi-task ViT, and these studies act on a Neural Interpreter" in capsys.readouterr().err
    assert not (tmp_path / "x" / "adaptation_results.json").exists()


# --- robustness of the public API -------------------------------------------------------------------------


def test_refused_reset_tasks_leaves_the_model_unchanged(tester):
    config = tester.get_config()
    model = MultiTaskViTForImageClassification(config).eval()
    inputs = tester.prepare_inputs(config)
    before = model(**inputs).logits
    for names, num_labels in (([], 3), (["x", "x"], None), ("mnist", None), (["x"], 0)):
        with pytest.raises(ValueError, match="task_names|num_labels"):
            model.reset_tasks(names, num_labels=num_labels)
    assert model.config.task_names == ["a", "b", "c"] and model.config.num_labels == 5
    torch.testing.assert_close(model(**inputs).logits, before)


def test_one_label_is_regression_as_in_transformers(tester):
    model = MultiTaskViTForImageClassification(tester.get_config(num_labels=1))
    x = tester.prepare_inputs(tester.get_config())["pixel_values"]
    targets = torch.rand(x.shape[0])
    out = model(pixel_values=x, labels=targets)
    assert model.config.problem_type == "regression"
    torch.testing.assert_close(out.loss, F.mse_loss(out.logits.squeeze(-1), targets))


def test_empty_batch_and_float_task_ids_give_clear_errors(tester):
    config = tester.get_config()
    model = MultiTaskViTForImageClassification(config)
    x = tester.prepare_inputs(config)["pixel_values"]
    with pytest.raises(ValueError, match="empty batch"):
        model(pixel_values=x[:0])
    with pytest.raises(ValueError, match="integer task indices"):
        model(pixel_values=x[:2], task_ids=torch.tensor([0.9, 1.7]))


def test_non_finite_inputs_and_overflow_give_clear_errors_not_nan(tester):
    config = tester.get_config()
    x = tester.prepare_inputs(config)["pixel_values"]
    for model in (MultiTaskViTModel(config).eval(), MultiTaskViTForImageClassification(config).eval()):
        with pytest.raises(ValueError, match=r"`pixel_values` contains NaN or infinite values"):
            model(pixel_values=torch.where(x > 1, float("nan"), x))
        with pytest.raises(
            FloatingPointError, match=r"NaN or infinite values in `(logits|last_hidden_state)`"
        ):
            model(pixel_values=x * 1e25)
    model = MultiTaskViTForImageClassification(tester.get_config(num_labels=1))
    with pytest.raises(ValueError, match=r"`labels` contains NaN"):
        model(pixel_values=x, labels=torch.full((x.shape[0],), float("nan")))


def test_a_meta_device_model_runs_a_shape_only_forward(tester):
    config = tester.get_config()
    with torch.device("meta"):
        model = MultiTaskViTForImageClassification(config)
        logits = model(**tester.prepare_inputs(config)).logits
    assert logits.is_meta and logits.shape[-1] == config.num_labels
