#!/usr/bin/env python
"""The adaptation studies of the paper (section 4.2, Figure 4 and 5) for a Neural Interpreter pre-trained on digits.

Starting from a checkpoint written by ``examples/run_digits.py`` (a local folder or a Hub repo):

- ``fast_adaptation`` (Figure 4a): fine-tune on N samples of a new dataset (K-MNIST in the paper, unaugmented) with a
  fresh CLS token and head, RAdam at a constant 0.05, batch 128, 10 epochs, several seeds (a seed also draws the N
  samples); test accuracy on the new dataset against N.
- ``reinitialized_functions`` (Figure 5): the same, after the function codes and signatures were drawn anew, so
  whatever the functions learned in pre-training is destroyed; the gap to ``fast_adaptation`` is what is reused.
- ``capacity_extension`` (Figure 4b): add k new functions to every script, then train only the function codes and
  signatures (and the new dataset's CLS token and head, which a new dataset needs) on 8,192 samples for 10 epochs;
  test accuracy against the number of functions. The paper used Shampoo here; this script uses RAdam.
- ``dropped_functions`` (Figure 4c): no training; the accuracy on the pre-training datasets when k functions per
  script are removed at test time (their compatibilities forced to 0 before normalisation): every choice of the
  k functions when there are at most ``--dropped_draws`` of them, else that many random draws.
- ``function_iterations`` (anytime inference): no training; the accuracy on the pre-training datasets when the
  model stops after 1, 2, ... of its trained function iterations.

``fast_adaptation`` also runs on the paper's multi-task ViT baseline (``run_digits.py --architecture vit``), for the
ViT curve of Figure 4a: a fresh CLS token and head, all parameters trained (the paper's ViT rate: 0.03, pass
``--adapt_learning_rate 0.03``). The other studies need a Neural Interpreter's functions; with a ViT checkpoint
and ``--studies`` left at its default only ``fast_adaptation`` runs, and asking for any of them is an error.

Results go to ``<output_dir>/adaptation_results.json``, ``adaptation_results.md`` and one PNG per study (with
matplotlib, the ``vis`` extra; ``examples/plot_adaptation_studies.py`` draws several runs, e.g. NI and ViT, in one
plot). ``--quick`` runs every study at tiny settings, to check the pipeline in a minute (offline):

    python examples/run_digits_adaptation.py --model_name_or_path runs/quickstart --new_task sklearn_digits \
        --dataset_source sklearn --quick --output_dir runs/adapt-quick
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import logging
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import transformers
from _common import DigitsTransform
from plot_adaptation_studies import results_markdown, write_plots
from tqdm.auto import tqdm
from transformers import HfArgumentParser, Trainer, TrainingArguments, set_seed

from ni_hf import (
    MultiTaskViTConfig,
    MultiTaskViTForImageClassification,
    NeuralInterpreterForImageClassification,
    NeuralInterpreterImageProcessor,
)
from ni_hf.data.digits import (
    SKLEARN_TASK,
    SOURCES,
    canonical_task_name,
    load_task_split,
    resolve_dataset_source,
)
from ni_hf.training.data_transfer import (
    DATALOADER_WORKERS_HELP,
    PIN_MEMORY_HELP,
    STATIC_BATCHES_NOTE,
    apply_gpu_loading_defaults,
    compile_for_static_batches,
)
from ni_hf.training.evaluation import CopiedPredictionsMixin, compute_multitask_accuracy
from ni_hf.training.model_card import mixed_precision
from ni_hf.training.paths import check_model_path

logger = logging.getLogger(__name__)


class AdaptationTrainer(CopiedPredictionsMixin, Trainer):
    """Trainer whose evaluation keeps every batch's logits when the model runs through CUDA graphs."""


STUDIES = (
    "fast_adaptation",
    "reinitialized_functions",
    "capacity_extension",
    "dropped_functions",
    "function_iterations",
)
# The studies that act on a Neural Interpreter's functions (or function iterations); a multi-task ViT has none.
FUNCTION_STUDIES = STUDIES[1:]
# --quick: every study at tiny settings, a check of the pipeline.
QUICK_SETTINGS = dict(
    num_train_samples=[32, 64],
    adaptation_seeds=[0, 1],
    adapt_epochs=1.0,
    capacity_new_functions=[0, 1],
    capacity_train_samples=32,
    max_eval_samples=64,
    dropped_draws=2,
)
KEY_NAMES = {
    "fast_adaptation": "training samples",
    "reinitialized_functions": "training samples",
    "capacity_extension": "functions per script",
}
RESULTS_JSON = "adaptation_results.json"
RESULTS_MD = "adaptation_results.md"


