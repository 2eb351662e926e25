#!/usr/bin/env python
"""Fuzzy Boolean expressions with Neural Interpreters: pre-training and adaptation (paper Table 1).

Rahaman et al., "Dynamic Inference with Neural Interpreters" (NeurIPS 2021), section 4.1 and the appendix
"Learning Fuzzy Boolean Expressions". A Neural Interpreter (the paper's ``fuzzy_boolean`` preset) is pre-trained
to regress 20 random fuzzy Boolean functions of 5 variables at once (one CLS token per function, a shared
regression head), then adapted to 10 new functions with 10 fresh CLS tokens in three settings, each starting from
the same pre-trained checkpoint:

* ``cls_tokens``: only the new CLS tokens are trained;
* ``type_inference``: + the type-inference MLPs and the function signatures of every script (type matching);
* ``all``: + all remaining parameters (the whole model).

Metric: R^2 = 1 - SSE/SST of every function on its test split, mean and population std over the functions, beside
the paper's values. Presets (``--preset``): ``full`` is the paper's protocol (163840 points per function, 80/20
split, batch 128, 20 + 3 epochs, RAdam 6e-3 / 5e-2, constant learning rate); ``reduced`` keeps its epochs on a
tenth of the points; ``quick`` is a smoke test of a few seconds. Every value can be overridden by its flag.

Outputs in ``--output_dir``: ``pretrain/`` and ``adapt-<setting>/`` (each model with its weights' SHA-256 in
``weights_sha256.json``, checked wherever it is loaded), ``fuzzy_boolean_results.{json,md}``, the model code, and ``README.md``, a model card with the measured R^2 as Hub ``model-index`` results and each saved model's
function usage on held-out points (``routing_<folder>_usage.json``, and with matplotlib, the `vis` extra, the
pictures ``routing_<folder>_{path,usage}.png``); ``--push_to_hub`` uploads the folder at the very end.

Examples::

    python examples/run_fuzzy_boolean.py --preset quick --output_dir /tmp/fb-quick
    python examples/run_fuzzy_boolean.py --preset full --output_dir runs/fb-full
    # the full protocol in pieces: checkpoint every 1024 steps; rerun the same command to continue (a finished
    # pre-training is not resumed: adapt it with --pretrained_model runs/fb-full/pretrain)
    python examples/run_fuzzy_boolean.py --preset full --output_dir runs/fb-full \
        --save_strategy steps --save_steps 1024 --save_total_limit 2 --resume_from_checkpoint last
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import HfArgumentParser, PretrainedConfig, Trainer, TrainingArguments, set_seed

from ni_hf import NeuralInterpreterConfig, NeuralInterpreterForSetRegression
from ni_hf.data.fuzzy_boolean import TensorBatchDataset, batch_collator, make_fuzzy_boolean_tensors
from ni_hf.training import (
    checkpoints,
    data_transfer,
    evaluation,
    model_cards,
    paths,
    publishing,
    run_flow,
    run_setup,
)
from ni_hf.training.presets import Preset, parse_with_presets, preset_field

logger = logging.getLogger("run_fuzzy_boolean")
PROG = "run_fuzzy_boolean.py"

# The dataclass defaults are the paper's protocol; the other presets change its sizes.
PRESETS = {
    "full": Preset(
        help="the paper's protocol (163840 points per function, batch 128, 20 pre-training epochs = 20480 steps, "
        "3 adaptation epochs = 3072 steps per setting)"
    ),
    "reduced": Preset(
        help="a tenth of the points per function, a check of the pipeline: 16384 points, 2060 + 309 steps",
        arguments={"points_per_function": 16384},
    ),
    "quick": Preset(
        help="a few steps on a few hundred points, a smoke test: 320 points, batch 32, 4 + 2 steps",
        arguments=dict(points_per_function=320, batch_size=32, pretrain_epochs=1.0, adapt_epochs=1.0,
                       pretrain_max_steps=4, adapt_max_steps=2),
    ),
}  # fmt: skip
# Parameter groups (see parameter_group) that each adaptation setting trains.
SETTING_GROUPS: dict[str, set[str]] = {
    "cls_tokens": {"task_tokens"},
    "type_inference": {"task_tokens", "type_matching"},
    "all": {"task_tokens", "type_matching", "other"},
}
# The options whose paper values (the dataclass defaults) define the protocol: a run that changes one deviates.
PROTOCOL_OPTIONS = (
    "points_per_function", "batch_size", "pretrain_epochs", "adapt_epochs", "pretrain_max_steps", "adapt_max_steps",
    "test_fraction", "num_pretrain_functions", "num_adapt_functions", "pretrain_learning_rate", "adapt_learning_rate",
    "adapt_pretrained_learning_rate",
)  # fmt: skip
# TrainingArguments that the protocol sets for each phase, with the option to use instead.
PHASE_FIELDS = {
    "learning_rate": "--pretrain_learning_rate / --adapt_learning_rate",
    "num_train_epochs": "--pretrain_epochs / --adapt_epochs",
    "max_steps": "--pretrain_max_steps / --adapt_max_steps",
    "per_device_train_batch_size": "--batch_size (the global batch)",
    "gradient_accumulation_steps": "--batch_size (the global batch)",
    "lr_scheduler_type": "nothing: the paper's rate is constant",
    "warmup_steps": "nothing: the paper uses no warm-up",
    "optim": "nothing: both phases use RAdam, as the paper (betas --adam_beta1/--adam_beta2, eps --adam_epsilon)",
    "radam": "nothing: both phases use RAdam, as the paper",
    "do_train": "--pretrained_model (no pre-training) or --settings none (no adaptation)",
    "do_eval": "nothing: every phase is evaluated (its R^2 is the result)",
}
NUM_VARIABLES = 5
RESULTS = "fuzzy_boolean_results"
DENSITY_POINTS = 4096
"""Test points on which each model's routing density is measured."""


