"""Model cards for trained Neural Interpreters: Hub metadata (model-index) plus a Jinja template.

:func:`build_digits_model_card` and :func:`build_fuzzy_boolean_model_card` render templates
(``ni_hf/training/model_cards/*_template.md``) with :meth:`huggingface_hub.ModelCard.from_template`. The
measured numbers go into the card's YAML header as ``model-index`` results (one
:class:`huggingface_hub.EvalResult` per dataset, or per phase of the fuzzy-Boolean experiment), so the Hub shows
them and ``huggingface_hub.ModelCard.load(path).data.eval_results`` reads them back.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import numbers
import os
import platform
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

__all__ = [
    "DEFAULT_DIGITS_TEMPLATE",
    "DEFAULT_FUZZY_BOOLEAN_TEMPLATE",
    "DEFAULT_PGM_TEMPLATE",
    "PGM_TABLE_2",
    "FUZZY_BOOLEAN_TABLE_1",
    "TaskCardInfo",
    "build_digits_model_card",
    "build_fuzzy_boolean_model_card",
    "check_model_card_template",
    "describe_hardware",
    "digits_task_info",
    "digits_eval_results",
    "fuzzy_boolean_eval_results",
    "fuzzy_boolean_results_markdown",
    "fuzzy_boolean_routing_section",
    "mixed_precision",
    "training_hyperparameters",
    "write_digits_model_card",
    "write_fuzzy_boolean_model_card",
    "write_pgm_model_card",
]

logger = logging.getLogger(__name__)

# The templates ship with the package (the repository's top-level ``model_cards/`` links to this folder).
TEMPLATES = Path(__file__).resolve().parent / "model_cards"
DEFAULT_DIGITS_TEMPLATE = TEMPLATES / "digits_template.md"
DEFAULT_FUZZY_BOOLEAN_TEMPLATE = TEMPLATES / "fuzzy_boolean_template.md"
NI_CARD_TAGS = ("neural-interpreters", "image-classification", "multi-task", "digits", "ni_hf")
VIT_CARD_TAGS = (
    "vit",
    "neural-interpreters-baseline",
    "image-classification",
    "multi-task",
    "digits",
    "ni_hf",
)
# The paper's Table 1: label, mean and std of R^2 over the functions, per phase (pre-training, then the adaptation
# settings of examples/run_fuzzy_boolean.py).
FUZZY_BOOLEAN_TABLE_1: dict[str, tuple[str, float, float]] = {
    "pretraining": ("All parameters (pre-training)", 0.9983, 0.0005),
    "cls_tokens": ("Finetuning CLS tokens", 0.9202, 0.0198),
    "type_inference": ("+ type-inference parameters (and signatures)", 0.9857, 0.0034),
    "all": ("+ remaining parameters (all)", 0.9953, 0.0013),
}
FUZZY_BOOLEAN_ROUTING_POINTS = 256
"""Held-out test points on which a fuzzy-Boolean card shows each saved model's function usage."""
# The config settings a digits card lists, per architecture.
NI_SUMMARY_KEYS = (
    "hidden_size",
    "code_dim",
    "num_scripts",
    "num_function_iterations",
    "num_loc_layers",
    "num_functions",
    "num_attention_heads",
    "attention_head_size",
    "type_inference_depth",
    "type_inference_hidden_size",
    "type_dim",
    "truncation_tau",
    "freeze_signatures",
    "freeze_codes",
    "image_size",
    "patch_size",
    "use_relative_positional_bias",
    "share_task_tokens",
)
VIT_SUMMARY_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "qkv_bias",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "image_size",
    "patch_size",
)


@dataclass
class TaskCardInfo:
    """What the card says about one dataset (task).

    Args:
        name: task name, as in ``config.task_names`` (e.g. ``"mnist"``).
        dataset_id: dataset identifier for the model-index (a Hub dataset id such as ``"ylecun/mnist"``
            when the data came from the Hub, else the task name).
        pretty_name: human-readable dataset name.
        source: where the data was read from (Hub id, local folder, or scikit-learn).
        train_samples / eval_samples: number of training / evaluation samples used.
        accuracy: measured test accuracy in [0, 1], or None if not evaluated.
        dataset_config: the dataset's config name on the Hub, if any.
    """

    name: str
    dataset_id: str
    pretty_name: str
    source: str
    train_samples: int | None = None
    eval_samples: int | None = None
    accuracy: float | None = None
    dataset_config: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def mixed_precision(args: Any) -> str:
    """The autocast of a TrainingArguments run as `describe_hardware` and the results name it: bf16, fp16 or no."""
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "no"


