"""Configuration of the multi-task ViT baseline of the paper's Figure 4a (one CLS token and one head per task)."""

from __future__ import annotations

import contextvars
import dataclasses
import difflib
import functools
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import PretrainedConfig, ViTConfig
from transformers.utils import logging

logger = logging.get_logger(__name__)

# The paper's digits ViT baseline (appendix, Figure 4a): 8 pre-norm layers, d = 192, 3 heads of 64, MLP 192, 4x4
# patches of 32x32 RGB images, one CLS token and head per pre-training dataset. The reference's transformer
# (lucidrains' ViT) has no bias in its query/key/value projection.
MULTITASK_VIT_PRESETS: dict[str, dict[str, Any]] = {
    "digits": dict(
        hidden_size=192,
        num_hidden_layers=8,
        num_attention_heads=3,
        intermediate_size=192,
        qkv_bias=False,
        image_size=32,
        patch_size=4,
        num_channels=3,
        layer_norm_eps=1e-5,
        task_names=["mnist", "mnistm", "svhn"],
        num_labels=10,
    ),
}


# Label names that `from_paper` gives a preset unless the caller sets the labels.
MULTITASK_VIT_PRESET_ID2LABEL: dict[str, dict[int, str]] = {"digits": {i: str(i) for i in range(10)}}


# A copy of `configuration_neural_interpreter.validate_task_names`: a ViT checkpoint's copied remote code
# holds only this module and the modeling one, so neither may import the Neural Interpreter's modules.
def _validate_task_names(task_names: Any) -> list[str]:
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


# A copy of `configuration_neural_interpreter.PRETRAINED_CONFIG_KEYS` (this module may not import that one): keys a
# config.json written by transformers 4.x or 5.x may hold besides the dataclass fields of `PretrainedConfig`.
_PRETRAINED_CONFIG_KEYS = frozenset(
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


@functools.cache
def _pretrained_config_keys() -> frozenset[str]:
    """Every key `PretrainedConfig` accepts: its fields, _PRETRAINED_CONFIG_KEYS and the generation settings."""
    keys = set(_PRETRAINED_CONFIG_KEYS) | {field.name for field in dataclasses.fields(PretrainedConfig)}
    try:
        from transformers import GenerationConfig

        # Old config.json files hold generation settings, which PretrainedConfig drops.
        keys |= set(GenerationConfig._get_default_generation_params())
    except (ImportError, AttributeError):  # a private helper, absent from some transformers versions
        pass
    return frozenset(keys)


# True while `from_dict` builds a config: a config.json may hold attributes set on a config at run time (as
# transformers' own tests do), so unknown keys read from a file are warned about, not refused.
_LOADING: contextvars.ContextVar[bool] = contextvars.ContextVar("ni_hf_loading_vit_config", default=False)


def _check_extra_keys(config_class: type, extra: dict[str, Any]) -> None:
    """Refuse keyword arguments that are neither the config's fields nor `PretrainedConfig`'s known keys.

    While `from_dict` loads a file, an unknown key is a warning instead.
    """
    own = {field.name for field in dataclasses.fields(config_class)}
    known = own | _pretrained_config_keys()
    unknown = [key for key in extra if not key.startswith("_") and key not in known]
    if not unknown:
        return
    closest = {key: difflib.get_close_matches(key, sorted(known), n=1) for key in unknown}
    named = ", ".join(
        f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key) for key, close in closest.items()
    )
    listed = "" if all(closest.values()) else f" Its settings are {sorted(own)}."
    message = f"{config_class.__name__} got unknown setting(s) {named}.{listed}"
    if _LOADING.get():
        logger.warning(f"{message} Kept as attributes; the model does not read them.")
        return
    raise TypeError(message)


