"""Named settings an example script starts from (``--preset NAME``), and ``--config_overrides``.

A :class:`Preset` holds values for the script's argument dataclasses and for the model config. The script declares
a ``preset`` field (:func:`preset_field`) and parses with :func:`parse_with_presets`: the preset's values become the
defaults, so that a flag given on the command line wins, and its config settings merge with ``--config_overrides``
key by key (the flag's keys win). The merged settings reach the script as its ``config_overrides`` field, a
canonical ``key=value`` string that :func:`parse_config_overrides` turns into keyword arguments of the config.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import transformers

__all__ = [
    "DIGITS_PRESETS",
    "IMAGE_CLASSIFICATION_PRESETS",
    "PGM_PRESETS",
    "Preset",
    "config_setting_names",
    "explicit_arguments",
    "format_config_overrides",
    "parse_config_overrides",
    "parse_with_presets",
    "preset_field",
]

CONFIG_OVERRIDES_FIELD = "config_overrides"
PRESET_FIELD = "preset"
ARCHITECTURE_FIELD = "architecture"
DEFAULT_ARCHITECTURE = "neural_interpreter"


@dataclass(frozen=True)
class Preset:
    """Named settings a script starts from: argument values, and model-config values merged with --config_overrides.

    ``config`` is the Neural Interpreter's (or the only architecture's); ``architectures`` maps the script's other
    ``--architecture`` values to their own config settings (the baselines at a matched size).
    """

    help: str
    arguments: Mapping[str, Any] = field(default_factory=dict)  # argument field name -> value
    config: Mapping[str, Any] = field(default_factory=dict)  # model config setting -> value
    architectures: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Frozen all the way down: a script that changed a preset's dict would change it for every later parse.
        object.__setattr__(self, "arguments", MappingProxyType(dict(self.arguments)))
        object.__setattr__(self, "config", MappingProxyType(dict(self.config)))
        frozen = {name: MappingProxyType(dict(config)) for name, config in self.architectures.items()}
        object.__setattr__(self, "architectures", MappingProxyType(frozen))

    def config_for(self, architecture: str | None, name: str = "") -> Mapping[str, Any]:
        """The config settings for ``architecture`` (None or "neural_interpreter": ``config``); a preset with
        settings for other architectures only is refused for one it has none for, naming what it has."""
        if architecture in (None, DEFAULT_ARCHITECTURE):
            return self.config
        if architecture in self.architectures:
            return self.architectures[architecture]
        if not self.config and not self.architectures:
            return {}
        known = [DEFAULT_ARCHITECTURE, *self.architectures] if self.config else list(self.architectures)
        raise ValueError(
            f"--preset {name} has model settings for --architecture {' or '.join(known)}, not for {architecture!r}; "
            "choose another preset or give the model's settings with --config_overrides."
        )


def preset_field(presets: Mapping[str, Preset], default: str | None) -> Any:
    """The ``preset`` field of a script's argument dataclass: ``--preset NAME``, listing the presets in its help."""
    listing = "; ".join(f"{name}: {preset.help}" for name, preset in presets.items())
    return field(
        default=default,
        metadata={"help": f"Named settings to start from (a flag given explicitly wins). {listing}"},
    )


# --------------------------------------------------------------------------------------- config overrides


def config_setting_names(config_class: type) -> set[str]:
    """A config class's own settings (dataclass fields and named ``__init__`` arguments), not PretrainedConfig's."""
    common = {f.name for f in dataclasses.fields(transformers.PretrainedConfig)}
    names = (
        {f.name for f in dataclasses.fields(config_class) if f.init}
        if dataclasses.is_dataclass(config_class)
        else set()
    )
    names |= {
        name
        for name, parameter in inspect.signature(config_class.__init__).parameters.items()
        if name != "self"
        and parameter.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    }
    return names - common