def describe_hardware(device: str | None = None, world_size: int = 1, mixed_precision: str = "no") -> str:
    """One line naming the processors the run used: CPU model and cores, GPUs, processes, precision."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    parts = [f"{cpu} ({os.cpu_count()} logical CPU cores visible)"]
    if device is not None and str(device).startswith("cuda") and torch.cuda.is_available():
        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        parts.append(f"{torch.cuda.device_count()} x GPU ({', '.join(names)})")
    elif device is not None:
        parts.append(f"device {device}")
    parts.append(f"{world_size} process{'es' if world_size != 1 else ''}")
    parts.append(f"mixed precision: {mixed_precision}")
    parts.append(f"torch {torch.__version__}")
    return "; ".join(parts)


DIGITS_PRETTY_NAMES = {
    "mnist": "MNIST",
    "mnistm": "MNIST-M",
    "svhn": "SVHN (cropped digits)",
    "kmnist": "Kuzushiji-MNIST",
    "fashion_mnist": "Fashion-MNIST",
    "sklearn_digits": "scikit-learn digits (8x8)",
}


def digits_task_info(
    name: str, source: str, data_dir: str | None, n_train: int, n_eval: int, eval_metrics: Mapping[str, Any]
) -> TaskCardInfo:
    """What a digits card says about one dataset: where it came from, its sizes, its measured accuracy."""
    from ..data.digits import HUB_DATASETS

    spec = HUB_DATASETS.get(name)
    if source == "hub" and spec is not None:
        dataset_id, config_name, origin = spec.repo_id, spec.config, f"Hub: `{spec.repo_id}`"
    elif source == "sklearn":
        dataset_id, config_name, origin = (
            name,
            None,
            "scikit-learn `load_digits` (stratified 80/20 split, seed 0)",
        )
    else:
        dataset_id, config_name, origin = name, None, f"local files under `{data_dir}`"
    return TaskCardInfo(
        name=name,
        dataset_id=dataset_id,
        pretty_name=DIGITS_PRETTY_NAMES.get(name, name),
        source=origin,
        train_samples=n_train,
        eval_samples=int(eval_metrics.get(f"eval_num_samples_{name}", n_eval)),
        accuracy=eval_metrics.get(f"eval_accuracy_{name}"),
        dataset_config=config_name,
    )


def digits_eval_results(tasks: Sequence[TaskCardInfo], split: str = "test") -> list[EvalResult]:
    """One model-index ``EvalResult`` (image classification, accuracy) per evaluated task."""
    results = []
    for task in tasks:
        if not _is_number(task.accuracy):
            continue
        samples = f" ({task.eval_samples} samples)" if task.eval_samples is not None else ""
        results.append(
            EvalResult(
                task_type="image-classification",
                task_name="Image Classification",
                dataset_type=task.dataset_id,
                dataset_name=task.pretty_name,
                dataset_config=task.dataset_config,
                dataset_split=split,
                metric_type="accuracy",
                metric_name=f"Test accuracy{samples}",
                metric_value=round(float(task.accuracy), 6),
            )
        )
    return results


def build_digits_model_card(
    *,
    model_name: str,
    tasks: Sequence[TaskCardInfo],
    template_path: str | os.PathLike | None = None,
    overall_accuracy: float | None = None,
    hub_datasets: Sequence[str] = (),
    license: str | None = "mit",
    tags: Sequence[str] = ("neural-interpreters", "image-classification", "multi-task", "digits", "ni_hf"),
    **template_kwargs: Any,
) -> ModelCard:
    """Render the digits card: model-index metadata from ``tasks``, text from the template (it lists its variables)."""
    card_data = ModelCardData(
        model_name=model_name,
        library_name="transformers",
        pipeline_tag="image-classification",
        license=license,
        tags=list(tags),
        datasets=list(hub_datasets) or None,
        metrics=["accuracy"],
        eval_results=digits_eval_results(tasks) or None,
    )
    return _render(
        card_data,
        _template(template_path, DEFAULT_DIGITS_TEMPLATE),
        model_name=model_name,
        tasks=[_task_row(task) for task in tasks],
        overall_accuracy=_percent(overall_accuracy),
        **template_kwargs,
    )


def training_hyperparameters(args: Any, optimizer: str, train_metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The hyperparameter table of a card, from a run's TrainingArguments and train metrics."""
    world_size = getattr(args, "world_size", 1)
    schedule = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    return {
        "optimizer": optimizer,
        "betas, epsilon": f"({args.adam_beta1}, {args.adam_beta2}), {args.adam_epsilon}",
        "weight decay": args.weight_decay,
        "learning rate": f"{args.learning_rate:g}",
        "schedule": f"{schedule} {args.lr_scheduler_kwargs or ''}, warm-up steps {args.warmup_steps}",
        "batch size (global)": args.per_device_train_batch_size
        * world_size
        * args.gradient_accumulation_steps,
        "epochs": f"{train_metrics.get('epoch', args.num_train_epochs):g}",
        "optimizer steps": train_metrics.get("global_step", "-"),
        "seed": args.seed,
        "processes": world_size,
        "mixed precision": mixed_precision(args),
    }


