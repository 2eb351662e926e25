"""Checks of the configs: errors that name the setting and what was expected, and the settings the configs share.

The Neural Interpreter's, the multi-task ViT's and the context-blind baseline's configs use the checks below and
declare the settings they share once, in `MultiTaskConfigMixin` and `PanelConfigMixin`. Every model folder holds a
copy of this file (marked "Copied from", checked by tests/test_model_copies.py), which its checkpoints copy next to
the config, so their code runs without `ni_hf`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import difflib
import functools
import os
from collections.abc import Iterator
from typing import Any

from huggingface_hub.dataclasses import as_validated_field, validated_field
from huggingface_hub.errors import (
    HFValidationError,
    StrictDataclassError,
    StrictDataclassFieldValidationError,
)
from huggingface_hub.utils import validate_repo_id
from transformers import PreTrainedConfig
from transformers.utils import logging

# Keys a config.json written by transformers (4.x or 5.x) may hold besides the dataclass fields of
# `PreTrainedConfig`: what its `__post_init__` pops or sets, what `to_dict` adds, and the common attributes that
# transformers 4 saved in every config. Generation settings are added from `GenerationConfig`.
PRETRAINED_CONFIG_KEYS = frozenset(
    {
        "model_type",
        "auto_map",
        "custom_pipelines",
        "quantization_config",
        "torch_dtype",
        "num_labels",
        "name_or_path",
        "output_attentions",
        "attn_implementation",
        "experts_implementation",
        "per_layer_config",
        "tie_last_hidden_states",
        "rope_scaling",
        "rope_theta",
        "rope_parameters",
        "use_return_dict",
        "torchscript",
        "use_bfloat16",
        "tf_legacy_loss",
        "pruned_heads",
        "tie_word_embeddings",
        "is_decoder",
        "cross_attention_hidden_size",
        "add_cross_attention",
        "tie_encoder_decoder",
        "finetuning_task",
        "tokenizer_class",
        "prefix",
        "bos_token_id",
        "pad_token_id",
        "eos_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "task_specific_params",
    }
)

# True while `from_dict` builds a config: a config.json may hold attributes set on a config at run time (as
# transformers' own tests do), so unknown keys read from a file are warned about, not refused.
_READING_FILE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "ni_hf_reading_config_file", default=False
)


class InvalidSetting(ValueError):
    """A value a setting cannot take; the message says what was expected and `named_errors` adds the setting."""


def named_errors(cls: type) -> type:
    """Make a `@strict` config raise its validators' own errors, each naming the setting, instead of hub's wrappers.

    Apply it above `@strict`: field validators then refuse a bad value on assignment as at construction, and
    `validate()` raises the class validator's ValueError.
    """
    strict_setattr, strict_validate = cls.__setattr__, cls.validate

    def unwrapped(error: StrictDataclassError, name: str | None = None) -> Exception:
        cause = error.__cause__
        if isinstance(error, StrictDataclassFieldValidationError) and isinstance(cause, InvalidSetting):
            return ValueError(f"`{name}` {cause}")
        return cause if cause is not None else error

    def __setattr__(self: Any, name: str, value: Any) -> None:
        try:
            strict_setattr(self, name, value)
        except StrictDataclassError as error:
            raise unwrapped(error, name) from None

    @functools.wraps(strict_validate)
    def validate(self: Any) -> None:
        try:
            strict_validate(self)
        except StrictDataclassError as error:
            raise unwrapped(error) from None

    validate.__is_defined_by_strict_decorator__ = True  # lets a subclass apply `@strict` again
    cls.__setattr__ = __setattr__
    cls.validate = validate
    return cls


def is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@as_validated_field
def positive_int(value: Any) -> None:
    if not is_positive_int(value):
        raise InvalidSetting(f"must be a positive integer, got {value!r}.")


def validate_task_names(task_names: Any) -> list[str]:
    """A new list of the task names; a ValueError unless they are a non-empty sequence of distinct names."""
    # A string is iterable: list("mnist") would silently make five one-letter tasks.
    if isinstance(task_names, (str, bytes)):
        raise ValueError(f"`task_names` must be a list of names, got the string {task_names!r}.")
    # A task's index is its id: a set's order changes from one process to the next.
    if isinstance(task_names, (set, frozenset)):
        raise ValueError(f"`task_names` must be an ordered list of names, got the set {task_names!r}.")
    try:
        names = list(task_names)
    except TypeError:
        raise ValueError(f"`task_names` must be a list of names, got {task_names!r}.") from None
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"`task_names` must hold non-empty strings, got {name!r} in {names!r}.")
    if not names:
        raise ValueError("`task_names` must name at least one task, got an empty list.")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"`task_names` must be distinct, got {repeated} more than once in {names!r}.")
    return [str(name) for name in names]


def check_task_names(task_names: Any) -> None:
    """Field validator of `task_names`: None (one task, "default") or names `validate_task_names` accepts."""
    if task_names is not None:
        validate_task_names(task_names)


def check_task_index(default_task: Any) -> None:
    """Field validator of `default_task`: an int (whether it indexes `task_names` is a class validator's check)."""
    if not isinstance(default_task, int) or isinstance(default_task, bool):
        raise InvalidSetting(f"must be an integer index of `task_names`, got {default_task!r}.")


def check_num_labels(num_labels: Any) -> None:
    if not is_positive_int(num_labels):
        raise ValueError(
            f"`num_labels` must be a positive integer (the number of logits per sample), got {num_labels!r}."
        )


@functools.cache
def _pretrained_config_keys() -> frozenset[str]:
    """Every key `PreTrainedConfig` accepts: its fields, PRETRAINED_CONFIG_KEYS and the generation settings."""
    keys = set(PRETRAINED_CONFIG_KEYS) | {field.name for field in dataclasses.fields(PreTrainedConfig)}
    try:
        from transformers import GenerationConfig

        # Old config.json files hold generation settings, which PreTrainedConfig drops.
        keys |= set(GenerationConfig._get_default_generation_params())
    except (ImportError, AttributeError):  # a private helper, absent from some transformers versions
        pass
    return frozenset(keys)


def check_setting_names(config_class: type, kwargs: dict[str, Any]) -> None:
    """Refuse keyword arguments that are neither the config's fields nor keys `PreTrainedConfig` knows.

    Keys starting with "_" (transformers' private state) pass; a misspelt key is named with the closest setting.
    While `from_dict` reads a file, an unknown key is a warning instead.
    """
    fields = {field.name for field in dataclasses.fields(config_class)}
    known = fields | _pretrained_config_keys()
    unknown = [key for key in kwargs if not key.startswith("_") and key not in known]
    if not unknown:
        return
    closest = {key: difflib.get_close_matches(key, sorted(known), n=1) for key in unknown}
    named = ", ".join(
        f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key) for key, close in closest.items()
    )
    own = sorted(fields - {field.name for field in dataclasses.fields(PreTrainedConfig)})
    listed = "" if all(closest.values()) else f" Its own settings are {own}, besides PreTrainedConfig's."
    message = f"{config_class.__name__} got unknown setting(s) {named}.{listed}"
    if _READING_FILE.get():
        logging.get_logger(config_class.__module__).warning(
            f"{message} Kept as attributes; the model does not read them."
        )
        return
    raise TypeError(message)