def _parse_value(text: str) -> Any:
    """One value: JSON (numbers, true/false, null, lists, quoted strings), Python's True/False/None, else a string."""
    text = text.strip()
    python_literals = {"True": True, "False": False, "None": None}
    if text in python_literals:
        return python_literals[text]
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _split_overrides(overrides: str, option: str) -> dict[str, Any]:
    """``"key=value,key2=[1,2]"`` -> ``{"key": value, "key2": [1, 2]}``, checking only the syntax."""
    result: dict[str, Any] = {}
    for item in re.split(r",(?=\s*[A-Za-z_]\w*\s*=)", overrides.strip()):
        if "=" not in item:
            raise ValueError(f"{option}: expected key=value, got {item!r} in {overrides!r}.")
        key, value = (part.strip() for part in item.split("=", 1))
        if "," in value and not value.startswith(("[", "{", '"')):
            # The split above keeps a bare name after a comma glued to the previous value.
            first, *rest = (part.strip() for part in value.split(","))
            raise ValueError(
                f"{option}: expected key=value items, got {rest[-1]!r} without a value (after {key}={first}); "
                "a value that holds commas must be a JSON list, e.g. num_function_iterations=[2,1]."
            )
        result[key] = _parse_value(value)
    return result


def format_config_overrides(settings: Mapping[str, Any]) -> str | None:
    """The canonical ``--config_overrides`` string of ``settings`` (JSON values), None for none."""
    if not settings:
        return None
    return ",".join(f"{key}={json.dumps(value, separators=(',', ':'))}" for key, value in settings.items())


def parse_config_overrides(
    overrides: str | Mapping[str, Any] | None,
    config_class: type,
    reserved: Iterable[str] = (),
    option: str = "--config_overrides",
) -> dict[str, Any]:
    """``"key=value,key2=[1,2]"`` (or a dict) as config keyword arguments: every key a setting of ``config_class``,
    none of ``reserved`` (settings the script takes from its data)."""
    if overrides is None or (isinstance(overrides, str) and not overrides.strip()):
        return {}
    settings = dict(overrides) if isinstance(overrides, Mapping) else _split_overrides(overrides, option)
    valid = config_setting_names(config_class)
    reserved = set(reserved)
    for key in settings:
        if key in reserved:
            raise ValueError(f"{option}: {key} is set by the script from its data and cannot be overridden.")
        if key not in valid:
            raise ValueError(
                f"{option}: unknown setting {key!r}; {config_class.__name__} accepts {sorted(valid)}."
            )
    return settings


# ------------------------------------------------------------------------------------------------- parsing


def _argument_names(parser: transformers.HfArgumentParser) -> set[str]:
    return {f.name for dtype in parser.dataclass_types for f in dataclasses.fields(dtype) if f.init}


def explicit_arguments(parser: argparse.ArgumentParser, argv: Sequence[str]) -> frozenset[str]:
    """The destinations of the flags written in ``argv`` (not those left at their defaults); unknown flags ignored.

    argparse sets a default only where the namespace lacks the attribute, so a namespace that holds a marker for
    every destination keeps the marker exactly for the flags that were not given.
    """
    marker = object()
    destinations = {action.dest for action in parser._actions if action.dest != argparse.SUPPRESS}
    namespace = argparse.Namespace(**dict.fromkeys(destinations, marker))
    parsed, _ = argparse.ArgumentParser.parse_known_args(parser, list(argv), namespace)
    return frozenset(name for name, value in vars(parsed).items() if value is not marker)


def check_presets(parser: transformers.HfArgumentParser, presets: Mapping[str, Preset]) -> None:
    """Refuse presets that name an argument the parser's dataclasses lack, or config settings without a
    ``config_overrides`` field to merge them into (a mistake in the script, not in the command line)."""
    names = _argument_names(parser)
    if PRESET_FIELD not in names:
        raise TypeError(
            f"The argument dataclasses need a `{PRESET_FIELD}` field (ni_hf.training.presets.preset_field)."
        )
    for name, preset in presets.items():
        unknown = sorted(set(preset.arguments) - names)
        if unknown:
            raise TypeError(
                f"Preset {name!r} sets {unknown}, which are not arguments of {parser.dataclass_types}."
            )
        if PRESET_FIELD in preset.arguments or CONFIG_OVERRIDES_FIELD in preset.arguments:
            raise TypeError(f"Preset {name!r}: put config settings in `config`, not in `arguments`.")
        if (preset.config or preset.architectures) and CONFIG_OVERRIDES_FIELD not in names:
            raise TypeError(
                f"Preset {name!r} has config settings, but no dataclass has a `{CONFIG_OVERRIDES_FIELD}` field."
            )


