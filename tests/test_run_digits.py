"""examples/run_digits.py end to end: outputs, model card, reloading, DDP on CPU, resuming, offline push.

The runs use a tiny model and a tiny two-task data set written to a temporary folder in the local Parquet
layout (scikit-learn digits as "mnist" and a coloured, larger copy as "mnist_m"), so that they take seconds.
One run happens in this process (no import cost); the two-process DDP run and the remote-code check are
subprocesses. The real-data test needs ``<repo>/../shared/data`` and is marked slow.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import _scripts
import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "run_digits.py"
SHARED_DATA = REPO.parent / "shared" / "data"
TINY_CONFIG = (
    "hidden_size=16,code_dim=8,num_function_iterations=1,num_functions=2,num_attention_heads=2,"
    "attention_head_size=4,type_inference_hidden_size=8,type_dim=4"
)
TRAIN_PER_TASK = 40
EVAL_PER_TASK = 19  # 2 tasks x 19 = 38 test samples: not a multiple of 2 processes x batch 4
HUB_REPO = "me/ni-digits-test"


def load_script():
    """Import examples/run_digits.py as a module (it is not part of the package)."""
    return _scripts.load_script(SCRIPT, "run_digits")


run_digits = load_script()


@contextmanager
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, and a shared machine makes two threads very slow."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def isolated_run(home: Path) -> Iterator[list[str]]:
    """Run the script in this process: one thread, evaluate's caches in ``home``, log messages collected."""
    import evaluate.config

    handler = Collect()
    root = logging.getLogger()
    saved = {name: mod for name, mod in sys.modules.items() if name.split(".")[0] == "evaluate_modules"}
    with one_thread(), pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HOME", str(home))
        patch.setattr(evaluate.config, "HF_MODULES_CACHE", home / "modules")
        patch.setattr(evaluate.config, "HF_EVALUATE_CACHE", home / "evaluate")
        patch.setattr(evaluate.config, "HF_METRICS_CACHE", home / "metrics")
        # evaluate imports the copied metric script as package "evaluate_modules" found on sys.path.
        patch.setattr(sys, "path", [str(home / "modules"), *sys.path])
        for name in saved:
            del sys.modules[name]
        root.addHandler(handler)
        try:
            yield handler.messages
        finally:
            root.removeHandler(handler)
            for name in [name for name in sys.modules if name.split(".")[0] == "evaluate_modules"]:
                del sys.modules[name]
            sys.modules.update(saved)


class Collect(logging.Handler):
    """Keep the messages logged while a run happens in this process."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """Two small tasks in the Hub Parquet layout: sklearn digits as 8x8 gray 'mnist' and 16x16 RGB 'mnist_m'."""
    from datasets import ClassLabel, Dataset, Features, Image
    from sklearn.datasets import load_digits

    root = tmp_path_factory.mktemp("digits_data")
    bunch = load_digits()
    gray = np.round(bunch.images * (255 / 16)).astype(np.uint8)
    features = Features({"image": Image(), "label": ClassLabel(names=[str(i) for i in range(10)])})
    rng = np.random.default_rng(0)
    for folder, offset in (("mnist", 0), ("mnist_m", 400)):
        for split, start, size in (("train", offset, TRAIN_PER_TASK), ("test", offset + 200, EVAL_PER_TASK)):
            images = gray[start : start + size]
            if folder == "mnist_m":  # 16x16 RGB on a coloured background: another "domain"
                background = rng.integers(0, 80, size=(len(images), 1, 1, 3))
                rgb = np.clip(images[..., None].astype(np.int16) + background, 0, 255).astype(np.uint8)
                images = rgb.repeat(2, axis=1).repeat(2, axis=2)
            ds = Dataset.from_dict(
                {"image": list(images), "label": bunch.target[start : start + size].tolist()},
                features=features,
            )
            (root / folder).mkdir(exist_ok=True)
            ds.to_parquet(root / folder / f"{split}.parquet")
    return root


def tiny_args(output_dir: Path, data_dir: Path, *extra: str) -> list[str]:
    """Arguments of a few-second run on the two tiny tasks."""
    return [
        "--output_dir",
        str(output_dir),
        "--data_dir",
        str(data_dir),
        "--config_overrides",
        TINY_CONFIG,
        "--per_device_train_batch_size",
        "8",
        "--per_device_eval_batch_size",
        "8",
        "--max_steps",
        "4",
        "--eval_strategy",
        "no",
        "--save_strategy",
        "steps",
        "--save_steps",
        "2",
        "--logging_steps",
        "1",
        "--seed",
        "0",
        "--use_cpu",
        "true",
        "--max_eval_samples",
        str(EVAL_PER_TASK),
        *extra,
    ]


@pytest.fixture(scope="module")
def single_run(data_dir, tmp_path_factory):
    """One process, RandAugment on, --push_to_hub while offline: must save everything, then exit 1."""
    import huggingface_hub.constants

    base = tmp_path_factory.mktemp("single")
    output_dir = base / "out"
    with isolated_run(base / "hf_home") as messages, pytest.MonkeyPatch.context() as patch:
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        with pytest.raises(SystemExit) as exit_info:
            run_digits.main(tiny_args(output_dir, data_dir, "--push_to_hub", "--hub_model_id", HUB_REPO))
    return output_dir, exit_info.value.code, list(messages)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def logged_losses(output_dir: Path) -> dict[int, float]:
    """Step -> training loss from the Trainer's log history."""
    history = read_json(output_dir / "trainer_state.json")["log_history"]
    return {entry["step"]: entry["loss"] for entry in history if "loss" in entry}