@dataclass
class FuzzyBooleanArguments:
    """The experiment: data and the two phases; the defaults are the paper's protocol (``--preset full``)."""

    preset: str | None = preset_field(PRESETS, default="full")
    points_per_function: int = field(
        default=163840, metadata={"help": "Points (train + test) of each group of functions."}
    )
    test_fraction: float = field(
        default=0.2, metadata={"help": "Fraction of the points held out for testing."}
    )
    num_pretrain_functions: int = field(default=20, metadata={"help": "Functions of the pre-training task."})
    num_adapt_functions: int = field(default=10, metadata={"help": "New functions of the adaptation task."})
    dataset_seed: int = field(default=0, metadata={"help": "Seed of the truth tables and the input points."})
    adapt_dataset_seed: int | None = field(
        default=None,
        metadata={
            "help": "Draw the adaptation functions and points from this seed instead (the pre-training data stay "
            "those of --dataset_seed): another draw of the new functions."
        },
    )
    batch_size: int = field(
        default=128,
        metadata={
            "help": "Global training batch of both phases (paper: 128); with several processes each takes an "
            "equal share."
        },
    )
    pretrain_epochs: float = field(default=20.0, metadata={"help": "Pre-training epochs (paper: 20)."})
    adapt_epochs: float = field(default=3.0, metadata={"help": "Adaptation epochs per setting (paper: 3)."})
    pretrain_max_steps: int = field(
        default=-1, metadata={"help": "Pre-train for this many steps instead of the epochs (-1: the epochs)."}
    )
    adapt_max_steps: int = field(
        default=-1,
        metadata={"help": "Adapt for this many steps per setting instead of the epochs (-1: the epochs)."},
    )
    pretrain_learning_rate: float = field(
        default=6e-3, metadata={"help": "RAdam learning rate of pre-training (paper: 6e-3, constant)."}
    )
    adapt_learning_rate: float = field(
        default=5e-2,
        metadata={
            "help": "RAdam learning rate of adaptation (paper: 5e-2, constant). At 5e-2 the 'all' setting collapses "
            "to a constant prediction in our runs; see examples/README.md."
        },
    )
    adapt_pretrained_learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "A rate of their own for the pre-trained parameters a setting adapts, the new CLS tokens keeping "
            "--adapt_learning_rate (the paper's table does not say which parameters its fine-tuning rate applies "
            "to; 0.006 reads it as the pre-training rate). Default: --adapt_learning_rate for every parameter."
        },
    )
    settings: str = field(
        default="cls_tokens,type_inference,all",
        metadata={"help": "Comma-separated settings to adapt (cls_tokens, type_inference, all), or 'none'."},
    )
    pretrained_model: str | None = field(
        default=None,
        metadata={"help": "Skip pre-training: adapt this pre-trained model (a save_pretrained folder)."},
    )
    allow_mismatched_weights: bool = field(
        default=False, metadata={"help": "Load --pretrained_model even if its weights do not fit its model."}
    )
    model_card_template: str = field(
        default=str(model_cards.DEFAULT_FUZZY_BOOLEAN_TEMPLATE),
        metadata={"help": "Jinja template of the model card written to <output_dir>/README.md."},
    )

    def setting_names(self) -> list[str]:
        """The adaptation settings to run, in the given order."""
        if self.settings.strip().lower() == "none":
            return []
        return [name.strip() for name in self.settings.split(",")]


