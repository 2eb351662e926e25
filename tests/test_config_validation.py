"""Config validation: task names, overrides given to `from_pretrained`, types of settings, assignment, model types,
presets and their labels."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoConfig, AutoModelForImageClassification, ViTConfig, pipeline
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging as hf_logging

import ni_hf
from ni_hf.models.multitask_vit import configuration_multitask_vit, modeling_multitask_vit
from ni_hf.models.multitask_vit.configuration_multitask_vit import MultiTaskViTConfig
from ni_hf.models.neural_interpreter import configuration_neural_interpreter
from ni_hf.models.neural_interpreter.configuration_neural_interpreter import (
    ARCHITECTURE_FIELDS,
    PAPER_PRESETS,
    NeuralInterpreterConfig,
    validate_task_names,
)

TASKS = ["a", "b", "c"]
NI_SETTINGS = dict(
    hidden_size=32,
    code_dim=16,
    num_function_iterations=2,
    num_functions=3,
    num_attention_heads=2,
    attention_head_size=8,
    type_inference_hidden_size=16,
    type_dim=8,
    task_names=TASKS,
    num_labels=10,
)
VIT_SETTINGS = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    task_names=TASKS,
    num_labels=10,
)
CONFIGS = {NeuralInterpreterConfig: NI_SETTINGS, MultiTaskViTConfig: VIT_SETTINGS}
BOTH = pytest.mark.parametrize("config_class", list(CONFIGS), ids=["ni", "vit"])
TASK_NAME_VALIDATORS = pytest.mark.parametrize(
    "check",
    [validate_task_names, modeling_multitask_vit.validate_task_names],
    ids=["ni", "vit"],
)

FLOAT_FIELDS = [
    "truncation_tau",
    "sigma_init",
    "kernel_eps",
    "attention_eps",
    "input_position_embedding_std",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "layer_norm_eps",
    "initializer_range",
]
BOOL_FIELDS = [
    "straight_through",
    "outer_residual",
    "freeze_signatures",
    "freeze_codes",
    "freeze_patch_embedding",
    "use_relative_positional_bias",
    "share_task_tokens",
]
DIGITS = {i: str(i) for i in range(10)}


@contextlib.contextmanager
def transformers_warnings() -> Iterator[list[str]]:
    """The messages transformers logs meanwhile (its root logger does not propagate to pytest's caplog)."""
    messages: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


def tiny(config_class: type, **overrides):
    """A tiny config of either class."""
    return config_class(**{**CONFIGS[config_class], **overrides})


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[type, Path]:
    """A saved tiny classifier (config and weights) of each config class."""
    paths = {}
    for config_class, model_class in (
        (NeuralInterpreterConfig, ni_hf.NeuralInterpreterForImageClassification),
        (MultiTaskViTConfig, ni_hf.MultiTaskViTForImageClassification),
    ):
        path = tmp_path_factory.mktemp(config_class.model_type)
        torch.manual_seed(0)
        model_class(tiny(config_class)).save_pretrained(path)
        paths[config_class] = path
    return paths


# --- task names ---------------------------------------------------------------------------------------------


@BOTH
@pytest.mark.parametrize("names", ["mnist", b"mnist"])
def test_task_names_given_as_a_string_are_refused_not_split(config_class, names):
    with pytest.raises(ValueError, match=r"`task_names` must be a list of names, got the string b?'mnist'"):
        tiny(config_class, task_names=names)


@BOTH
@pytest.mark.parametrize(
    "names, message",
    [
        ([0, 1], r"non-empty string.*got 0"),
        (["a", ""], r"non-empty string.*got ''"),
        (["a", None], r"non-empty string.*got None"),
        ([], r"at least one"),
        (["a", "b", "a"], r"distinct.*'a'"),
        (5, r"a list of names, got 5"),
    ],
)
def test_config_refuses_bad_task_names(config_class, names, message):
    with pytest.raises(ValueError, match=message):
        tiny(config_class, task_names=names)


@BOTH
def test_task_names_none_means_one_default_task_and_a_tuple_becomes_a_list(config_class):
    assert tiny(config_class, task_names=None).task_names == ["default"]
    config = tiny(config_class, task_names=("x", "y"))
    assert config.task_names == ["x", "y"] and type(config.task_names) is list


@TASK_NAME_VALIDATORS
def test_validate_task_names_returns_a_new_list_of_names(check):
    names = ["mnist", "svhn"]
    result = check(names)
    assert result == names and result is not names
    assert check(("x", "y")) == ["x", "y"] and check(iter(["z"])) == ["z"]


@TASK_NAME_VALIDATORS
@pytest.mark.parametrize(
    "names, message",
    [
        ("mnist", r"a list of names, got the string 'mnist'"),
        (b"ab", r"a list of names, got the string b'ab'"),
        (None, r"a list of names, got None"),
        (3.5, r"a list of names, got 3.5"),
        ([0, 1], r"non-empty string"),
        ([""], r"non-empty string"),
        ([], r"at least one"),
        (["x", "x"], r"distinct"),
    ],
)
def test_validate_task_names_refuses(check, names, message):
    with pytest.raises(ValueError, match=rf"`task_names`.*{message}"):
        check(names)


def test_multitask_vit_config_module_imports_only_what_its_checkpoint_copies():
    """A ViT checkpoint's copied remote code holds its config, its modeling file and its copy of the config checks."""
    tree = ast.parse(Path(configuration_multitask_vit.__file__).read_text())
    modules = [
        alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    ] + [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert not any("neural_interpreter" in module or module.startswith("ni_hf") for module in modules)
    relative = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level}
    assert relative == {"configuration_checks"}


def test_both_configs_declare_their_shared_settings_and_checks_once():
    """The task and panel settings are the mixins' fields, not each config's; the checks live in the checks file."""
    for config_class in (NeuralInterpreterConfig, MultiTaskViTConfig):
        names = {field.name for field in dataclasses.fields(config_class)}
        assert {"task_names", "default_task", "panel_size", "panel_cnn_layers"} <= names
    for module in (configuration_neural_interpreter, configuration_multitask_vit):
        source = Path(module.__file__).read_text()
        for declaration in (
            "task_names: list",
            "default_task: int",
            "panel_size: int",
            "panel_cnn_layers: int",
        ):
            assert declaration not in source, (module.__name__, declaration)
        assert "def validate_task_names" not in source and "PRETRAINED_CONFIG_KEYS" not in source


# --- overrides given to from_pretrained ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(hidden_size=-1), r"`hidden_size` must be a positive integer, got -1"),
        (
            dict(num_attention_heads=5),
            r"`hidden_size` \(32\) must be divisible by `num_attention_heads` \(5\)",
        ),
        (dict(task_names="xy"), r"`task_names` must be a list of names, got the string 'xy'"),
        (dict(task_names=[]), r"`task_names`"),
        (dict(default_task=7), r"`default_task` must index `task_names` \(0..2\), got 7"),
        (dict(truncation_tau="1.4"), r"`truncation_tau`"),
        (dict(freeze_signatures="no"), r"`freeze_signatures`"),
    ],
)
def test_neural_interpreter_from_pretrained_validates_overrides(saved, overrides, message):
    path = saved[NeuralInterpreterConfig]
    with pytest.raises(ValueError, match=message):
        NeuralInterpreterConfig.from_pretrained(path, **overrides)
    with pytest.raises(ValueError, match=message):
        NeuralInterpreterConfig.from_pretrained(path, return_unused_kwargs=True, **overrides)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(default_task=9), r"`default_task` must index `task_names` \(0..2\), got 9"),
        (dict(default_task=True), r"`default_task`"),
        (dict(task_names=[]), r"`task_names`.*at least one"),
        (dict(task_names="xy"), r"`task_names` must be a list of names, got the string 'xy'"),
    ],
)
def test_multitask_vit_from_pretrained_validates_overrides(saved, overrides, message):
    path = saved[MultiTaskViTConfig]
    with pytest.raises(ValueError, match=message):
        MultiTaskViTConfig.from_pretrained(path, **overrides)
    with pytest.raises(ValueError, match=message):
        MultiTaskViTConfig.from_pretrained(path, return_unused_kwargs=True, **overrides)


