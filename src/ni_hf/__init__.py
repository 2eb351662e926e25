"""Neural Interpreters (Rahaman, Gondal et al., NeurIPS 2021) as a Hugging Face transformers model.

Importing the package registers the config, models and image processor with the Auto classes.
"""

from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoModel,
    AutoModelForImageClassification,
)

from .kernels import fast_line_of_code  # noqa: F401  (registers attn_implementation="fast")
from .models.multitask_vit.configuration_multitask_vit import MULTITASK_VIT_PRESETS, MultiTaskViTConfig
from .models.multitask_vit.modeling_multitask_vit import (
    MultiTaskViTForImageClassification,
    MultiTaskViTModel,
    MultiTaskViTPreTrainedModel,
)
from .models.neural_interpreter.configuration_neural_interpreter import (
    PAPER_PRESETS,
    NeuralInterpreterConfig,
    vit_baseline_config,
)
from .models.neural_interpreter.image_processing_neural_interpreter import (
    NeuralInterpreterImageProcessor,
    NeuralInterpreterImageProcessorTorchvision,
)
from .models.neural_interpreter.modeling_neural_interpreter import (
    ALL_ATTENTION_FUNCTIONS,
    NeuralInterpreterAttentionInterface,
    NeuralInterpreterForImageClassification,
    NeuralInterpreterForSetRegression,
    NeuralInterpreterImageClassifierOutput,
    NeuralInterpreterModel,
    NeuralInterpreterModelOutput,
    NeuralInterpreterPreTrainedModel,
    NeuralInterpreterSetRegressionOutput,
)

__version__ = "0.1.0"

AutoConfig.register(NeuralInterpreterConfig.model_type, NeuralInterpreterConfig, exist_ok=True)
AutoModel.register(NeuralInterpreterConfig, NeuralInterpreterModel, exist_ok=True)
AutoModelForImageClassification.register(
    NeuralInterpreterConfig, NeuralInterpreterForImageClassification, exist_ok=True
)
# Both backends, as transformers' models have them: AutoImageProcessor takes torchvision where it is installed.
_IMAGE_PROCESSORS = {
    "pil": NeuralInterpreterImageProcessor,
    "torchvision": NeuralInterpreterImageProcessorTorchvision,
}
AutoImageProcessor.register(
    NeuralInterpreterConfig, image_processor_classes=dict(_IMAGE_PROCESSORS), exist_ok=True
)
# The multi-task ViT baseline (paper, Figure 4a) reads the same images or patches.
AutoConfig.register(MultiTaskViTConfig.model_type, MultiTaskViTConfig, exist_ok=True)
AutoModel.register(MultiTaskViTConfig, MultiTaskViTModel, exist_ok=True)
AutoModelForImageClassification.register(
    MultiTaskViTConfig, MultiTaskViTForImageClassification, exist_ok=True
)
AutoImageProcessor.register(
    MultiTaskViTConfig, image_processor_classes=dict(_IMAGE_PROCESSORS), exist_ok=True
)
# `pipeline()` also looks for a video processor, and transformers infers one from the image processor's `auto_map`
# (`...NeuralInterpreterVideoProcessor`, which does not exist). With no local entry that lookup asks on stdin
# whether to run the checkpoint's code; this entry, empty, says there is no video processor, so it fails quietly.
# (The mapping, not `AutoVideoProcessor.register`: without torchvision `AutoVideoProcessor` is a placeholder.)
try:
    from transformers.models.auto.video_processing_auto import VIDEO_PROCESSOR_MAPPING

    VIDEO_PROCESSOR_MAPPING.register(NeuralInterpreterConfig, {}, exist_ok=True)
    VIDEO_PROCESSOR_MAPPING.register(MultiTaskViTConfig, {}, exist_ok=True)
except ImportError:  # a transformers without video processors has no such lookup
    pass

# `save_pretrained` then writes `auto_map` and copies the (flat, relatively imported) code files.
NeuralInterpreterConfig.register_for_auto_class()
NeuralInterpreterModel.register_for_auto_class("AutoModel")
NeuralInterpreterForImageClassification.register_for_auto_class("AutoModelForImageClassification")
NeuralInterpreterImageProcessor.register_for_auto_class("AutoImageProcessor")
MultiTaskViTConfig.register_for_auto_class()
MultiTaskViTModel.register_for_auto_class("AutoModel")
MultiTaskViTForImageClassification.register_for_auto_class("AutoModelForImageClassification")

__all__ = [
    "ALL_ATTENTION_FUNCTIONS",
    "NeuralInterpreterAttentionInterface",
    "MULTITASK_VIT_PRESETS",
    "PAPER_PRESETS",
    "MultiTaskViTConfig",
    "MultiTaskViTForImageClassification",
    "MultiTaskViTModel",
    "MultiTaskViTPreTrainedModel",
    "NeuralInterpreterConfig",
    "NeuralInterpreterForImageClassification",
    "NeuralInterpreterForSetRegression",
    "NeuralInterpreterImageClassifierOutput",
    "NeuralInterpreterImageProcessor",
    "NeuralInterpreterImageProcessorTorchvision",
    "NeuralInterpreterModel",
    "NeuralInterpreterModelOutput",
    "NeuralInterpreterPreTrainedModel",
    "NeuralInterpreterSetRegressionOutput",
    "vit_baseline_config",
]