def parse_with_presets(
    parser: transformers.HfArgumentParser,
    presets: Mapping[str, Preset],
    args: Sequence[str] | None = None,
    default: str | None = None,
) -> tuple[Any, ...]:
    """Parse the dataclasses with `--preset NAME`'s values as defaults: a flag given explicitly wins; the
    preset's `config` and `--config_overrides` merge key by key (the flag's keys win).

    ``default``: the preset when ``--preset`` is not given (else the ``preset`` field's own default; None: no
    preset). An unknown preset name is refused naming the valid ones. The preset's values become ``parser``'s
    defaults: give each call a parser of its own.
    """
    check_presets(parser, presets)
    argv = list(sys.argv[1:] if args is None else args)
    if default is not None:
        parser.set_defaults(**{PRESET_FIELD: default})
    # argparse's own pass finds --preset as the real parse will (abbreviations, "--preset=NAME") and converts no
    # dataclass yet.
    namespace, _ = argparse.ArgumentParser.parse_known_args(parser, argv)
    repeated = [item for item in argv if item == f"--{PRESET_FIELD}" or item.startswith(f"--{PRESET_FIELD}=")]
    if len(repeated) > 1:
        raise ValueError(
            f"--{PRESET_FIELD} given {len(repeated)} times; a run starts from one preset (later flags override it)."
        )
    name = getattr(namespace, PRESET_FIELD)
    if name is not None and name not in presets:
        raise ValueError(f"--preset {name!r}: expected one of {list(presets)}.")
    preset = presets[name] if name is not None else Preset(help="")
    parser.set_defaults(**preset.arguments)
    parsed = parser.parse_args_into_dataclasses(args=argv)
    architecture = next(
        (getattr(a, ARCHITECTURE_FIELD) for a in parsed if hasattr(a, ARCHITECTURE_FIELD)), None
    )
    settings = preset.config_for(architecture, name or "")
    if settings:
        for arguments in parsed:
            if hasattr(arguments, CONFIG_OVERRIDES_FIELD):
                given = getattr(arguments, CONFIG_OVERRIDES_FIELD)
                explicit = _split_overrides(given, "--config_overrides") if given and given.strip() else {}
                setattr(arguments, CONFIG_OVERRIDES_FIELD, format_config_overrides({**settings, **explicit}))
    return parsed


# ------------------------------------------------------------------------------------------------ presets

DIGITS_PRESETS: dict[str, Preset] = {
    # The argument dataclasses' defaults of run_digits.py are the paper's recipe.
    "paper": Preset(
        help="the paper's digits recipe (MNIST, MNIST-M and SVHN from the Hub, the 'digits' config, RAdam, cosine "
        "decay from 8e-4 to 1e-6, batch 128, 100 epochs, RandAugment n=2 m=9)",
    ),
    "quickstart": Preset(
        help="a 78k-parameter model (3 function iterations, no dropout) on scikit-learn's bundled 8x8 digits for 30 "
        "epochs, offline, minutes on a CPU",
        arguments={
            "dataset_source": "sklearn",
            "attn_implementation": "fast",  # the package's CPU fast path (ni_hf.kernels)
            "num_train_epochs": 30,
            "per_device_train_batch_size": 64,
            "learning_rate": 3e-3,
            "adam_beta2": 0.99,
            "randaugment_num_ops": 1,
            "randaugment_magnitude": 5.0,
            "randaugment_operations": ["rotate", "shear_x", "shear_y", "translate_x", "translate_y"],
            "save_strategy": "no",
            "eval_strategy": "no",
            # One persistent worker prepares the next batches on the second core while the step trains.
            "dataloader_num_workers": 1,
            "dataloader_persistent_workers": True,
        },
        config={
            "hidden_size": 64,
            "code_dim": 64,
            "attention_head_size": 32,
            "type_inference_hidden_size": 64,
            "patch_size": 8,
            "num_function_iterations": 3,
            "num_functions": 4,
        },
    ),
}


# The quickstart's model, which fits a CPU, and the ViT baseline at a matched size (80,778 against 78,467
# parameters on 10 classes).
_SMALL_NEURAL_INTERPRETER = {
    "hidden_size": 64,
    "code_dim": 64,
    "attention_head_size": 32,
    "type_inference_hidden_size": 64,
    "num_function_iterations": 3,
    "num_functions": 4,
}
_SMALL_VIT = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128}