# ------------------------------------------------------------------------------------------- unit level


def test_config_overrides_are_parsed_checked_and_applied():
    parsed = run_digits.parse_config_overrides(
        "num_functions=6, truncation_tau=1.2,num_function_iterations=[2,3],initializer_range=null,straight_through=true"
    )
    assert parsed == {
        "num_functions": 6,
        "truncation_tau": 1.2,
        "num_function_iterations": [2, 3],
        "initializer_range": None,
        "straight_through": True,
    }
    with pytest.raises(ValueError, match="unknown setting 'num_funtions'"):
        run_digits.parse_config_overrides("num_funtions=6")
    with pytest.raises(ValueError, match="set by the script"):
        run_digits.parse_config_overrides("task_names=['a']")
    model_args = run_digits.ModelArguments(config_overrides="num_functions=6,hidden_size=64", hidden_size=32)
    config = run_digits.build_config(model_args, ["mnist", "svhn"])
    assert (config.num_functions, config.hidden_size, config.num_function_iterations) == (6, 32, 8)
    assert config.task_names == ["mnist", "svhn"] and config.num_labels == 10


def test_paper_recipe_is_the_default():
    _, data_args, args = run_digits.parse_arguments(["--output_dir", "unused"])
    assert args.radam and args.learning_rate == 8e-4 and args.warmup_steps == 0
    assert args.lr_scheduler_type == "cosine_with_min_lr" and args.lr_scheduler_kwargs == {"min_lr": 1e-6}
    assert args.per_device_train_batch_size == 128 and args.num_train_epochs == 100
    assert args.do_train and args.do_eval and not args.remove_unused_columns
    assert args.label_names == ["labels", "task_ids"]
    assert not args.logging_nan_inf_filter  # a NaN loss shows in the log; no per-step sync on a GPU
    assert data_args.randaugment
    assert run_digits.resolve_data_arguments(data_args) == ("hub", ["mnist", "mnistm", "svhn"])
    _, data_args, _ = run_digits.parse_arguments(["--output_dir", "x", "--dataset_source", "sklearn"])
    assert run_digits.resolve_data_arguments(data_args) == ("sklearn", ["sklearn_digits"])
    _, data_args, _ = run_digits.parse_arguments(["--output_dir", "x", "--randaugment", "false"])
    assert not data_args.randaugment


def test_local_source_finds_the_paper_datasets_present(data_dir):
    _, data_args, _ = run_digits.parse_arguments(["--output_dir", "x", "--data_dir", str(data_dir)])
    assert run_digits.resolve_data_arguments(data_args) == ("local", ["mnist", "mnistm"])


def test_batch_randaugment_keeps_shape_and_scale_and_is_seeded():
    from ni_hf.augmentation import BatchRandAugment
    from ni_hf.image_processing_neural_interpreter import patchify

    images = torch.rand(6, 3, 32, 32) * 2 - 1  # normalized with mean = std = 0.5
    augment = BatchRandAugment(num_ops=2, magnitude=5, probability=1.0, image_size=32, patch_size=4)
    torch.manual_seed(0)
    out = augment(images)
    assert out.shape == images.shape and out.min() >= -1 and out.max() <= 1
    assert not torch.equal(out, images)
    torch.manual_seed(0)
    patches = augment(patchify(images, 4))
    torch.testing.assert_close(patches, patchify(out, 4))
    with pytest.raises(ValueError, match="magnitude"):
        BatchRandAugment(magnitude=10.5)