@dataclass
class AdaptationArguments:
    """What to adapt, to what, and which studies to run."""

    model_name_or_path: str = field(
        metadata={
            "help": "A digits checkpoint of run_digits.py (its output_dir or a Hub repo id): a Neural Interpreter, "
            "or a multi-task ViT (--architecture vit), which runs fast_adaptation only. A path that is absolute, "
            "starts with . or ~, or has more than one '/' must be an existing folder; 'namespace/name' that is "
            "not a folder here is a Hub repo id."
        }
    )
    studies: str = field(
        default=",".join(STUDIES),
        metadata={
            "help": f"Comma-separated studies to run, some of {list(STUDIES)} (default: all; for a multi-task ViT "
            "checkpoint: fast_adaptation, the only one it has)."
        },
    )
    new_task: str = field(
        default="kmnist",
        metadata={
            "help": "The new dataset to adapt to (paper: K-MNIST, 'kmnist'; also 'fashion_mnist', 'mnist')."
        },
    )
    dataset_source: str | None = field(
        default=None,
        metadata={
            "help": f"Where the data comes from, one of {list(SOURCES)}: the Hub, 'local' Parquet folders "
            "(--data_dir) or 'sklearn' (scikit-learn's 8x8 digits, offline). Default: 'local' if --data_dir is "
            "given, else 'hub' (as in run_digits.py). The same source serves the new dataset and, for "
            "dropped_functions, the pre-training datasets (scikit-learn's digits always come from scikit-learn).",
            "choices": list(SOURCES),
        },
    )
    data_dir: str | None = field(
        default=None,
        metadata={
            "help": "Folder holding <task>/train.parquet, ... (as in run_digits.py). Only for --dataset_source "
            "local, which it selects when --dataset_source is not given; with 'hub' or 'sklearn' it is an error."
        },
    )
    num_train_samples: list[int] = field(
        default_factory=lambda: [128, 512, 2048, 8192],
        metadata={
            "help": "fast_adaptation / reinitialized_functions: training set sizes N of the new dataset; all of "
            "them are checked against its training split before the first run."
        },
    )
    adaptation_seeds: list[int] = field(
        default_factory=lambda: [0, 1, 2, 3, 4, 5],
        metadata={
            "help": "Seeds of every adaptation run (paper: 6); a seed draws the N samples, the new CLS "
            "token and head, the re-drawn functions and the data order."
        },
    )
    adapt_epochs: float = field(default=10.0, metadata={"help": "Fine-tuning epochs (paper: 10)."})
    adapt_learning_rate: float = field(
        default=0.05,
        metadata={
            "help": "RAdam learning rate, constant (paper: 0.05 for the Neural Interpreter, 0.03 for the ViT)."
        },
    )
    batch_size: int = field(
        default=128,
        metadata={"help": "Global training batch size (paper: 128); split evenly over the processes."},
    )
    capacity_new_functions: list[int] = field(
        default_factory=lambda: [0, 1, 2, 3],
        metadata={"help": "capacity_extension: numbers k of functions added to every script."},
    )
    capacity_train_samples: int = field(
        default=8192,
        metadata={
            "help": "capacity_extension: training samples of the new dataset (paper: 8192); checked against its "
            "training split before the first run."
        },
    )
    capacity_learning_rate: float = field(
        default=0.05,
        metadata={
            "help": "capacity_extension: RAdam learning rate (the paper grid-searched it, with Shampoo)."
        },
    )
    max_eval_samples: int | None = field(
        default=None,
        metadata={
            "help": "Evaluate on at most this many test samples per dataset (a seeded subset; default all)."
        },
    )
    dropped_draws: int = field(
        default=10,
        metadata={
            "help": "dropped_functions: random draws of the dropped functions for each k; when there are at most "
            "this many possible choices, each of them once instead."
        },
    )
    eval_batch_size: int = field(default=256, metadata={"help": "Batch size of the evaluation loops."})
    quick: bool = field(
        default=False,
        metadata={
            "help": "Check the pipeline in about a minute: every study at tiny settings ("
            + ", ".join(f"{k}={v}" for k, v in QUICK_SETTINGS.items())
            + "), replacing those options."
        },
    )


