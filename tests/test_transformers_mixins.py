"""transformers' own generic tests (`ModelTesterMixin`, `ConfigTester`, `ImageProcessingTestMixin`) run against the
Neural Interpreter image classifier, its backbone, its config and its image processor, with tiny configs, as
transformers' ViT tests do.

The mixins are not in the transformers wheel: they are taken from the source distribution of the installed version,
fetched once with `pip download --no-binary :all: --no-deps transformers==<version>` into
`~/.cache/ni_hf/transformers-tests-<version>` (`NI_HF_CACHE` moves it), never copied into this repository. Where it
cannot be had (no network, no pip), the module skips with the reason. The sdist lacks four small helper modules the
mixins import; `_stand_ins` provides them (named there). Tests that cannot apply to this architecture (it has no
`num_hidden_layers`, no `input_ids`, no token embeddings) are skipped below, each with its reason.
"""

from __future__ import annotations

import copy
import importlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import types
import unittest
import unittest.mock
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from transformers.models.auto import modeling_auto
from transformers.utils import is_torchvision_available

from ni_hf import (
    NeuralInterpreterConfig,
    NeuralInterpreterForImageClassification,
    NeuralInterpreterForMultipleChoice,
    NeuralInterpreterModel,
)
from ni_hf.models.neural_interpreter.image_processing_neural_interpreter import (
    NeuralInterpreterImageProcessor,
    NeuralInterpreterImageProcessorTorchvision,
)

VERSION = transformers.__version__
PACKAGE = "hf_transformers_tests"  # the sdist's tests/ folder, imported under this name
MIXIN_FILES = ("test_modeling_common.py", "test_configuration_common.py", "test_image_processing_common.py")


def _cache_dir() -> Path:
    root = Path(os.environ.get("NI_HF_CACHE", Path.home() / ".cache" / "ni_hf"))
    return root / f"transformers-tests-{VERSION}"


def _fetch_mixins() -> Path | str:
    """The folder holding PACKAGE (fetched and extracted on first use), or why it cannot be had."""
    cache = _cache_dir()
    if all((cache / PACKAGE / name).is_file() for name in MIXIN_FILES):
        return cache
    with tempfile.TemporaryDirectory() as tmp:
        source_only = ["--no-binary", ":all:", "--no-deps", "--retries", "1", "--timeout", "20"]
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            *source_only,
            f"transformers=={VERSION}",
            "-d",
            tmp,
        ]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"`pip download transformers=={VERSION}` (source) failed: {error}"
        archives = list(Path(tmp).glob("transformers-*.tar.gz"))
        if result.returncode != 0 or not archives:
            return f"`pip download transformers=={VERSION}` (source) failed: {result.stderr.strip()[-500:]}"
        cache.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cache.parent))  # beside the cache, so that the rename is atomic
        package = staging / PACKAGE
        package.mkdir(parents=True)
        with tarfile.open(archives[0]) as archive:
            for name in MIXIN_FILES:
                member = archive.extractfile(f"transformers-{VERSION}/tests/{name}")
                if member is None:
                    return f"transformers {VERSION}'s source distribution has no tests/{name}"
                (package / name).write_bytes(member.read())
        (package / "__init__.py").write_text("")
    shutil.rmtree(cache, ignore_errors=True)
    staging.rename(cache)  # atomic: a concurrent run sees all files or none
    return cache


def _stand_ins() -> None:
    """The helper modules the mixins import that the sdist does not ship, as small stand-ins.

    `tests/utils/test_configuration_utils.py`: `config_common_kwargs`, non-default values of PretrainedConfig's
    fields (what `ConfigTester.check_config_arguments_init` sets and reads back). `tests/exporters/test_export.py`
    and `tests/generation/test_utils.py`: base and marker classes of their mixins (torch.export and generate tests,
    which this model does not have). `utils/fetch_hub_objects_for_ci.py`: `url_to_local_path` (identity; only the
    segmentation tests use it).
    """
    modules = {
        f"{PACKAGE}.utils": {},
        f"{PACKAGE}.utils.test_configuration_utils": {
            "config_common_kwargs": {
                "return_dict": False,
                "output_hidden_states": True,
                "output_attentions": True,
                "dtype": "float16",
                "chunk_size_feed_forward": 5,
                "architectures": ["BertModel"],
                "id2label": {0: "label"},
                "label2id": {"label": "0"},
                "problem_type": "regression",
            }
        },
        f"{PACKAGE}.exporters": {},
        f"{PACKAGE}.exporters.test_export": {"ExportTesterMixin": type("ExportTesterMixin", (), {})},
        f"{PACKAGE}.generation": {},
        f"{PACKAGE}.generation.test_utils": {"GenerationTesterMixin": type("GenerationTesterMixin", (), {})},
        "fetch_hub_objects_for_ci": {"url_to_local_path": lambda url: url},
    }
    for name, attributes in modules.items():
        module = sys.modules.setdefault(name, types.ModuleType(name))
        for key, value in attributes.items():
            setattr(module, key, value)


