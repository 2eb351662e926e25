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
plot). ``--preset quick`` runs every study at tiny settings, to check the pipeline in a minute (offline):

    python examples/run_digits_adaptation.py --model_name_or_path runs/quickstart --new_task sklearn_digits \
        --dataset_source sklearn --preset quick --output_dir runs/adapt-quick
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import transformers
from plot_adaptation_studies import STUDIES, results_markdown, write_plots
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
    DigitsTransform,
    canonical_task_name,
    known_task_names,
    load_task_split,
    resolve_dataset_source,
)
from ni_hf.training import data_transfer, run_flow, run_setup
from ni_hf.training.checkpoints import load_checked
from ni_hf.training.evaluation import CopiedPredictionsMixin, evaluate_multitask_accuracy
from ni_hf.training.paths import check_model_path
from ni_hf.training.presets import Preset, parse_with_presets, preset_field

logger = logging.getLogger(__name__)

TRAINING_STUDIES = STUDIES[:3]
# The studies that act on a Neural Interpreter's functions (or function iterations); a multi-task ViT has none.
FUNCTION_STUDIES = STUDIES[1:]
# The argument dataclass's defaults are the paper's settings.
PRESETS = {
    "paper": Preset(help="the paper's settings: N = 128, 512, 2048, 8192, 6 seeds, 10 epochs, k = 0-3 added functions"),
    "quick": Preset(
        help="every study at tiny settings, a check of the pipeline in about a minute",
        arguments=dict(num_train_samples=[32, 64], adaptation_seeds=[0, 1], adapt_epochs=1.0,
                       capacity_new_functions=[0, 1], capacity_train_samples=32, max_eval_samples=64, dropped_draws=2),
    ),
}  # fmt: skip
# TrainingArguments that every fine-tuning run sets itself, with the option to use instead.
RUN_FIELDS = {
    "learning_rate": "--adapt_learning_rate / --capacity_learning_rate",
    "num_train_epochs": "--adapt_epochs",
    "max_steps": "--adapt_epochs",
    "per_device_train_batch_size": "--batch_size (the global batch)",
    "gradient_accumulation_steps": "--batch_size (the global batch)",
    "lr_scheduler_type": "nothing: the rate is constant",
    "warmup_steps": "nothing: the rate is constant",
    "optim": "nothing: every run uses RAdam (betas --adam_beta1/--adam_beta2, eps --adam_epsilon)",
    "seed": "--adaptation_seeds",
    "data_seed": "--adaptation_seeds",
    "radam": "nothing: every run uses RAdam",
    "do_train": "--studies dropped_functions,function_iterations (the studies without training)",
    "do_eval": "nothing: every study's result is a test accuracy",
    "save_strategy": "nothing: a run keeps no model or checkpoint, only its accuracy",
}
# Options of a training script that the studies have no use for, with the reason.
UNUSED_OPTIONS = {
    "resume_from_checkpoint": "every run starts from --model_name_or_path; rerun a study instead",
    "max_train_minutes": "the runs have no time limit; lower --adapt_epochs or the sizes instead",
    "push_to_hub": "the studies write results and plots, not a model; upload --output_dir with `hf upload`",
}
RESULTS = "adaptation_results"
PROG = "run_digits_adaptation.py"


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
    preset: str | None = preset_field(PRESETS, default="paper")
    allow_mismatched_weights: bool = field(
        default=False,
        metadata={"help": "Load --model_name_or_path even if its weights do not fit its model."},
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
        metadata={"help": "The new dataset (paper: K-MNIST, 'kmnist'; also 'fashion_mnist', 'mnist')."},
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
        metadata={"help": "Constant RAdam learning rate (paper: 0.05; 0.03 for the multi-task ViT)."},
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
        metadata={"help": "capacity_extension: RAdam learning rate (the paper grid-searched Shampoo's)."},
    )
    max_eval_samples: int | None = field(
        default=None,
        metadata={"help": "At most this many test samples per dataset (a seeded subset; default: all)."},
    )
    dropped_draws: int = field(
        default=10,
        metadata={
            "help": "dropped_functions: random draws of the dropped functions for each k; when there are at most "
            "this many possible choices, each of them once instead."
        },
    )
    eval_batch_size: int = field(default=256, metadata={"help": "Batch size of the evaluation loops."})

    def study_names(self) -> list[str]:
        """The studies asked for, in the given order."""
        return [study.strip() for study in self.studies.split(",") if study.strip()]


