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
from _digits_runs import EVAL_PER_TASK, REPO, SCRIPT, TINY_CONFIG, tiny_args, write_tiny_digits

from ni_hf.training.checkpoints import LOCK_NAME
from ni_hf.training.presets import DIGITS_PRESETS, parse_config_overrides

SHARED_DATA = REPO.parent / "shared" / "data"
HUB_REPO = "me/ni-digits-test"


def load_script():
    """Import examples/run_digits.py as a module (it is not part of the package)."""
    return _scripts.load_script(SCRIPT, "run_digits")


run_digits = load_script()


one_thread = _scripts.one_thread


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
    return write_tiny_digits(tmp_path_factory.mktemp("digits_data"))


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

README_QUICKSTART = [
    "--dataset_source", "sklearn", "--config_overrides",
    "hidden_size=64,code_dim=64,attention_head_size=32,type_inference_hidden_size=64,patch_size=8,"
    "num_function_iterations=3,num_functions=4",
    "--num_train_epochs", "30", "--per_device_train_batch_size", "64", "--learning_rate", "3e-3",
    "--adam_beta2", "0.99", "--randaugment_num_ops", "1", "--randaugment_magnitude", "5",
    "--randaugment_operations", "rotate", "shear_x", "shear_y", "translate_x", "translate_y",
    "--save_strategy", "no", "--eval_strategy", "no",
    "--dataloader_num_workers", "1", "--dataloader_persistent_workers", "true", "--attn_implementation", "fast",
]  # fmt: skip


def test_config_overrides_are_parsed_checked_and_applied():
    from ni_hf import NeuralInterpreterConfig

    parsed = parse_config_overrides(
        "num_functions=6, truncation_tau=1.2,num_function_iterations=[2,3],initializer_range=null,straight_through=true",
        NeuralInterpreterConfig,
    )
    assert parsed == {
        "num_functions": 6,
        "truncation_tau": 1.2,
        "num_function_iterations": [2, 3],
        "initializer_range": None,
        "straight_through": True,
    }
    with pytest.raises(ValueError, match="unknown setting 'num_funtions'"):
        parse_config_overrides("num_funtions=6", NeuralInterpreterConfig)
    with pytest.raises(ValueError, match="set by the script"):
        parse_config_overrides("task_names=['a']", NeuralInterpreterConfig, reserved=["task_names"])
    with pytest.raises(ValueError, match="without a value"):
        parse_config_overrides("num_functions=6,typo", NeuralInterpreterConfig)
    model_args = run_digits.ModelArguments(config_overrides="num_functions=6,hidden_size=64")
    config = run_digits.build_config(model_args, ["mnist", "svhn"])
    assert (config.num_functions, config.hidden_size, config.num_function_iterations) == (6, 64, 8)
    assert config.task_names == ["mnist", "svhn"] and config.num_labels == 10


def test_the_paper_preset_is_the_default_and_the_papers_recipe():
    model_args, data_args, args = run_digits.parse_arguments(["--output_dir", "unused"])
    assert model_args.preset == "paper" and model_args.paper_config == "digits"
    assert args.radam and args.learning_rate == 8e-4 and args.warmup_steps == 0
    assert args.lr_scheduler_type == "cosine_with_min_lr" and args.lr_scheduler_kwargs == {"min_lr": 1e-6}
    assert args.per_device_train_batch_size == 128 and args.num_train_epochs == 100
    assert args.do_train and args.do_eval and not args.remove_unused_columns
    assert args.label_names == ["labels", "task_ids"]
    assert data_args.randaugment and (data_args.randaugment_num_ops, data_args.randaugment_magnitude) == (
        2,
        9,
    )
    assert run_digits.resolve_tasks(data_args) == ("hub", ["mnist", "mnistm", "svhn"])
    explicit = run_digits.parse_arguments(["--output_dir", "unused", "--preset", "paper"])
    assert explicit == (model_args, data_args, args)


def test_the_quickstart_preset_is_the_readme_command_and_every_flag_overrides_it():
    def parsed(*argv: str):
        model_args, data_args, args = run_digits.parse_arguments(["--output_dir", "unused", *argv])
        model_args.preset = "-"
        return model_args, data_args, args.to_dict()

    assert parsed("--preset", "quickstart") == parsed(*README_QUICKSTART)
    _, data_args, args = parsed(
        "--preset", "quickstart", "--num_train_epochs", "5", "--randaugment_operations", "rotate"
    )
    assert args["num_train_epochs"] == 5 and args["learning_rate"] == 3e-3 and args["save_strategy"] == "no"
    assert data_args.randaugment_operations == ["rotate"] and data_args.dataset_source == "sklearn"
    _, _, args = parsed("--preset", "quickstart", "--dataloader_num_workers", "0")
    assert args["dataloader_num_workers"] == 0 and not args["dataloader_persistent_workers"]
    model_args, _, _ = parsed(
        "--preset=quickstart", "--config_overrides", "hidden_size=32,truncation_tau=1.2"
    )
    merged = {**DIGITS_PRESETS["quickstart"].config, "hidden_size": 32, "truncation_tau": 1.2}
    assert run_digits.build_config(model_args, ["sklearn_digits"]).to_dict().items() >= merged.items()
    with _scripts.refused("--preset 'fast'"):
        run_digits.parse_arguments(["--output_dir", "unused", "--preset", "fast"])


