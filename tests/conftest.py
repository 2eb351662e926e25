"""Shared test settings and the tiny-model tester (transformers' ModelTester pattern)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ni_hf import (
    MultiTaskViTConfig,
    NeuralInterpreterConfig,
    NeuralInterpreterForImageClassification,
    NeuralInterpreterForMultipleChoice,
    NeuralInterpreterForSetRegression,
    NeuralInterpreterImageProcessor,
    NeuralInterpreterModel,
)

# Tiny test models gain nothing from intra-op threads, and on a busy 2-core machine OpenMP threads that wait
# for each other can make a millisecond op take seconds.
torch.set_num_threads(1)

# What a digits checkpoint reads: the image processor's 32 x 32 RGB images (in 8 x 8 patches, to stay tiny), ten
# labels named by their digit, and one script, as in the paper's digits models.
DIGITS_LIKE = dict(
    num_scripts=1,
    num_function_iterations=2,
    image_size=32,
    patch_size=8,
    task_names=["mnist", "mnistm"],
    num_labels=10,
    id2label={i: str(i) for i in range(10)},
)

# The settings a multi-task ViT takes from the tester; its depth and MLP are the ViT's own.
VIT_SHARED_SETTINGS = (
    "hidden_size",
    "num_attention_heads",
    "image_size",
    "patch_size",
    "num_channels",
    "task_names",
    "num_labels",
    "id2label",
)


class NeuralInterpreterModelTester:
    """Tiny configs and `create_and_check_*` methods, as in transformers' test suite."""

    def __init__(self, batch_size: int = 3, **overrides) -> None:
        self.batch_size = batch_size
        self.settings = dict(
            hidden_size=16,
            code_dim=8,
            num_scripts=2,
            num_function_iterations=[2, 1],
            num_loc_layers=2,
            num_functions=3,
            num_attention_heads=2,
            attention_head_size=4,
            type_inference_hidden_size=12,
            type_dim=6,
            truncation_tau=1.4,
            image_size=8,
            patch_size=2,
            num_channels=3,
            task_names=["a", "b"],
            num_labels=5,
        )
        self.settings.update(overrides)

    @classmethod
    def digits_like(cls, batch_size: int = 3, **overrides) -> NeuralInterpreterModelTester:
        """A tester whose models read what a digits checkpoint reads (`DIGITS_LIKE`), at the tester's sizes."""
        return cls(batch_size, **{**DIGITS_LIKE, **overrides})

    def get_config(self, **overrides) -> NeuralInterpreterConfig:
        return NeuralInterpreterConfig(**{**self.settings, **overrides})

    def get_set_regression_config(self, **overrides) -> NeuralInterpreterConfig:
        """A tiny set-regression config: three fuzzy-Boolean-style tasks of one output each, no positional bias."""
        regression = dict(use_relative_positional_bias=False, task_names=["f0", "f1", "f2"], num_labels=1)
        return self.get_config(**{**regression, **overrides})

    def get_vit_config(self, **overrides) -> MultiTaskViTConfig:
        """A tiny multi-task ViT (one layer) with the tester's width, images, patches, tasks and labels."""
        shared = {key: self.settings[key] for key in VIT_SHARED_SETTINGS if key in self.settings}
        return MultiTaskViTConfig(**{**shared, "num_hidden_layers": 1, "intermediate_size": 16, **overrides})

    def get_image_processor(
        self, config: NeuralInterpreterConfig | MultiTaskViTConfig
    ) -> NeuralInterpreterImageProcessor:
        """The image processor that turns images into `config`'s inputs (its image size and patches)."""
        size = {"height": config.image_size, "width": config.image_size}
        return NeuralInterpreterImageProcessor(size=size, patch_size=config.patch_size)

    def save_image_classifier(
        self, path: Path, config: NeuralInterpreterConfig | None = None, seed: int = 0
    ) -> Path:
        """Save a seeded, untrained image classifier of `config` (default: `get_config()`) and its image processor."""
        config = self.get_config() if config is None else config
        torch.manual_seed(seed)
        NeuralInterpreterForImageClassification(config).save_pretrained(path)
        self.get_image_processor(config).save_pretrained(path)
        return path

    def get_pgm_config(self, **overrides) -> NeuralInterpreterConfig:
        """A tiny multiple-choice config: 16 x 16 panels through 2 stride-2 convolutions, no positional bias."""
        pgm = dict(
            use_relative_positional_bias=False,
            task_names=["pgm"],
            num_labels=1,
            panel_size=16,
            panel_cnn_channels=4,
            panel_cnn_layers=2,
        )
        return self.get_config(**{**pgm, **overrides})

    def prepare_pgm_inputs(self, config: NeuralInterpreterConfig) -> dict[str, torch.Tensor]:
        b, s = self.batch_size, config.panel_size
        return {
            "pixel_values": torch.randn(b, config.num_panels, config.panel_channels, s, s),
            "labels": torch.arange(b) % config.num_choices,
        }

    def prepare_inputs(self, config: NeuralInterpreterConfig) -> dict[str, torch.Tensor]:
        b = self.batch_size
        return {
            "pixel_values": torch.randn(b, config.num_patches, config.patch_dim),
            "task_ids": torch.arange(b) % config.num_tasks,
            "labels": torch.arange(b) % config.num_labels,
        }

    def set_size(self, config: NeuralInterpreterConfig) -> int:
        return config.num_task_tokens + config.num_patches

    def create_and_check_model(self, config: NeuralInterpreterConfig) -> None:
        model = NeuralInterpreterModel(config).eval()
        inputs = self.prepare_inputs(config)
        out = model(pixel_values=inputs["pixel_values"], output_hidden_states=True, output_routing=True)
        n = self.set_size(config)
        assert out.last_hidden_state.shape == (self.batch_size, n, config.hidden_size)
        assert out.pooler_output.shape == (self.batch_size, config.num_tasks, config.hidden_size)
        iterations = sum(config.iterations_per_script)
        assert len(out.hidden_states) == iterations + 1
        assert len(out.compatibilities) == iterations
        assert out.compatibilities[0].shape == (self.batch_size, config.num_functions, n)
        assert out.types[0].shape == (self.batch_size, n, config.type_dim)

    def create_and_check_for_image_classification(self, config: NeuralInterpreterConfig) -> None:
        model = NeuralInterpreterForImageClassification(config).eval()
        out = model(**self.prepare_inputs(config))
        assert out.logits.shape == (self.batch_size, config.num_labels)
        assert out.loss.ndim == 0 and torch.isfinite(out.loss)

    def create_and_check_for_set_regression(self, config: NeuralInterpreterConfig) -> None:
        model = NeuralInterpreterForSetRegression(config).eval()
        x = torch.rand(self.batch_size, config.num_input_variables)
        y = torch.rand(self.batch_size, config.num_tasks)
        out = model(inputs=x, labels=y)
        assert out.predictions.shape == (self.batch_size, config.num_tasks)
        assert torch.isfinite(out.loss)

    def create_and_check_for_multiple_choice(self, config: NeuralInterpreterConfig) -> None:
        model = NeuralInterpreterForMultipleChoice(config).eval()
        out = model(**self.prepare_pgm_inputs(config), output_routing=True)
        assert out.logits.shape == (self.batch_size, config.num_choices)
        assert out.loss.ndim == 0 and torch.isfinite(out.loss)
        set_size = 1 + config.num_context_panels + 1  # CLS, the context panels, one candidate
        assert out.compatibilities[0].shape == (
            self.batch_size * config.num_choices,
            config.num_functions,
            set_size,
        )


@pytest.fixture
def tester() -> NeuralInterpreterModelTester:
    torch.manual_seed(0)
    return NeuralInterpreterModelTester()