@dataclass
class AdaptationTrainingArguments(TrainingArguments):
    """TrainingArguments for the fine-tuning runs; the script sets learning rate, epochs and batch size per study."""

    save_strategy: str = field(default="no", metadata={"help": "Checkpoints of the many short runs: none."})
    logging_steps: float = field(
        default=50, metadata={"help": "Log the training loss every this many steps."}
    )
    logging_nan_inf_filter: bool = field(
        default=False,
        metadata={
            "help": "Replace a NaN or inf training loss by the running mean in the logged loss (transformers' "
            "default: true). False here: a NaN shows in the log instead of being averaged away, and the check, a "
            "device-to-host sync at every step, no longer stalls a GPU."
        },
    )
    remove_unused_columns: bool = field(
        default=False,
        metadata={"help": "Must stay false: the images are preprocessed by a dataset transform."},
    )
    dataloader_pin_memory: bool = field(default=torch.cuda.is_available(), metadata={"help": PIN_MEMORY_HELP})
    disable_tqdm: bool | None = field(
        default=True, metadata={"help": "The Trainer's own bar per run (off: the studies show one bar each)."}
    )

    dataloader_num_workers: int | None = field(default=None, metadata={"help": DATALOADER_WORKERS_HELP})

    def __post_init__(self) -> None:
        # before transformers turns accelerator_config into an AcceleratorConfig
        apply_gpu_loading_defaults(self)
        super().__post_init__()


# --------------------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------------------


def check_sizes(exp: AdaptationArguments, studies: list[str], available: int, task_name: str) -> None:
    """Every training set size the studies will draw must fit in the new dataset's training split."""
    requested = {}
    if {"fast_adaptation", "reinitialized_functions"} & set(studies):
        requested["--num_train_samples"] = exp.num_train_samples
    if "capacity_extension" in studies:
        requested["--capacity_train_samples"] = [exp.capacity_train_samples]
    too_large = {option: [n for n in sizes if n > available] for option, sizes in requested.items()}
    too_large = {option: sizes for option, sizes in too_large.items() if sizes}
    if too_large:
        what = " and ".join(f"{option} {' '.join(map(str, sizes))}" for option, sizes in too_large.items())
        raise ValueError(
            f"{what}: more than the {available} images of the training split of {task_name} "
            f"({exp.dataset_source}); pass sizes of at most {available}."
        )


# --------------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------------


def num_classes(dataset: datasets.Dataset) -> int:
    """Classes of a dataset's ``label`` column (its ClassLabel, else the largest label + 1)."""
    feature = dataset.features["label"]
    if isinstance(feature, datasets.ClassLabel):
        return feature.num_classes
    return int(max(dataset["label"])) + 1


def subset(dataset: datasets.Dataset, size: int, seed: int) -> datasets.Dataset:
    """A seeded random subset of ``size`` rows; asking for more rows than there are is an error."""
    if size > len(dataset):
        raise ValueError(f"Asked for {size} training samples, but the dataset has only {len(dataset)}.")
    return dataset.select(np.random.default_rng(seed).permutation(len(dataset))[:size])


# --------------------------------------------------------------------------------------------------------
# Model preparation
# --------------------------------------------------------------------------------------------------------


def prepare_model(
    path: str,
    task_name: str,
    num_labels: int,
    seed: int,
    reinitialize_functions: bool = False,
    new_functions: int = 0,
    functions_only: bool = False,
) -> NeuralInterpreterForImageClassification | MultiTaskViTForImageClassification:
    """The pre-trained model with a fresh CLS token and head for the new dataset, ready for one study's run.

    ``reinitialize_functions``: draw every function's code and signature anew, N(0, 1) as at initialisation.
    ``new_functions``: capacity extension, k functions appended to every script.
    ``functions_only``: train only codes, signatures, the CLS token and the head (signatures unfrozen).
    """
    set_seed(seed)
    model = load_pretrained(path)
    # The new CLS token and head first, so that every variant of a seed starts from the same ones.
    model.reset_tasks([task_name], num_labels=num_labels)
    if isinstance(model, MultiTaskViTForImageClassification):
        if reinitialize_functions or new_functions or functions_only:
            raise ValueError(
                f"{path} is a multi-task ViT: it has no functions to re-draw, add or train alone."
            )
        return model
    backbone = model.neural_interpreter
    generator = torch.Generator().manual_seed(seed + 1)
    if reinitialize_functions:
        with torch.no_grad():
            for script in backbone.scripts:
                for param in (script.signatures, script.codes):
                    param.copy_(torch.randn(param.shape, generator=generator))
    if new_functions:
        backbone.add_functions(new_functions)
    if functions_only:
        model.config.freeze_signatures = model.config.freeze_codes = False
        for name, param in model.named_parameters():
            param.requires_grad_(
                name.endswith((".signatures", ".codes"))
                or "task_tokens" in name
                or name.startswith("classifier.")
            )
    return model