@BOTH
def test_from_pretrained_applies_valid_overrides_and_normalises_task_names(saved, config_class):
    path = saved[config_class]
    config = config_class.from_pretrained(path, default_task=2)
    assert type(config) is config_class and config.default_task == 2 and config.task_names == TASKS
    config, unused = config_class.from_pretrained(
        path, task_names=("x", "y"), return_unused_kwargs=True, not_a_setting=1
    )
    assert (
        config.task_names == ["x", "y"] and type(config.task_names) is list and unused == {"not_a_setting": 1}
    )
    assert config_class.from_pretrained(path, task_names=None).task_names == ["default"]


@BOTH
def test_auto_classes_validate_overrides(saved, config_class):
    path = saved[config_class]
    assert type(AutoConfig.from_pretrained(path)) is config_class
    with pytest.raises(ValueError, match=r"`default_task` must index `task_names` \(0..2\), got 7"):
        AutoConfig.from_pretrained(path, default_task=7)
    with pytest.raises(ValueError, match=r"`default_task` must index `task_names` \(0..2\), got 7"):
        AutoModelForImageClassification.from_pretrained(path, default_task=7)
    model = AutoModelForImageClassification.from_pretrained(path, default_task=1)
    assert model.config.default_task == 1


# --- types of the settings ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FLOAT_FIELDS)
@pytest.mark.parametrize("value", ["0.1", True, [0.1], float("nan")], ids=["str", "bool", "list", "nan"])
def test_float_settings_must_be_real_numbers(name, value):
    with pytest.raises(
        ValueError, match=rf"`{name}` must be (None or )?a .*number.*got {re.escape(repr(value))}"
    ):
        tiny(NeuralInterpreterConfig, **{name: value})