_found = _fetch_mixins()
if isinstance(_found, str):
    pytest.skip(f"transformers' test mixins cannot be had: {_found}", allow_module_level=True)
if str(_found) not in sys.path:
    sys.path.insert(0, str(_found))
_stand_ins()
try:
    modeling_common = importlib.import_module(f"{PACKAGE}.test_modeling_common")
    configuration_common = importlib.import_module(f"{PACKAGE}.test_configuration_common")
    image_processing_common = importlib.import_module(f"{PACKAGE}.test_image_processing_common")
except ImportError as error:  # e.g. a helper module a newer sdist imports that `_stand_ins` does not provide
    pytest.skip(
        f"transformers {VERSION}'s test mixins do not import here: {error!r}", allow_module_level=True
    )

ModelTesterMixin = modeling_common.ModelTesterMixin
floats_tensor, ids_tensor = modeling_common.floats_tensor, modeling_common.ids_tensor
ConfigTester = configuration_common.ConfigTester


class NeuralInterpreterModelTester:
    """Tiny configs and inputs for the mixins, as transformers' `ViTModelTester`."""

    def __init__(self, parent: unittest.TestCase) -> None:
        self.parent = parent
        self.batch_size = 5
        self.image_size = 8
        self.patch_size = 2
        self.num_channels = 3
        self.is_training = True
        self.hidden_size = 32
        self.num_attention_heads = 2
        self.num_function_iterations = 2
        self.type_sequence_label_size = 10
        self.task_names = ["a", "b"]
        # The mixins' names for the model's depth and sequence: one hidden state per function iteration, one
        # attention map per LOC of each iteration (one LOC here); tokens are the patches and one CLS per task.
        self.num_hidden_layers = self.num_function_iterations
        self.seq_length = (self.image_size // self.patch_size) ** 2 + len(self.task_names)

    def get_config(self) -> NeuralInterpreterConfig:
        return NeuralInterpreterConfig(
            hidden_size=self.hidden_size,
            code_dim=16,
            num_function_iterations=self.num_function_iterations,
            num_functions=3,
            num_attention_heads=self.num_attention_heads,
            attention_head_size=8,
            type_inference_hidden_size=16,
            type_dim=8,
            image_size=self.image_size,
            patch_size=self.patch_size,
            num_channels=self.num_channels,
            task_names=self.task_names,
            num_labels=self.type_sequence_label_size,
            initializer_range=0.02,
        )

    def prepare_config_and_inputs(self) -> tuple[NeuralInterpreterConfig, torch.Tensor, torch.Tensor]:
        pixel_values = floats_tensor([self.batch_size, self.num_channels, self.image_size, self.image_size])
        labels = ids_tensor([self.batch_size], self.type_sequence_label_size)
        return self.get_config(), pixel_values, labels

    def prepare_config_and_inputs_for_common(self) -> tuple[NeuralInterpreterConfig, dict[str, torch.Tensor]]:
        config, pixel_values, _ = self.prepare_config_and_inputs()
        return config, {"pixel_values": pixel_values}

    def create_and_check_model(self, config, pixel_values, labels) -> None:
        model = NeuralInterpreterModel(config).eval()
        result = model(pixel_values)
        expected = (self.batch_size, self.seq_length, self.hidden_size)
        self.parent.assertEqual(tuple(result.last_hidden_state.shape), expected)

    def create_and_check_for_image_classification(self, config, pixel_values, labels) -> None:
        model = NeuralInterpreterForImageClassification(config).eval()
        result = model(pixel_values, labels=labels)
        self.parent.assertEqual(tuple(result.logits.shape), (self.batch_size, self.type_sequence_label_size))
        self.parent.assertTrue(torch.isfinite(result.loss))


class NeuralInterpreterModelTest(ModelTesterMixin, unittest.TestCase):
    """`ModelTesterMixin` on the backbone and the image classifier (ViT's test, for this model)."""

    all_model_classes = (NeuralInterpreterModel, NeuralInterpreterForImageClassification)
    test_resize_embeddings = False
    test_torch_exportable = False
    has_attentions = True

    def setUp(self) -> None:
        # The mixin tells base models from heads (which get labels and are trained) by transformers' own name
        # tables, where a custom model is not: list ours there, as a built-in model is.
        for names, class_name in (
            (modeling_auto.MODEL_MAPPING_NAMES, "NeuralInterpreterModel"),
            (
                modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
                "NeuralInterpreterForImageClassification",
            ),
        ):
            patcher = unittest.mock.patch.dict(names, {NeuralInterpreterConfig.model_type: class_name})
            patcher.start()
            self.addCleanup(patcher.stop)
        self.model_tester = NeuralInterpreterModelTester(self)
        self.config_tester = ConfigTester(
            self,
            config_class=NeuralInterpreterConfig,
            has_text_modality=False,
            # No `num_hidden_layers`: the depth is `num_scripts` x `num_function_iterations`.
            common_properties=["hidden_size", "num_attention_heads"],
            hidden_size=32,
            num_attention_heads=4,
        )

    def test_config(self) -> None:
        self.config_tester.run_common_tests()

    def test_model(self) -> None:
        self.model_tester.create_and_check_model(*self.model_tester.prepare_config_and_inputs())

    def test_for_image_classification(self) -> None:
        self.model_tester.create_and_check_for_image_classification(
            *self.model_tester.prepare_config_and_inputs()
        )

    @unittest.skip(reason="No `input_ids`: the mixin makes `inputs_embeds` from token ids (as ViT skips it)")
    def test_inputs_embeds(self) -> None:
        pass

    @unittest.skip(reason="No `input_ids`: the mixin makes `inputs_embeds` from token ids (as ViT skips it)")
    def test_inputs_embeds_matches_input_ids(self) -> None:
        pass

    def test_model_get_set_embeddings(self) -> None:
        """The mixin's test with a patch projection where it expects an `nn.Embedding` of tokens (as ViT's)."""
        config, _ = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config)
            self.assertIsInstance(model.get_input_embeddings(), torch.nn.Module)
            new_projection = torch.nn.Linear(12, self.model_tester.hidden_size)
            model.set_input_embeddings(new_projection)
            self.assertIs(model.get_input_embeddings(), new_projection)
            output = model.get_output_embeddings()
            self.assertTrue(output is None or isinstance(output, torch.nn.Linear))