@dataclass
class FuzzyBooleanTrainingArguments(run_setup.ExampleTrainingArguments):
    """TrainingArguments with this experiment's defaults; the fields in PHASE_FIELDS are set per phase."""

    output_dir: str | None = field(
        default="runs/fuzzy_boolean", metadata={"help": "Where the models and results are written."}
    )
    per_device_eval_batch_size: int = field(default=1024, metadata={"help": "Evaluation batch size."})
    logging_steps: float = field(
        default=50, metadata={"help": "Log the training loss every this many steps."}
    )
    save_strategy: str = field(
        default="no", metadata={"help": "Intermediate checkpoints (the final models are always saved)."}
    )
    max_grad_norm: float = field(default=0.0, metadata={"help": "Gradient clipping (0: none, as the paper)."})


ARGUMENTS = (FuzzyBooleanArguments, FuzzyBooleanTrainingArguments)


# --- argument checks ----------------------------------------------------------------------------------------


def memory_needed(
    exp: FuzzyBooleanArguments, eval_batch: int, config: PretrainedConfig | None = None
) -> dict[str, int]:
    """Lower bounds of the bytes a run needs: the data (host), one batch and one sample's attention (device).

    Data: both groups' float32 inputs and targets, plus the larger group's float64 targets while they are made.
    Batch: the CLS tokens with their gradients and RAdam's two moments, and the set of the largest batch (5 +
    functions tokens of width hidden_size), which every layer holds. Attention: the weights of Eq. 6 of one
    sample, one per function, head and pair of tokens.
    """
    config = config or NeuralInterpreterConfig.from_paper("fuzzy_boolean")
    points = exp.points_per_function
    num_test = round(points * exp.test_fraction)
    functions = max(exp.num_pretrain_functions, exp.num_adapt_functions)
    tokens = NUM_VARIABLES + functions
    hidden = config.hidden_size
    batch = max(min(exp.batch_size, points - num_test), min(eval_batch, num_test))
    floats = 2 * NUM_VARIABLES + exp.num_pretrain_functions + exp.num_adapt_functions
    return {
        "data": points * (4 * floats + 8 * functions),
        "model": 4 * 4 * functions * hidden + 4 * batch * tokens * hidden,
        "attention": 4 * config.num_functions * config.num_attention_heads * tokens**2,
    }


def load_pretrained(exp: FuzzyBooleanArguments) -> NeuralInterpreterForSetRegression:
    """--pretrained_model: a saved fuzzy-Boolean regressor (weights that do not fit it, or differ from their
    recorded checksum, are refused) of --num_pretrain_functions functions."""
    exp.pretrained_model = paths.check_model_path(exp.pretrained_model, "--pretrained_model")
    config = checkpoints.read_checkpoint_config(exp.pretrained_model, "--pretrained_model")
    saved = config.get("architectures") or [config.get("model_type", "model of no model_type")]
    if NeuralInterpreterForSetRegression.__name__ not in saved:
        raise ValueError(
            f"--pretrained_model {exp.pretrained_model}: its config.json describes a {', '.join(saved)}; expected "
            "the NeuralInterpreterForSetRegression of this script's pre-training (<output_dir>/pretrain)."
        )
    model = checkpoints.load_checked(
        NeuralInterpreterForSetRegression,
        exp.pretrained_model,
        exp.allow_mismatched_weights,
        option="--pretrained_model",
    )
    if model.config.num_tasks != exp.num_pretrain_functions:
        raise ValueError(
            f"--pretrained_model {exp.pretrained_model} regresses {model.config.num_tasks} functions; pass "
            f"--num_pretrain_functions {model.config.num_tasks} so that its test data match."
        )
    return model


def refuse_phase_fields(argv: Sequence[str]) -> None:
    """Refuse the TrainingArguments that the protocol sets for each phase (PHASE_FIELDS), naming the option to use.

    Checked before ``run_flow.parse_arguments``' shared checks, whose advice for some of these fields (--radam false
    to use --optim, --do_train false) does not hold for this script.
    """
    with run_setup.exit_on_bad_arguments(PROG):
        _, args = parse_args(argv)
        run_setup.check_fields_left_alone(args, PHASE_FIELDS, "the protocol sets it for each phase")