def write_digits_model_card(
    output_dir: str | os.PathLike,
    *,
    repo_id: str,
    model: Any,
    tasks: Sequence[TaskCardInfo],
    eval_metrics: Mapping[str, Any],
    train_metrics: Mapping[str, Any],
    training_args: Any,
    optimizer: str,
    command: str,
    launcher_note: str,
    randaugment: str | None,
    preset: str | None = None,
    max_eval_samples: int | None = None,
    template_path: str | os.PathLike | None = None,
    extra_limitations: Sequence[str] = (),
) -> Path:
    """Write ``<output_dir>/README.md`` for a digits run of ``examples/run_digits.py``; return its path."""
    import transformers

    from .. import __version__

    config = model.config
    vit = config.model_type == "ni_multitask_vit"
    runtime = train_metrics.get("train_runtime")
    card = build_digits_model_card(
        template_path=template_path,
        model_name=repo_id.split("/")[-1],
        tasks=tasks,
        overall_accuracy=eval_metrics.get("eval_accuracy"),
        hub_datasets=[task.dataset_id for task in tasks if "/" in task.dataset_id],
        tags=VIT_CARD_TAGS if vit else NI_CARD_TAGS,
        repo_id=repo_id,
        config=config,
        architecture="vit" if vit else "neural_interpreter",
        model_class=type(model).__name__,
        eval_samples_total=int(eval_metrics.get("eval_num_samples", 0)),
        eval_subset_note=(
            f"Evaluated on at most {max_eval_samples} test samples per dataset (a seeded random subset), not the "
            "full test sets: the accuracies are estimates."
            if max_eval_samples is not None
            else ""
        ),
        randaugment=randaugment,
        preset=preset,
        training_command=command,
        launcher_note=launcher_note,
        hyperparameters=training_hyperparameters(training_args, optimizer, train_metrics),
        config_summary={key: getattr(config, key) for key in (VIT_SUMMARY_KEYS if vit else NI_SUMMARY_KEYS)},
        num_parameters=f"{sum(p.numel() for p in model.parameters()):,}",
        num_trainable_parameters=f"{sum(p.numel() for p in model.parameters() if p.requires_grad):,}",
        hardware=describe_hardware(
            str(training_args.device), training_args.world_size, mixed_precision(training_args)
        ),
        train_runtime=f"{runtime:.0f} s" if runtime is not None else "not trained in this run",
        transformers_version=transformers.__version__,
        ni_hf_version=__version__,
        extra_limitations=list(extra_limitations),
    )
    path = Path(output_dir) / "README.md"
    card.save(path)
    return path


def _render(card_data: ModelCardData, template: Path, **template_kwargs: Any) -> ModelCard:
    """The one rendering path of every card: the template with its variables, dated now unless given a date."""
    template_kwargs.setdefault("date", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))
    return ModelCard.from_template(card_data, template_path=str(template), **template_kwargs)