def test_local_source_finds_the_paper_datasets_present(data_dir):
    _, data_args, _ = run_digits.parse_arguments(["--output_dir", "x", "--data_dir", str(data_dir)])
    assert run_digits.resolve_tasks(data_args) == ("local", ["mnist", "mnistm"])


def test_dataloader_workers_started_by_forkserver_unpickle_the_transform(data_dir, tmp_path):
    """Workers that do not fork get the dataset's transform pickled (a closure could not be)."""
    args = tiny_args(tmp_path / "out", data_dir, "--dataloader_num_workers", "1", "--save_strategy", "no")
    _scripts.run_with_forkserver(SCRIPT, args, tmp_path)
    assert (tmp_path / "out" / "model.safetensors").is_file()


@pytest.mark.parametrize("architecture", ["neural_interpreter", "vit"])
def test_the_problem_type_and_attention_are_set_before_the_first_forward(
    architecture, data_dir, tmp_path, monkeypatch
):
    """The script sets the problem type, so no (compiled) forward writes it into the config and recompiles."""
    seen = []

    class Recording(run_digits.DigitsTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append((self.model.config.problem_type, self.model.config._attn_implementation))

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
        run_digits.main([*args, "--attn_implementation", "eager"])
    assert seen == [("single_label_classification", "eager")]


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
    assert any(
        m.startswith("NeuralInterpreterForImageClassification: ") and "parameters" in m for m in messages
    )
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


def test_model_card_shows_the_routing_of_the_trained_model(single_run):
    """A computational-path picture and the function usage of test images, linked from the card and uploaded."""
    output_dir, _, _ = single_run
    text = (output_dir / "README.md").read_text()
    assert "## Routing" in text and "(routing_path.png)" in text
    assert (output_dir / "routing_path.png").read_bytes().startswith(b"\x89PNG")
    usage = read_json(output_dir / "routing_usage.json")
    assert usage  # the numbers behind the card's usage table


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


def mean_cross_entropy(model, processor, data_dir: Path) -> float:
    """The mean cross-entropy over all test samples of the tiny tasks, computed directly."""
    import io

    import pyarrow.parquet as pq
    from PIL import Image

    losses = []
    for task_id, folder in enumerate(("mnist", "mnist_m")):
        table = pq.read_table(data_dir / folder / "test.parquet").to_pydict()
        images = [Image.open(io.BytesIO(item["bytes"])) for item in table["image"]]
        batch = processor(images=images, return_tensors="pt")
        with torch.no_grad():
            logits = model(**batch, task_ids=torch.full((len(images),), task_id)).logits.double()
        labels = torch.as_tensor(table["label"])
        losses.append(torch.nn.functional.cross_entropy(logits, labels, reduction="none"))
    return float(torch.cat(losses).mean())


def test_eval_loss_is_the_mean_over_samples_whatever_the_batches(single_run, data_dir):
    """38 test samples in batches of 8: the Trainer's own eval_loss weighs the last batch of 6 as 8."""
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    output_dir = single_run[0]
    model = AutoModelForImageClassification.from_pretrained(output_dir).eval()
    expected = mean_cross_entropy(model, AutoImageProcessor.from_pretrained(output_dir), data_dir)
    assert read_json(output_dir / "all_results.json")["eval_loss"] == pytest.approx(expected, rel=1e-5)


def test_resume_last_continues_from_the_newest_complete_checkpoint(single_run, data_dir, tmp_path):
    """checkpoint-3 lost its trainer_state.json (a save killed midway): 'last' skips it, says so, takes 2."""
    output_dir, _, _ = single_run
    resumed = tmp_path / "resumed"
    shutil.copytree(output_dir / "checkpoint-2", resumed / "checkpoint-2")
    shutil.copytree(output_dir / "checkpoint-4", resumed / "checkpoint-3")
    (resumed / "checkpoint-3" / "trainer_state.json").unlink()
    with isolated_run(tmp_path / "hf_home") as messages:
        run_digits.main(tiny_args(resumed, data_dir, "--resume_from_checkpoint", "last"))
    state = read_json(resumed / "trainer_state.json")
    assert state["global_step"] == 4
    original, again = logged_losses(output_dir), logged_losses(resumed)
    assert set(again) == {1, 2, 3, 4}  # steps 1-2 restored from the checkpoint, 3-4 trained now
    # Model, optimizer, scheduler, data order and RNG (hence RandAugment) states are all restored.
    for step in (3, 4):
        assert math.isclose(again[step], original[step], rel_tol=1e-3), (step, again, original)
    assert any("Skipping" in m and "checkpoint-3" in m and "trainer_state.json" in m for m in messages), (
        messages
    )
    assert any(m.startswith("Resuming from") and m.endswith("checkpoint-2") for m in messages), messages


def test_resume_last_without_a_complete_checkpoint_is_refused(data_dir, tmp_path):
    (tmp_path / "out" / "checkpoint-5").mkdir(parents=True)
    with isolated_run(tmp_path / "hf_home"), pytest.raises(ValueError, match="no complete checkpoint"):
        run_digits.main(tiny_args(tmp_path / "out", data_dir, "--resume_from_checkpoint", "last"))


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
    # The eval loss is the mean over the 38 samples, not over shards padded and weighed by batch size.
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(output_dir).eval()
    expected = mean_cross_entropy(model, AutoImageProcessor.from_pretrained(output_dir), data_dir)
    assert results["eval_loss"] == pytest.approx(expected, rel=1e-5)


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
    with _scripts.refused(r"--optim sgd with --radam true.*--radam false"):
        run_digits.main(quick_args(tmp_path, "--dataset_source", "sklearn", "--optim", "sgd"))
    model_args, data_args, args = run_digits.parse_arguments(
        quick_args(tmp_path, "--optim", "sgd", "--radam", "false")
    )
    run_digits.check_arguments(model_args, data_args, args)  # --radam false: --optim is what trains


@pytest.mark.parametrize("source", ["sklearn", "hub"])
def test_data_dir_with_another_source_is_refused(no_data_loading, tmp_path, source):
    with _scripts.refused(
        f"--data_dir only applies to --dataset_source local.*got --dataset_source {source}"
    ):
        run_digits.main(quick_args(tmp_path, "--dataset_source", source, "--data_dir", "/nonexistent"))


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (["--config_overrides", "num_funtions=6"], "unknown setting 'num_funtions'"),
        (["--architecture", "vit", "--config_overrides", "hidden_size=64"], "divisible"),
        (["--num_train_epochs", "0"], r"--num_train_epochs 0: no training step would run"),
        (["--max_steps", "0"], r"--max_steps 0: no training step would run"),
        (["--max_train_samples", "0"], r"--max_train_samples 0: must be at least 1"),
        (["--max_eval_samples", "0"], r"--max_eval_samples 0: must be at least 1"),
        (["--randaugment_operations", "rotate", "warp"], r"unknown \['warp'\]"),
        (["--randaugment_magnitude", "10.5"], r"magnitude.*\[0, 10\]"),
    ],
)
def test_what_cannot_train_is_refused_before_any_work(no_data_loading, tmp_path, extra, error):
    with _scripts.refused(error):
        run_digits.main(quick_args(tmp_path / "out", "--dataset_source", "sklearn", *extra))
    assert not (tmp_path / "out" / "README.md").exists()