def check_arguments(
    exp: FuzzyBooleanArguments, args: TrainingArguments, given: frozenset[str] = frozenset()
) -> None:
    """Refuse, naming the option, every value that would fail or be ignored later, and a run that cannot fit, before
    any work (``run_flow.parse_arguments``' check; the fields of PHASE_FIELDS are refused before it)."""
    run_flow.refuse_unused(
        given, ["max_train_minutes"], "the protocol's phases run for their epochs or steps"
    )
    for name in ("points_per_function", "batch_size", "num_pretrain_functions", "num_adapt_functions"):
        run_setup.check_at_least(f"--{name}", getattr(exp, name), 1)
    for name in ("dataset_seed", "adapt_dataset_seed"):
        if (getattr(exp, name) or 0) < 0:
            raise ValueError(f"--{name} must be >= 0 (a numpy seed), got {getattr(exp, name)}.")
    if not 0 < exp.test_fraction < 1:
        raise ValueError(f"--test_fraction must lie strictly between 0 and 1, got {exp.test_fraction}.")
    num_test = round(exp.points_per_function * exp.test_fraction)
    if num_test < 2 or exp.points_per_function - num_test < 1:
        raise ValueError(
            f"--points_per_function {exp.points_per_function} with --test_fraction {exp.test_fraction} leaves "
            f"{exp.points_per_function - num_test} training and {num_test} test points; R^2 needs at least 1 and 2."
        )
    check_phases(exp, args)
    run_setup.per_device_batch_size(exp.batch_size, args.world_size)
    model_cards.check_model_card_template(exp.model_card_template)
    if args.push_to_hub:
        publishing.check_push(args)
    if exp.pretrained_model and args.resume_from_checkpoint:
        raise ValueError(
            "--resume_from_checkpoint continues a pre-training; --pretrained_model skips it: drop one."
        )
    config = load_pretrained(exp).config if exp.pretrained_model else None
    check_fits(exp, args, config)
    if not exp.pretrained_model:
        pretrain = phase_arguments(args, exp, "pretrain")
        pretraining_resume_point(args.resume_from_checkpoint, Path(pretrain.output_dir), pretrain)


def check_phases(exp: FuzzyBooleanArguments, args: TrainingArguments) -> None:
    """Refuse a phase's length or learning rate that would train nothing or fail, and settings that do not exist."""
    for phase in ("pretrain", "adapt"):
        epochs, steps = getattr(exp, f"{phase}_epochs"), getattr(exp, f"{phase}_max_steps")
        if steps == 0 or steps < -1:
            raise ValueError(
                f"--{phase}_max_steps must be -1 (train for the epochs) or at least 1, got {steps}."
            )
        run_setup.check_positive(f"--{phase}_epochs", epochs)
    for name in ("pretrain_learning_rate", "adapt_learning_rate", "adapt_pretrained_learning_rate"):
        run_setup.check_positive(f"--{name}", getattr(exp, name))
    if exp.adapt_pretrained_learning_rate is not None and args.weight_decay:
        raise ValueError(
            f"--adapt_pretrained_learning_rate builds RAdam groups without weight decay; --weight_decay "
            f"{args.weight_decay} would be ignored there, so drop one of the two."
        )
    settings = exp.setting_names()
    if any(name not in SETTING_GROUPS for name in settings) or len(set(settings)) != len(settings):
        raise ValueError(
            f"--settings {exp.settings!r}: expected distinct names among {list(SETTING_GROUPS)}, or 'none'."
        )


def check_fits(exp: FuzzyBooleanArguments, args: TrainingArguments, config: PretrainedConfig | None) -> None:
    """Refuse a run whose data (host), one batch or one sample's attention (device) cannot fit (``memory_needed``;
    ``config``: the model's, when it is not the paper's preset)."""
    needed = memory_needed(exp, args.per_device_eval_batch_size, config)
    functions = f"--num_pretrain_functions {exp.num_pretrain_functions} and --num_adapt_functions {exp.num_adapt_functions}"
    batches = f"--batch_size {exp.batch_size} (evaluation: --per_device_eval_batch_size {args.per_device_eval_batch_size})"
    tokens = NUM_VARIABLES + max(exp.num_pretrain_functions, exp.num_adapt_functions)
    for part, device, flags, holds in (
        ("data", "cpu", f"--points_per_function {exp.points_per_function} with {functions}", "for the data"),
        ("model", args.device, f"{batches} with {functions}", "for one batch"),
        ("attention", args.device, f"{functions} (sets of up to {tokens} tokens)",
         "for one sample's attention weights (Eq. 6: one per function, head and pair of tokens)"),
    ):  # fmt: skip
        run_setup.check_memory(needed[part], device, flags, holds)