def test_the_transform_augments_when_given_randaugment_and_only_then():
    """--randaugment_where workers: the dataset transform (run in the workers) applies RandAugment to the batch."""
    from PIL import Image as PILImage

    from ni_hf import NeuralInterpreterImageProcessor
    from ni_hf.augmentation import BatchRandAugment

    processor = NeuralInterpreterImageProcessor()
    rng = np.random.default_rng(0)
    batch = {
        "image": [PILImage.fromarray(rng.integers(0, 255, (28, 28), dtype=np.uint8)) for _ in range(6)],
        "label": [1, 2, 3, 4, 5, 6],
        "task_id": [0, 1, 0, 1, 0, 1],
    }
    augment = BatchRandAugment(num_ops=2, magnitude=9, probability=1.0)
    plain = run_digits.DigitsTransform(processor)(batch)
    torch.manual_seed(0)
    augmented = run_digits.DigitsTransform(processor, augmentation=augment)(batch)
    torch.manual_seed(0)
    expected = augment(torch.from_numpy(np.stack(plain["pixel_values"])))
    assert augmented["labels"] == plain["labels"] and augmented["task_ids"] == plain["task_ids"]
    assert all(
        image.dtype == np.float32 and image.shape == (3, 32, 32) for image in augmented["pixel_values"]
    )
    np.testing.assert_array_equal(np.stack(augmented["pixel_values"]), expected.numpy())
    assert not np.array_equal(np.stack(augmented["pixel_values"]), np.stack(plain["pixel_values"]))


@pytest.mark.parametrize(
    ("where", "workers", "in_workers"),
    [("auto", 0, False), ("auto", 2, True), ("device", 2, False), ("workers", 1, True)],
)
def test_randaugment_runs_in_the_workers_when_there_are_any_or_when_asked(where, workers, in_workers):
    assert run_digits.randaugment_in_workers(where, workers) is in_workers


def test_randaugment_in_workers_without_workers_is_refused(no_data_loading, tmp_path):
    with pytest.raises(ValueError, match=r"--randaugment_where workers needs.*--dataloader_num_workers"):
        run_digits.main(quick_args(tmp_path, "--dataset_source", "sklearn", "--randaugment_where", "workers"))


def test_training_with_randaugment_in_a_worker_process_leaves_the_training_step_alone(
    data_dir, tmp_path, monkeypatch
):
    """One DataLoader worker (auto): the batches come augmented from it, and the trainer gets no augmentation."""
    trainers = []

    class Recording(run_digits.DigitsTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            trainers.append(self)

    monkeypatch.setattr(run_digits, "DigitsTrainer", Recording)
    with isolated_run(tmp_path / "hf_home") as messages:
        run_digits.main(
            tiny_args(tmp_path / "out", data_dir, "--dataloader_num_workers", "1", "--save_strategy", "no")
        )
    assert len(trainers) == 1 and trainers[0].augmentation is None
    assert any("augmented in the 1 DataLoader workers (CPU)" in message for message in messages), messages
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_dataloader_workers_started_by_forkserver_unpickle_the_transform(data_dir, tmp_path):
    """Workers that do not fork get the dataset's transform pickled; as a closure it could not be
    ("Can't pickle local object 'make_transform.<locals>.transform'"), so training with workers failed there."""
    args = tiny_args(tmp_path / "out", data_dir, "--dataloader_num_workers", "1", "--save_strategy", "no")
    _scripts.run_with_forkserver(SCRIPT, args, tmp_path)
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_an_evaluation_at_the_last_step_is_the_final_one_and_is_not_run_again(
    data_dir, tmp_path, monkeypatch
):
    """--eval_strategy steps with an evaluation at the last step: main() reports it instead of evaluating again."""
    evaluations = []

    class Counting(run_digits.DigitsTrainer):
        def evaluate(self, *args, **kwargs):
            evaluations.append(self.state.global_step)
            return super().evaluate(*args, **kwargs)

    monkeypatch.setattr(run_digits, "DigitsTrainer", Counting)
    output_dir = tmp_path / "out"
    args = tiny_args(output_dir, data_dir, "--save_strategy", "no", "--randaugment", "false")
    args[args.index("--eval_strategy") + 1] = "steps"
    with isolated_run(tmp_path / "hf_home") as messages:
        results = run_digits.main([*args, "--eval_steps", "2"])
    assert evaluations == [2, 4]  # not a third time after training
    assert any("is the final one: not run again" in message for message in messages), messages
    last = [
        entry
        for entry in json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
        if "eval_accuracy" in entry
    ][-1]
    assert last["step"] == 4 and results["eval_accuracy"] == last["eval_accuracy"]
    saved = json.loads((output_dir / "eval_results.json").read_text())
    assert saved["eval_accuracy"] == last["eval_accuracy"] and saved["eval_samples"] > 0


@pytest.mark.parametrize("architecture", ["neural_interpreter", "vit"])
def test_the_problem_type_is_set_before_the_first_forward(architecture, data_dir, tmp_path, monkeypatch):
    """The script sets it, so no (compiled) forward writes it into the config, which would recompile at step 2."""
    seen = []

    class Recording(run_digits.DigitsTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self.model.config.problem_type)

    monkeypatch.setattr(run_digits, "DigitsTrainer", Recording)
    args = tiny_args(tmp_path / "out", data_dir, "--save_strategy", "no", "--randaugment", "false")
    args[args.index("--max_steps") + 1] = "1"
    if architecture == "vit":
        args[args.index("--config_overrides") : args.index("--config_overrides") + 2] = [
            "--architecture",
            "vit",
            "--config_overrides",
            "hidden_size=16,num_hidden_layers=1,num_attention_heads=2,intermediate_size=16",
        ]
    with isolated_run(tmp_path / "hf_home"):
        run_digits.main(args)
    assert seen == ["single_label_classification"]


def test_a_compiled_run_compiles_for_static_batches(data_dir, tmp_path, monkeypatch):
    """An epoch's last, smaller batch must not turn the compiled graph dynamic for every later step."""
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "")  # so that teardown restores what was there before
    monkeypatch.delenv("ACCELERATE_DYNAMO_USE_DYNAMIC")
    seen = []

    class Recording(run_digits.DigitsTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self.accelerator.state.dynamo_plugin.dynamic)

    monkeypatch.setattr(run_digits, "DigitsTrainer", Recording)
    args = tiny_args(tmp_path / "out", data_dir, "--save_strategy", "no", "--randaugment", "false")
    args[args.index("--max_steps") + 1] = "1"
    with isolated_run(tmp_path / "hf_home"):
        run_digits.main([*args, "--torch_compile", "true", "--torch_compile_backend", "eager"])
    assert seen == [False]