def _percent(value: float | None) -> str | None:
    """Format an accuracy in [0, 1] as a percentage with two decimals, or None."""
    if not _is_number(value):
        return None
    return f"{100.0 * float(value):.2f}%"


def _task_row(task: TaskCardInfo) -> Mapping[str, Any]:
    """The fields of one task as the template's results and data tables show them."""
    return {
        "name": task.name,
        "dataset_id": task.dataset_id,
        "pretty_name": task.pretty_name,
        "source": task.source,
        "train_samples": "-" if task.train_samples is None else task.train_samples,
        "eval_samples": "-" if task.eval_samples is None else task.eval_samples,
        "accuracy": _percent(task.accuracy) or "not evaluated",
        **task.extra,
    }


def _template(template_path: str | os.PathLike | None, default: Path) -> Path:
    path = Path(template_path) if template_path is not None else default
    if not path.is_file():
        raise FileNotFoundError(
            f"Model card template {path} not found; expected a Jinja template such as {default} (the package's "
            f"{default.name})."
        )
    return path


def check_model_card_template(path: str | os.PathLike, option: str = "--model_card_template") -> None:
    """Refuse a card template that does not exist or does not parse as Jinja, naming ``option`` and the line."""
    import jinja2

    if not Path(path).is_file():
        raise ValueError(f"{option} {path} does not exist.")
    try:
        jinja2.Environment().parse(Path(path).read_text())
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"{option} {path}: {error} (line {error.lineno}).") from None


def _is_number(value: Any) -> bool:
    """A measured value: a real number, not None and not NaN (what a metric left unevaluated reads as)."""
    return isinstance(value, numbers.Real) and not math.isnan(value)


def fuzzy_boolean_eval_results(results: Mapping[str, Any]) -> list[EvalResult]:
    """One model-index ``EvalResult`` (mean R^2 over its functions) per phase of a run_fuzzy_boolean.py run."""
    arguments = results.get("arguments", {})
    form = arguments.get("function_form", "canonical")
    seed = arguments.get("dataset_seed", 0)
    adapt_seed = arguments.get("adapt_dataset_seed")
    # The Hub groups model-index results by task and dataset (type, config, split): one group for the
    # pre-training functions, one for the new functions, whose metrics name the adaptation setting.
    phases = [("pretraining", "pre-training functions", seed, "", results.get("pretraining", {}))]
    for info in results.get("adaptation", {}).values():
        group_seed = seed if adapt_seed is None else adapt_seed
        phases.append(("new", "new functions", group_seed, f"; adapted: {info['label']}", info))
    evaluated = []
    for kind, group, group_seed, setting, info in phases:
        if not _is_number(info.get("r2_mean")):
            continue
        evaluated.append(
            EvalResult(
                task_type="tabular-regression",
                task_name="Set regression of fuzzy Boolean functions",
                dataset_type=f"fuzzy-boolean-functions-{kind}",
                dataset_name=f"Fuzzy Boolean functions of 5 variables ({group})",
                dataset_config=f"seed {group_seed}, {form} sums of products",
                dataset_split="test",
                metric_type="r_squared",
                metric_name=f"R^2, mean over {info.get('num_functions', '?')} functions{setting}",
                metric_value=round(float(info["r2_mean"]), 6),
            )
        )
    return evaluated


def build_fuzzy_boolean_model_card(
    *,
    model_name: str,
    results: Mapping[str, Any],
    template_path: str | os.PathLike | None = None,
    license: str | None = "mit",
    tags: Sequence[str] = ("neural-interpreters", "fuzzy-boolean", "set-regression", "multi-task", "ni_hf"),
    routing: str = "",
    **template_kwargs: Any,
) -> ModelCard:
    """Render the fuzzy-Boolean card: model-index metadata from ``results`` (run_fuzzy_boolean.py's results
    dict), text from the Jinja template (``model_cards/fuzzy_boolean_template.md`` lists what it reads), and the
    ``routing`` Markdown (function usage, see ``ni_hf.visualization.write_set_routing_card_assets``) at its end."""
    card_data = ModelCardData(
        model_name=model_name,
        library_name="transformers",
        license=license,
        tags=list(tags),
        metrics=["r_squared"],
        eval_results=fuzzy_boolean_eval_results(results) or None,
    )
    card = _render(
        card_data,
        _template(template_path, DEFAULT_FUZZY_BOOLEAN_TEMPLATE),
        model_name=model_name,
        **template_kwargs,
    )
    if routing.strip():
        card.text = card.text.rstrip() + "\n\n" + routing.strip() + "\n"
    return card