class NeuralInterpreterMultipleChoiceModelTester(NeuralInterpreterModelTester):
    """Tiny PGM puzzles for the mixins: 16 panels of 16 x 16, each candidate's set a CLS token, 8 context panels and
    the candidate (10 tokens), the candidates folded into the batch."""

    def __init__(self, parent: unittest.TestCase) -> None:
        super().__init__(parent)
        self.num_choices = 8
        self.seq_length = 10

    def get_config(self) -> NeuralInterpreterConfig:
        config = super().get_config().to_dict()
        pgm = dict(
            use_relative_positional_bias=False,
            task_names=["pgm"],
            num_labels=1,
            id2label=None,
            label2id=None,
            panel_size=16,
            panel_cnn_channels=4,
            panel_cnn_layers=2,
        )
        config.update(pgm)
        for key in ("model_type", "transformers_version", "id2label", "label2id", "architectures"):
            config.pop(key, None)
        return NeuralInterpreterConfig(**config)

    def prepare_config_and_inputs_for_common(self) -> tuple[NeuralInterpreterConfig, dict[str, torch.Tensor]]:
        config = self.get_config()
        pixel_values = floats_tensor(
            [self.batch_size, config.num_panels, 1, config.panel_size, config.panel_size]
        )
        return config, {"pixel_values": pixel_values}