def check_model_type(config_class: type, model_type: Any) -> None:
    """Refuse a config dict of another model type (transformers only warns), naming the class that reads it."""
    if model_type is None or model_type == config_class.model_type:
        return
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type in CONFIG_MAPPING:
        hint = f"read it with {CONFIG_MAPPING[model_type].__name__} (or AutoConfig)"
    else:
        hint = (
            "transformers knows no config class of that type; if its checkpoint ships its code, read it with "
            "AutoConfig.from_pretrained(..., trust_remote_code=True)"
        )
    raise ValueError(
        f"{config_class.__name__} reads configs of model_type {config_class.model_type!r}, got one of model_type "
        f"{model_type!r}: {hint}."
    )


def check_checkpoint_path(path: Any) -> None:
    """Refuse, by name, a path that is neither a folder nor a Hub repo id (the Hub's error speaks of repo ids)."""
    if not isinstance(path, (str, os.PathLike)) or os.path.exists(path):
        return
    try:
        validate_repo_id(os.fspath(path))
    except HFValidationError:
        raise OSError(
            f"`{os.fspath(path)}` is not a folder that exists (nor a Hub repo id, 'name' or 'namespace/name'): "
            "check the path, or save the model there first."
        ) from None


@contextlib.contextmanager
def reading_config_file() -> Iterator[None]:
    """Meanwhile, unknown keys are warned about instead of refused (they come from a file, not from a caller)."""
    token = _READING_FILE.set(True)
    try:
        yield
    finally:
        _READING_FILE.reset(token)