# --- adaptation settings ------------------------------------------------------------------------------------


def parameter_group(name: str) -> str:
    """``task_tokens`` (the CLS tokens), ``type_matching`` (type-inference MLPs and signatures), ``unused`` (the
    patch embedding, which sets never read) or ``other`` (LOCs, codes, sigma, input embedding, head, ...)."""
    if name.startswith("neural_interpreter.patch_embedding."):
        return "unused"
    if name == "neural_interpreter.task_tokens":
        return "task_tokens"
    if re.fullmatch(r"neural_interpreter\.scripts\.\d+\.(type_inference\..+|signatures)", name):
        return "type_matching"
    return "other"


def set_adaptation_trainable(model: torch.nn.Module, setting: str) -> dict[str, int]:
    """Make exactly the parameters of ``setting``'s groups trainable; return the trainable count per group."""
    counts = {"task_tokens": 0, "type_matching": 0, "other": 0}
    for name, param in model.named_parameters():
        group = parameter_group(name)
        param.requires_grad_(group in SETTING_GROUPS[setting])
        if param.requires_grad:
            counts[group] += param.numel()
    return counts


def adaptation_param_groups(
    model: torch.nn.Module, token_learning_rate: float, pretrained_learning_rate: float
) -> list[dict[str, Any]]:
    """RAdam groups: the CLS tokens at one rate, the other trainable (pre-trained) parameters at another."""
    tokens, pretrained = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (tokens if parameter_group(name) == "task_tokens" else pretrained).append(param)
    groups = [
        {"params": tokens, "lr": token_learning_rate},
        {"params": pretrained, "lr": pretrained_learning_rate},
    ]
    return [group for group in groups if group["params"]]


# --- training -----------------------------------------------------------------------------------------------


class FuzzyBooleanTrainer(checkpoints.ExactResumeMixin, evaluation.CopiedPredictionsMixin, Trainer):
    """Trainer that resumes exactly (the same weights as an uninterrupted run, train_loss over the whole run, no
    resume past the end) and whose predictions survive a CUDA-graphed model (dynamo's cudagraphs backend)."""


def phase_arguments(base: TrainingArguments, exp: FuzzyBooleanArguments, phase: str) -> TrainingArguments:
    """A copy of ``base`` for one phase ("pretrain", "adapt-<setting>"): its folder, constant learning rate, each
    process's share of the global batch, and length."""
    kind = phase.split("-")[0]
    return dataclasses.replace(
        base,
        output_dir=str(Path(base.output_dir) / phase),
        learning_rate=getattr(exp, f"{kind}_learning_rate"),
        per_device_train_batch_size=exp.batch_size // base.world_size,
        num_train_epochs=getattr(exp, f"{kind}_epochs"),
        max_steps=getattr(exp, f"{kind}_max_steps"),
        lr_scheduler_type="constant",
    )


def make_trainer(
    model: torch.nn.Module,
    args: TrainingArguments,
    train: TensorBatchDataset,
    test: TensorBatchDataset,
    param_groups: list[dict[str, Any]] | None = None,
) -> Trainer:
    """A Trainer with RAdam at the phase's rate (``args``: a phase's, whose learning rate is not the run's, so not
    ``ExampleRun.optimizer``; ``param_groups``, each with its own ``lr``, replace its single group), the
    whole-batch collator and R^2 metrics."""
    betas = (args.adam_beta1, args.adam_beta2)
    optimizer_kwargs: dict[str, Any] = {"lr": args.learning_rate, "betas": betas, "eps": args.adam_epsilon}
    if param_groups is not None:
        optimizer_kwargs["params"] = param_groups
    return FuzzyBooleanTrainer(
        model=model,
        args=args,
        data_collator=batch_collator,
        train_dataset=train,
        eval_dataset=test,
        compute_metrics=evaluation.compute_r2_metrics,
        optimizer_cls_and_kwargs=(torch.optim.RAdam, optimizer_kwargs),
    )


