"""PyTorch multi-task ViT: the baseline of the paper's Figure 4a, with the Neural Interpreter's task scaffolding.

As the reference's `MultiViT`, every sample carries one learned CLS token per task in front of its patch tokens,
and each sample is classified by its own task's token through its own LayerNorm + Linear head; the encoder is
transformers' pre-norm `ViTLayer`, the patch embedding transformers' `ViTPatchEmbeddings`. Positions are learned
for the patch tokens only (the task tokens are told apart by their own values), and there is no final LayerNorm
before the heads, which normalise themselves (as in the reference).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    ImageClassifierOutput,
    MultipleChoiceModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.vit.modeling_vit import ViTLayer, ViTPatchEmbeddings
from transformers.utils.generic import can_return_tuple

from .configuration_checks import PANEL_FIELDS, validate_task_names
from .configuration_multitask_vit import MultiTaskViTConfig
from .modeling_checks import (
    BuiltSettingsMixin,
    CheckedLoadingMixin,
    check_forward,
    check_not_empty,
    check_tensor,
)
from .panel_embedding import PanelEmbedding, init_panel_embedding
from .task_heads import TaskHead, TaskHeadsMixin, multiple_choice_loss


class MultiTaskViTEmbeddings(nn.Module):
    """Task (CLS) tokens, then the patch embeddings plus learned positions (or a set of vectors as it is)."""

    def __init__(self, config: MultiTaskViTConfig, add_patch_embedding: bool = True) -> None:
        super().__init__()
        self.config = config
        self.task_tokens = nn.Parameter(torch.empty(config.num_tasks, config.hidden_size))
        self.patch_embeddings = ViTPatchEmbeddings(config) if add_patch_embedding else None
        self.position_embeddings = (
            nn.Parameter(torch.empty(config.num_patches, config.hidden_size)) if add_patch_embedding else None
        )
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def embed_patches(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) images or (B, num_patches, patch_dim) patches -> (B, num_patches, d)."""
        config = self.config
        projection = self.patch_embeddings.projection
        if pixel_values.dim() == 4:
            if pixel_values.shape[1:] != (config.num_channels, config.image_size, config.image_size):
                raise ValueError(
                    f"Images must have shape (batch, {config.num_channels}, {config.image_size}, {config.image_size}), got "
                    f"{tuple(pixel_values.shape)}; resize them with NeuralInterpreterImageProcessor."
                )
            return self.patch_embeddings(pixel_values.to(projection.weight.dtype))
        if pixel_values.dim() != 3 or pixel_values.shape[1:] != (config.num_patches, config.patch_dim):
            raise ValueError(
                f"`pixel_values` must be images (batch, {config.num_channels}, {config.image_size}, {config.image_size}) or patches "
                f"(batch, {config.num_patches}, {config.patch_dim}), got {tuple(pixel_values.shape)}."
            )
        # Patches come flattened as (row, col, channel), the image processor's layout: the convolution's
        # (out, channel, row, col) kernel read in that order is the same projection as on the image.
        weight = projection.weight.permute(0, 2, 3, 1).reshape(config.hidden_size, config.patch_dim)
        return F.linear(pixel_values.to(weight.dtype), weight, projection.bias)

    def forward(
        self, pixel_values: torch.Tensor | None, inputs_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, T + N, d): the T task tokens first, then the patches with their positions, or a set as it is."""
        if inputs_embeds is None:
            if self.patch_embeddings is None:
                raise ValueError("This ViT was built without a patch embedding: pass `inputs_embeds`, a set.")
            elements = self.embed_patches(pixel_values) + self.position_embeddings
        else:
            elements = inputs_embeds.to(self.task_tokens.dtype)
        tokens = self.task_tokens.to(elements.dtype).unsqueeze(0).expand(elements.shape[0], -1, -1)
        return self.dropout(torch.cat([tokens, elements], dim=1))


# The settings that fix the shapes of the backbone's parameters (each head adds its own), and of its patches.
BACKBONE_SETTINGS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "qkv_bias",
    "task_names",
)
IMAGE_SETTINGS = ("image_size", "patch_size", "num_channels")


class MultiTaskViTPreTrainedModel(BuiltSettingsMixin, CheckedLoadingMixin, PreTrainedModel):
    config_class = MultiTaskViTConfig
    config: MultiTaskViTConfig
    base_model_prefix = "vit"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _no_split_modules = ["MultiTaskViTEmbeddings", "ViTLayer"]
    _supports_sdpa = True
    # Trainer must not assume the model averages the loss over processes itself.
    accepts_loss_kwargs = False
    # Whether forward raises on NaN or inf (one host sync).
    checks_finite = True
    # The heads, by the Auto class that loads each; those whose backbone reads sets (`CheckedLoadingMixin`).
    head_classes = {
        "MultiTaskViTForImageClassification": "AutoModelForImageClassification",
        "MultiTaskViTForMultipleChoice": "AutoModelForMultipleChoice",
    }
    set_input_heads = ("MultiTaskViTForMultipleChoice",)

    def __init__(self, config: MultiTaskViTConfig, *inputs: Any, **kwargs: Any) -> None:
        # A config changed in place after construction (`config.task_names = []`) is checked here, not later.
        if isinstance(config, MultiTaskViTConfig):
            config.validate_tasks()
        super().__init__(config, *inputs, **kwargs)

    def check_built_settings(self) -> None:
        """As `BuiltSettingsMixin`'s, and `config.attn_implementation` one of transformers' attention functions."""
        super().check_built_settings()
        name = self.config._attn_implementation
        if name not in (None, "eager") and name not in ALL_ATTENTION_FUNCTIONS:
            raise ValueError(
                f'`config.attn_implementation` is "{name}": the ViT layers run transformers\' attention functions, '
                f"expected one of {sorted({'eager', *ALL_ATTENTION_FUNCTIONS})} (set it with "
                "model.set_attn_implementation)."
            )

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Save as transformers does; a checkpoint with copied code also names the backbone for `AutoModel`."""
        if self._auto_class is not None:
            auto_map = dict(getattr(self.config, "auto_map", None) or {})
            auto_map.setdefault("AutoModel", "modeling_multitask_vit.MultiTaskViTModel")
            self.config.auto_map = auto_map
        return super().save_pretrained(save_directory, *args, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """ViT's init (truncated normal weights, learned positions); task tokens ~ N(0, 1) as the NI's."""
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            init.trunc_normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, nn.BatchNorm2d):
            init.ones_(module.weight)
            init.zeros_(module.bias)
            init.zeros_(module.running_mean)
            init.ones_(module.running_var)
            init.zeros_(module.num_batches_tracked)
        elif isinstance(module, MultiTaskViTEmbeddings):
            if module.position_embeddings is not None:
                init.trunc_normal_(module.position_embeddings, mean=0.0, std=std)
            init.normal_(module.task_tokens)
        elif isinstance(module, PanelEmbedding):  # after its layers: the panel CNN's own initialisation wins
            init_panel_embedding(module)