def test_eager_formulation_reaches_every_line_of_code_and_trains(data_dir, tmp_path, monkeypatch):
    """--eager_formulation and --token_alignment switch the model the Trainer trains, and say so in the log."""
    from ni_hf.modeling_neural_interpreter import LineOfCode

    seen = []

    class Recording(run_digits.DigitsTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            locs = [m for m in self.model.modules() if isinstance(m, LineOfCode)]
            seen.extend(
                (m.bilinear_logits, m.columns_attention, m.fused_attention, m.token_alignment) for m in locs
            )

    monkeypatch.setattr(run_digits, "DigitsTrainer", Recording)
    args = tiny_args(tmp_path / "out", data_dir, "--save_strategy", "no", "--randaugment", "false")
    args[args.index("--max_steps") + 1] = "2"
    extra = [
        "--attn_implementation",
        "eager",
        "--eager_formulation",
        "bilinear-columns",
        "--token_alignment",
        "8",
    ]
    with isolated_run(tmp_path / "hf_home") as messages:
        metrics = run_digits.main([*args, *extra])
    assert seen and set(seen) == {(True, True, False, 8)}
    assert any("bilinear-columns formulation, tokens padded to a multiple of 8" in m for m in messages)
    assert math.isfinite(metrics["train_loss"])


# --------------------------------------------------------------------------------------- one process


def test_output_dir_holds_what_a_hub_repo_needs(single_run):
    output_dir, _, _ = single_run
    files = {p.name for p in output_dir.iterdir()}
    expected = {
        "model.safetensors",
        "config.json",
        "configuration_neural_interpreter.py",
        "modeling_neural_interpreter.py",
        "image_processing_neural_interpreter.py",
        "preprocessor_config.json",
        "all_results.json",
        "README.md",
    }
    assert expected <= files, expected - files
    config = read_json(output_dir / "config.json")
    assert config["auto_map"]["AutoModelForImageClassification"].endswith(
        "NeuralInterpreterForImageClassification"
    )
    assert config["task_names"] == ["mnist", "mnistm"] and config["hidden_size"] == 16
    results = read_json(output_dir / "all_results.json")
    assert results["world_size"] == 1 and results["global_step"] == 4
    assert results["eval_num_samples"] == 2 * EVAL_PER_TASK
    assert results["eval_num_samples_mnist"] == results["eval_num_samples_mnistm"] == EVAL_PER_TASK
    assert {"eval_accuracy", "eval_accuracy_mnist", "eval_accuracy_mnistm"} <= set(results)
    assert {"checkpoint-2", "checkpoint-4"} <= files


def test_offline_push_fails_clearly_after_saving(single_run):
    output_dir, code, messages = single_run
    assert code == 1
    failure = [m for m in messages if "--push_to_hub failed" in m]
    assert failure and "HF_HUB_OFFLINE" in failure[0] and str(output_dir) in failure[0]
    assert (output_dir / "model.safetensors").is_file() and (output_dir / "README.md").is_file()
    assert any("Dataset 'mnistm'" in m and f"{EVAL_PER_TASK} test samples" in m for m in messages)
    assert any("parameters" in m and "trainable" in m for m in messages)
    assert any(m.startswith("Test accuracy mnist:") for m in messages)


def test_model_card_parses_and_carries_the_measured_accuracies(single_run):
    from huggingface_hub import ModelCard

    output_dir, _, _ = single_run
    card = ModelCard.load(output_dir / "README.md")
    results = read_json(output_dir / "all_results.json")
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "image-classification"
    assert card.data.model_name == HUB_REPO.split("/")[-1]
    by_dataset = {r.dataset_type: r for r in card.data.eval_results}
    assert set(by_dataset) == {"mnist", "mnistm"}
    for name, result in by_dataset.items():
        assert result.metric_type == "accuracy" and result.dataset_split == "test"
        assert math.isclose(result.metric_value, results[f"eval_accuracy_{name}"], abs_tol=1e-6)
    assert "model-index" in (output_dir / "README.md").read_text()
    text = card.text
    assert "run_digits.py" in text and TINY_CONFIG in text  # the training command
    assert "## Limitations" in text and "Hardware:" in text and "## Training data" in text


def evaluate_accuracy(model, processor, data_dir: Path) -> dict[str, float]:
    """Accuracy of a model on the tiny test sets, with the saved processor."""
    import io

    import pyarrow.parquet as pq
    from PIL import Image

    accuracies = {}
    for task_id, (task, folder) in enumerate((("mnist", "mnist"), ("mnistm", "mnist_m"))):
        table = pq.read_table(data_dir / folder / "test.parquet").to_pydict()
        images = [Image.open(io.BytesIO(item["bytes"])) for item in table["image"]]
        batch = processor(images=images, return_tensors="pt")
        with torch.no_grad():
            logits = model(**batch, task_ids=torch.full((len(images),), task_id)).logits
        accuracies[task] = float((logits.argmax(-1).numpy() == np.asarray(table["label"])).mean())
    return accuracies


def test_saved_folder_reloads_with_auto_classes_and_reproduces_accuracy(single_run, data_dir):
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    import ni_hf  # noqa: F401  (registers the Auto classes)

    output_dir, _, _ = single_run
    model = AutoModelForImageClassification.from_pretrained(output_dir).eval()
    processor = AutoImageProcessor.from_pretrained(output_dir)
    assert type(model).__module__.startswith("ni_hf")
    results = read_json(output_dir / "all_results.json")
    accuracies = evaluate_accuracy(model, processor, data_dir)
    for task, accuracy in accuracies.items():
        assert math.isclose(accuracy, results[f"eval_accuracy_{task}"], abs_tol=1e-9)


REMOTE = textwrap.dedent(
    """
    import io, json, sys
    sys.modules["ni_hf"] = None  # the package must not be importable here
    import numpy as np, pyarrow.parquet as pq, torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    out, data = sys.argv[1], sys.argv[2]
    model = AutoModelForImageClassification.from_pretrained(out, trust_remote_code=True).eval()
    processor = AutoImageProcessor.from_pretrained(out, trust_remote_code=True)
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    accuracies = {}
    for task_id, (task, folder) in enumerate((("mnist", "mnist"), ("mnistm", "mnist_m"))):
        table = pq.read_table(f"{data}/{folder}/test.parquet").to_pydict()
        images = [Image.open(io.BytesIO(item["bytes"])) for item in table["image"]]
        batch = processor(images=images, return_tensors="pt")
        with torch.no_grad():
            logits = model(**batch, task_ids=torch.full((len(images),), task_id)).logits
        accuracies[task] = float((logits.argmax(-1).numpy() == np.asarray(table["label"])).mean())
    print("ACCURACIES", json.dumps(accuracies))
    """
)


def test_saved_folder_reloads_with_remote_code_without_the_package(single_run, data_dir, tmp_path):
    output_dir, _, _ = single_run
    env = {
        **os.environ,
        "PYTHONPATH": "",
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", REMOTE, str(output_dir), str(data_dir)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    accuracies = json.loads(proc.stdout.split("ACCURACIES", 1)[1])
    results = read_json(output_dir / "all_results.json")
    for task, accuracy in accuracies.items():
        assert math.isclose(accuracy, results[f"eval_accuracy_{task}"], abs_tol=1e-9)


def test_resume_continues_from_the_saved_step(single_run, data_dir, tmp_path):
    output_dir, _, _ = single_run
    resumed = tmp_path / "resumed"
    shutil.copytree(output_dir / "checkpoint-2", resumed / "checkpoint-2")
    with isolated_run(tmp_path / "hf_home") as messages:
        run_digits.main(tiny_args(resumed, data_dir, "--resume_from_checkpoint", "last"))
    state = read_json(resumed / "trainer_state.json")
    assert state["global_step"] == 4
    original, again = logged_losses(output_dir), logged_losses(resumed)
    assert set(again) == {1, 2, 3, 4}  # steps 1-2 restored from the checkpoint, 3-4 trained now
    # Model, optimizer, scheduler, data order and RNG (hence RandAugment) states are all restored.
    for step in (3, 4):
        assert math.isclose(again[step], original[step], rel_tol=1e-3), (step, again, original)
    assert any("Resuming from checkpoint (last in output_dir)" in m for m in messages)


# ---------------------------------------------------------------------------------------- two processes


def test_two_process_ddp_on_cpu(single_run, data_dir, tmp_path):
    """gloo DDP with two ranks: same global batch as the single run, loss not scaled, eval counted once."""
    output_dir = tmp_path / "ddp"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "HF_HOME": str(tmp_path / "hf_home"),
    }
    args = tiny_args(output_dir, data_dir)
    args[args.index("--per_device_train_batch_size") + 1] = "4"  # 2 x 4 = the single run's batch of 8
    args[args.index("--per_device_eval_batch_size") + 1] = "4"  # 38 test samples: not a multiple of 8
    command = _scripts.torchrun_command(SCRIPT, *args, "--ddp_find_unused_parameters", "false")
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "Process 0 of world size 2" in log and "Process 1 of world size 2" in log
    results = read_json(output_dir / "all_results.json")
    assert results["world_size"] == 2 and results["eval_world_size"] == 2
    # Every test sample counted exactly once, although 38 is not a multiple of 2 processes x 4.
    assert results["eval_num_samples"] == results["eval_samples"] == 2 * EVAL_PER_TASK
    assert results["eval_num_samples_mnist"] == results["eval_num_samples_mnistm"] == EVAL_PER_TASK
    # The logged loss is the mean over both ranks, not their sum: compare with the one-process run
    # (same seed, same global batch of 8; RandAugment draws differ, hence the tolerance).
    single_loss = logged_losses(single_run[0])[1]
    ddp_loss = logged_losses(output_dir)[1]
    assert abs(ddp_loss - single_loss) < 0.15 * single_loss, (ddp_loss, single_loss)
    assert (output_dir / "model.safetensors").is_file() and (output_dir / "README.md").is_file()


# ------------------------------------------------------------------------------------------- real data


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"{SHARED_DATA} (local MNIST / MNIST-M) not present")
def test_short_training_on_real_mnist_and_mnist_m(tmp_path):
    """About a minute on 3,000 MNIST + 3,000 MNIST-M images: clearly better than chance (10%) on both."""
    output_dir = tmp_path / "real"
    args = [
        "--output_dir",
        str(output_dir),
        "--data_dir",
        str(SHARED_DATA),
        "--task_names",
        "mnist",
        "mnistm",
        "--config_overrides",
        "hidden_size=64,code_dim=64,attention_head_size=32,type_inference_hidden_size=64,patch_size=8,"
        "num_function_iterations=4,num_functions=4",
        "--max_train_samples",
        "3000",
        "--max_eval_samples",
        "500",
        "--num_train_epochs",
        "4",
        "--per_device_train_batch_size",
        "64",
        "--learning_rate",
        "3e-3",
        "--adam_beta2",
        "0.99",
        "--randaugment",
        "false",
        "--eval_strategy",
        "no",
        "--save_strategy",
        "no",
        "--use_cpu",
        "true",
    ]
    with isolated_run(tmp_path / "hf_home"):
        results = run_digits.main(args)
    assert results["eval_num_samples_mnist"] == results["eval_num_samples_mnistm"] == 500
    assert results["eval_accuracy_mnist"] > 0.5, results
    assert results["eval_accuracy_mnistm"] > 0.2, results


