"""What the image-classification scripts share (examples/run_image_classification.py, examples/run_digits.py): the
models they train and the checks of their settings, the augmentation arguments and RandAugment on the training
device, the Trainer, the label sets a model is fitted to before fine-tuning, and the model card's routing picture."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import Trainer

from ..data.augmentation import OPERATION_NAMES, BatchRandAugment, select_operations
from ..models.multitask_vit import MultiTaskViTConfig, MultiTaskViTForImageClassification
from ..models.neural_interpreter import NeuralInterpreterConfig, NeuralInterpreterForImageClassification
from .checkpoints import ExactResumeMixin, read_checkpoint_config
from .evaluation import CopiedPredictionsMixin
from .presets import parse_config_overrides

__all__ = [
    "DATA_DEFINED_CONFIG_KEYS",
    "IMAGE_CLASSIFIERS",
    "AugmentationArguments",
    "ImageClassificationTrainer",
    "build_augmentation",
    "check_augmentation",
    "check_model_settings",
    "fit_label_sets",
    "routing_assets_writer",
    "saved_architecture",
    "task_sizes",
    "write_image_classification_card",
]

logger = logging.getLogger(__name__)

# --architecture: its config and model classes.
IMAGE_CLASSIFIERS: dict[str, tuple[type, type]] = {
    "neural_interpreter": (NeuralInterpreterConfig, NeuralInterpreterForImageClassification),
    "vit": (MultiTaskViTConfig, MultiTaskViTForImageClassification),
}
DATA_DEFINED_CONFIG_KEYS = ("task_names", "num_labels", "id2label", "label2id")
# Settings of the PGM panel CNN, which an image classifier never reads.
UNREAD_CONFIG_KEYS = ("panel_size", "panel_cnn_layers", "panel_cnn_channels", "panel_cnn_kernel_size")


def check_model_settings(
    model_args: Any, given: frozenset[str], own_flags: Sequence[str] = ()
) -> dict[str, Any]:
    """--config_overrides and --attn_implementation checked against --architecture; returns the overrides.

    ``own_flags``: config keys the script sets by flags of their own, refused in --config_overrides.
    """
    overrides = parse_config_overrides(
        model_args.config_overrides, IMAGE_CLASSIFIERS[model_args.architecture][0]
    )
    moved = [key for key in own_flags if key in overrides]
    if moved:
        raise ValueError(f"--config_overrides {', '.join(moved)}: pass --{' --'.join(moved)} instead.")
    unread = [key for key in UNREAD_CONFIG_KEYS if key in overrides]
    if unread:
        raise ValueError(
            f"--config_overrides {', '.join(unread)}: an image classifier has no panel CNN to read it."
        )
    if model_args.architecture == "vit" and model_args.attn_implementation == "fast":
        if "attn_implementation" in given:
            raise ValueError(
                "--attn_implementation fast is the Neural Interpreter's CPU kernels; the ViT runs transformers' "
                "attention ('eager' or 'sdpa')."
            )
        model_args.attn_implementation = None  # the preset's choice for a Neural Interpreter
    return overrides


def saved_architecture(path: str, does: str = "trains") -> str:
    """The --architecture of a saved model, from its config's model_type (another model's is refused)."""
    by_type = {config_class.model_type: name for name, (config_class, _) in IMAGE_CLASSIFIERS.items()}
    model_type = read_checkpoint_config(path).get("model_type")
    if model_type not in by_type:
        raise ValueError(
            f"--model_name_or_path {path}: its config.json has model_type {model_type!r}; this script {does} "
            f"{' or '.join(repr(t) for t in by_type)} models."
        )
    return by_type[model_type]


RANDAUGMENT_OPTIONS = (
    "randaugment_num_ops",
    "randaugment_magnitude",
    "randaugment_operations",
    "randaugment_probability",
)


@dataclass
class AugmentationArguments:
    """How training batches are augmented (RandAugment, on the training device)."""

    randaugment: bool = field(default=True, metadata={"help": "Augment training batches with RandAugment."})
    randaugment_num_ops: int = field(default=2, metadata={"help": "RandAugment: operations per image (n)."})
    randaugment_magnitude: float = field(
        default=9.0,
        metadata={"help": "RandAugment magnitude m on timm's scale, in [0, 10] (paper: rand-m9)."},
    )
    randaugment_operations: list[str] | None = field(
        default=None,
        metadata={"help": "RandAugment operations to draw from (default: all): " + " ".join(OPERATION_NAMES)},
    )
    randaugment_probability: float = field(
        default=0.5,
        metadata={"help": "RandAugment: probability that an image gets a drawn operation (timm: 0.5)."},
    )


def check_augmentation(augmentation: AugmentationArguments, given: frozenset[str], do_train: bool) -> None:
    """Refuse RandAugment settings that cannot be meant, or that would have no effect (written with
    ``--randaugment false``, or without training), naming the flags."""
    written = [f"--{name}" for name in RANDAUGMENT_OPTIONS if name in given]
    if written and not augmentation.randaugment:
        raise ValueError(f"{', '.join(written)} with --randaugment false: no batch would be augmented.")
    if written and not do_train:
        raise ValueError(
            f"{', '.join(written)} with --do_train false: augmentation acts on training batches only."
        )
    if augmentation.randaugment and do_train:
        _rand_augment(augmentation)  # refuses a bad n, m, probability or operation name


def _rand_augment(augmentation: AugmentationArguments, **kwargs: Any) -> BatchRandAugment:
    return BatchRandAugment(
        augmentation.randaugment_num_ops,
        augmentation.randaugment_magnitude,
        augmentation.randaugment_probability,
        policy=select_operations(augmentation.randaugment_operations),
        **kwargs,
    )


def build_augmentation(
    augmentation: AugmentationArguments, processor: Any, device: torch.device, do_train: bool
) -> BatchRandAugment | None:
    """RandAugment on ``device`` for normalized batches of ``processor``, or None when off (or not training)."""
    if not (augmentation.randaugment and do_train):
        return None
    module = _rand_augment(augmentation, image_mean=processor.image_mean, image_std=processor.image_std)
    logger.info(f"Training batches augmented on {device}: RandAugment({module.extra_repr()})")
    return module.to(device)


class ImageClassificationTrainer(ExactResumeMixin, CopiedPredictionsMixin, Trainer):
    """Trainer that augments training batches on the training device, and leaves the eval loss to compute_metrics."""

    def __init__(self, *args: Any, augmentation: torch.nn.Module | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.augmentation = augmentation

    def training_step(self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None):
        """RandAugment ``pixel_values`` once the batch is on the device, then train as usual."""
        if self.augmentation is not None:
            inputs = self._prepare_inputs(inputs)
            inputs["pixel_values"] = self.augmentation(inputs["pixel_values"])
        return super().training_step(model, inputs, num_items_in_batch)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Logits and labels without the batch loss (compute_metrics computes the exact mean over samples)."""
        _, logits, labels = super().prediction_step(model, inputs, False, ignore_keys=ignore_keys)
        return None, logits, labels