def preset_settings(
    preset: dict[str, Any], id2label: dict[int, str] | None, overrides: dict[str, Any]
) -> dict[str, Any]:
    """A preset's settings with the caller's overrides, and its label names unless the caller sets labels."""
    settings = {**preset, **overrides}
    if "id2label" in overrides and "num_labels" not in overrides:
        # The caller's id2label sets the number of labels; the preset's num_labels would conflict with it.
        settings.pop("num_labels", None)
    if (
        id2label is not None
        and not {"id2label", "label2id"} & overrides.keys()
        and settings.get("num_labels") == len(id2label)
    ):
        settings["id2label"] = dict(id2label)
        settings["label2id"] = {label: i for i, label in id2label.items()}
    return settings


class CheckedConfigMixin:
    """Refuses unknown settings by name (warns when they come from a file) and another model type's config dict."""

    model_type: str

    def __post_init__(self, **kwargs: Any) -> None:
        check_setting_names(type(self), kwargs)
        super().__post_init__(**kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, **kwargs: Any) -> Any:
        """As `PreTrainedConfig.from_pretrained`, saying so when a path is neither a folder nor a Hub repo id."""
        check_checkpoint_path(pretrained_model_name_or_path)
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> Any:
        """As `PreTrainedConfig.from_dict`, refusing another model's config; the overrides are checked together."""
        check_model_type(cls, config_dict.get("model_type"))
        with reading_config_file():
            result = super().from_dict(config_dict, **kwargs)
        # from_dict sets the overrides one by one after construction: only each one's own field was checked.
        (result[0] if isinstance(result, tuple) else result).validate()
        return result