# ------------------------------------------------------------------------------ argument checks, evaluation


@pytest.fixture
def no_data_loading(monkeypatch):
    """Make loading data an error: the checks below must fail before it."""

    def refuse(*args, **kwargs):
        raise AssertionError("the datasets were loaded before the arguments were checked")

    monkeypatch.setattr(run_digits, "load_digits_tasks", refuse)


def quick_args(output_dir: Path, *extra: str) -> list[str]:
    return ["--output_dir", str(output_dir), "--use_cpu", "true", "--report_to", "none", *extra]


def test_optim_with_radam_is_refused(no_data_loading, tmp_path):
    with pytest.raises(ValueError, match=r"--optim sgd with --radam true.*--radam false"):
        run_digits.main(quick_args(tmp_path, "--dataset_source", "sklearn", "--optim", "sgd"))
    model_args, data_args, args = run_digits.parse_arguments(
        quick_args(tmp_path, "--optim", "sgd", "--radam", "false")
    )
    run_digits.check_arguments(model_args, data_args, args)  # --radam false: --optim is what trains


def test_a_missing_model_card_template_is_refused_before_training(no_data_loading, tmp_path):
    with pytest.raises(ValueError, match=r"--model_card_template /no/such/card.md does not exist"):
        run_digits.main(
            quick_args(tmp_path, "--dataset_source", "sklearn", "--model_card_template", "/no/such/card.md")
        )