@pytest.mark.parametrize(
    "name, value",
    [("truncation_tau", "1.4"), ("sigma_init", "1"), ("hidden_dropout_prob", "0.1"), ("kernel_eps", "x")],
)
def test_float_settings_given_as_strings_give_a_value_error_naming_them(name, value):
    with pytest.raises(ValueError, match=rf"`{name}`.*got {re.escape(repr(value))}"):
        tiny(NeuralInterpreterConfig, **{name: value})


def test_float_settings_accept_ints_and_floats():
    config = tiny(
        NeuralInterpreterConfig,
        truncation_tau=1,
        sigma_init=2,
        kernel_eps=1,
        attention_eps=1e-7,
        input_position_embedding_std=1,
        hidden_dropout_prob=0,
        attention_probs_dropout_prob=0.1,
        layer_norm_eps=1e-6,
        initializer_range=0.02,
    )
    assert config.truncation_tau == 1 and config.initializer_range == 0.02
    assert tiny(NeuralInterpreterConfig, initializer_range=None).initializer_range is None


@pytest.mark.parametrize("value", [-1.0, 0.0, 0])
def test_layer_norm_eps_must_be_positive(value):
    with pytest.raises(ValueError, match=rf"`layer_norm_eps` must be > 0, got {value!r}"):
        tiny(NeuralInterpreterConfig, layer_norm_eps=value)


@pytest.mark.parametrize("value", [-0.02, 0.0])
def test_initializer_range_must_be_none_or_positive(value):
    with pytest.raises(ValueError, match=rf"`initializer_range` must be None or > 0, got {value!r}"):
        tiny(NeuralInterpreterConfig, initializer_range=value)


@pytest.mark.parametrize(
    "name, value",
    [("kernel_eps", -1e-6), ("kernel_eps", 0), ("attention_eps", -1.0), ("attention_eps", 0.0)],
)
def test_epsilons_must_be_positive(name, value):
    """Eqs. 4 and 6 divide by eps + a sum that is 0 when every weight is truncated: eps = 0 gives NaN."""
    with pytest.raises(ValueError, match=rf"`{name}` must be > 0, got {value!r}"):
        tiny(NeuralInterpreterConfig, **{name: value})


def test_position_std_must_not_be_negative():
    with pytest.raises(ValueError, match=r"`input_position_embedding_std` must be >= 0, got -1"):
        tiny(NeuralInterpreterConfig, input_position_embedding_std=-1)
    assert tiny(NeuralInterpreterConfig, input_position_embedding_std=0).input_position_embedding_std == 0


@pytest.mark.parametrize("name", BOOL_FIELDS)
@pytest.mark.parametrize("value", ["no", 1, 0, None], ids=["str", "one", "zero", "none"])
def test_boolean_settings_must_be_bools(name, value):
    with pytest.raises(ValueError, match=rf"`{name}` must be True or False, got {value!r}"):
        tiny(NeuralInterpreterConfig, **{name: value})


def test_boolean_settings_accept_bools():
    config = tiny(NeuralInterpreterConfig, **{name: True for name in BOOL_FIELDS})
    assert all(getattr(config, name) is True for name in BOOL_FIELDS)


@pytest.mark.parametrize(
    "value, num_scripts",
    [(True, 1), (0, 1), (1.0, 1), ("2", 1), ([1.5], 1), ([True], 1), ([2, 0], 2), ([2], 2), ((2, None), 2)],
)
def test_num_function_iterations_must_be_positive_ints(value, num_scripts):
    with pytest.raises(
        ValueError, match=rf"`num_function_iterations` must be .*got {re.escape(repr(value))}"
    ):
        tiny(NeuralInterpreterConfig, num_function_iterations=value, num_scripts=num_scripts)


