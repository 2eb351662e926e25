"""PyTorch context-blind PGM baseline: each candidate panel scored alone, the context panels never read.

The sanity row of the RAVEN literature (I-RAVEN, RAVEN-FAIR): a model that sees only the candidates. It is the
Neural Interpreter's PGM scaffolding without the interpreter and without the context: the same panel CNN and
candidate position embedding (`PanelEmbedding`), the same LayerNorm + Linear scorer (`TaskHead`), a softmax over
the candidates. What it scores above chance, the candidates give away by themselves.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import MultipleChoiceModelOutput
from transformers.utils.generic import can_return_tuple

from .configuration_checks import PANEL_FIELDS
from .configuration_context_blind import ContextBlindConfig
from .modeling_checks import (
    BuiltSettingsMixin,
    CheckedLoadingMixin,
    check_forward,
    check_not_empty,
    check_tensor,
)
from .panel_embedding import PanelEmbedding, init_panel_embedding
from .task_heads import TaskHead, multiple_choice_loss


class ContextBlindPreTrainedModel(BuiltSettingsMixin, CheckedLoadingMixin, PreTrainedModel):
    config_class = ContextBlindConfig
    config: ContextBlindConfig
    base_model_prefix = "context_blind"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    # Trainer must not assume the model averages the loss over processes itself.
    accepts_loss_kwargs = False
    # Whether forward raises on NaN or inf (one host sync).
    checks_finite = True
    head_classes = {"ContextBlindForMultipleChoice": "AutoModelForMultipleChoice"}

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """The panel CNN's own initialisation; the scorer's Linear as the Neural Interpreter's heads (PyTorch's)."""
        if isinstance(module, nn.Linear):
            init.kaiming_uniform_(module.weight, a=5**0.5)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, PanelEmbedding):  # after its layers: the panel CNN's own initialisation wins
            init_panel_embedding(module)


class ContextBlindForMultipleChoice(ContextBlindPreTrainedModel):
    """Scores (B, num_choices) of PGM candidates, each from its own panel alone: panel CNN, then scorer."""

    def __init__(self, config: ContextBlindConfig) -> None:
        super().__init__(config)
        self.panel_embedding = PanelEmbedding(config)
        self.scorer = TaskHead(config.hidden_size, 1, config.layer_norm_eps)
        self.post_init()

    def fixed_settings(self) -> tuple[str, ...]:
        return ("hidden_size", *PANEL_FIELDS)

    def get_input_embeddings(self) -> nn.Module:
        return self.panel_embedding

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.panel_embedding = value

    @can_return_tuple
    def forward(
        self, pixel_values: torch.Tensor | None = None, labels: torch.Tensor | None = None
    ) -> MultipleChoiceModelOutput:
        r"""Scores (B, num_choices) of the candidates; cross-entropy against `labels` (B,), the correct ones.

        Args:
            pixel_values: (B, 16, 1, 80, 80) panels as the Neural Interpreter's PGM model reads them (the 8 context
                panels, then the 8 candidates, from `NeuralInterpreterPanelProcessor`); only the candidates are read.
            labels: (B,) index of each puzzle's correct candidate (-100: not counted).
        """
        self.check_built_settings()
        device = self.scorer.linear.weight.device
        check_tensor(
            "pixel_values", pixel_values, "panels as NeuralInterpreterPanelProcessor gives them", device
        )
        check_not_empty(pixel_values.shape[0])
        candidates = self.panel_embedding.embed_candidates(pixel_values)  # (B, K, d)
        logits = self.scorer(candidates).squeeze(-1)  # (B, K)
        labels = None if labels is None else torch.as_tensor(labels)
        if self.checks_finite:
            candidate_panels = pixel_values[:, self.config.num_context_panels :]
            check_forward(self, {"pixel_values": candidate_panels, "labels": labels}, {"logits": logits})
        loss = None if labels is None else multiple_choice_loss(logits, labels)
        return MultipleChoiceModelOutput(loss=loss, logits=logits)


__all__ = ["ContextBlindForMultipleChoice", "ContextBlindPreTrainedModel"]