def _r2(mean: float | None, std: float | None) -> str:
    """'mean ± std' of an R^2, or 'n/a' for none or a non-finite one."""
    if mean is None or not math.isfinite(mean):
        return "n/a"
    return f"{mean:.4f} ± {std:.4f}"


def _adaptation_rates(sizes: Mapping[str, Any]) -> str:
    """'0.05' or '0.05 (pre-trained parameters 0.006)' for the adaptation's rates."""
    rate = f"{sizes['adapt_learning_rate']}"
    if sizes.get("adapt_pretrained_learning_rate") is not None:
        rate += f" (pre-trained parameters {sizes['adapt_pretrained_learning_rate']})"
    return rate


def fuzzy_boolean_results_markdown(results: Mapping[str, Any]) -> str:
    """A run_fuzzy_boolean.py run's results as a Markdown table beside the paper's Table 1."""
    sizes, pre, env = results["protocol"], results["pretraining"], results["environment"]
    pretraining = (
        f"pre-training {pre['train_steps']} steps"
        if "train_steps" in pre
        else f"pre-trained model loaded from {pre['checkpoint']}"
    )
    processes = (
        f" ({sizes['world_size']} processes x {sizes['per_device_batch_size']})"
        if sizes["world_size"] > 1
        else ""
    )
    _, paper_mean, paper_std = FUZZY_BOOLEAN_TABLE_1["pretraining"]
    lines = [
        f"## Fuzzy Boolean results ({sizes['protocol']} protocol)",
        "",
        f"{sizes['points_per_function']} points per function (test fraction {sizes['test_fraction']}), batch "
        f"{sizes['batch_size']}{processes}, {pretraining}, adaptation {sizes['adapt_length']} per setting; RAdam "
        f"{sizes['pretrain_learning_rate']} / {_adaptation_rates(sizes)}, constant. R^2 = 1 - SSE/SST per function "
        "on its test split; mean ± population std over the functions.",
        "",
        "| Parameter set | R^2 (this run) | R^2 (paper) |",
        "|---|---|---|",
        f"| All parameters (pre-training, {pre['num_functions']} functions) | "
        f"{_r2(pre.get('r2_mean'), pre.get('r2_std'))} | {_r2(paper_mean, paper_std)} |",
    ]
    for name, (label, paper_mean, paper_std) in list(FUZZY_BOOLEAN_TABLE_1.items())[1:]:
        res = results["adaptation"].get(name)
        measured = _r2(res["r2_mean"], res["r2_std"]) if res else "not run"
        lines.append(f"| {label} | {measured} | {_r2(paper_mean, paper_std)} |")
    densities = [("pre-trained", pre)] + list(results["adaptation"].items())
    precision = f"{env['mixed_precision']} autocast, " if env["mixed_precision"] != "no" else ""
    lines += [
        "",
        "Routing density (fraction of (function, token) pairs with C > 0, mean over the function iterations; "
        f"first {pre['routing_density']['num_samples']} test points): "
        + ", ".join(f"{name} {res['routing_density']['mean']:.3f}" for name, res in densities)
        + ".",
        "",
        f"Run on {env['date']}: {env['device']}, {env['cpu']} ({env['cpu_count']} cores, {env['torch_threads']} "
        f"torch threads), {precision}torch {env['torch']}, transformers {env['transformers']}; wall time "
        f"{results['wall_time_s']:.0f} s.",
    ]
    if pre.get("train_runtime_s"):
        lines.append(
            f"Pre-training steps: {pre['train_steps']} in {pre['train_runtime_s']:.1f} s "
            f"({pre['train_steps'] / pre['train_runtime_s']:.1f} steps/s, the Trainer's train_runtime)."
        )
    return "\n".join(lines) + "\n"


