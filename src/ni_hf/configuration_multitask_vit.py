"""Configuration of the multi-task ViT baseline of the paper's Figure 4a (one CLS token and one head per task)."""

from __future__ import annotations

from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import ViTConfig

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
        self.task_names = list(self.task_names) if self.task_names is not None else ["default"]
        super().__post_init__(**kwargs)
        self.validate_tasks()

    @classmethod
    def from_paper(cls, name: str = "digits", **overrides: Any) -> MultiTaskViTConfig:
        """The paper's ViT baseline: "digits" (1,809,438 parameters with its three heads, paper: 1.80M)."""
        if name not in MULTITASK_VIT_PRESETS:
            raise ValueError(f"Unknown preset {name!r}; expected one of {sorted(MULTITASK_VIT_PRESETS)}.")
        return cls(**{**MULTITASK_VIT_PRESETS[name], **overrides})

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
        if not self.task_names or len(set(self.task_names)) != len(self.task_names):
            raise ValueError(
                f"`task_names` must be a non-empty list of distinct names, got {self.task_names!r}."
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