def test_an_empty_split_is_refused_by_name(data_dir, tmp_path):
    from datasets import Dataset

    broken = tmp_path / "data"
    shutil.copytree(data_dir, broken)
    table = Dataset.from_parquet(str(data_dir / "mnist" / "test.parquet"))
    table.select([]).to_parquet(broken / "mnist" / "test.parquet")
    with (
        isolated_run(tmp_path / "hf_home"),
        pytest.raises(
            ValueError, match=r"test split of (task )?'?mnist'? (holds no samples|has no usable rows)"
        ),
    ):
        run_digits.main(tiny_args(tmp_path / "out", broken, "--max_eval_samples", "5"))


def test_an_output_dir_in_use_by_a_live_run_is_refused_and_a_stale_lock_taken_over(no_data_loading, tmp_path):
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    lock = output_dir / LOCK_NAME
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as other:
        lock.write_text(str(other.pid))
        try:
            with pytest.raises(RuntimeError, match=f"in use by another run \\(process {other.pid}"):
                run_digits.main(quick_args(output_dir, "--dataset_source", "sklearn"))
            assert lock.read_text() == str(other.pid)  # the live run's lock is left alone
        finally:
            other.kill()
    other.wait()
    # Its process is gone: the next run takes the lock over (and gets as far as loading the data), then frees it.
    with (
        isolated_run(tmp_path / "hf_home") as messages,
        pytest.raises(AssertionError, match="datasets were loaded"),
    ):
        run_digits.main(quick_args(output_dir, "--dataset_source", "sklearn"))
    assert any(f"Taking over {lock}" in m for m in messages) and not lock.exists()