def fuzzy_boolean_routing_section(
    output_dir: str | os.PathLike,
    test_inputs: Mapping[str, Any],
    num_points: int = FUZZY_BOOLEAN_ROUTING_POINTS,
) -> str:
    """The card's "Routing" section: the function usage (C of Eq. 4) of every model saved in ``output_dir``
    (folder -> its held-out test inputs), its JSON and, with matplotlib (the `vis` extra), its pictures."""
    from ..models.neural_interpreter.modeling_neural_interpreter import NeuralInterpreterForSetRegression
    from ..visualization import write_set_routing_card_assets

    output_dir = Path(output_dir)
    draw = importlib.util.find_spec("matplotlib") is not None
    if not draw:
        logger.warning(
            "No routing pictures on the model card (no matplotlib); pip install 'ni_hf[vis]' for them"
        )
    sections = []
    for folder, inputs in test_inputs.items():
        if not (output_dir / folder / "config.json").is_file():
            continue
        model = NeuralInterpreterForSetRegression.from_pretrained(output_dir / folder)
        assets = write_set_routing_card_assets(
            model, inputs[:num_points], output_dir, f"routing_{folder}", f"### `{folder}/`", draw=draw
        )
        sections.append(assets["markdown"].strip())
        logger.info(f"Function usage of {folder}/ for the model card: {', '.join(map(str, assets['files']))}")
    if not sections:
        return ""
    intro = (
        "## Routing\n\nWhich functions each saved model uses: the compatibility C of Eq. 4 (how much function u "
        f"processes token i; over u it sums to at most 1) on the first (at most {num_points}) held-out test "
        "points of its functions. Tokens are the CLS token of every function to regress, then the 5 input variables."
    )
    return "\n\n".join([intro, *sections]) + "\n"


def write_fuzzy_boolean_model_card(
    output_dir: str | os.PathLike,
    results: Mapping[str, Any],
    *,
    markdown: str,
    repo_id: str,
    command: str,
    launcher_note: str,
    protocol_note: str = "",
    deviations: Sequence[str] = (),
    template_path: str | os.PathLike | None = None,
    routing: str = "",
) -> Path:
    """Write ``<output_dir>/README.md`` for a run of ``examples/run_fuzzy_boolean.py`` (its ``results`` and their
    ``markdown``), with the model code copied to the top of ``output_dir`` so that the card's snippet loads the
    model of every folder without ni_hf; ``routing`` (Markdown) goes at its end. Returns its path."""
    from .. import __version__

    output_dir = Path(output_dir)
    sizes, arguments, pre, env = (
        results["protocol"],
        results["arguments"],
        results["pretraining"],
        results["environment"],
    )
    folders = [
        name
        for name in ("pretrain", *(f"adapt-{setting}" for setting in results["adaptation"]))
        if (output_dir / name / "config.json").is_file()
    ]
    for source in (output_dir / folders[0]).glob("*.py") if folders else ():  # the model's remote code
        shutil.copyfile(source, output_dir / source.name)
    trained_here = "train_steps" in pre
    if sizes["protocol"] != "full":
        recipe_note = ""  # the template says so in bold
    elif deviations:
        recipe_note = "This run deviates from the paper's protocol: " + "; ".join(deviations) + "."
    else:
        recipe_note = (
            "This run followed the paper's protocol (section 4.1 and its appendix's hyperparameter table)."
        )
    per_function = [
        ("pretrain", pre),
        *((f"adapt-{name}", info) for name, info in results["adaptation"].items()),
    ]
    card = build_fuzzy_boolean_model_card(
        template_path=template_path,
        routing=routing,
        model_name=f"Neural Interpreter, fuzzy-Boolean experiment ({sizes['protocol']} protocol)",
        results=results,
        repo_id=repo_id,
        example_folder=folders[0] if folders else "pretrain",
        protocol=sizes["protocol"],
        protocol_note=protocol_note,
        recipe_note=recipe_note,
        num_pretrain_functions=arguments["num_pretrain_functions"],
        num_adapt_functions=arguments["num_adapt_functions"],
        settings=[
            {
                "name": name,
                "label": info["label"],
                "trainable": f"{sum(info['trainable_parameters'].values()):,}",
            }
            for name, info in results["adaptation"].items()
        ],
        has_pretrain="pretrain" in folders,
        results_markdown=markdown.strip(),
        per_function=[
            {"name": name, "r2": ", ".join(f"{v:.4f}" for v in info["r2_per_function"])}
            for name, info in per_function
        ],
        dataset_seed=arguments["dataset_seed"],
        adapt_dataset_seed=arguments["adapt_dataset_seed"],
        function_form="canonical",
        points_per_function=sizes["points_per_function"],
        test_percent=f"{100 * sizes['test_fraction']:g}",
        training_command=command,
        launcher_note=launcher_note,
        hyperparameters={
            "protocol": sizes["protocol"],
            "batch (global)": sizes["batch_size"],
            "processes x batch per process": f"{sizes['world_size']} x {sizes['per_device_batch_size']}",
            "pre-training": f"{pre['train_steps']} steps, RAdam lr {sizes['pretrain_learning_rate']}, constant"
            if trained_here
            else f"loaded from {pre['checkpoint']} (not trained here)",
            "adaptation": f"{sizes['adapt_length']} per setting, RAdam lr {_adaptation_rates(sizes)}, constant",
            "seed (model, CLS tokens, data order)": results["seed"],
        },
        model_changes="",
        hardware=describe_hardware(env["device"], sizes["world_size"], env["mixed_precision"]),
        wall_time=f"{results['wall_time_s']:.0f} s",
        transformers_version=env["transformers"],
        ni_hf_version=__version__,
        extra_limitations=[]
        if trained_here
        else [f"The pre-trained model was loaded from `{pre['checkpoint']}`; it is not part of this folder."],
    )
    path = output_dir / "README.md"
    card.save(str(path))
    return path