@dataclasses.dataclass(init=False, repr=False, eq=False, kw_only=True)
class MultiTaskConfigMixin(CheckedConfigMixin):
    """What the image models' configs share: tasks with a CLS token and a head each, labels, image patches.

    Setting `task_names` to None means one task, "default", and a tuple becomes a list. `attn_implementation`
    assigned on the config is the model's `_attn_implementation`, which its forward reads (and checks).

    Args:
        task_names: the tasks (datasets), each with its own CLS token and head, in this order; None: one task,
            "default".
        default_task: index of the task used when `task_ids` is not given (e.g. by `pipeline`).
    """

    task_names: list[str] | tuple[str, ...] | None = validated_field(check_task_names, default=None)
    default_task: int = validated_field(check_task_index, default=0)

    def __setattr__(self, name: str, value: Any) -> None:
        # One form of the tasks whichever way a config gets them: constructor, from_pretrained override, assignment.
        if name == "task_names":
            value = ["default"] if value is None else validate_task_names(value)
        elif (
            name == "attn_implementation"
        ):  # else a stray attribute that no forward reads, saved in config.json
            name = "_attn_implementation"
        super().__setattr__(name, value)

    @property
    def num_labels(self) -> int | None:
        """The number of labels: the length of `id2label`."""
        return len(self.id2label) if self.id2label is not None else None

    @num_labels.setter
    def num_labels(self, num_labels: int) -> None:
        check_num_labels(num_labels)
        PreTrainedConfig.num_labels.fset(self, num_labels)

    @property
    def num_tasks(self) -> int:
        return len(self.task_names)

    @property
    def grid_size(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid_size**2

    @property
    def patch_dim(self) -> int:
        return self.patch_size * self.patch_size * self.num_channels

    def validate_tasks(self) -> None:
        """The task names (a list edited in place too), `default_task` one of their indices, at least one label."""
        validate_task_names(self.task_names)
        if not 0 <= self.default_task < len(self.task_names):
            raise ValueError(
                f"`default_task` must index `task_names` (0..{len(self.task_names) - 1}), got {self.default_task}."
            )
        # `id2label` set to {} directly leaves the heads with no logits.
        if not self.id2label:
            raise ValueError(
                "`num_labels` must be a positive integer (the number of logits per sample), got "
                f"{self.num_labels!r} (id2label={self.id2label!r})."
            )

    def validate_attention_heads(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"`hidden_size` ({self.hidden_size}) must be divisible by `num_attention_heads` "
                f"({self.num_attention_heads}): each head gets hidden_size / heads value features."
            )

    def validate_patches(self) -> None:
        if not isinstance(self.image_size, int) or not isinstance(self.patch_size, int):
            raise ValueError(
                f"`image_size` and `patch_size` must be integers (square images and patches), got "
                f"{self.image_size!r} and {self.patch_size!r}."
            )
        if self.image_size % self.patch_size:
            raise ValueError(
                f"`patch_size` ({self.patch_size}) must divide `image_size` ({self.image_size}): images are cut "
                f"into patch_size x patch_size patches; choose an image_size that is a multiple of patch_size."
            )


@dataclasses.dataclass(init=False, repr=False, eq=False, kw_only=True)
class PanelConfigMixin:
    """PGM puzzles and WReN's panel CNN (`PanelEmbedding`), the same settings in every config that reads panels.

    Args:
        num_context_panels: context panels of a PGM puzzle (the 3x3 matrix without its last panel), each with a
            learned embedding of its matrix position; every candidate gets the embedding of the missing one.
        num_choices: candidate panels of a PGM puzzle; the multiple-choice models score each (`num_labels` = 1).
        panel_size: side of the square panels the panel CNN reads (80 in WReN).
        panel_channels: channels of each panel (1: PGM panels are grey-scale).
        panel_cnn_channels: channels of each convolution of the panel CNN.
        panel_cnn_layers: 3x3 convolutions of stride 2 (each with BatchNorm and ReLU) in the panel CNN, followed
            by a Linear map of its `panel_feature_dim` features to hidden_size.
    """

    num_context_panels: int = positive_int(default=8)
    num_choices: int = positive_int(default=8)
    panel_size: int = positive_int(default=80)
    panel_channels: int = positive_int(default=1)
    panel_cnn_channels: int = positive_int(default=32)
    panel_cnn_layers: int = positive_int(default=4)

    @property
    def num_panels(self) -> int:
        """Panels of one PGM puzzle: the context panels, then the candidates."""
        return self.num_context_panels + self.num_choices

    @property
    def panel_feature_size(self) -> int:
        """Side of the panel CNN's last feature map: each 3x3 convolution of stride 2, padding 1 halves it, rounding up."""
        return -(-self.panel_size // 2**self.panel_cnn_layers)

    @property
    def panel_feature_dim(self) -> int:
        """Features the panel CNN gives the Linear map to hidden_size."""
        return self.panel_cnn_channels * self.panel_feature_size**2


PANEL_FIELDS = tuple(field.name for field in dataclasses.fields(PanelConfigMixin))
"""The panel settings, which fix the shapes of the panel CNN's parameters."""