def task_sizes(dataset: Any, task_names: Sequence[str], split: str) -> list[int]:
    """Rows of each task in a split; a task without any is refused by name."""
    task_ids = np.asarray(dataset.with_format(None)["task_id"], dtype=np.int64)
    counts = np.bincount(task_ids, minlength=len(task_names))
    empty = [name for name, count in zip(task_names, counts, strict=True) if count == 0]
    if empty:
        raise ValueError(
            f"The {split} split of {', '.join(empty)} holds no samples: nothing to train or evaluate on."
        )
    return [int(count) for count in counts]


def fit_label_sets(model: Any, task_names: Sequence[str], label_names: Sequence[str]) -> bool:
    """Give a loaded classifier fresh task tokens and heads (``reset_tasks``) when the data's tasks or labels are
    not the ones it was trained on, and say so; returns whether it did. The backbone is kept: fine-tuning."""
    config = model.config
    saved_labels = [config.id2label[i] for i in range(config.num_labels)]
    if list(config.task_names) == list(task_names) and saved_labels == list(label_names):
        return False
    logger.warning(
        f"The saved model's tasks {list(config.task_names)} with labels {saved_labels} are not the data's "
        f"{list(task_names)} with labels {list(label_names)}: fresh CLS tokens and heads "
        f"({len(label_names)} labels) for fine-tuning; the rest of the model is kept."
    )
    model.reset_tasks(list(task_names), num_labels=len(label_names))
    config.id2label = dict(enumerate(label_names))
    config.label2id = {name: i for i, name in enumerate(label_names)}
    return True


def routing_assets_writer(
    model: torch.nn.Module, test: Any, card: Path, num_images: int = 64
) -> Callable[[], Mapping[str, Any]]:
    """What draws the card's routing picture: the computational path of a test image and the function usage of a
    test batch (``ni_hf.visualization.write_routing_card_assets``), for ``ExampleRun.append_routing_picture``."""

    def write() -> Mapping[str, Any]:
        from ..visualization import write_routing_card_assets

        batch = test.shuffle(seed=0).select(range(min(num_images, len(test))))[:]
        return write_routing_card_assets(
            model,
            torch.as_tensor(np.stack(batch["pixel_values"])).to(model.device),
            torch.as_tensor(batch["task_ids"]),
            card.parent,
            labels=batch["labels"],
        )

    return write


def write_image_classification_card(
    run: Any,
    model: torch.nn.Module,
    trainer: ImageClassificationTrainer,
    tasks: Sequence[Any],
    metrics: tuple[Mapping[str, Any], Mapping[str, Any]],
    test: Any,
    draw: bool,
    **card: Any,
) -> Path:
    """The run's model card (``model_cards.write_digits_model_card``: ``tasks``' results, the command, the optimizer,
    the augmentation, the hardware; ``card`` adds its other arguments) and, when ``draw``, its routing picture of
    ``test`` images. ``metrics``: the training and the evaluation metrics. Returns the card's path."""
    from .model_cards import write_digits_model_card
    from .publishing import hub_repo_id

    args = run.args
    command, launcher_note = run.command()
    augmentation = trainer.augmentation
    optim = "RAdam (torch.optim.RAdam)" if args.radam else str(getattr(args.optim, "value", args.optim))
    path = write_digits_model_card(
        args.output_dir,
        repo_id=hub_repo_id(args),
        model=model,
        tasks=list(tasks),
        train_metrics=metrics[0],
        eval_metrics=metrics[1],
        training_args=args,
        optimizer=optim,
        command=command,
        launcher_note=launcher_note,
        randaugment=augmentation.extra_repr() if augmentation is not None else None,
        **card,
    )
    logger.info(f"Model card written to {path}")
    if draw:
        run.append_routing_picture(path, routing_assets_writer(model, test, path))
    return path