def pretraining_resume_point(
    resume_from_checkpoint: str | None, pretrain_dir: Path, training_args: TrainingArguments | None = None
) -> str | None:
    """The checkpoint pre-training resumes from (``ni_hf.training.checkpoints.resolve_resume_checkpoint``); for
    "true"/"last" with no complete one yet, None: pre-training starts, so that one command starts and continues.
    With ``training_args`` (pre-training's), a checkpoint at the end of pre-training is refused: its model is final."""
    value = resume_from_checkpoint
    if value is not None and str(value).lower() in checkpoints.RESUME_LAST:
        try:
            value = checkpoints.last_complete_checkpoint(str(pretrain_dir))
        except ValueError:
            if (
                Path(pretrain_dir) / "config.json"
            ).is_file():  # saved at the end only: the pre-training finished
                raise ValueError(
                    f"--resume_from_checkpoint {resume_from_checkpoint}: {pretrain_dir} holds the model of a finished "
                    f"pre-training and no checkpoint-* to resume; pass --pretrained_model {pretrain_dir} instead to "
                    "adapt it, or another --output_dir to train anew."
                ) from None
            logger.info("No complete checkpoint-* in %s yet: pre-training starts from scratch", pretrain_dir)
            return None
    checkpoint = checkpoints.resolve_resume_checkpoint(value, str(pretrain_dir))
    if checkpoint is not None and training_args is not None:
        try:
            checkpoints.check_not_finished(checkpoint, training_args)
        except ValueError as error:
            raise ValueError(
                f"{error} To adapt that model, pass --pretrained_model {pretrain_dir} instead of "
                "--resume_from_checkpoint."
            ) from None
    return checkpoint


def evaluate(
    trainer: Trainer, model: torch.nn.Module, dataset: TensorBatchDataset, batch_size: int, row: str
) -> dict[str, Any]:
    """R^2 per function on ``dataset`` (Trainer.predict), the routing density of ``model`` (the uncompiled module)
    on its first ``DENSITY_POINTS`` points, and the paper's R^2 of Table 1's ``row``, logged beside this run's."""
    output = trainer.predict(dataset, metric_key_prefix="test")
    inputs = dataset.inputs[:DENSITY_POINTS]
    batches = ({"inputs": inputs[i : i + batch_size]} for i in range(0, inputs.shape[0], batch_size))
    density = evaluation.routing_density(model, batches)
    r2 = evaluation.summarize_r2(evaluation.r2_per_function(output.predictions, output.label_ids))
    label, paper_mean, paper_std = model_cards.FUZZY_BOOLEAN_TABLE_1[row]
    logger.info(
        "%s: R^2 over %d functions %.4f ± %.4f (paper %.4f ± %.4f)",
        label, output.label_ids.shape[1], r2["r2_mean"], r2["r2_std"], paper_mean, paper_std,
    )  # fmt: skip
    keys = ("per_iteration", "mean", "functions_per_token_mean", "num_samples")
    return {
        **r2,
        "num_functions": output.label_ids.shape[1],
        "routing_density": {key: density[key] for key in keys},
        "paper_r2_mean": paper_mean,
        "paper_r2_std": paper_std,
    }


def train_phase(run: run_flow.ExampleRun, trainer: Trainer, resume: str | None = None) -> dict[str, Any]:
    """Train from ``resume`` (None: from the start), save the model and its checksum to the phase's folder
    (``ExampleRun.train``), and return what the results record of the training."""
    # "" rather than None, which ExampleRun.train would read as --resume_from_checkpoint in the phase's folder.
    metrics = run.train(trainer, resume=resume or "")
    return {
        "checkpoint": trainer.args.output_dir,
        "train_steps": metrics["global_step"],
        "train_runtime_s": metrics.get("train_runtime"),
        "final_train_loss": metrics["train_loss"],
    }


def protocol_deviations(results: dict[str, Any]) -> list[str]:
    """How a run differs from the paper's protocol (the arguments' defaults), one item each."""
    defaults = {f.name: f.default for f in dataclasses.fields(FuzzyBooleanArguments)}
    paper = dict(defaults)
    run = {**results["arguments"], **results["protocol"]}
    paper.update(
        pretrain_max_steps="the epochs",
        adapt_max_steps="the epochs",
        adapt_pretrained_learning_rate="not set",
    )
    return [
        f"{key} {run[key]} (paper: {paper[key]})" for key in PROTOCOL_OPTIONS if run[key] != defaults[key]
    ]


