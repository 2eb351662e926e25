"""The Neural Interpreter: configuration, models and heads, image processor, input checks."""

from .configuration_neural_interpreter import PAPER_PRESETS, NeuralInterpreterConfig, vit_baseline_config
from .image_processing_neural_interpreter import (
    NeuralInterpreterImageProcessor,
    NeuralInterpreterImageProcessorTorchvision,
    NeuralInterpreterPanelProcessor,
)
from .modeling_neural_interpreter import *  # noqa: F403
from .modeling_neural_interpreter import __all__ as _modeling_all

__all__ = [
    "NeuralInterpreterConfig",
    "NeuralInterpreterImageProcessor",
    "NeuralInterpreterImageProcessorTorchvision",
    "NeuralInterpreterPanelProcessor",
    "PAPER_PRESETS",
    "vit_baseline_config",
    *_modeling_all,
]
