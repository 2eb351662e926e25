# Copied from ni_hf.models.neural_interpreter.panel_embedding: edit the original, not this copy
"""The panel embedding of the paper's PGM set-up (section 4.3), shared by every model that reads PGM puzzles.

Every panel of a puzzle goes through WReN's shallow CNN (Barrett et al. 2018: 3x3 convolutions of stride 2, each with
BatchNorm and ReLU, then a Linear map to the hidden size), and gets a learned embedding of its place: one of the 8
context positions of the 3x3 matrix, or the 9th, the missing panel's, for every candidate. Every model folder holds
a copy of this file (marked "Copied from", checked by tests/test_model_copies.py), which its checkpoints copy.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from transformers import initialization as init


class PanelEmbedding(nn.Module):
    """(B, 16, C, S, S) panels -> context (B, 8, d) and candidates (B, 8, d) embeddings, each with its position's."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        channels, layers = config.panel_channels, []
        for _ in range(config.panel_cnn_layers):
            layers += [
                nn.Conv2d(channels, config.panel_cnn_channels, kernel_size=3, stride=2, padding=1),
                nn.BatchNorm2d(config.panel_cnn_channels),
                nn.ReLU(),
            ]
            channels = config.panel_cnn_channels
        self.cnn = nn.Sequential(*layers)
        side = math.ceil(config.panel_size / 2**config.panel_cnn_layers)  # each layer halves, rounding up
        self.projection = nn.Linear(channels * side * side, config.hidden_size)
        self.position_embeddings = nn.Parameter(
            torch.empty(config.num_context_panels + 1, config.hidden_size)
        )
        self.num_context_panels = config.num_context_panels
        self.panel_shape = (config.panel_channels, config.panel_size, config.panel_size)
        self.num_panels = config.num_context_panels + config.num_choices

    def check_panels(self, pixel_values: torch.Tensor) -> None:
        """Refuse, naming the expected layout, anything but (B, 16, C, S, S) panels."""
        expected = (self.num_panels, *self.panel_shape)
        if pixel_values.dim() != 5 or tuple(pixel_values.shape[1:]) != expected:
            raise ValueError(
                f"PGM `pixel_values` must have shape (batch, {', '.join(map(str, expected))}): "
                f"{self.num_context_panels} context panels, then the candidates, as NeuralInterpreterPanelProcessor "
                f"gives them; got {tuple(pixel_values.shape)}."
            )

    def embed_panels(self, panels: torch.Tensor) -> torch.Tensor:
        """(B, P, C, S, S) panels -> (B, P, d): the CNN and the projection, every panel in one batch."""
        features = self.cnn(panels.flatten(0, 1).to(self.projection.weight.dtype))
        return self.projection(features.flatten(1)).view(panels.shape[0], panels.shape[1], -1)

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each panel embedded once: the context panels are shared by the sets of all candidates."""
        self.check_panels(pixel_values)
        panels = self.embed_panels(pixel_values)
        context = panels[:, : self.num_context_panels] + self.position_embeddings[:-1]
        candidates = panels[:, self.num_context_panels :] + self.position_embeddings[-1]
        return context, candidates

    def embed_candidates(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, K, d): the candidates alone, as `forward` embeds them; no context panel is read (not even by the
        BatchNorm statistics of a training batch)."""
        self.check_panels(pixel_values)
        return self.embed_panels(pixel_values[:, self.num_context_panels :]) + self.position_embeddings[-1]

    @staticmethod
    def candidate_sets(context: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """(B * K, 9, d): for each of the K candidates, the 8 context embeddings and that candidate's."""
        batch, num_choices, d = candidates.shape
        shared = context.unsqueeze(1).expand(batch, num_choices, *context.shape[1:])
        return torch.cat([shared, candidates.unsqueeze(2)], dim=2).flatten(0, 1)


@torch.no_grad()
def init_panel_embedding(module: PanelEmbedding) -> None:
    """The panel CNN's one initialisation, whichever model holds it: PyTorch's default for the convolutions and the
    projection (Kaiming-uniform weights, biases uniform in +-1/sqrt(fan_in)), BatchNorm as the identity, the
    positions ~ N(0, 1). PyTorch's default because the authors' PyTorch code keeps it for every layer it builds (the
    BatchNorm after each convolution would normalise away the scale of a ViT-style N(0, 0.02) anyway).
    """
    for layer in (*module.cnn, module.projection):
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            init.kaiming_uniform_(layer.weight, a=math.sqrt(5))
            bound = 1 / math.sqrt(layer.weight[0].numel())
            init.uniform_(layer.bias, -bound, bound)
        elif isinstance(layer, nn.BatchNorm2d):
            init.ones_(layer.weight)
            init.zeros_(layer.bias)
            init.zeros_(layer.running_mean)
            init.ones_(layer.running_var)
            init.zeros_(layer.num_batches_tracked)
    init.normal_(module.position_embeddings)