# --- the phases ---------------------------------------------------------------------------------------------


def protocol_sizes(exp: FuzzyBooleanArguments, world_size: int) -> dict[str, Any]:
    """The protocol as the results record it: sizes, each process's share of the batch, rates, adaptation length."""
    sizes = {key: getattr(exp, key) for key in PROTOCOL_OPTIONS[:6]}
    rates = ("pretrain_learning_rate", "adapt_learning_rate", "adapt_pretrained_learning_rate")
    sizes.update(
        protocol=exp.preset,
        world_size=world_size,
        per_device_batch_size=exp.batch_size // world_size,
        test_fraction=exp.test_fraction,
        **{key: getattr(exp, key) for key in rates},
        adapt_length=f"{exp.adapt_max_steps} steps"
        if exp.adapt_max_steps > 0
        else f"{exp.adapt_epochs:g} epochs",
    )
    return sizes


def make_datasets(exp: FuzzyBooleanArguments) -> dict[str, dict[str, TensorBatchDataset]]:
    """The pre-training and adaptation functions' points: ``{"pretrain"|"adapt": {"train"|"test": dataset}}``."""
    data = make_fuzzy_boolean_tensors(
        num_pretrain_functions=exp.num_pretrain_functions,
        num_adapt_functions=exp.num_adapt_functions,
        points_per_function=exp.points_per_function,
        test_fraction=exp.test_fraction,
        seed=exp.dataset_seed,
        adapt_seed=exp.adapt_dataset_seed,
    )
    return {
        group: {split: TensorBatchDataset(*data[group][split]) for split in ("train", "test")}
        for group in ("pretrain", "adapt")
    }


def pretrain(
    run: run_flow.ExampleRun, exp: FuzzyBooleanArguments, data: dict[str, TensorBatchDataset]
) -> tuple[dict[str, Any], str, Trainer]:
    """Pre-train on the pre-training functions (or load --pretrained_model) and evaluate; return the results, the
    pre-trained model's folder and the Trainer."""
    args = phase_arguments(run.args, exp, "pretrain")
    if exp.pretrained_model:
        model = run.model(
            NeuralInterpreterForSetRegression,
            path=exp.pretrained_model,
            allow_mismatched_weights=exp.allow_mismatched_weights,
            option="--pretrained_model",
        )
        logger.info("Pre-trained model loaded from %s (pre-training skipped)", exp.pretrained_model)
        trainer = make_trainer(model, args, data["train"], data["test"])
        pretraining: dict[str, Any] = {"checkpoint": exp.pretrained_model}
    else:
        resume = pretraining_resume_point(run.args.resume_from_checkpoint, Path(args.output_dir), args)
        set_seed(run.args.seed)
        names = [f"f{i}" for i in range(exp.num_pretrain_functions)]
        config = NeuralInterpreterConfig.from_paper("fuzzy_boolean", task_names=names)
        model = run.model(NeuralInterpreterForSetRegression, config=config)
        trainer = make_trainer(model, args, data["train"], data["test"])
        logger.info(
            "Pre-training %d parameters on %d functions%s", model.num_parameters(), len(names),
            f", resumed from {resume}" if resume else "",
        )  # fmt: skip
        pretraining = {**train_phase(run, trainer, resume), "resumed_from": resume}
    results = {**pretraining, **evaluate(trainer, model, data["test"], exp.batch_size, "pretraining")}
    return results, exp.pretrained_model or args.output_dir, trainer


def adapt(
    run: run_flow.ExampleRun,
    exp: FuzzyBooleanArguments,
    data: dict[str, TensorBatchDataset],
    pretrain_dir: str,
    setting: str,
) -> tuple[dict[str, Any], Trainer]:
    """Adapt the pre-trained model to the new functions in one setting (fresh CLS tokens, the setting's parameter
    groups trained) and evaluate; return the results and the Trainer."""
    model = run.model(
        NeuralInterpreterForSetRegression,
        path=pretrain_dir,
        allow_mismatched_weights=exp.allow_mismatched_weights,
        option="--pretrained_model",
    )
    torch.manual_seed(run.args.seed + 1)  # the same fresh CLS tokens in every setting
    model.neural_interpreter.reset_task_tokens(
        [f"f{exp.num_pretrain_functions + i}" for i in range(exp.num_adapt_functions)]
    )
    counts = set_adaptation_trainable(model, setting)
    param_groups = None
    if exp.adapt_pretrained_learning_rate is not None:
        param_groups = adaptation_param_groups(
            model, exp.adapt_learning_rate, exp.adapt_pretrained_learning_rate
        )
    logger.info("Adaptation %r: trainable parameters %s", setting, counts)
    set_seed(run.args.seed)
    args = phase_arguments(run.args, exp, f"adapt-{setting}")
    trainer = make_trainer(model, args, data["train"], data["test"], param_groups)
    results = {
        "label": model_cards.FUZZY_BOOLEAN_TABLE_1[setting][0],
        "trainable_parameters": counts,
        **train_phase(run, trainer),
        **evaluate(trainer, model, data["test"], exp.batch_size, setting),
    }
    return results, trainer