def test_num_function_iterations_accepts_an_int_or_one_per_script():
    assert tiny(NeuralInterpreterConfig, num_function_iterations=3, num_scripts=2).iterations_per_script == [
        3,
        3,
    ]
    for value in ([2, 1], (2, 1)):
        config = tiny(NeuralInterpreterConfig, num_function_iterations=value, num_scripts=2)
        assert config.iterations_per_script == [2, 1]


@BOTH
@pytest.mark.parametrize("value", [0.5, 1.0, True, "0", None])
def test_default_task_must_be_an_int(config_class, value):
    with pytest.raises(
        ValueError, match=rf"`default_task` must be an integer index of `task_names`.*got {value!r}"
    ):
        tiny(config_class, default_task=value)


@BOTH
def test_default_task_must_index_the_tasks(config_class):
    assert tiny(config_class, default_task=2).default_task == 2
    for value in (-1, 3):
        with pytest.raises(
            ValueError, match=rf"`default_task` must index `task_names` \(0..2\), got {value}"
        ):
            tiny(config_class, default_task=value)


@pytest.mark.parametrize("name", sorted(PAPER_PRESETS))
def test_paper_presets_are_valid_and_survive_save_and_load(name, tmp_path):
    config = NeuralInterpreterConfig.from_paper(name)
    config.validate()
    config.save_pretrained(tmp_path)
    loaded = NeuralInterpreterConfig.from_pretrained(tmp_path)
    assert loaded.to_dict() == config.to_dict()


def test_a_saved_config_with_every_setting_changed_loads_back(tmp_path):
    config = NeuralInterpreterConfig(
        **{**NI_SETTINGS, "num_scripts": 2, "num_function_iterations": [2, 1]},
        truncation_tau=1,
        sigma_init=0.5,
        kernel_eps=1e-4,
        attention_eps=1e-5,
        straight_through=True,
        outer_residual=True,
        freeze_signatures=False,
        freeze_codes=True,
        freeze_patch_embedding=True,
        use_relative_positional_bias=False,
        share_task_tokens=True,
        default_task=2,
        input_position_embedding_std=0.02,
        input_position_embedding_placement="every_loc",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        initializer_range=0.02,
        layer_norm_eps=1e-6,
    )
    config.save_pretrained(tmp_path)
    loaded = NeuralInterpreterConfig.from_pretrained(tmp_path)
    assert loaded.to_dict() == config.to_dict() and loaded.iterations_per_script == [2, 1]


# --- labels of the digits presets ---------------------------------------------------------------------------


@BOTH
def test_digits_preset_names_its_labels_and_they_survive_save_and_load(config_class, tmp_path):
    config = config_class.from_paper("digits")
    assert config.num_labels == 10 and config.id2label == DIGITS
    assert config.label2id == {str(i): i for i in range(10)}
    config.save_pretrained(tmp_path)
    loaded = config_class.from_pretrained(tmp_path)
    assert loaded.id2label == DIGITS and loaded.label2id == {str(i): i for i in range(10)}


@BOTH
def test_digits_preset_leaves_labels_the_caller_sets(config_class):
    assert config_class.from_paper("digits", num_labels=10).id2label == DIGITS
    fewer = config_class.from_paper("digits", num_labels=3)
    assert fewer.num_labels == 3 and set(fewer.id2label) == {0, 1, 2}
    assert config_class.from_paper("digits", num_labels=3, task_names=["x"]).num_labels == 3
    with transformers_warnings() as warnings:
        named = config_class.from_paper("digits", id2label={0: "odd", 1: "even"})
    assert named.num_labels == 2 and named.id2label == {0: "odd", 1: "even"}
    assert not [w for w in warnings if "incompatible" in w]
    both = config_class.from_paper("digits", id2label={0: "no", 1: "yes"}, label2id={"no": 0, "yes": 1})
    assert both.label2id == {"no": 0, "yes": 1}


def test_other_presets_keep_their_labels():
    assert NeuralInterpreterConfig.from_paper("fuzzy_boolean").num_labels == 1
    assert "id2label" not in PAPER_PRESETS["digits"]


def test_pipeline_of_a_digits_preset_model_reports_digit_labels(tmp_path):
    small = {k: v for k, v in NI_SETTINGS.items() if k not in ("task_names", "num_labels")}
    config = NeuralInterpreterConfig.from_paper("digits", **{**small, "num_function_iterations": 1})
    torch.manual_seed(0)
    ni_hf.NeuralInterpreterForImageClassification(config).eval().save_pretrained(tmp_path)
    ni_hf.NeuralInterpreterImageProcessor().save_pretrained(tmp_path)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (28, 28), dtype=np.uint8))
    result = pipeline("image-classification", model=str(tmp_path), top_k=10)(image)
    assert {r["label"] for r in result} == set(DIGITS.values())


