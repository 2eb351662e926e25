"""Neural Interpreters (Rahaman, Gondal et al., NeurIPS 2021) as a Hugging Face transformers model.

Importing the package registers the configs, models and image processors (images and PGM panels) with the Auto classes.
"""

from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoModel,
    AutoModelForImageClassification,
    AutoModelForMultipleChoice,
)

from .kernels import fast_line_of_code  # noqa: F401  (registers attn_implementation="fast")
from .models.context_blind.configuration_context_blind import ContextBlindConfig
from .models.context_blind.modeling_context_blind import (
    ContextBlindForMultipleChoice,
    ContextBlindPreTrainedModel,
)
from .models.multitask_vit.configuration_multitask_vit import MULTITASK_VIT_PRESETS, MultiTaskViTConfig
from .models.multitask_vit.modeling_multitask_vit import (
    MultiTaskViTForImageClassification,
    MultiTaskViTForMultipleChoice,
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
    NeuralInterpreterPanelProcessor,
)
from .models.neural_interpreter.modeling_neural_interpreter import (
    ALL_ATTENTION_FUNCTIONS,
    ALL_LINE_OF_CODE_FUNCTIONS,
    NeuralInterpreterAttentionInterface,
    NeuralInterpreterForImageClassification,
    NeuralInterpreterForMultipleChoice,
    NeuralInterpreterForSetRegression,
    NeuralInterpreterImageClassifierOutput,
    NeuralInterpreterLineOfCodeInterface,
    NeuralInterpreterModel,
    NeuralInterpreterModelOutput,
    NeuralInterpreterMultipleChoiceOutput,
    NeuralInterpreterPreTrainedModel,
    NeuralInterpreterSetRegressionOutput,
    RoutingKwargs,
    RoutingOutput,
)

__version__ = "0.1.0"

AutoConfig.register(NeuralInterpreterConfig.model_type, NeuralInterpreterConfig, exist_ok=True)
AutoModel.register(NeuralInterpreterConfig, NeuralInterpreterModel, exist_ok=True)
AutoModelForImageClassification.register(
    NeuralInterpreterConfig, NeuralInterpreterForImageClassification, exist_ok=True
)
AutoModelForMultipleChoice.register(
    NeuralInterpreterConfig, NeuralInterpreterForMultipleChoice, exist_ok=True
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
AutoModelForMultipleChoice.register(MultiTaskViTConfig, MultiTaskViTForMultipleChoice, exist_ok=True)
# A PGM checkpoint's config is a NeuralInterpreterConfig too. AutoImageProcessor loads a saved `image_processor_type`
# from the registered {backend: class} dict that holds that name, taking the dict's entry for the backend: in the
# config's dict "pil" is the image processor, so the panel processor gets a dict of its own, under its own key.
AutoImageProcessor.register(
    "neural_interpreter_pgm", image_processor_classes={"pil": NeuralInterpreterPanelProcessor}, exist_ok=True
)
# The context-blind PGM baseline reads the same panels (through its own multiple-choice class only).
AutoConfig.register(ContextBlindConfig.model_type, ContextBlindConfig, exist_ok=True)
AutoModelForMultipleChoice.register(ContextBlindConfig, ContextBlindForMultipleChoice, exist_ok=True)
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
NeuralInterpreterForMultipleChoice.register_for_auto_class("AutoModelForMultipleChoice")
NeuralInterpreterImageProcessor.register_for_auto_class("AutoImageProcessor")
NeuralInterpreterPanelProcessor.register_for_auto_class("AutoImageProcessor")
MultiTaskViTConfig.register_for_auto_class()
MultiTaskViTModel.register_for_auto_class("AutoModel")
MultiTaskViTForImageClassification.register_for_auto_class("AutoModelForImageClassification")
MultiTaskViTForMultipleChoice.register_for_auto_class("AutoModelForMultipleChoice")
ContextBlindConfig.register_for_auto_class()
ContextBlindForMultipleChoice.register_for_auto_class("AutoModelForMultipleChoice")

__all__ = [
    "ALL_ATTENTION_FUNCTIONS",
    "ContextBlindConfig",
    "ContextBlindForMultipleChoice",
    "ContextBlindPreTrainedModel",
    "ALL_LINE_OF_CODE_FUNCTIONS",
    "NeuralInterpreterAttentionInterface",
    "NeuralInterpreterLineOfCodeInterface",
    "MULTITASK_VIT_PRESETS",
    "PAPER_PRESETS",
    "MultiTaskViTConfig",
    "MultiTaskViTForImageClassification",
    "MultiTaskViTForMultipleChoice",
    "MultiTaskViTModel",
    "MultiTaskViTPreTrainedModel",
    "NeuralInterpreterConfig",
    "NeuralInterpreterForImageClassification",
    "NeuralInterpreterForMultipleChoice",
    "NeuralInterpreterForSetRegression",
    "NeuralInterpreterImageClassifierOutput",
    "NeuralInterpreterMultipleChoiceOutput",
    "NeuralInterpreterImageProcessor",
    "NeuralInterpreterImageProcessorTorchvision",
    "NeuralInterpreterPanelProcessor",
    "NeuralInterpreterModel",
    "NeuralInterpreterModelOutput",
    "NeuralInterpreterPreTrainedModel",
    "NeuralInterpreterSetRegressionOutput",
    "RoutingKwargs",
    "RoutingOutput",
    "vit_baseline_config",
]