@pytest.mark.parametrize("source", ["sklearn", "hub"])
def test_data_dir_with_another_source_is_refused(no_data_loading, tmp_path, source):
    with pytest.raises(
        ValueError, match=f"--data_dir only applies to --dataset_source local.*got --dataset_source {source}"
    ):
        run_digits.main(quick_args(tmp_path, "--dataset_source", source, "--data_dir", "/nonexistent"))


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (["--config_overrides", "num_funtions=6"], "unknown setting 'num_funtions'"),
        (["--architecture", "vit", "--config_overrides", "hidden_size=64"], "divisible"),
        (["--architecture", "vit", "--eager_formulation", "bilinear"], "a vit model has no Eq. 6"),
        (["--token_alignment", "0"], "--token_alignment must be a positive number"),
    ],
)
def test_config_is_checked_before_the_data_are_loaded(no_data_loading, tmp_path, overrides, error):
    with pytest.raises(ValueError, match=error):
        run_digits.main(quick_args(tmp_path, "--dataset_source", "sklearn", *overrides))


def test_recipe_note_lists_every_deviation_from_the_paper():
    def note(*argv: str, tasks: list[str] | None = None, train_metrics: dict | None = None) -> str:
        model_args, data_args, args = run_digits.parse_arguments(["--output_dir", "unused", *argv])
        source, names = run_digits.resolve_data_arguments(data_args)
        names = tasks or names
        return run_digits._recipe_note(
            source=source,
            data_dir=data_args.data_dir,
            task_names=names,
            config=run_digits.build_config(model_args, names),
            data_args=data_args,
            train_metrics={"epoch": 100.0} if train_metrics is None else train_metrics,
            args=args,
        )

    assert note() == "This run followed that recipe."
    deviating = note(
        "--config_overrides", "hidden_size=64", "--learning_rate", "3e-3", tasks=["mnist", "mnistm"]
    )
    assert deviating.startswith("This run deviates from that recipe: ")
    assert "datasets mnist, mnistm (recipe mnist, mnistm, svhn)" in deviating
    assert "hidden_size=64 (recipe 192)" in deviating and "learning rate 0.003 (recipe 0.0008)" in deviating
    assert "followed" not in deviating
    others = note(
        "--architecture", "vit", "--radam", "false", "--optim", "adamw_torch", "--per_device_train_batch_size",
        "32", "--randaugment", "false", "--max_train_samples", "100", train_metrics={},
    )  # fmt: skip
    for expected in (
        "architecture vit (recipe neural_interpreter)",
        "optimizer adamw_torch (recipe RAdam)",
        "global batch size 32 (recipe 128)",
        "no augmentation",
        "at most 100 training images per dataset",
        "no training in this run (recipe: 100 epochs)",
    ):
        assert expected in others, (expected, others)
    assert "epochs 50 (recipe 100)" in note(train_metrics={"epoch": 50.0})


