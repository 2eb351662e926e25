"""The paper's multi-task ViT baseline: configuration and models (it reads the Neural Interpreter's processor)."""

from .configuration_multitask_vit import MULTITASK_VIT_PRESETS, MultiTaskViTConfig
from .modeling_multitask_vit import (
    MultiTaskViTForImageClassification,
    MultiTaskViTForMultipleChoice,
    MultiTaskViTModel,
    MultiTaskViTPreTrainedModel,
)

__all__ = [
    "MULTITASK_VIT_PRESETS",
    "MultiTaskViTConfig",
    "MultiTaskViTForImageClassification",
    "MultiTaskViTForMultipleChoice",
    "MultiTaskViTModel",
    "MultiTaskViTPreTrainedModel",
]
