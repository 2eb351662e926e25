"""Configuration of the multi-task ViT baseline of the paper's Figure 4a (one CLS token and one head per task)."""

# Annotations stay strings, so `@strict` leaves the type of the fields below to their validators, whose errors name
# the setting and what it expects.
from __future__ import annotations

from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import ViTConfig

from .configuration_checks import MultiTaskConfigMixin, PanelConfigMixin, named_errors, preset_settings

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
    # The paper's PGM ViT baseline (section 4.3): the Neural Interpreter's panel CNN and recipe, 4 pre-norm layers of
    # d = 192 (4 heads, MLP 192): 1,074,721 parameters against the PGM Neural Interpreter's 1,107,987.
    "pgm": dict(
        hidden_size=192,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=192,
        qkv_bias=False,
        layer_norm_eps=1e-5,
        task_names=["pgm"],
        num_labels=1,
    ),
}

# Label names that `from_paper` gives a preset unless the caller sets the labels.
MULTITASK_VIT_PRESET_ID2LABEL: dict[str, dict[int, str]] = {"digits": {i: str(i) for i in range(10)}}


@named_errors
@strict
class MultiTaskViTConfig(MultiTaskConfigMixin, PanelConfigMixin, ViTConfig):
    r"""A `ViTConfig` with one learned CLS token and one LayerNorm + Linear head per task.

    Args:
        task_names: the tasks (datasets), each with its own CLS token and head, in this order; None: one task,
            "default".
        default_task: index of the task used when `task_ids` is not given (e.g. by `pipeline`).
        num_context_panels / num_choices / panel_size / panel_channels / panel_cnn_channels / panel_cnn_layers:
            PGM puzzles and their panel CNN for `MultiTaskViTForMultipleChoice` (see `PanelConfigMixin`).
        Other arguments as in `transformers.ViTConfig` (`pooler_*` and `encoder_stride` are unused).
    """

    model_type = "ni_multitask_vit"

    @classmethod
    def from_paper(cls, name: str = "digits", **overrides: Any) -> MultiTaskViTConfig:
        """The paper's ViT baseline: "digits" (1,809,438 parameters with its three heads, paper: 1.80M)."""
        if name not in MULTITASK_VIT_PRESETS:
            raise ValueError(f"Unknown preset {name!r}; expected one of {sorted(MULTITASK_VIT_PRESETS)}.")
        settings = preset_settings(
            MULTITASK_VIT_PRESETS[name], MULTITASK_VIT_PRESET_ID2LABEL.get(name), overrides
        )
        return cls(**settings)


__all__ = ["MULTITASK_VIT_PRESETS", "MultiTaskViTConfig"]