class NeuralInterpreterMultipleChoiceTest(ModelTesterMixin, unittest.TestCase):
    """`ModelTesterMixin` on the multiple-choice model (PGM puzzles)."""

    all_model_classes = (NeuralInterpreterForMultipleChoice,)
    test_resize_embeddings = False
    test_torch_exportable = False
    has_attentions = True

    def setUp(self) -> None:
        names = modeling_auto.MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES
        patcher = unittest.mock.patch.dict(
            names, {NeuralInterpreterConfig.model_type: "NeuralInterpreterForMultipleChoice"}
        )
        patcher.start()
        self.addCleanup(patcher.stop)
        self.model_tester = NeuralInterpreterMultipleChoiceModelTester(self)

    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        """The mixin repeats text inputs once per choice; a puzzle already holds its candidates among its panels."""
        inputs = copy.deepcopy(inputs_dict)
        if return_labels:
            inputs["labels"] = torch.ones(self.model_tester.batch_size, dtype=torch.long)
        return inputs

    @unittest.skip(reason="No `input_ids`: the mixin makes `inputs_embeds` from token ids (as ViT skips it)")
    def test_inputs_embeds(self) -> None:
        pass

    @unittest.skip(reason="No `input_ids`: the mixin makes `inputs_embeds` from token ids (as ViT skips it)")
    def test_inputs_embeds_matches_input_ids(self) -> None:
        pass

    def test_model_get_set_embeddings(self) -> None:
        """The mixin's test with the panel CNN where it expects an `nn.Embedding` of tokens."""
        config, _ = self.model_tester.prepare_config_and_inputs_for_common()
        model = NeuralInterpreterForMultipleChoice(config)
        self.assertIsInstance(model.get_input_embeddings(), torch.nn.Module)
        replacement = type(model.panel_embedding)(config)
        model.set_input_embeddings(replacement)
        self.assertIs(model.get_input_embeddings(), replacement)


class NeuralInterpreterImageProcessingTester(image_processing_common.ImageProcessingTester):
    """The processor's settings for the mixin: 16 x 16 images in 4 x 4 patches, of both backends where installed."""

    def __init__(self, parent: unittest.TestCase) -> None:
        super().__init__(
            parent,
            batch_size=4,
            num_channels=3,
            min_resolution=12,
            max_resolution=48,
            do_resize=True,
            size={"height": 16, "width": 16},
            do_normalize=True,
            image_mean=[0.5, 0.5, 0.5],
            image_std=[0.5, 0.5, 0.5],
            do_patchify=True,
            patch_size=4,
        )

    def _get_image_processing_classes(self) -> dict[str, type]:
        # The mixin looks the classes up by the test file's folder (tests/models/<model>/); ours is tests/.
        classes: dict[str, type] = {"pil": NeuralInterpreterImageProcessor}
        if is_torchvision_available():
            classes["torchvision"] = NeuralInterpreterImageProcessorTorchvision
        return classes

    def expected_output_image_shape(self, images: list) -> tuple[int, int]:
        """Patch tokens: (num_patches, patch_size * patch_size * channels)."""
        grid = (self.size["height"] // self.patch_size) * (self.size["width"] // self.patch_size)
        return grid, self.patch_size * self.patch_size * self.num_channels


class NeuralInterpreterImageProcessingTest(
    image_processing_common.ImageProcessingTestMixin, unittest.TestCase
):
    """`ImageProcessingTestMixin` on the image processor."""

    image_processor_tester_class = NeuralInterpreterImageProcessingTester

    @unittest.skipUnless(
        is_torchvision_available(),
        "torchvision is not installed: NeuralInterpreterImageProcessorTorchvision exists",
    )
    def test_new_models_require_torchvision_backend(self) -> None:
        super().test_new_models_require_torchvision_backend()

    def test_rgba_arrays_convert_like_transformers_own_processors(self) -> None:
        """The 4-channel case of `test_convert_to_rgb_mixed_input_batch`, with values checked, not only run."""
        rgba = np.random.default_rng(0).integers(0, 256, size=(16, 16, 4), dtype=np.uint8)
        processor = NeuralInterpreterImageProcessor(
            do_patchify=False, do_normalize=False, size={"height": 16, "width": 16}
        )
        ours = processor(rgba, return_tensors="np")["pixel_values"][0]
        theirs = (
            transformers.image_transforms.convert_to_rgb(rgba, return_numpy=True).transpose(2, 0, 1) / 255
        )
        np.testing.assert_allclose(ours, theirs, atol=1e-6)