@strict
class MultiTaskViTConfig(ViTConfig):
    r"""A `ViTConfig` with one learned CLS token and one LayerNorm + Linear head per task.

    Args:
        task_names: the tasks (datasets), each with its own CLS token and head, in this order.
        default_task: index of the task used when `task_ids` is not given (e.g. by `pipeline`).
        Other arguments as in `transformers.ViTConfig` (`pooler_*` and `encoder_stride` are unused).
    """

    model_type = "ni_multitask_vit"

    task_names: list[str] | None = None
    default_task: int = 0

    def __post_init__(self, **kwargs: Any) -> None:
        _check_extra_keys(type(self), kwargs)
        num_labels = kwargs.get("num_labels")
        if num_labels is not None and (
            isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 1
        ):
            raise ValueError(
                f"`num_labels` must be a positive integer (one logit per class), got {num_labels!r}."
            )
        self.task_names = (
            _validate_task_names(self.task_names) if self.task_names is not None else ["default"]
        )
        super().__post_init__(**kwargs)
        self.validate_tasks()

    @classmethod
    def from_paper(cls, name: str = "digits", **overrides: Any) -> MultiTaskViTConfig:
        """The paper's ViT baseline: "digits" (1,809,438 parameters with its three heads, paper: 1.80M)."""
        if name not in MULTITASK_VIT_PRESETS:
            raise ValueError(f"Unknown preset {name!r}; expected one of {sorted(MULTITASK_VIT_PRESETS)}.")
        settings = {**MULTITASK_VIT_PRESETS[name], **overrides}
        if "id2label" in overrides and "num_labels" not in overrides:
            # The caller's id2label sets the number of labels; the preset's num_labels would conflict with it.
            settings.pop("num_labels", None)
        id2label = MULTITASK_VIT_PRESET_ID2LABEL.get(name)
        if (
            id2label is not None
            and not {"id2label", "label2id"} & overrides.keys()
            and settings.get("num_labels") == len(id2label)
        ):
            settings["id2label"] = dict(id2label)
            settings["label2id"] = {label: i for i, label in id2label.items()}
        return cls(**settings)

    @classmethod
    def from_dict(
        cls, config_dict: dict[str, Any], **kwargs: Any
    ) -> MultiTaskViTConfig | tuple[MultiTaskViTConfig, dict[str, Any]]:
        """As `PretrainedConfig.from_dict` (unknown keys warned about), validated again after the kwargs are set."""
        loading = _LOADING.set(True)
        try:
            result = super().from_dict(config_dict, **kwargs)
        finally:
            _LOADING.reset(loading)
        config = result[0] if isinstance(result, tuple) else result
        if config.task_names is None:
            config.task_names = ["default"]
        else:
            config.task_names = _validate_task_names(config.task_names)
        config.validate_tasks()
        return result

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
        """Raise a ValueError naming what was expected for inconsistent task settings or geometry."""
        _validate_task_names(self.task_names)
        # `num_labels = n` sets id2label; n <= 0 leaves it empty, and the heads would give empty logits.
        if not self.id2label:
            raise ValueError(
                f"`num_labels` must be a positive integer (one logit per class), got {self.num_labels!r} "
                f"(id2label={self.id2label!r})."
            )
        if not isinstance(self.default_task, int) or isinstance(self.default_task, bool):
            raise ValueError(
                f"`default_task` must be an integer index of `task_names`, got {self.default_task!r}."
            )
        if not 0 <= self.default_task < len(self.task_names):
            raise ValueError(
                f"`default_task` must index `task_names` (0..{len(self.task_names) - 1}), got {self.default_task}."
            )
        if not isinstance(self.image_size, int) or not isinstance(self.patch_size, int):
            raise ValueError("`image_size` and `patch_size` must be integers (square images and patches).")
        if self.image_size % self.patch_size:
            raise ValueError(
                f"`patch_size` ({self.patch_size}) must divide `image_size` ({self.image_size})."
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"`hidden_size` ({self.hidden_size}) must be divisible by `num_attention_heads` "
                f"({self.num_attention_heads})."
            )


__all__ = ["MULTITASK_VIT_PRESETS", "MultiTaskViTConfig"]