# --------------------------------------------------------------------------------------------------------- PGM

DEFAULT_PGM_TEMPLATE = TEMPLATES / "pgm_template.md"
# The paper's Table 2 (val / test accuracy, %), by DeepMind's regime names.
PGM_TABLE_2: dict[str, dict[str, tuple[float, float]]] = {
    "neutral": {"NI": (77.3, 77.0), "ViT": (73.3, 72.7), "WReN": (63.0, 62.6)},
    "interpolation": {"NI": (87.9, 70.5), "ViT": (89.9, 67.7), "WReN": (79.0, 64.4)},
    "attrs.pairs": {"NI": (69.5, 36.6), "ViT": (69.4, 34.1), "WReN": (46.7, 27.2)},
    "attr.rel.pairs": {"NI": (68.6, 45.2), "ViT": (67.6, 44.1), "WReN": (63.9, 41.9)},
    "attr.rels": {"NI": (79.9, 20.0), "ViT": (73.8, 15.9), "WReN": (63.4, 19.0)},
    "extrapolation": {"NI": (91.8, 19.4), "ViT": (92.2, 16.4), "WReN": (69.3, 17.2)},
}
PGM_RELATION_TYPES = ("progression", "XOR", "OR", "AND", "consistent_union")
PGM_NI_SUMMARY_KEYS = (
    *NI_SUMMARY_KEYS[:13],
    "panel_size",
    "panel_cnn_layers",
    "panel_cnn_channels",
)
PGM_VIT_SUMMARY_KEYS = (*VIT_SUMMARY_KEYS[:4], "panel_size", "panel_cnn_layers", "panel_cnn_channels")


def pgm_eval_results(results: Mapping[str, Any]) -> list[EvalResult]:
    """One model-index ``EvalResult`` (accuracy) per evaluated split of a run_pgm.py run."""
    dataset = {"generated": "ni_hf PGM-style generator", "hub": "HuggingFaceM4/PGM"}.get(
        results["dataset_source"], "DeepMind PGM"
    )
    return [
        EvalResult(
            task_type="multiple-choice",
            dataset_type=dataset,
            dataset_name=f"PGM {results['regime']} ({split})",
            dataset_split=split,
            metric_type="accuracy",
            metric_value=float(results[split]["accuracy"]),
        )
        for split in ("val", "test")
        if _is_number(results.get(split, {}).get("accuracy"))
    ]