def test_do_train_false_without_a_checkpoint_is_refused_and_keeps_the_trained_model(
    single_run, data_dir, tmp_path
):
    trained = tmp_path / "trained"
    shutil.copytree(single_run[0], trained, ignore=shutil.ignore_patterns("checkpoint-*"))
    before = {name: (trained / name).read_bytes() for name in ("model.safetensors", "README.md")}
    with isolated_run(tmp_path / "hf_home"), _scripts.refused("needs --model_name_or_path"):
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
        (["--do_train", "false", "--push_to_hub"], "nothing to upload"),
        (["--do_train", "false", "--resume_from_checkpoint", "last"], "pass it as --model_name_or_path"),
    ],
)
def test_model_name_or_path_refuses_what_it_cannot_do(single_run, no_data_loading, tmp_path, extra, error):
    args = quick_args(tmp_path / "eval", "--model_name_or_path", str(single_run[0]), *extra)
    with _scripts.refused(error):
        run_digits.main(args)


def test_do_train_false_does_not_write_into_a_saved_model(single_run, no_data_loading):
    output_dir = single_run[0]
    args = quick_args(output_dir, "--model_name_or_path", str(output_dir), "--do_train", "false")
    with _scripts.refused("holds a saved model"):
        run_digits.main(args)


def test_a_corrupt_checkpoint_or_another_model_type_is_named(single_run, no_data_loading, tmp_path):
    saved = tmp_path / "saved"
    shutil.copytree(single_run[0], saved, ignore=shutil.ignore_patterns("checkpoint-*"))
    weights = saved / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    args = quick_args(tmp_path / "eval", "--model_name_or_path", str(saved), "--do_train", "false")
    with _scripts.refused(f"{weights} is not a readable safetensors file"):
        run_digits.main(args)
    shutil.copy(single_run[0] / "model.safetensors", weights)
    config = read_json(saved / "config.json")
    (saved / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    with (
        isolated_run(tmp_path / "hf_home"),
        pytest.raises(ValueError, match="model_type 'bert'; this script"),
    ):
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
    assert evaluated["eval_loss"] == pytest.approx(results["eval_loss"], rel=1e-6)
    assert {p.name for p in output_dir.iterdir()} == {"eval_results.json", "all_results.json"}
    assert (trained / "model.safetensors").read_bytes() == weights
    assert any("nothing trained or saved" in m for m in messages)
    # One of the saved model's tasks: its own head (task id 1 of the model, 0 of the data).
    with isolated_run(tmp_path / "hf_home"):
        one = run_digits.main(quick_args(tmp_path / "eval_mnistm", *base, "--task_names", "mnistm"))
    assert one["eval_num_samples"] == one["eval_num_samples_mnistm"] == EVAL_PER_TASK
    assert one["eval_accuracy_mnistm"] == pytest.approx(results["eval_accuracy_mnistm"], abs=1e-9)
    with isolated_run(tmp_path / "hf_home"), pytest.raises(ValueError, match="has no head for them"):
        run_digits.main(quick_args(tmp_path / "eval_svhn", *base, "--task_names", "svhn"))


def test_model_card_leaves_out_a_numpy_nan_accuracy_like_a_python_one():
    from ni_hf.training.model_cards import TaskCardInfo, digits_eval_results
    from ni_hf.training.model_cards.common import percent as _percent

    tasks = [
        TaskCardInfo("mnist", "ylecun/mnist", "MNIST", "hub", accuracy=np.float32("nan")),
        TaskCardInfo("svhn", "svhn", "SVHN", "hub", accuracy=np.float32(0.5)),
    ]
    assert [result.dataset_name for result in digits_eval_results(tasks)] == ["SVHN"]
    assert _percent(np.float32("nan")) == _percent(float("nan"))


def test_flipped_weight_bytes_or_a_folder_without_config_are_refused_before_evaluating(single_run, tmp_path):
    """Safetensors has no checksum: the run's weights_sha256.json catches 64 flipped data bytes (which loaded, and
    evaluated to a wrong accuracy), and a folder without config.json is named as such."""
    saved = tmp_path / "saved"
    shutil.copytree(single_run[0], saved, ignore=shutil.ignore_patterns("checkpoint-*"))
    weights = saved / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = bytes(255 - b for b in data[-64:])
    weights.write_bytes(bytes(data))
    args = quick_args(tmp_path / "eval", "--model_name_or_path", str(saved), "--do_train", "false")
    with _scripts.refused("has SHA-256 .* the file changed after it was saved"):
        run_digits.main(args)
    shutil.copy(single_run[0] / "model.safetensors", weights)
    (saved / "config.json").unlink()
    with _scripts.refused("the folder holds no config.json"):
        run_digits.main(args)