def write_results_and_card(
    run: run_flow.ExampleRun,
    exp: FuzzyBooleanArguments,
    results: dict[str, Any],
    datasets: dict[str, dict[str, TensorBatchDataset]],
) -> None:
    """fuzzy_boolean_results.{json,md} and the model card with each saved model's routing on held-out points."""
    output_dir = Path(run.args.output_dir)
    markdown = model_cards.fuzzy_boolean_results_markdown(results)
    run_setup.write_results(output_dir, RESULTS, results, markdown)
    test_inputs = {"pretrain": datasets["pretrain"]["test"].inputs}
    test_inputs.update(
        {f"adapt-{setting}": datasets["adapt"]["test"].inputs for setting in results["adaptation"]}
    )
    command, launcher_note = run.command()
    card_path = model_cards.write_fuzzy_boolean_model_card(
        output_dir,
        results,
        markdown=markdown,
        repo_id=publishing.hub_repo_id(run.args),
        command=command,
        launcher_note=launcher_note,
        protocol_note=PRESETS[exp.preset].help,
        deviations=protocol_deviations(results),
        template_path=exp.model_card_template,
        routing=model_cards.fuzzy_boolean_routing_section(output_dir, test_inputs),
    )
    logger.info("Model card written to %s", card_path)


# --- main ---------------------------------------------------------------------------------------------------


def parse_args(
    args: Sequence[str] | None = None,
) -> tuple[FuzzyBooleanArguments, FuzzyBooleanTrainingArguments]:
    """Parse the command line (``args``; default sys.argv) into the two dataclasses, ``--preset``'s values first,
    without the checks of ``main``."""
    return parse_with_presets(HfArgumentParser(ARGUMENTS), PRESETS, args)


def main(args: Sequence[str] | None = None) -> dict[str, Any]:
    """Pre-train, adapt in each setting, evaluate; write the results and the model card, push; return the results."""
    argv = run_flow.argv_of(args)
    refuse_phase_fields(argv)
    exp, base_args = run_flow.parse_arguments(ARGUMENTS, PRESETS, argv, check=check_arguments, prog=PROG)
    with run_flow.ExampleRun.start(__file__, argv, base_args, logger) as run:
        return run_protocol(run, exp)


def run_protocol(run: run_flow.ExampleRun, exp: FuzzyBooleanArguments) -> dict[str, Any]:
    """The data, pre-training, each adaptation setting, the results and the card, the push."""
    start_time = time.perf_counter()
    if data_transfer.compile_for_static_batches(run.args):
        logger.info("torch.compile for static shapes: an epoch's last, smaller batch gets a graph of its own")
    sizes = protocol_sizes(exp, run.args.world_size)
    logger.info("Protocol %s: %s", exp.preset, sizes)
    datasets = make_datasets(exp)
    results: dict[str, Any] = {
        "protocol": sizes,
        "arguments": dataclasses.asdict(exp),
        "seed": run.args.seed,
        "adaptation": {},
    }
    results["pretraining"], pretrain_dir, trainer = pretrain(run, exp, datasets["pretrain"])
    for setting in exp.setting_names():
        results["adaptation"][setting], trainer = adapt(run, exp, datasets["adapt"], pretrain_dir, setting)
    results["environment"] = run_setup.environment(run.args)
    results["wall_time_s"] = time.perf_counter() - start_time
    if run.is_main_process:
        write_results_and_card(run, exp, results, datasets)
    run.finish(trainer, "Neural Interpreter fuzzy-Boolean experiment (examples/run_fuzzy_boolean.py)")
    return results


if __name__ == "__main__":
    main()