@BOTH
@pytest.mark.parametrize("model_name", ["backbone", "classifier"])
def test_a_config_changed_in_place_is_refused_when_a_model_is_built(config_class, model_name):
    model_class = {
        (NeuralInterpreterConfig, "backbone"): ni_hf.NeuralInterpreterModel,
        (NeuralInterpreterConfig, "classifier"): ni_hf.NeuralInterpreterForImageClassification,
        (MultiTaskViTConfig, "backbone"): ni_hf.MultiTaskViTModel,
        (MultiTaskViTConfig, "classifier"): ni_hf.MultiTaskViTForImageClassification,
    }[config_class, model_name]
    config = tiny(config_class)
    config.default_task = (
        7  # an int, so assignment takes it: whether it indexes task_names is checked across settings
    )
    with pytest.raises(ValueError, match=r"`default_task` must index `task_names` \(0..2\), got 7"):
        model_class(config)


def test_a_neural_interpreter_config_changed_in_place_is_refused_by_validate_and_save(tmp_path):
    config = tiny(NeuralInterpreterConfig)
    config.validate()
    with pytest.raises(ValueError, match=r"`num_functions` must be a positive integer, got 0"):
        config.update({"num_functions": 0})
    assert config.num_functions == 3
    config.num_attention_heads = 5  # a positive int, but 32 features do not split over 5 heads
    message = r"`hidden_size` \(32\) must be divisible by `num_attention_heads` \(5\)"
    with pytest.raises(ValueError, match=message):
        config.validate()
    with pytest.raises(ValueError, match=message):
        config.save_pretrained(tmp_path)
    assert not (tmp_path / "config.json").exists()


# --- unknown keys and label counts -------------------------------------------------------------------------

FIXTURES = Path(__file__).parent / "fixtures" / "checkpoint_687f283"
# Keys that config.json files written by transformers 4.x hold besides a model's own settings.
TRANSFORMERS_4_KEYS = {
    "torch_dtype": "float32",
    "transformers_version": "4.46.0",
    "_name_or_path": "some/model",
    "architectures": ["SomeModel"],
    "tie_word_embeddings": True,
    "torchscript": False,
    "use_bfloat16": False,
    "pruned_heads": {},
    "is_decoder": False,
    "add_cross_attention": False,
    "tokenizer_class": None,
    "pad_token_id": None,
    "bos_token_id": None,
    "eos_token_id": None,
    "task_specific_params": None,
    "finetuning_task": None,
    "max_length": 20,
    "num_beams": 1,
    "use_cache": True,
    "return_dict": True,
    "output_hidden_states": False,
    "output_attentions": False,
    "chunk_size_feed_forward": 0,
    "problem_type": None,
}


@BOTH
@pytest.mark.parametrize(
    "key, suggestion", [("hiden_size", "hidden_size"), ("num_attention_head", "num_attention_heads")]
)
def test_a_misspelt_setting_is_refused_with_the_closest_name(config_class, key, suggestion):
    with pytest.raises(TypeError, match=rf"unknown setting.*'{key}' \(did you mean '{suggestion}'\?\)"):
        tiny(config_class, **{key: 32})


@BOTH
def test_an_unknown_setting_without_a_close_name_lists_the_settings(config_class):
    with pytest.raises(
        TypeError, match=r"unknown setting.*'zzz_qqq'\. Its (own )?settings are \[.*'hidden_size'"
    ):
        tiny(config_class, zzz_qqq=1)


@BOTH
def test_keys_that_transformers_writes_in_config_files_still_load(config_class, tmp_path):
    config = tiny(config_class)
    loaded = config_class.from_dict({**config.to_dict(), **TRANSFORMERS_4_KEYS})
    assert loaded.hidden_size == config.hidden_size and loaded.task_names == TASKS
    assert config_class(**config.to_dict()).to_dict() == config.to_dict()
    config.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "auto_map": {"AutoConfig": "x.Y"}}))
    assert config_class.from_pretrained(tmp_path).auto_map == {"AutoConfig": "x.Y"}