def is_vit_checkpoint(path: str) -> bool:
    """Whether the checkpoint is a multi-task ViT (``run_digits.py --architecture vit``), from its config."""
    config_dict, _ = transformers.PretrainedConfig.get_config_dict(path)
    return config_dict.get("model_type") == MultiTaskViTConfig.model_type


def load_pretrained(
    path: str,
) -> NeuralInterpreterForImageClassification | MultiTaskViTForImageClassification:
    """``from_pretrained`` without its progress bar: a study loads the checkpoint once per run."""
    model_class = (
        MultiTaskViTForImageClassification
        if is_vit_checkpoint(path)
        else NeuralInterpreterForImageClassification
    )
    transformers.utils.logging.disable_progress_bar()
    try:
        model = model_class.from_pretrained(path)
    finally:
        transformers.utils.logging.enable_progress_bar()
    if model.config.problem_type is None:  # not inferred in a compiled forward, which would then recompile
        model.config.problem_type = "single_label_classification"
    return model


def trainable_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# --------------------------------------------------------------------------------------------------------
# Training and evaluation
# --------------------------------------------------------------------------------------------------------


def finetune(
    model: NeuralInterpreterForImageClassification,
    train: datasets.Dataset,
    base: AdaptationTrainingArguments,
    exp: AdaptationArguments,
    learning_rate: float,
    seed: int,
    output_dir: Path,
) -> dict[str, Any]:
    """Fine-tune with RAdam at a constant rate for ``exp.adapt_epochs``; returns steps, loss and time."""
    world_size = base.world_size
    args = dataclasses.replace(
        base,
        output_dir=str(output_dir),
        learning_rate=learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        num_train_epochs=exp.adapt_epochs,
        max_steps=-1,
        per_device_train_batch_size=exp.batch_size // world_size,
        seed=seed,
        data_seed=seed,
    )
    trainer = AdaptationTrainer(
        model=model,
        args=args,
        train_dataset=train,
        optimizer_cls_and_kwargs=(
            torch.optim.RAdam,
            {"lr": learning_rate, "betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon},
        ),
    )
    output = trainer.train()
    return {
        "train_steps": output.global_step,
        "train_runtime_s": output.metrics.get("train_runtime"),
        "final_train_loss": output.training_loss,
    }


@torch.no_grad()
def accuracy(
    model: NeuralInterpreterForImageClassification,
    tests: list[datasets.Dataset],
    task_names: list[str],
    batch_size: int,
    **forward_kwargs: Any,
) -> dict[str, float]:
    """Test accuracy overall and per task (``accuracy_<task>``); ``forward_kwargs`` go to the model's forward
    (e.g. ``disabled_functions``, ``num_function_iterations``)."""
    model.eval()
    device = next(model.parameters()).device
    predictions, labels, task_ids = [], [], []
    batches = ((test, start) for test in tests for start in range(0, len(test), batch_size))
    for test, start in batches:
        batch = test[start : start + batch_size]
        pixel_values = torch.from_numpy(np.stack(batch["pixel_values"])).to(device)
        ids = torch.tensor(batch["task_ids"], device=device)
        logits = model(pixel_values=pixel_values, task_ids=ids, **forward_kwargs).logits
        predictions.append(logits.argmax(-1).cpu().numpy())
        labels.append(np.asarray(batch["labels"]))
        task_ids.append(np.asarray(batch["task_ids"]))
    return compute_multitask_accuracy(
        np.concatenate(predictions), np.concatenate(labels), np.concatenate(task_ids), task_names
    )


def summarize(values: list[float]) -> dict[str, Any]:
    return {
        "values": values,
        "mean": float(np.mean(values)),
        "std": float(np.std(values)),
        "runs": len(values),
    }


# --------------------------------------------------------------------------------------------------------
# Studies
# --------------------------------------------------------------------------------------------------------


def finetune_and_record(
    out: dict[str, Any],
    key: str,
    model: NeuralInterpreterForImageClassification,
    train: datasets.Dataset,
    test: datasets.Dataset,
    task_name: str,
    learning_rate: float,
    seed: int,
    study: str,
    exp: AdaptationArguments,
    base: AdaptationTrainingArguments,
    **extra: Any,
) -> float:
    """One run of a study: fine-tune, test, and add its accuracy and details to ``out[key]``."""
    info = finetune(model, train, base, exp, learning_rate, seed, Path(base.output_dir) / study)
    acc = accuracy(model, [test], [task_name], exp.eval_batch_size)["accuracy"]
    entry = out.setdefault(key, {**extra, "accuracy": [], "details": []})
    entry["accuracy"].append(acc)
    entry["details"].append({"seed": seed, **info, "trainable_parameters": trainable_parameters(model)})
    what = "".join(f", {name.replace('_', ' ')} {value}" for name, value in extra.items())
    logger.info(
        "%s: %s %s%s, seed %d: %d steps, test accuracy %.4f",
        study,
        KEY_NAMES[study],
        key,
        what,
        seed,
        info["train_steps"],
        acc,
    )
    return acc


def summarize_runs(out: dict[str, Any]) -> dict[str, Any]:
    """Replace every entry's accuracies by their mean, std and count (the values kept)."""
    for entry in out.values():
        entry.update(summarize(entry.pop("accuracy")))
    return out


def run_adaptation_study(
    exp: AdaptationArguments,
    base: AdaptationTrainingArguments,
    train: datasets.Dataset,
    test: datasets.Dataset,
    task_name: str,
    labels: int,
    reinitialize: bool,
) -> dict[str, Any]:
    """fast_adaptation (reinitialize=False) or reinitialized_functions: accuracy per N over the seeds."""
    study = "reinitialized_functions" if reinitialize else "fast_adaptation"
    out: dict[str, Any] = {}
    runs = [(n, seed) for n in exp.num_train_samples for seed in exp.adaptation_seeds]
    bar = images_bar(study, [n for n, _ in runs], exp, base)
    for n, seed in runs:
        model = prepare_model(
            exp.model_name_or_path, task_name, labels, seed, reinitialize_functions=reinitialize
        )
        finetune_and_record(
            out,
            str(n),
            model,
            subset(train, n, seed),
            test,
            task_name,
            exp.adapt_learning_rate,
            seed,
            study,
            exp,
            base,
        )
        bar.update(n * exp.adapt_epochs)
    bar.close()
    return summarize_runs(out)


def run_capacity_extension(
    exp: AdaptationArguments,
    base: AdaptationTrainingArguments,
    train: datasets.Dataset,
    test: datasets.Dataset,
    task_name: str,
    labels: int,
) -> dict[str, Any]:
    """Accuracy on the new dataset with k functions added, only codes / signatures / CLS token / head trained."""
    out: dict[str, Any] = {}
    runs = [(k, seed) for k in exp.capacity_new_functions for seed in exp.adaptation_seeds]
    bar = images_bar("capacity_extension", [exp.capacity_train_samples] * len(runs), exp, base)
    for k, seed in runs:
        model = prepare_model(
            exp.model_name_or_path, task_name, labels, seed, new_functions=k, functions_only=True
        )
        samples = subset(train, exp.capacity_train_samples, seed)
        key = str(model.config.num_functions)  # functions per script after adding k
        finetune_and_record(
            out,
            key,
            model,
            samples,
            test,
            task_name,
            exp.capacity_learning_rate,
            seed,
            "capacity_extension",
            exp,
            base,
            new_functions=k,
        )
        bar.update(exp.capacity_train_samples * exp.adapt_epochs)
    bar.close()
    return summarize_runs(out)


def images_bar(study: str, sizes: list[int], exp: AdaptationArguments, base: TrainingArguments) -> tqdm:
    """A progress bar over the training images a study's runs will see, so that its estimate of the time left
    weighs a run of 8,192 samples as 128 runs of 64."""
    total = sum(sizes) * exp.adapt_epochs
    return tqdm(total=total, desc=study, unit="img", unit_scale=True, disable=not base.should_log)


def pretrained_with_tests(
    exp: AdaptationArguments, processor: NeuralInterpreterImageProcessor
) -> tuple[NeuralInterpreterForImageClassification, list[str], list[datasets.Dataset]]:
    """The pre-trained model, its task names and the test split of every pre-training dataset, preprocessed."""
    model = load_pretrained(exp.model_name_or_path)
    task_names = list(model.config.task_names)
    # scikit-learn's digits exist only there; every other pre-training dataset comes from --dataset_source.
    sources = {name: "sklearn" if name == SKLEARN_TASK else exp.dataset_source for name in task_names}
    tests = [
        load_task_split(
            name, "test", sources[name], exp.data_dir, max_samples=exp.max_eval_samples
        ).with_transform(DigitsTransform(processor, task_id=i))
        for i, name in enumerate(task_names)
    ]
    logger.info("Pre-training datasets %s: %s test images", task_names, [len(t) for t in tests])
    return model, task_names, tests


def summarize_per_task(results: list[dict[str, float]]) -> dict[str, Any]:
    """Mean, std and count of every accuracy (overall and per task) over several evaluations."""
    return {key: summarize([r[key] for r in results]) for key in results[0]}


def run_function_iterations(
    exp: AdaptationArguments, processor: NeuralInterpreterImageProcessor, show_progress: bool = True
) -> dict[str, Any]:
    """Anytime inference: accuracy on the pre-training datasets after 1, 2, ... of the trained iterations."""
    model, task_names, tests = pretrained_with_tests(exp, processor)
    trained = max(model.config.iterations_per_script)
    out: dict[str, Any] = {}
    for n in tqdm(range(1, trained + 1), desc="function_iterations", disable=not show_progress):
        out[str(n)] = summarize_per_task(
            [accuracy(model, tests, task_names, exp.eval_batch_size, num_function_iterations=n)]
        )
        logger.info(
            "function_iterations: %d of %d: accuracy %.4f", n, trained, out[str(n)]["accuracy"]["mean"]
        )
    return out


def run_dropped_functions(
    exp: AdaptationArguments, processor: NeuralInterpreterImageProcessor, show_progress: bool = True
) -> dict[str, Any]:
    """Accuracy on the pre-training datasets with k random functions per script dropped at test time."""
    model, task_names, tests = pretrained_with_tests(exp, processor)
    num_functions, num_scripts = model.config.num_functions, model.config.num_scripts
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    for k in tqdm(range(num_functions), desc="dropped_functions", disable=not show_progress):
        subsets = list(itertools.combinations(range(num_functions), k))
        if len(subsets) ** num_scripts <= exp.dropped_draws:
            # Few enough choices: every one of them once, rather than random draws that repeat some.
            choices = [dict(enumerate(c)) for c in itertools.product(subsets, repeat=num_scripts)]
        else:
            choices = [
                {s: tuple(rng.choice(num_functions, k, replace=False)) for s in range(num_scripts)}
                for _ in range(exp.dropped_draws)
            ]
        draws, results = [], []
        for choice in choices:
            draws.append({s: sorted(int(u) for u in functions) for s, functions in choice.items()})
            results.append(
                accuracy(
                    model, tests, task_names, exp.eval_batch_size, disabled_functions=draws[-1] if k else None
                )
            )
        entry: dict[str, Any] = {"draws": draws, **summarize_per_task(results)}
        out[str(k)] = entry
        logger.info(
            "dropped_functions: %d of %d dropped: accuracy %.4f", k, num_functions, entry["accuracy"]["mean"]
        )
    return out


# --------------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------------


def environment(base: TrainingArguments) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "device": str(base.device),
        "world_size": base.world_size,
        "mixed_precision": mixed_precision(base),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def parse_args(argv: list[str] | None = None) -> tuple[AdaptationArguments, AdaptationTrainingArguments]:
    parser = HfArgumentParser((AdaptationArguments, AdaptationTrainingArguments))
    return parser.parse_args_into_dataclasses(args=argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the requested studies; write and return the results."""
    exp, base = parse_args(argv)
    if exp.quick:
        exp = dataclasses.replace(exp, **QUICK_SETTINGS)
    exp.model_name_or_path = check_model_path(exp.model_name_or_path)
    exp.dataset_source = resolve_dataset_source(exp.dataset_source, exp.data_dir)
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO, stream=sys.stdout
    )
    logger.setLevel(logging.INFO if base.should_log else logging.WARNING)
    if compile_for_static_batches(base):
        logger.info(STATIC_BATCHES_NOTE)
    studies = [s.strip() for s in exp.studies.split(",") if s.strip()]
    unknown = [s for s in studies if s not in STUDIES]
    if unknown or not studies:
        raise ValueError(f"--studies: unknown {unknown or 'none given'}; expected some of {list(STUDIES)}.")
    vit = is_vit_checkpoint(exp.model_name_or_path)
    needs_functions = [s for s in studies if s in FUNCTION_STUDIES]
    if vit and needs_functions:
        if exp.studies != AdaptationArguments.studies:
            raise ValueError(
                f"--studies {','.join(needs_functions)}: {exp.model_name_or_path} is a multi-task ViT, and these "
                "studies act on a Neural Interpreter's functions (re-drawn, added or dropped); a ViT checkpoint "
                "runs fast_adaptation only."
            )
        logger.info(
            "%s is a multi-task ViT: running fast_adaptation only (%s need a Neural Interpreter's functions).",
            exp.model_name_or_path,
            ", ".join(needs_functions),
        )
        studies = [s for s in studies if s not in FUNCTION_STUDIES]
    if exp.batch_size % base.world_size:
        raise ValueError(
            f"--batch_size {exp.batch_size} is the global batch; it must be divisible by the number of processes "
            f"({base.world_size})."
        )
    output_dir = Path(base.output_dir)
    processor = NeuralInterpreterImageProcessor()
    results: dict[str, Any] = {
        "model": exp.model_name_or_path,
        "architecture": "vit" if vit else "neural_interpreter",
        "new_task": canonical_task_name(exp.new_task),
        "arguments": dataclasses.asdict(exp),
        "studies": studies,
    }
    training_studies = [s for s in studies if s not in ("dropped_functions", "function_iterations")]
    if training_studies:
        train_raw = load_task_split(exp.new_task, "train", exp.dataset_source, exp.data_dir)
        check_sizes(exp, training_studies, len(train_raw), results["new_task"])
        test_raw = load_task_split(
            exp.new_task, "test", exp.dataset_source, exp.data_dir, max_samples=exp.max_eval_samples
        )
        labels = num_classes(train_raw)
        task_name = results["new_task"]
        train = train_raw.with_transform(DigitsTransform(processor, task_id=0))
        test = test_raw.with_transform(DigitsTransform(processor, task_id=0))
        logger.info(
            "New dataset %s (%s): %d training images available, %d test images, %d classes",
            task_name,
            exp.dataset_source,
            len(train),
            len(test),
            labels,
        )
        for study in training_studies:
            if study == "capacity_extension":
                results[study] = run_capacity_extension(exp, base, train, test, task_name, labels)
            else:
                results[study] = run_adaptation_study(
                    exp, base, train, test, task_name, labels, reinitialize=study == "reinitialized_functions"
                )
    if "dropped_functions" in studies:
        results["dropped_functions"] = run_dropped_functions(exp, processor, show_progress=base.should_log)
    if "function_iterations" in studies:
        results["function_iterations"] = run_function_iterations(
            exp, processor, show_progress=base.should_log
        )
    results["environment"] = environment(base)
    if base.process_index != 0:
        return results
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / RESULTS_JSON).write_text(json.dumps(results, indent=2) + "\n")
    markdown = results_markdown([results])
    (output_dir / RESULTS_MD).write_text(markdown)
    print(markdown)
    logger.info("Results written to %s and %s", output_dir / RESULTS_JSON, output_dir / RESULTS_MD)
    try:
        plots = write_plots([results], output_dir)
    except ImportError:
        logger.warning("matplotlib is not installed (pip install 'ni_hf[vis]'): no plots drawn.")
    else:
        logger.info("Plots: %s", ", ".join(str(p) for p in plots))
    return results


if __name__ == "__main__":
    main()