@dataclass
class AdaptationTrainingArguments(run_setup.ExampleTrainingArguments):
    """TrainingArguments for the fine-tuning runs; the fields in RUN_FIELDS are set by every run."""

    save_strategy: str = field(default="no", metadata={"help": "Checkpoints of the many short runs: none."})
    logging_steps: float = field(
        default=50, metadata={"help": "Log the training loss every this many steps."}
    )
    disable_tqdm: bool | None = field(
        default=True, metadata={"help": "The Trainer's own bar per run (off: the studies show one bar each)."}
    )
    dataloader_num_workers: int | None = field(
        default=None, metadata={"help": data_transfer.DATALOADER_WORKERS_HELP}
    )


class AdaptationTrainer(CopiedPredictionsMixin, Trainer):
    """Trainer whose evaluation keeps every batch's logits when the model runs through CUDA graphs."""


ARGUMENTS = (AdaptationArguments, AdaptationTrainingArguments)


# --- arguments ----------------------------------------------------------------------------------------------


def memory_needed(
    exp: AdaptationArguments,
    studies: list[str],
    base: TrainingArguments,
    config: transformers.PretrainedConfig,
) -> int:
    """A lower bound of the bytes one batch needs on the device: the set of the largest batch (patches + CLS tokens
    of width hidden_size), which every layer holds, and one sample's work per function of the widest model
    (capacity_extension's added functions): the attention weights of Eq. 6 (one per head and pair of tokens) and
    the outputs of Eq. 7 (one per token)."""
    tokens = (config.image_size // config.patch_size) ** 2 + max(len(config.task_names), 1)
    functions = getattr(config, "num_functions", 1)
    if "capacity_extension" in studies:
        functions += max(exp.capacity_new_functions)
    batch = max(exp.batch_size // base.world_size, exp.eval_batch_size)
    per_function = config.num_attention_heads * tokens**2 + tokens * config.hidden_size
    return 4 * (batch * tokens * config.hidden_size + functions * per_function)


def refuse_run_fields(argv: Sequence[str]) -> None:
    """Refuse the TrainingArguments that every fine-tuning run sets itself (RUN_FIELDS), naming the option to use.

    Checked before ``run_flow.parse_arguments``' shared checks, whose advice for some of these fields (--radam false
    to use --optim, --do_train false) does not hold for this script.
    """
    with run_setup.exit_on_bad_arguments(PROG):
        _, base = parse_args(list(argv))
        run_setup.check_fields_left_alone(base, RUN_FIELDS, "every fine-tuning run sets it")


def check_arguments(
    exp: AdaptationArguments, base: TrainingArguments, given: frozenset[str] = frozenset()
) -> None:
    """Refuse, naming the option, every value that would fail or be ignored later, before any data is loaded
    (``run_flow.parse_arguments``' check; the fields of RUN_FIELDS are refused before it)."""
    for name, reason in UNUSED_OPTIONS.items():
        run_flow.refuse_unused(given, [name], reason)
    for name, minimum in (("num_train_samples", 1), ("adaptation_seeds", 0), ("capacity_new_functions", 0)):
        values = getattr(exp, name)
        run_setup.check_at_least(f"--{name}", values, minimum)
        if len(set(values)) != len(values):
            raise ValueError(f"--{name} {' '.join(map(str, values))}: expected each value once.")
    for name in ("capacity_train_samples", "max_eval_samples", "dropped_draws", "eval_batch_size"):
        run_setup.check_at_least(f"--{name}", getattr(exp, name), 1)
    for name in ("adapt_epochs", "adapt_learning_rate", "capacity_learning_rate"):
        run_setup.check_positive(f"--{name}", getattr(exp, name))
    run_setup.per_device_batch_size(exp.batch_size, base.world_size)
    exp.model_name_or_path = check_model_path(exp.model_name_or_path)
    exp.dataset_source = resolve_dataset_source(exp.dataset_source, exp.data_dir)
    studies = studies_to_run(exp)
    # Weights that do not fit the model are refused here, before any data.
    config = load_pretrained(exp.model_name_or_path, exp.allow_mismatched_weights).config
    known = known_task_names(exp.dataset_source)
    new_task = canonical_task_name(exp.new_task)
    if exp.dataset_source != "local" and new_task not in known and set(studies) & set(TRAINING_STUDIES):
        raise ValueError(
            f"--new_task {exp.new_task}: not a dataset of --dataset_source {exp.dataset_source}; expected one of {known}."
        )
    flags = f"--batch_size {exp.batch_size} and --eval_batch_size {exp.eval_batch_size}"
    if "capacity_extension" in studies:
        flags += f" and --capacity_new_functions {max(exp.capacity_new_functions)}"
    run_setup.check_memory(memory_needed(exp, studies, base, config), base.device, flags, "for one batch")


def studies_to_run(exp: AdaptationArguments) -> list[str]:
    """The studies asked for (``--studies``); for a multi-task ViT checkpoint, those it has: the function studies
    are refused when asked for by name, and left out of the default."""
    studies = exp.study_names()
    unknown = [s for s in studies if s not in STUDIES]
    if unknown or not studies:
        raise ValueError(f"--studies: unknown {unknown or 'none given'}; expected some of {list(STUDIES)}.")
    needs_functions = [s for s in studies if s in FUNCTION_STUDIES]
    if not (needs_functions and is_vit_checkpoint(exp.model_name_or_path)):
        return studies
    if exp.studies != AdaptationArguments.studies:
        raise ValueError(
            f"--studies {','.join(needs_functions)}: {exp.model_name_or_path} is a multi-task ViT, and these "
            "studies act on a Neural Interpreter's functions (re-drawn, added or dropped); a ViT checkpoint "
            "runs fast_adaptation only."
        )
    return [s for s in studies if s not in FUNCTION_STUDIES]


def check_sizes(exp: AdaptationArguments, studies: list[str], available: int, task_name: str) -> None:
    """Every training set size the studies will draw must fit in the new dataset's training split."""
    requested = {}
    if {"fast_adaptation", "reinitialized_functions"} & set(studies):
        requested["--num_train_samples"] = exp.num_train_samples
    if "capacity_extension" in studies:
        requested["--capacity_train_samples"] = [exp.capacity_train_samples]
    too_large = {option: [n for n in sizes if n > available] for option, sizes in requested.items()}
    if too_large := {option: sizes for option, sizes in too_large.items() if sizes}:
        what = " and ".join(f"{option} {' '.join(map(str, sizes))}" for option, sizes in too_large.items())
        raise ValueError(
            f"{what}: more than the {available} images of the training split of {task_name} "
            f"({exp.dataset_source}); pass sizes of at most {available}."
        )


# --- data and models ----------------------------------------------------------------------------------------


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


def is_vit_checkpoint(path: str) -> bool:
    """Whether the checkpoint is a multi-task ViT (``run_digits.py --architecture vit``), from its config."""
    config_dict, _ = transformers.PretrainedConfig.get_config_dict(path)
    return config_dict.get("model_type") == MultiTaskViTConfig.model_type


def load_pretrained(
    path: str, allow_mismatched_weights: bool = False
) -> NeuralInterpreterForImageClassification | MultiTaskViTForImageClassification:
    """The checkpoint (weights that do not fit are refused), without ``from_pretrained``'s progress bar: a study
    loads it once per run."""
    model_class = (
        MultiTaskViTForImageClassification
        if is_vit_checkpoint(path)
        else NeuralInterpreterForImageClassification
    )
    transformers.utils.logging.disable_progress_bar()
    try:
        model = load_checked(model_class, path, allow_mismatched_weights)
    finally:
        transformers.utils.logging.enable_progress_bar()
    if model.config.problem_type is None:  # not inferred in a compiled forward, which would then recompile
        model.config.problem_type = "single_label_classification"
    return model


def prepare_model(
    path: str,
    task_name: str,
    num_labels: int,
    seed: int,
    reinitialize_functions: bool = False,
    new_functions: int = 0,
    functions_only: bool = False,
    allow_mismatched_weights: bool = False,
) -> NeuralInterpreterForImageClassification | MultiTaskViTForImageClassification:
    """The pre-trained model with a fresh CLS token and head for the new dataset, ready for one study's run.

    ``reinitialize_functions``: draw every function's code and signature anew, N(0, 1) as at initialisation.
    ``new_functions``: capacity extension, k functions appended to every script.
    ``functions_only``: train only codes, signatures, the CLS token and the head (signatures unfrozen).
    """
    set_seed(seed)
    model = load_pretrained(path, allow_mismatched_weights)
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


# --- training and evaluation --------------------------------------------------------------------------------


def finetune(
    model: NeuralInterpreterForImageClassification,
    train: datasets.Dataset,
    base: AdaptationTrainingArguments,
    exp: AdaptationArguments,
    learning_rate: float,
    seed: int,
    output_dir: Path,
) -> dict[str, Any]:
    """Fine-tune with RAdam at a constant rate for ``exp.adapt_epochs``; returns steps, loss and time.

    A study's run keeps only its accuracy, so it trains with ``Trainer.train`` rather than ``ExampleRun.train``,
    which would save every run's model; its RAdam has the run's own rate, not the one of ``ExampleRun.optimizer``.
    """
    args = dataclasses.replace(
        base, output_dir=str(output_dir), learning_rate=learning_rate, lr_scheduler_type="constant", warmup_steps=0,
        num_train_epochs=exp.adapt_epochs, max_steps=-1, per_device_train_batch_size=exp.batch_size // base.world_size,
        seed=seed, data_seed=seed,
    )  # fmt: skip
    betas = (args.adam_beta1, args.adam_beta2)
    optimizer = (torch.optim.RAdam, {"lr": learning_rate, "betas": betas, "eps": args.adam_epsilon})
    trainer = AdaptationTrainer(
        model=model, args=args, train_dataset=train, optimizer_cls_and_kwargs=optimizer
    )
    output = trainer.train()
    return {
        "train_steps": output.global_step,
        "train_runtime_s": output.metrics.get("train_runtime"),
        "final_train_loss": output.training_loss,
    }


# --- studies ------------------------------------------------------------------------------------------------


def run_training_study(
    study: str,
    exp: AdaptationArguments,
    base: AdaptationTrainingArguments,
    train: datasets.Dataset,
    test: datasets.Dataset,
    task_name: str,
    labels: int,
) -> dict[str, Any]:
    """fast_adaptation, reinitialized_functions (accuracy per N over the seeds) or capacity_extension (accuracy per
    number of functions, k added and only codes, signatures, CLS token and head trained)."""
    capacity = study == "capacity_extension"
    keys = exp.capacity_new_functions if capacity else exp.num_train_samples
    runs = [(key, seed) for key in keys for seed in exp.adaptation_seeds]
    # The bar counts training images, so that its estimate weighs a run of 8,192 samples as 128 runs of 64.
    total = sum(exp.capacity_train_samples if capacity else key for key, _ in runs) * exp.adapt_epochs
    bar = tqdm(total=total, desc=study, unit="img", unit_scale=True, disable=not base.should_log)
    out: dict[str, Any] = {}
    for key, seed in runs:
        size = exp.capacity_train_samples if capacity else key
        model = prepare_model(
            exp.model_name_or_path, task_name, labels, seed, reinitialize_functions=study == "reinitialized_functions",
            new_functions=key if capacity else 0, functions_only=capacity,
            allow_mismatched_weights=exp.allow_mismatched_weights,
        )  # fmt: skip
        rate = exp.capacity_learning_rate if capacity else exp.adapt_learning_rate
        info = finetune(
            model, subset(train, size, seed), base, exp, rate, seed, Path(base.output_dir) / study
        )
        acc = evaluate_multitask_accuracy(model, [test], [task_name], exp.eval_batch_size)["accuracy"]
        # capacity_extension's entries: the functions per script after adding k
        name = str(model.config.num_functions) if capacity else str(key)
        entry = out.setdefault(name, {"new_functions": key} if capacity else {})
        entry.setdefault("accuracy", []).append(acc)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        entry.setdefault("details", []).append({"seed": seed, **info, "trainable_parameters": trainable})
        what = f"functions per script {name}, new functions {key}" if capacity else f"training samples {name}"
        logger.info(f"{study}: {what}, seed {seed}: {info['train_steps']} steps, test accuracy {acc:.4f}")
        bar.update(size * exp.adapt_epochs)
    bar.close()
    for entry in out.values():
        entry.update(run_setup.summarize_runs(entry.pop("accuracy")))
    return out


def pretrained_with_tests(
    exp: AdaptationArguments, processor: NeuralInterpreterImageProcessor
) -> tuple[NeuralInterpreterForImageClassification, list[str], list[datasets.Dataset]]:
    """The pre-trained model, its task names and the test split of every pre-training dataset, preprocessed."""
    model = load_pretrained(exp.model_name_or_path, exp.allow_mismatched_weights)
    task_names = list(model.config.task_names)
    # scikit-learn's digits exist only there; every other pre-training dataset comes from --dataset_source.
    sources = {name: "sklearn" if name == SKLEARN_TASK else exp.dataset_source for name in task_names}
    tests = [
        load_task_split(
            name, "test", sources[name], exp.data_dir, max_samples=exp.max_eval_samples
        ).with_transform(DigitsTransform(processor, task_id=i))
        for i, name in enumerate(task_names)
    ]
    logger.info(f"Pre-training datasets {task_names}: {[len(t) for t in tests]} test images")
    return model, task_names, tests


def summarize_per_task(results: list[dict[str, float]]) -> dict[str, Any]:
    """Mean, std and count of every accuracy (overall and per task) over several evaluations."""
    return {key: run_setup.summarize_runs([r[key] for r in results]) for key in results[0]}


def run_function_iterations(
    exp: AdaptationArguments, processor: NeuralInterpreterImageProcessor, show_progress: bool = True
) -> dict[str, Any]:
    """Anytime inference: accuracy on the pre-training datasets after 1, 2, ... of the trained iterations."""
    model, task_names, tests = pretrained_with_tests(exp, processor)
    trained = max(model.config.iterations_per_script)
    out: dict[str, Any] = {}
    for n in tqdm(range(1, trained + 1), desc="function_iterations", disable=not show_progress):
        result = evaluate_multitask_accuracy(
            model, tests, task_names, exp.eval_batch_size, num_function_iterations=n
        )
        out[str(n)] = summarize_per_task([result])
        logger.info(f"function_iterations: {n} of {trained}: accuracy {out[str(n)]['accuracy']['mean']:.4f}")
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
        draws = [
            {s: sorted(int(u) for u in functions) for s, functions in choice.items()} for choice in choices
        ]
        results = [
            evaluate_multitask_accuracy(
                model, tests, task_names, exp.eval_batch_size, disabled_functions=draw if k else None
            )
            for draw in draws
        ]
        out[str(k)] = {"draws": draws, **summarize_per_task(results)}
        logger.info(
            f"dropped_functions: {k} of {num_functions} dropped: accuracy {out[str(k)]['accuracy']['mean']:.4f}"
        )
    return out


# --- main ---------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> tuple[AdaptationArguments, AdaptationTrainingArguments]:
    """The command line, with ``--preset``'s values as defaults, without the checks of ``main``."""
    return parse_with_presets(HfArgumentParser(ARGUMENTS), PRESETS, argv)


@dataclass
class NewTask:
    """The new dataset of the training studies: its training split, test split (preprocessed) and classes."""

    name: str
    train: datasets.Dataset
    test: datasets.Dataset
    num_labels: int


def load_new_task(
    exp: AdaptationArguments, studies: list[str], processor: NeuralInterpreterImageProcessor
) -> NewTask:
    """The new dataset, after checking that its training split holds every size the studies draw (else exit 2)."""
    name = canonical_task_name(exp.new_task)
    train = load_task_split(exp.new_task, "train", exp.dataset_source, exp.data_dir)
    with run_setup.exit_on_bad_arguments(PROG):
        check_sizes(exp, studies, len(train), name)
    test = load_task_split(
        exp.new_task, "test", exp.dataset_source, exp.data_dir, max_samples=exp.max_eval_samples
    )
    return NewTask(
        name=name,
        train=train.with_transform(DigitsTransform(processor, task_id=0)),
        test=test.with_transform(DigitsTransform(processor, task_id=0)),
        num_labels=num_classes(train),
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the requested studies; write and return the results."""
    argv = run_flow.argv_of(argv)
    refuse_run_fields(argv)
    exp, base = run_flow.parse_arguments(ARGUMENTS, PRESETS, argv, check=check_arguments, prog=PROG)
    studies = studies_to_run(exp)
    processor = NeuralInterpreterImageProcessor()
    # Loaded before the run starts, so that a size the split cannot give is refused with nothing written.
    training = [s for s in studies if s in TRAINING_STUDIES]
    new_task = load_new_task(exp, training, processor) if training else None
    with run_flow.ExampleRun.start(__file__, argv, base, logger) as run:
        return run_studies(run, exp, studies, processor, new_task)


def run_studies(
    run: run_flow.ExampleRun,
    exp: AdaptationArguments,
    studies: list[str],
    processor: NeuralInterpreterImageProcessor,
    new_task: NewTask | None,
) -> dict[str, Any]:
    """Each study in turn, then the results and plots (main process)."""
    base = run.args
    # transformers' INFO at each of the many Trainers and checkpoint loads would bury the studies' own log.
    if base.log_level == "passive":
        transformers.utils.logging.set_verbosity_warning()
    if data_transfer.compile_for_static_batches(base):
        logger.info(data_transfer.STATIC_BATCHES_NOTE)
    vit = is_vit_checkpoint(exp.model_name_or_path)
    left_out = [s for s in exp.study_names() if s not in studies]
    if left_out:
        logger.info(
            f"{exp.model_name_or_path} is a multi-task ViT: running {', '.join(studies)} only ({', '.join(left_out)} "
            "need a Neural Interpreter's functions)."
        )
    results: dict[str, Any] = {
        "model": exp.model_name_or_path,
        "architecture": "vit" if vit else "neural_interpreter",
        "new_task": canonical_task_name(exp.new_task),
        "arguments": dataclasses.asdict(exp),
        "studies": studies,
    }
    if new_task is not None:
        logger.info(
            f"New dataset {new_task.name} ({exp.dataset_source}): {len(new_task.train)} training images available, "
            f"{len(new_task.test)} test images, {new_task.num_labels} classes"
        )
    for study in (s for s in studies if s in TRAINING_STUDIES):
        results[study] = run_training_study(
            study, exp, base, new_task.train, new_task.test, new_task.name, new_task.num_labels
        )
    if "dropped_functions" in studies:
        results["dropped_functions"] = run_dropped_functions(exp, processor, show_progress=base.should_log)
    if "function_iterations" in studies:
        results["function_iterations"] = run_function_iterations(
            exp, processor, show_progress=base.should_log
        )
    results["environment"] = run_setup.environment(base)
    if run.is_main_process:
        write_results_and_plots(results, Path(base.output_dir))
    return results


def write_results_and_plots(results: dict[str, Any], output_dir: Path) -> None:
    """adaptation_results.{json,md} and one PNG per study (without matplotlib, none, with a warning)."""
    run_setup.write_results(output_dir, RESULTS, results, results_markdown([results]))
    try:
        plots = write_plots([results], output_dir)
    except ImportError:
        logger.warning("matplotlib is not installed (pip install 'ni_hf[vis]'): no plots drawn.")
    else:
        logger.info(f"Plots: {', '.join(str(p) for p in plots)}")


if __name__ == "__main__":
    main()