@BOTH
def test_a_config_file_with_an_unknown_key_loads_with_a_warning_naming_it(config_class, tmp_path):
    """A config.json may hold attributes set on a config at run time (transformers' own tests set
    `layer_norm_epsilon` and the like before saving): loading warns, naming the closest setting."""
    tiny(config_class).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "hiden_size": 7}))
    with CaptureLogger(hf_logging.get_logger(config_class.__module__)) as captured:
        loaded = config_class.from_pretrained(tmp_path)
    assert "'hiden_size' (did you mean 'hidden_size'?)" in captured.out
    assert loaded.hidden_size == 32 and loaded.hiden_size == 7
    with pytest.raises(TypeError, match="hiden_size"):  # building one in Python still refuses it
        tiny(config_class, hiden_size=7)


@pytest.mark.parametrize("name", ["image_classifier", "set_regression"])
def test_the_checkpoint_fixtures_configs_still_load(name):
    config = NeuralInterpreterConfig.from_pretrained(FIXTURES / name)
    assert config.architectures and config.auto_map
    assert (config.panel_size, config.panel_cnn_layers) == (80, 4)  # settings the files predate: the defaults


@BOTH
@pytest.mark.parametrize("value", [0, -1, 2.5, True])
def test_num_labels_must_be_a_positive_integer(config_class, value):
    with pytest.raises(ValueError, match=rf"`num_labels` must be a positive integer.*got {value!r}"):
        tiny(config_class, num_labels=value)


@BOTH
def test_num_labels_set_to_zero_in_place_is_refused(config_class):
    config = tiny(config_class)
    with pytest.raises(ValueError, match=r"`num_labels` must be a positive integer.*got 0"):
        config.num_labels = 0
    assert config.num_labels == 10 and len(config.id2label) == 10
    config.id2label = {}  # no labels left: only the check across settings sees it
    for validate in (config.validate, config.validate_tasks):
        with pytest.raises(ValueError, match=r"`num_labels` must be a positive integer.*got 0"):
            validate()


# --- assignment -------------------------------------------------------------------------------------------

ASSIGNMENTS = [
    ("hidden_size", 0, r"`hidden_size` must be a positive integer, got 0"),
    ("num_functions", 2.0, r"`num_functions` must be a positive integer, got 2.0"),
    ("panel_size", -80, r"`panel_size` must be a positive integer, got -80"),
    ("panel_cnn_layers", True, r"`panel_cnn_layers` must be a positive integer, got True"),
    ("freeze_codes", "yes", r"`freeze_codes` must be True or False, got 'yes'"),
    ("truncation_tau", "1.4", r"`truncation_tau` must be a finite real number.*got '1.4'"),
    ("truncation_tau", 5.0, r"`truncation_tau` must lie in \[0, 2\).*got 5.0"),
    ("kernel_eps", 0.0, r"`kernel_eps` must be > 0, got 0.0"),
    ("sigma_init", float("inf"), r"`sigma_init` must be a finite real number.*got inf"),
    ("hidden_dropout_prob", 1.0, r"`hidden_dropout_prob` must lie in \[0, 1\), got 1.0"),
    ("input_position_embedding_std", -1, r"`input_position_embedding_std` must be >= 0, got -1"),
    ("initializer_range", 0, r"`initializer_range` must be None or > 0, got 0"),
    (
        "input_position_embedding_placement",
        "everywhere",
        r"`input_position_embedding_placement` must be one of",
    ),
    ("num_function_iterations", [2, 0], r"`num_function_iterations` must be .*got \[2, 0\]"),
    ("task_names", "ab", r"`task_names` must be a list of names, got the string 'ab'"),
    ("task_names", ["a", "a"], r"`task_names` must be distinct"),
    ("default_task", True, r"`default_task` must be an integer index of `task_names`, got True"),
    ("num_labels", 0, r"`num_labels` must be a positive integer.*got 0"),
]


@pytest.mark.parametrize("name, value, message", ASSIGNMENTS, ids=[f"{n}={v!r}" for n, v, _ in ASSIGNMENTS])
def test_a_bad_value_assigned_is_refused_by_name_and_leaves_the_config_unchanged(
    tester, name, value, message
):
    config = tester.get_config()
    before = config.to_dict()
    with pytest.raises(ValueError, match=message):
        setattr(config, name, value)
    assert config.to_dict() == before
    with pytest.raises(ValueError, match=message):  # the same message as at construction
        tester.get_config(**{name: value})


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("task_names", [], r"`task_names` must name at least one task"),
        ("default_task", 1.0, r"`default_task` must be an integer index of `task_names`, got 1.0"),
        ("num_labels", -1, r"`num_labels` must be a positive integer.*got -1"),
        ("hidden_size", "32", r"'hidden_size' expected int"),  # ViTConfig's own field, typed by transformers
    ],
)
def test_a_bad_value_assigned_to_a_multitask_vit_config_is_refused_by_name(name, value, message):
    config = tiny(MultiTaskViTConfig)
    before = config.to_dict()
    with pytest.raises((ValueError, TypeError), match=message):
        setattr(config, name, value)
    assert config.to_dict() == before