class MultiTaskViTModel(MultiTaskViTPreTrainedModel):
    """The backbone: task tokens and patch embeddings through pre-norm ViT layers."""

    def __init__(self, config: MultiTaskViTConfig, add_patch_embedding: bool = True) -> None:
        r"""add_patch_embedding: False for a head that feeds sets (`inputs_embeds`), which never reads patches."""
        super().__init__(config)
        self.config = config
        self.embeddings = MultiTaskViTEmbeddings(config, add_patch_embedding)
        self.layers = nn.ModuleList(ViTLayer(config) for _ in range(config.num_hidden_layers))
        self.post_init()

    def fixed_settings(self) -> tuple[str, ...]:
        return BACKBONE_SETTINGS + (IMAGE_SETTINGS if self.embeddings.patch_embeddings is not None else ())

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.patch_embeddings

    @property
    def task_tokens(self) -> nn.Parameter:
        return self.embeddings.task_tokens

    def reset_task_tokens(self, task_names: Sequence[str]) -> None:
        """Replace the task (CLS) tokens by fresh N(0, 1) ones, one per new task (adaptation to new tasks)."""
        # Validate before any change: a refused call leaves the model as it was.
        names = validate_task_names(task_names)
        self.config.task_names = names
        self.config.default_task = 0
        ref = self.embeddings.task_tokens
        self.embeddings.task_tokens = nn.Parameter(
            torch.randn(len(names), ref.shape[1], device=ref.device, dtype=ref.dtype)
        )
        self.record_built_settings()

    def add_task_tokens(self, task_names: Sequence[str]) -> list[int]:
        """Append fresh N(0, 1) task (CLS) tokens for new tasks; the existing ones stay, unchanged.

        Returns the indices of the new tasks; an image classifier needs a head per new task too (`add_tasks`).
        """
        names = validate_task_names(task_names)
        if set(names) & set(self.config.task_names):
            raise ValueError(
                f"`task_names` must be new, distinct names (existing: {self.config.task_names}); got {names}."
            )
        old = self.config.num_tasks
        self.config.task_names = [*self.config.task_names, *names]
        ref = self.embeddings.task_tokens
        fresh = torch.randn(len(names), ref.shape[1], device=ref.device, dtype=ref.dtype)
        self.embeddings.task_tokens = nn.Parameter(
            torch.cat([ref.data, fresh]), requires_grad=ref.requires_grad
        )
        self.record_built_settings()
        return list(range(old, old + len(names)))

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        inputs_embeds: torch.Tensor | None = None,
        check_finite: bool | None = None,
    ) -> BaseModelOutputWithPooling:
        r"""Run the layers on the task tokens and the patches (or a set of vectors).

        Args:
            pixel_values: images (B, C, H, W) or patches (B, num_patches, patch_dim) from the image processor.
            output_hidden_states: return the tokens before the first and after every layer.
            inputs_embeds: instead of pixel values, a set of vectors (B, N, d) used as it is (no positions added).
            check_finite: check the inputs and the output for NaN and inf (default `self.checks_finite`); a head
                passes False and checks them with its own, in one host sync.

        Returns `last_hidden_state` (B, T + N, d) and `pooler_output` (B, T, d), the task tokens.
        """
        if (pixel_values is None) == (inputs_embeds is None):
            raise ValueError(
                "Pass exactly one of `pixel_values` (images or patches) and `inputs_embeds` (a set)."
            )
        self.check_built_settings()
        given = pixel_values if inputs_embeds is None else inputs_embeds
        what = "images or patches from NeuralInterpreterImageProcessor" if inputs_embeds is None else "a set"
        name = "pixel_values" if inputs_embeds is None else "inputs_embeds"
        check_tensor(name, given, what, self.embeddings.task_tokens.device)
        if given.shape[0] == 0:
            raise ValueError("Got an empty batch (0 samples); pass at least one image.")
        if inputs_embeds is not None and (
            inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != self.config.hidden_size
        ):
            raise ValueError(
                f"`inputs_embeds` must have shape (batch, set_size, {self.config.hidden_size}), got "
                f"{tuple(inputs_embeds.shape)}."
            )
        output_hidden_states = (
            self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        hidden = self.embeddings(pixel_values, inputs_embeds)
        all_hidden = (hidden,) if output_hidden_states else None
        for layer in self.layers:
            hidden = layer(hidden)
            if output_hidden_states:
                all_hidden += (hidden,)
        if self.checks_finite if check_finite is None else check_finite:
            inputs = {"pixel_values": pixel_values, "inputs_embeds": inputs_embeds}
            check_forward(self, inputs, {"last_hidden_state": hidden})
        pooled = hidden[:, : self.config.num_tasks]
        return BaseModelOutputWithPooling(
            last_hidden_state=hidden, pooler_output=pooled, hidden_states=all_hidden
        )


class MultiTaskViTForImageClassification(TaskHeadsMixin, MultiTaskViTPreTrainedModel):
    """Multi-task image classifier: each sample's task id picks its CLS token output and its head."""

    def __init__(self, config: MultiTaskViTConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.vit = MultiTaskViTModel(config)
        self.classifier = nn.ModuleList(
            TaskHead(config.hidden_size, config.num_labels, config.layer_norm_eps)
            for _ in range(config.num_tasks)
        )
        self.post_init()

    def fixed_settings(self) -> tuple[str, ...]:
        return ("num_labels",)

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        task_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
    ) -> ImageClassifierOutput:
        r"""Logits of each sample's task head; the loss of `config.problem_type` when `labels` are given.

        Args:
            task_ids: (B,) index of each sample's task in `config.task_names` (default `config.default_task`).
            labels: (B,) class indices (cross-entropy); (B, num_labels) floats for multi-label classification or
                regression, with transformers' own rules for `problem_type` (`TaskHeadsMixin.classification_loss`).
            Other arguments as in `MultiTaskViTModel.forward`.
        """
        self.check_built_settings()
        self.check_task_heads()
        outputs = self.vit(
            pixel_values=pixel_values, output_hidden_states=output_hidden_states, check_finite=False
        )
        logits = self.task_logits(outputs.pooler_output, task_ids)
        labels = None if labels is None else torch.as_tensor(labels, device=logits.device)
        if self.checks_finite:
            inputs = {"pixel_values": pixel_values, "labels": labels}
            check_forward(self, inputs, {"logits": logits, "last_hidden_state": outputs.last_hidden_state})
        loss = None if labels is None else self.classification_loss(logits, labels)
        return ImageClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


class MultiTaskViTForMultipleChoice(MultiTaskViTPreTrainedModel):
    """The paper's PGM ViT baseline (section 4.3): the Neural Interpreter's scaffolding (panel CNN, one set of a CLS
    token, the 8 context panels and a candidate per candidate, a head scoring the CLS output), ViT layers between."""

    def __init__(self, config: MultiTaskViTConfig) -> None:
        if config.num_labels != 1 or config.num_tasks != 1:
            raise ValueError(
                "MultiTaskViTForMultipleChoice scores each candidate with one CLS token and one output: it needs "
                f"num_labels=1 and one task (the 'pgm' preset's), got {config.num_labels} and {config.num_tasks}."
            )
        super().__init__(config)
        self.panel_embedding = PanelEmbedding(config)
        self.vit = MultiTaskViTModel(config, add_patch_embedding=False)
        self.scorer = TaskHead(config.hidden_size, 1, config.layer_norm_eps)
        self.post_init()

    def fixed_settings(self) -> tuple[str, ...]:
        return PANEL_FIELDS

    def get_input_embeddings(self) -> nn.Module:
        return self.panel_embedding

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
    ) -> MultipleChoiceModelOutput:
        r"""Scores (B, num_choices) of the candidates of (B, 16, 1, 80, 80) panels; cross-entropy against `labels`."""
        self.check_built_settings()
        device = self.scorer.linear.weight.device
        check_tensor(
            "pixel_values", pixel_values, "panels as NeuralInterpreterPanelProcessor gives them", device
        )
        check_not_empty(pixel_values.shape[0])
        context, candidates = self.panel_embedding(pixel_values)
        sets = PanelEmbedding.candidate_sets(context, candidates)
        outputs = self.vit(inputs_embeds=sets, output_hidden_states=output_hidden_states, check_finite=False)
        logits = self.scorer(outputs.pooler_output[:, 0]).view(candidates.shape[0], candidates.shape[1])
        labels = None if labels is None else torch.as_tensor(labels)
        if self.checks_finite:
            check_forward(self, {"pixel_values": pixel_values, "labels": labels}, {"logits": logits})
        loss = None if labels is None else multiple_choice_loss(logits, labels)
        return MultipleChoiceModelOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


__all__ = [
    "MultiTaskViTPreTrainedModel",
    "MultiTaskViTModel",
    "MultiTaskViTForImageClassification",
    "MultiTaskViTForMultipleChoice",
]