def test_model_card_says_how_the_run_deviates_from_the_recipe(single_run):
    output_dir, _, _ = single_run
    card = (output_dir / "README.md").read_text()
    assert "This run deviates from that recipe: datasets mnist, mnistm (recipe mnist, mnistm, svhn)" in card
    assert "hidden_size=16 (recipe 192)" in card and "global batch size 8 (recipe 128)" in card
    assert "followed that recipe" not in card
    # Only the model's own settings count, not what every saved config carries.
    assert "auto_map" not in card and "use_cache" not in card and "transformers_version" not in card


def test_do_train_false_without_a_checkpoint_is_refused_and_keeps_the_trained_model(
    single_run, data_dir, tmp_path
):
    trained = tmp_path / "trained"
    shutil.copytree(single_run[0], trained, ignore=shutil.ignore_patterns("checkpoint-*"))
    before = {name: (trained / name).read_bytes() for name in ("model.safetensors", "README.md")}
    with isolated_run(tmp_path / "hf_home"), pytest.raises(ValueError, match="needs --model_name_or_path"):
        run_digits.main(tiny_args(trained, data_dir, "--do_train", "false"))
    assert {name: (trained / name).read_bytes() for name in before} == before


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (["--do_train", "true"], "needs --do_train false"),
        (
            ["--do_train", "false", "--config_overrides", "hidden_size=8"],
            "--config_overrides: settings of a new",
        ),
        (["--do_train", "false", "--hidden_size", "8"], "--hidden_size: settings of a new model"),
        (["--do_train", "false", "--push_to_hub"], "nothing to upload"),
        (["--do_train", "false", "--resume_from_checkpoint", "last"], "pass it as --model_name_or_path"),
    ],
)
def test_model_name_or_path_refuses_what_it_cannot_do(single_run, no_data_loading, tmp_path, extra, error):
    args = quick_args(tmp_path / "eval", "--model_name_or_path", str(single_run[0]), *extra)
    with pytest.raises(ValueError, match=error):
        run_digits.main(args)