@BOTH
def test_assigned_task_names_take_the_constructors_form(config_class):
    config = tiny(config_class)
    config.task_names = ("x", "y")
    assert config.task_names == ["x", "y"] and type(config.task_names) is list
    config.task_names = None
    assert config.task_names == ["default"] and config.num_tasks == 1


def test_good_values_assigned_take_effect_and_save(tester, tmp_path):
    config = tester.get_config()
    config.truncation_tau, config.kernel_eps, config.num_function_iterations = 1.5, 1e-3, [3, 1]
    config.save_pretrained(tmp_path)
    loaded = NeuralInterpreterConfig.from_pretrained(tmp_path)
    assert (loaded.truncation_tau, loaded.kernel_eps, loaded.iterations_per_script) == (1.5, 1e-3, [3, 1])


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            dict(num_attention_heads=3),
            r"`hidden_size` \(16\) must be divisible by `num_attention_heads` \(3\)",
        ),
        (dict(patch_size=3), r"`patch_size` \(3\) must divide `image_size` \(8\)"),
        (dict(num_scripts=3), r"`num_function_iterations` must be .*\(num_scripts=3\), got \[2, 1\]"),
        (dict(default_task=2), r"`default_task` must index `task_names` \(0..1\), got 2"),
    ],
)
def test_an_edit_that_breaks_a_rule_across_settings_is_refused_by_validate_and_save(
    tester, tmp_path, edit, message
):
    config = tester.get_config()
    config.update(edit)  # each value is fine on its own
    with pytest.raises(ValueError, match=message):
        config.validate()
    with pytest.raises(ValueError, match=message):
        config.save_pretrained(tmp_path)
    assert not (tmp_path / "config.json").exists()


def test_a_task_list_edited_in_place_is_refused_by_validate(tester):
    config = tester.get_config()
    config.task_names.append("a")
    with pytest.raises(ValueError, match=r"`task_names` must be distinct, got \['a'\]"):
        config.validate()


def test_architecture_fields_name_settings_of_the_config(tester):
    config = tester.get_config()
    fields = {field.name for field in dataclasses.fields(NeuralInterpreterConfig)}
    assert set(ARCHITECTURE_FIELDS) <= fields | {"num_labels"}
    assert len(set(ARCHITECTURE_FIELDS)) == len(ARCHITECTURE_FIELDS)
    assert {"num_functions", "hidden_size", "num_labels", "task_names", "panel_cnn_layers"} <= set(
        ARCHITECTURE_FIELDS
    )
    assert not {"truncation_tau", "num_function_iterations", "kernel_eps"} & set(ARCHITECTURE_FIELDS)
    assert all(getattr(config, name) is not None for name in ARCHITECTURE_FIELDS)


@BOTH
def test_the_settings_are_the_dataclass_fields_and_the_init_arguments(config_class):
    """What the example scripts read to list a config's own arguments."""
    fields = {field.name for field in dataclasses.fields(config_class)}
    arguments = set(inspect.signature(config_class.__init__).parameters) - {"self"}
    assert arguments == fields and {"task_names", "default_task", "hidden_size"} <= fields


# --- another model's config -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config_class, model_type, expected_class",
    [
        (NeuralInterpreterConfig, "vit", "ViTConfig"),
        (NeuralInterpreterConfig, "ni_multitask_vit", "MultiTaskViTConfig"),
        (NeuralInterpreterConfig, "no_such_model", "trust_remote_code=True"),
        (MultiTaskViTConfig, "vit", "ViTConfig"),
        (MultiTaskViTConfig, "neural_interpreter", "NeuralInterpreterConfig"),
        (MultiTaskViTConfig, "no_such_model", "trust_remote_code=True"),
    ],
)
def test_a_config_dict_of_another_model_type_is_refused_naming_both_types_and_the_class_to_use(
    config_class, model_type, expected_class
):
    config_dict = {**tiny(config_class).to_dict(), "model_type": model_type}
    message = (
        rf"{config_class.__name__} reads configs of model_type '{config_class.model_type}', got one of model_type "
        rf"'{model_type}': .*{re.escape(expected_class)}"
    )
    with pytest.raises(ValueError, match=message):
        config_class.from_dict(config_dict)