IMAGE_CLASSIFICATION_PRESETS: dict[str, Preset] = {
    # No preset: the argument dataclasses' defaults and the paper's digits model (633k parameters).
    "small": Preset(
        help="the quickstart's 78k-parameter model (3 function iterations, no dropout; the ViT at 81k), trained "
        "with RAdam at 3e-3 in batches of 64 with light geometric RandAugment: minutes per epoch of 10k images on "
        "a CPU",
        arguments={
            "learning_rate": 3e-3,
            "adam_beta2": 0.99,
            "randaugment_num_ops": 1,
            "randaugment_magnitude": 5.0,
            "randaugment_operations": ["rotate", "shear_x", "shear_y", "translate_x", "translate_y"],
            "attn_implementation": "fast",  # the package's CPU fast path (ni_hf.kernels)
        },
        config=_SMALL_NEURAL_INTERPRETER,
        architectures={"vit": _SMALL_VIT},
    ),
}


# The model settings of the PGM presets, per architecture: the Neural Interpreter's and the ViT's at a matched size.
_PGM_CPU_PANELS = dict(panel_size=32, panel_cnn_layers=3, panel_cnn_channels=16)
_PGM_QUICK_PANELS = dict(panel_size=16, panel_cnn_layers=2, panel_cnn_channels=4)
_PGM_CPU_MODELS = {
    "neural_interpreter": dict(
        hidden_size=64,
        code_dim=64,
        num_functions=4,
        num_attention_heads=2,
        attention_head_size=16,
        type_inference_hidden_size=64,
        num_function_iterations=2,
        **_PGM_CPU_PANELS,
    ),
    # 4 layers: 122,273 parameters against the Neural Interpreter's 125,163 (neutral).
    "vit": dict(
        hidden_size=64, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64, **_PGM_CPU_PANELS
    ),
    # The Neural Interpreter's panel CNN and scorer, seeing the candidates only.
    "candidates_only": dict(hidden_size=64, **_PGM_CPU_PANELS),
}
_PGM_QUICK_MODELS = {
    "neural_interpreter": dict(
        hidden_size=16,
        code_dim=8,
        num_functions=3,
        num_attention_heads=2,
        attention_head_size=4,
        type_inference_hidden_size=12,
        type_dim=6,
        num_function_iterations=2,
        **_PGM_QUICK_PANELS,
    ),
    "vit": dict(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, **_PGM_QUICK_PANELS
    ),
    "candidates_only": dict(hidden_size=16, **_PGM_QUICK_PANELS),
}

# The PGM presets of examples/run_pgm.py.
PGM_PRESETS: dict[str, Preset] = {
    # The argument dataclasses' defaults of run_pgm.py are the paper's recipe; the models from_paper("pgm", regime).
    "paper": Preset(
        help="the paper's PGM model per regime (2 scripts x 8 function iterations, d 192) and recipe (batch 72, 30 "
        "epochs, RAdam 4e-4 with cosine decay to 1e-4), 80x80 panels: a GPU job",
    ),
    "cpu": Preset(
        help="a 125k-parameter model (2 scripts x 2 function iterations, as many as the ViT's 4 layers; d 64) on "
        "12,000 generated puzzles of 1 to 4 triples (as DeepMind's) of 32x32 panels, 8 epochs (3,000 steps of 32)",
        arguments={
            "dataset_source": "generated",
            "max_triples": 4,
            "num_train_puzzles": 12_000,
            "num_eval_puzzles": 1_000,
            "num_train_epochs": 8,
            "per_device_train_batch_size": 32,
            "per_device_eval_batch_size": 100,
            "learning_rate": 2e-3,
            "lr_scheduler_kwargs": {"min_lr": 1e-4},
            "warmup_steps": 100,
            "eval_strategy": "no",
            "save_strategy": "no",
        },
        config=_PGM_CPU_MODELS["neural_interpreter"],
        architectures={name: _PGM_CPU_MODELS[name] for name in ("vit", "candidates_only")},
    ),
    "quick": Preset(
        help="a smoke test: a tiny model, 64 generated puzzles of 16x16 panels, one epoch",
        arguments={
            "dataset_source": "generated",
            "max_triples": 1,
            "num_train_puzzles": 64,
            "num_eval_puzzles": 32,
            "num_train_epochs": 1,
            "per_device_train_batch_size": 16,
            "per_device_eval_batch_size": 32,
            "learning_rate": 1e-3,
            "eval_strategy": "no",
            "save_strategy": "no",
            "logging_steps": 1,
        },
        config=_PGM_QUICK_MODELS["neural_interpreter"],
        architectures={name: _PGM_QUICK_MODELS[name] for name in ("vit", "candidates_only")},
    ),
}
