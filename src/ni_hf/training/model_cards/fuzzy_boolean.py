"""The card of a fuzzy-Boolean run (examples/run_fuzzy_boolean.py): R^2 per phase beside the paper's Table 1, and
the function usage of every saved model."""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .common import TEMPLATES, describe_hardware, is_number, render, template

logger = logging.getLogger(__name__)

DEFAULT_FUZZY_BOOLEAN_TEMPLATE = TEMPLATES / "fuzzy_boolean_template.md"
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
        if not is_number(info.get("r2_mean")):
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
    card = render(
        card_data,
        template(template_path, DEFAULT_FUZZY_BOOLEAN_TEMPLATE),
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
    from ... import NeuralInterpreterForSetRegression
    from ...visualization import write_set_routing_card_assets

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
    from ... import __version__

    output_dir = Path(output_dir)
    sizes, arguments, pre, env = (
        results[key] for key in ("protocol", "arguments", "pretraining", "environment")
    )
    folders = _saved_model_folders(output_dir, results)
    _copy_model_code(output_dir, folders)
    card = build_fuzzy_boolean_model_card(
        template_path=template_path,
        routing=routing,
        model_name=f"Neural Interpreter, fuzzy-Boolean experiment ({sizes['protocol']} protocol)",
        results=results,
        repo_id=repo_id,
        example_folder=folders[0] if folders else "pretrain",
        protocol=sizes["protocol"],
        protocol_note=protocol_note,
        recipe_note=_recipe_note(sizes["protocol"], deviations),
        num_pretrain_functions=arguments["num_pretrain_functions"],
        num_adapt_functions=arguments["num_adapt_functions"],
        settings=_adaptation_settings(results),
        has_pretrain="pretrain" in folders,
        results_markdown=markdown.strip(),
        per_function=_r2_per_function_rows(results),
        dataset_seed=arguments["dataset_seed"],
        adapt_dataset_seed=arguments["adapt_dataset_seed"],
        function_form="canonical",
        points_per_function=sizes["points_per_function"],
        test_percent=f"{100 * sizes['test_fraction']:g}",
        training_command=command,
        launcher_note=launcher_note,
        hyperparameters=_fuzzy_boolean_hyperparameters(results),
        model_changes="",
        hardware=describe_hardware(env["device"], sizes["world_size"], env["mixed_precision"]),
        wall_time=f"{results['wall_time_s']:.0f} s",
        transformers_version=env["transformers"],
        ni_hf_version=__version__,
        extra_limitations=_loaded_pretraining_limitations(pre),
    )
    path = output_dir / "README.md"
    card.save(str(path))
    return path


def _loaded_pretraining_limitations(pretraining: Mapping[str, Any]) -> list[str]:
    """The limitation a run that loaded its pre-trained model adds: that model is not in the run's folder."""
    if "train_steps" in pretraining:
        return []
    return [
        f"The pre-trained model was loaded from `{pretraining['checkpoint']}`; it is not part of this folder."
    ]


def _saved_model_folders(output_dir: Path, results: Mapping[str, Any]) -> list[str]:
    """The run's model folders (``pretrain``, ``adapt-<setting>``) that hold a saved model, in that order."""
    return [
        name
        for name in ("pretrain", *(f"adapt-{setting}" for setting in results["adaptation"]))
        if (output_dir / name / "config.json").is_file()
    ]


def _copy_model_code(output_dir: Path, folders: Sequence[str]) -> None:
    """Copy the model's remote code (the first saved folder's ``*.py``) to the top of ``output_dir``."""
    for source in (output_dir / folders[0]).glob("*.py") if folders else ():
        shutil.copyfile(source, output_dir / source.name)


def _recipe_note(protocol: str, deviations: Sequence[str]) -> str:
    """What a full-protocol run says about following the paper's recipe (other protocols: the template says it)."""
    if protocol != "full":
        return ""  # the template says so in bold
    if deviations:
        return "This run deviates from the paper's protocol: " + "; ".join(deviations) + "."
    return "This run followed the paper's protocol (section 4.1 and its appendix's hyperparameter table)."


def _adaptation_settings(results: Mapping[str, Any]) -> list[dict[str, str]]:
    """Name, label and number of trainable parameters of each adaptation setting."""
    return [
        {
            "name": name,
            "label": info["label"],
            "trainable": f"{sum(info['trainable_parameters'].values()):,}",
        }
        for name, info in results["adaptation"].items()
    ]


def _r2_per_function_rows(results: Mapping[str, Any]) -> list[dict[str, str]]:
    """R^2 of every function of the pre-trained and each adapted model."""
    per_function = [
        ("pretrain", results["pretraining"]),
        *((f"adapt-{name}", info) for name, info in results["adaptation"].items()),
    ]
    return [
        {"name": name, "r2": ", ".join(f"{v:.4f}" for v in info["r2_per_function"])}
        for name, info in per_function
    ]


def _fuzzy_boolean_hyperparameters(results: Mapping[str, Any]) -> dict[str, Any]:
    """The card's hyperparameter table: protocol, batch, processes, pre-training, adaptation and seed."""
    sizes, pre = results["protocol"], results["pretraining"]
    return {
        "protocol": sizes["protocol"],
        "batch (global)": sizes["batch_size"],
        "processes x batch per process": f"{sizes['world_size']} x {sizes['per_device_batch_size']}",
        "pre-training": f"{pre['train_steps']} steps, RAdam lr {sizes['pretrain_learning_rate']}, constant"
        if "train_steps" in pre
        else f"loaded from {pre['checkpoint']} (not trained here)",
        "adaptation": f"{sizes['adapt_length']} per setting, RAdam lr {_adaptation_rates(sizes)}, constant",
        "seed (model, CLS tokens, data order)": results["seed"],
    }