def write_pgm_model_card(
    output_dir: str | os.PathLike,
    results: Mapping[str, Any],
    *,
    model: Any,
    training_args: Any,
    repo_id: str,
    launcher_note: str,
    template_path: str | os.PathLike | None = None,
) -> Path:
    """Write ``<output_dir>/README.md`` for a run of ``examples/run_pgm.py`` from its results; return its path."""
    import transformers

    from .. import __version__

    config, vit = model.config, results["architecture"] == "vit"
    splits = [split for split in ("val", "test") if split in results]
    split_rows = [
        {"split": s, "accuracy": _percent(results[s]["accuracy"]), "num_samples": results[s]["num_samples"]}
        for s in splits
    ]
    relation_rows = [
        {
            "name": name,
            "values": [
                f"{_percent(results[s].get(f'accuracy_{name}'))} ({results[s].get(f'num_samples_{name}', 0)})"
                if results[s].get(f"num_samples_{name}")
                else "-"
                for s in splits
            ],
        }
        for name in PGM_RELATION_TYPES
    ]
    anytime_rows = [
        {
            "function_iterations": row["function_iterations"],
            "values": [_percent(row.get(f"{s}_accuracy")) for s in splits],
        }
        for row in results.get("anytime", [])
    ]
    reference = PGM_TABLE_2.get(results["regime"])
    paper_reference = (
        "; ".join(f"{name} {val} / {test}" for name, (val, test) in reference.items())
        if reference
        else "the paper does not report this regime"
    )
    source = results["dataset_source"]
    sizes = results.get("sizes", {})
    data = {
        "generated": f"the package's offline PGM-style generator (at most {results.get('max_triples')} triple(s) per "
        "puzzle)",
        "hub": "the Hub's HuggingFaceM4/PGM (neutral)",
        "deepmind": "DeepMind's PGM release",
    }[source] + f", {', '.join(f'{n:,} {s}' for s, n in sizes.items())} puzzles"
    limitations = [
        "Measured at the scale of this run, not the paper's (1.2M training puzzles, 30 epochs on GPUs).",
    ]
    if source == "generated":
        limitations.append(
            "The generator follows Barrett et al. 2018's description, not DeepMind's code: its puzzles, value sets and "
            "held-out sets are its own, so the numbers are not comparable with the paper's Table 2."
        )
    runtime = results.get("train", {}).get("train_runtime")
    card = _render(
        ModelCardData(
            library_name="transformers",
            license="mit",
            model_name=repo_id.split("/")[-1],
            pipeline_tag=None,
            tags=[
                "neural-interpreters" if not vit else "neural-interpreters-baseline",
                "pgm",
                "abstract-reasoning",
                "ni_hf",
            ],
            eval_results=pgm_eval_results(results),
        ),
        _template(template_path, DEFAULT_PGM_TEMPLATE),
        model_name=repo_id.split("/")[-1],
        repo_id=repo_id,
        architecture=results["architecture"],
        model_class=type(model).__name__,
        config=config,
        regime=results["regime"],
        data_description=data,
        split_rows=split_rows,
        relation_rows=relation_rows,
        anytime_rows=anytime_rows,
        paper_reference=paper_reference,
        training_command=results["command"],
        launcher_note=launcher_note,
        hyperparameters=training_hyperparameters(
            training_args,
            "RAdam" if training_args.radam else str(training_args.optim),
            results.get("train", {}),
        ),
        config_summary={
            key: getattr(config, key) for key in (PGM_VIT_SUMMARY_KEYS if vit else PGM_NI_SUMMARY_KEYS)
        },
        num_parameters=f"{model.num_parameters():,}",
        num_trainable_parameters=f"{model.num_parameters(only_trainable=True):,}",
        hardware=describe_hardware(
            str(training_args.device), training_args.world_size, mixed_precision(training_args)
        ),
        train_runtime=f"{runtime:.0f} s" if runtime is not None else "not trained in this run",
        transformers_version=transformers.__version__,
        ni_hf_version=__version__,
        limitations=limitations,
    )
    path = Path(output_dir) / "README.md"
    card.save(path)
    return path
