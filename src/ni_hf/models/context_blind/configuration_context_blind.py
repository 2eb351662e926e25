"""Configuration of the context-blind PGM baseline: a panel CNN and a scorer that never see the context panels."""

# Annotations stay strings, so `@strict` leaves each type to the field's validator, whose error names the setting.
from __future__ import annotations

import math
from typing import Any

from huggingface_hub.dataclasses import as_validated_field, strict
from transformers import PreTrainedConfig

from .configuration_checks import (
    PANEL_FIELDS,
    CheckedConfigMixin,
    InvalidSetting,
    PanelConfigMixin,
    named_errors,
    positive_int,
)


@as_validated_field
def positive_real(value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidSetting(f"must be a finite real number > 0, got {value!r}.")


@named_errors
@strict
class ContextBlindConfig(CheckedConfigMixin, PanelConfigMixin, PreTrainedConfig):
    r"""Configuration of `ContextBlindForMultipleChoice`: the sanity row of the RAVEN literature for PGM puzzles.

    Each candidate panel goes through the panel CNN of the Neural Interpreter's PGM model (`PanelEmbedding`) and its
    LayerNorm + Linear scorer (`TaskHead`) alone; the context panels are never read. Its accuracy above chance is what
    the candidates give away without the matrix. `from_panel_config` matches a given PGM model's panel CNN and width.

    Args:
        hidden_size: width d of each panel's embedding (the panel CNN's projection, the scorer's input).
        layer_norm_eps: epsilon of the scorer's LayerNorm.
        num_context_panels / num_choices / panel_size / panel_channels / panel_cnn_channels / panel_cnn_layers:
            PGM puzzles and their panel CNN (see `PanelConfigMixin`).
    """

    model_type = "ni_context_blind"

    hidden_size: int = positive_int(default=192)
    layer_norm_eps: float = positive_real(default=1e-5)

    @classmethod
    def from_panel_config(cls, config: Any, **overrides: Any) -> ContextBlindConfig:
        """The baseline of a PGM model's config (a `NeuralInterpreterConfig` or `MultiTaskViTConfig`): the same
        panels, panel CNN, hidden size and LayerNorm epsilon, so its panel CNN and scorer have the same shapes."""
        missing = [
            name for name in ("hidden_size", "layer_norm_eps", *PANEL_FIELDS) if not hasattr(config, name)
        ]
        if missing:
            raise ValueError(
                f"`config` must describe a PGM model's panel CNN (a NeuralInterpreterConfig or MultiTaskViTConfig), "
                f"got a {type(config).__name__} without {missing}."
            )
        settings = {name: getattr(config, name) for name in ("hidden_size", "layer_norm_eps", *PANEL_FIELDS)}
        return cls(**{**settings, **overrides})


__all__ = ["ContextBlindConfig"]
