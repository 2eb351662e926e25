"""The card of a PGM run (examples/run_pgm.py): val and test accuracy beside the paper's Table 2, per relation
type, and the anytime curve."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCardData

from ...data.pgm_generator import RELATIONS
from .common import (
    NI_SUMMARY_KEYS,
    TEMPLATES,
    VIT_SUMMARY_KEYS,
    describe_hardware,
    is_number,
    mixed_precision,
    percent,
    render,
    template,
    training_hyperparameters,
)

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
PGM_RELATION_TYPES = RELATIONS
PGM_NI_SUMMARY_KEYS = (
    *NI_SUMMARY_KEYS[:13],
    "panel_size",
    "panel_cnn_layers",
    "panel_cnn_channels",
)
PGM_CONTEXT_BLIND_SUMMARY_KEYS = ("hidden_size", "panel_size", "panel_cnn_layers", "panel_cnn_channels")
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
        if is_number(results.get(split, {}).get("accuracy"))
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

    from ... import __version__

    config, architecture = model.config, results["architecture"]
    other = results.get("test_other_context")
    splits = [split for split in ("val", "test") if split in results]
    runtime = results.get("train", {}).get("train_runtime")
    card = render(
        _pgm_card_data(results, repo_id, architecture),
        template(template_path, DEFAULT_PGM_TEMPLATE),
        model_name=repo_id.split("/")[-1],
        repo_id=repo_id,
        architecture=architecture,
        other_context=None
        if not other
        else {"accuracy": percent(other["accuracy"]), "num_samples": other["num_samples"]},
        model_class=type(model).__name__,
        config=config,
        regime=results["regime"],
        data_description=_data_description(results),
        split_rows=_split_rows(results, splits),
        relation_rows=_relation_rows(results, splits),
        anytime_rows=_anytime_rows(results, splits),
        paper_reference=_paper_reference(results["regime"]),
        training_command=results["command"],
        launcher_note=launcher_note,
        hyperparameters=training_hyperparameters(
            training_args,
            "RAdam" if training_args.radam else str(training_args.optim),
            results.get("train", {}),
        ),
        config_summary={key: getattr(config, key) for key in _summary_keys(architecture)},
        num_parameters=f"{model.num_parameters():,}",
        num_trainable_parameters=f"{model.num_parameters(only_trainable=True):,}",
        hardware=describe_hardware(
            str(training_args.device), training_args.world_size, mixed_precision(training_args)
        ),
        train_runtime=f"{runtime:.0f} s" if runtime is not None else "not trained in this run",
        transformers_version=transformers.__version__,
        ni_hf_version=__version__,
        limitations=_limitations(results["dataset_source"]),
    )
    path = Path(output_dir) / "README.md"
    card.save(path)
    return path


def _summary_keys(architecture: str) -> tuple[str, ...]:
    """The config settings the card lists for ``architecture``."""
    return {"vit": PGM_VIT_SUMMARY_KEYS, "candidates_only": PGM_CONTEXT_BLIND_SUMMARY_KEYS}.get(
        architecture, PGM_NI_SUMMARY_KEYS
    )


def _pgm_card_data(results: Mapping[str, Any], repo_id: str, architecture: str) -> ModelCardData:
    """The card's metadata: library, license, tags and the model-index results."""
    return ModelCardData(
        library_name="transformers",
        license="mit",
        model_name=repo_id.split("/")[-1],
        pipeline_tag=None,
        tags=[
            "neural-interpreters" if architecture == "neural_interpreter" else "neural-interpreters-baseline",
            "pgm",
            "abstract-reasoning",
            "ni_hf",
        ],
        eval_results=pgm_eval_results(results),
    )


def _split_rows(results: Mapping[str, Any], splits: list[str]) -> list[dict[str, Any]]:
    """Accuracy and number of puzzles of each evaluated split."""
    return [
        {"split": s, "accuracy": percent(results[s]["accuracy"]), "num_samples": results[s]["num_samples"]}
        for s in splits
    ]


def _relation_rows(results: Mapping[str, Any], splits: list[str]) -> list[dict[str, Any]]:
    """Accuracy (number of puzzles) per relation type and split; "-" where a split has none of the type."""
    return [
        {
            "name": name,
            "values": [
                f"{percent(results[s].get(f'accuracy_{name}'))} ({results[s].get(f'num_samples_{name}', 0)})"
                if results[s].get(f"num_samples_{name}")
                else "-"
                for s in splits
            ],
        }
        for name in PGM_RELATION_TYPES
    ]


def _anytime_rows(results: Mapping[str, Any], splits: list[str]) -> list[dict[str, Any]]:
    """Accuracy of each split per number of function iterations (the anytime curve)."""
    return [
        {
            "function_iterations": row["function_iterations"],
            "values": [percent(row.get(f"{s}_accuracy")) for s in splits],
        }
        for row in results.get("anytime", [])
    ]


def _paper_reference(regime: str) -> str:
    """The paper's Table 2 val / test accuracies of ``regime``, or a line saying it does not report it."""
    reference = PGM_TABLE_2.get(regime)
    if not reference:
        return "the paper does not report this regime"
    return "; ".join(f"{name} {val} / {test}" for name, (val, test) in reference.items())


def _data_description(results: Mapping[str, Any]) -> str:
    """Where the run's puzzles came from and how many of each split it had."""
    sizes = results.get("sizes", {})
    source = {
        "generated": f"the package's offline PGM-style generator (at most {results.get('max_triples')} triple(s) per "
        "puzzle)",
        "hub": "the Hub's HuggingFaceM4/PGM (neutral)",
        "deepmind": "DeepMind's PGM release",
    }[results["dataset_source"]]
    return source + f", {', '.join(f'{n:,} {s}' for s, n in sizes.items())} puzzles"


def _limitations(source: str) -> list[str]:
    """The card's limitations: the run's scale, and for generated puzzles that they are not DeepMind's."""
    limitations = [
        "Measured at the scale of this run, not the paper's (1.2M training puzzles, 30 epochs on GPUs).",
    ]
    if source == "generated":
        limitations.append(
            "The generator follows Barrett et al. 2018's description, not DeepMind's code: its puzzles, value sets and "
            "held-out sets are its own, so the numbers are not comparable with the paper's Table 2."
        )
    return limitations