@BOTH
def test_from_pretrained_refuses_a_folder_holding_another_models_config(config_class, saved, tmp_path):
    ViTConfig(hidden_size=32, num_attention_heads=2).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"got one of model_type 'vit': read it with ViTConfig"):
        config_class.from_pretrained(tmp_path)
    other = saved[MultiTaskViTConfig if config_class is NeuralInterpreterConfig else NeuralInterpreterConfig]
    with pytest.raises(ValueError, match=rf"reads configs of model_type '{config_class.model_type}'"):
        config_class.from_pretrained(other)
    assert type(AutoConfig.from_pretrained(other)) is not config_class  # the Auto class still picks by type


# --- the PGM preset ---------------------------------------------------------------------------------------

# The paper's appendix "Abstract Reasoning with PGMs": (tau, d_type, frozen signatures) per regime.
PGM_SELECTION = {
    "neutral": (1.62, 20, False),
    "interpolation": (1.62, 20, False),
    "attrs.pairs": (1.40, 32, True),
    "attr.rel.pairs": (1.66, 24, False),
    "attr.rels": (1.42, 24, True),
    "extrapolation": (1.42, 24, True),
    "attrs.shape.color": (1.62, 20, False),
    "attrs.line.type": (1.62, 20, False),
}
PGM_CONSTANTS = dict(
    hidden_size=192,
    code_dim=192,
    num_scripts=2,
    num_function_iterations=8,
    num_loc_layers=1,
    num_functions=5,
    num_attention_heads=4,
    attention_head_size=32,
    type_inference_depth=2,
    type_inference_hidden_size=192,
    freeze_codes=False,
    use_relative_positional_bias=False,
    num_labels=1,
    num_context_panels=8,
    num_choices=8,
    panel_size=80,
    panel_channels=1,
    panel_cnn_channels=32,
    panel_cnn_layers=4,
)


@pytest.mark.parametrize("regime", list(PGM_SELECTION))
def test_pgm_preset_has_the_papers_constants_and_each_regimes_selection(regime):
    config = NeuralInterpreterConfig.from_paper("pgm", regime=regime)
    assert {name: getattr(config, name) for name in PGM_CONSTANTS} == PGM_CONSTANTS
    assert (config.truncation_tau, config.type_dim, config.freeze_signatures) == PGM_SELECTION[regime]
    assert config.iterations_per_script == [8, 8] and config.num_panels == 16


def test_pgm_preset_defaults_to_the_neutral_regime_and_takes_overrides():
    default = NeuralInterpreterConfig.from_paper("pgm")
    assert default.to_dict() == NeuralInterpreterConfig.from_paper("pgm", regime="neutral").to_dict()
    config = NeuralInterpreterConfig.from_paper(
        "pgm", regime="attrs.pairs", truncation_tau=1.5, panel_size=160
    )
    assert (config.truncation_tau, config.type_dim, config.panel_size) == (1.5, 32, 160)


@pytest.mark.parametrize(
    "regime, warned", [("attrs.line.type", True), ("attrs.shape.color", True), ("neutral", False)]
)
def test_pgm_regimes_the_paper_leaves_out_say_they_get_the_neutral_selection(regime, warned):
    with CaptureLogger(hf_logging.get_logger(configuration_neural_interpreter.__name__)) as captured:
        NeuralInterpreterConfig.from_paper("pgm", regime=regime)
    assert (f"no hyper-parameters for the PGM regime {regime!r}; using the neutral" in captured.out) is warned


def test_pgm_preset_refuses_an_unknown_regime_naming_the_valid_ones():
    with pytest.raises(
        ValueError, match=r"Unknown PGM regime 'held_out'; expected one of \['neutral', .*'attrs.pairs'"
    ):
        NeuralInterpreterConfig.from_paper("pgm", regime="held_out")


@pytest.mark.parametrize("name", ["digits", "fuzzy_boolean"])
def test_regime_is_refused_by_the_other_presets(name):
    with pytest.raises(
        ValueError, match=rf"`regime` applies to the 'pgm' preset only, got regime='neutral' for '{name}'"
    ):
        NeuralInterpreterConfig.from_paper(name, regime="neutral")


@pytest.mark.parametrize(
    "panel_size, layers, side", [(80, 4, 5), (81, 4, 6), (160, 4, 10), (1, 4, 1), (8, 1, 4), (7, 3, 1)]
)
def test_panel_cnn_feature_size_is_the_panel_side_halved_per_layer_rounding_up(
    tester, panel_size, layers, side
):
    config = tester.get_config(panel_size=panel_size, panel_cnn_layers=layers, panel_cnn_channels=3)
    assert config.panel_feature_size == side and config.panel_feature_dim == 3 * side**2