def test_do_train_false_does_not_write_into_a_saved_model(single_run, no_data_loading):
    output_dir = single_run[0]
    args = quick_args(output_dir, "--model_name_or_path", str(output_dir), "--do_train", "false")
    with pytest.raises(ValueError, match="holds a saved model"):
        run_digits.main(args)


def test_do_train_false_evaluates_the_saved_model_and_saves_nothing(single_run, data_dir, tmp_path):
    trained = single_run[0]
    results = read_json(trained / "all_results.json")
    weights = (trained / "model.safetensors").read_bytes()
    base = ["--model_name_or_path", str(trained), "--do_train", "false", "--data_dir", str(data_dir)]
    base += ["--per_device_eval_batch_size", "8", "--max_eval_samples", str(EVAL_PER_TASK), "--seed", "0"]
    output_dir = tmp_path / "eval"
    with isolated_run(tmp_path / "hf_home") as messages:
        evaluated = run_digits.main(quick_args(output_dir, *base))
    for task in ("mnist", "mnistm"):  # the trained model, not a fresh one: the same accuracies
        assert evaluated[f"eval_accuracy_{task}"] == pytest.approx(results[f"eval_accuracy_{task}"], abs=1e-9)
    assert {p.name for p in output_dir.iterdir()} == {"eval_results.json", "all_results.json"}
    assert (trained / "model.safetensors").read_bytes() == weights
    assert any("nothing was trained, so no model, checkpoint or model card was saved" in m for m in messages)
    # One of the saved model's tasks: its own head (task id 1 of the model, 0 of the data).
    with isolated_run(tmp_path / "hf_home"):
        one = run_digits.main(quick_args(tmp_path / "eval_mnistm", *base, "--task_names", "mnistm"))
    assert one["eval_num_samples"] == one["eval_num_samples_mnistm"] == EVAL_PER_TASK
    assert one["eval_accuracy_mnistm"] == pytest.approx(results["eval_accuracy_mnistm"], abs=1e-9)
    with pytest.raises(ValueError, match="has no head for them"):
        run_digits.main(quick_args(tmp_path / "eval_svhn", *base, "--task_names", "svhn"))


def test_model_card_leaves_out_a_numpy_nan_accuracy_like_a_python_one():
    import numpy as np

    from ni_hf.model_card import TaskCardInfo, _percent, digits_eval_results

    tasks = [
        TaskCardInfo("mnist", "ylecun/mnist", "MNIST", "hub", accuracy=np.float32("nan")),
        TaskCardInfo("svhn", "svhn", "SVHN", "hub", accuracy=np.float32(0.5)),
    ]
    assert [result.dataset_name for result in digits_eval_results(tasks)] == ["SVHN"]
    assert _percent(np.float32("nan")) == _percent(float("nan"))


def test_a_float32_cpu_run_logs_the_hint_about_native_bf16(no_data_loading, tmp_path, monkeypatch, caplog):
    """On a CPU that multiplies bf16 natively (ni_hf.cpu_bf16), a float32 run names the flags, before any work."""
    asked = []
    monkeypatch.setattr(run_digits, "native_bf16_hint", lambda bf16: asked.append(bf16) or "BF16 HINT")
    with caplog.at_level(logging.INFO), pytest.raises(AssertionError, match="datasets were loaded"):
        run_digits.main(quick_args(tmp_path, "--dataset_source", "sklearn"))
    assert "BF16 HINT" in caplog.text and asked == [False]


def test_a_cpu_run_logs_the_hint_about_mkl_on_amd_cpus(no_data_loading, tmp_path, monkeypatch, caplog):
    """Where MKL takes its generic path on an AMD CPU (ni_hf.mkl_dispatch), the run says what to do, before any work."""
    monkeypatch.setattr(run_digits, "slow_mkl_hint", lambda: "MKL HINT")
    with caplog.at_level(logging.WARNING), pytest.raises(AssertionError, match="datasets were loaded"):
        run_digits.main(quick_args(tmp_path, "--dataset_source", "sklearn"))
    assert "MKL HINT" in caplog.text
