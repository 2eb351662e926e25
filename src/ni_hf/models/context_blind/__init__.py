"""The context-blind PGM baseline: the panel CNN and the scorer of the Neural Interpreter, seeing the candidates only."""

from .configuration_context_blind import ContextBlindConfig
from .modeling_context_blind import ContextBlindForMultipleChoice, ContextBlindPreTrainedModel

__all__ = ["ContextBlindConfig", "ContextBlindForMultipleChoice", "ContextBlindPreTrainedModel"]
