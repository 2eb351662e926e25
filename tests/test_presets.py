"""ni_hf.training.presets: a flag beats the preset, config settings merge key by key, and every preset of every
example script parses."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import _scripts
import pytest
from transformers import HfArgumentParser

from ni_hf import NeuralInterpreterConfig
from ni_hf.training.presets import (
    DIGITS_PRESETS,
    Preset,
    config_setting_names,
    format_config_overrides,
    parse_config_overrides,
    parse_with_presets,
    preset_field,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TOY_PRESETS = {
    "small": Preset(
        help="a small run", arguments={"epochs": 3, "names": ["a", "b"]}, config={"hidden_size": 8}
    ),
    "large": Preset(
        help="a large run", arguments={"epochs": 30}, config={"hidden_size": 64, "num_functions": 6}
    ),
}


@dataclass
class ToyArguments:
    preset: str | None = preset_field(TOY_PRESETS, default="small")
    epochs: int = field(default=1, metadata={"help": "epochs"})
    learning_rate: float = field(default=0.1, metadata={"help": "learning rate"})
    names: list[str] | None = field(default=None, metadata={"help": "names"})
    config_overrides: str | None = field(default=None, metadata={"help": "config settings"})


def parse(*argv: str, presets=TOY_PRESETS, **kwargs) -> ToyArguments:
    (arguments,) = parse_with_presets(HfArgumentParser(ToyArguments), presets, list(argv), **kwargs)
    return arguments


def overrides(arguments: ToyArguments) -> dict:
    return parse_config_overrides(arguments.config_overrides, NeuralInterpreterConfig)


def test_the_presets_values_are_defaults_that_a_flag_beats():
    assert (parse().epochs, parse().names, parse().learning_rate) == (3, ["a", "b"], 0.1)
    assert parse("--preset", "large").epochs == 30
    assert parse("--epochs", "7").epochs == 7
    assert parse("--preset", "large", "--epochs", "7").epochs == 7
    assert parse("--epochs", "7", "--preset=large").epochs == 7  # the order of the flags does not matter
    assert parse("--names", "c").names == ["c"]
    assert parse("--pres", "large").epochs == 30  # an abbreviation argparse accepts selects the preset too
    assert parse(default="large").epochs == 30 and parse(default="large").preset == "large"


def test_the_presets_config_merges_with_config_overrides_key_by_key():
    assert overrides(parse()) == {"hidden_size": 8}
    assert overrides(
        parse("--preset", "large", "--config_overrides", "hidden_size=32,truncation_tau=1.2")
    ) == {
        "hidden_size": 32,  # the flag's key wins
        "num_functions": 6,  # the preset's other key stays
        "truncation_tau": 1.2,
    }
    with pytest.raises(ValueError, match="without a value"):
        parse("--config_overrides", "hidden_size=32,typo")


def test_an_unknown_preset_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match=r"--preset 'huge': expected one of \['small', 'large'\]"):
        parse("--preset", "huge")


@pytest.mark.parametrize(
    ("preset", "error"),
    [
        (Preset(help="", arguments={"epoch": 3}), r"sets \['epoch'\], which are not arguments"),
        (Preset(help="", arguments={"config_overrides": "a=1"}), "put config settings in `config`"),
    ],
)
def test_a_preset_for_an_argument_the_script_lacks_is_a_programming_error(preset, error):
    with pytest.raises(TypeError, match=error):
        parse(presets={**TOY_PRESETS, "bad": preset})  # refused whichever preset is chosen


def test_a_preset_cannot_be_changed_after_it_is_defined():
    with pytest.raises(TypeError):
        DIGITS_PRESETS["quickstart"].config["hidden_size"] = 8


def test_config_overrides_round_trip_through_the_canonical_string():
    settings = {
        "num_function_iterations": [2, 1],
        "truncation_tau": 1.2,
        "straight_through": True,
        "x": "eager",
    }
    text = format_config_overrides(settings)
    assert text == 'num_function_iterations=[2,1],truncation_tau=1.2,straight_through=true,x="eager"'
    with pytest.raises(ValueError, match="unknown setting 'x'"):
        parse_config_overrides(text, NeuralInterpreterConfig)
    del settings["x"]
    assert parse_config_overrides(format_config_overrides(settings), NeuralInterpreterConfig) == settings
    assert format_config_overrides({}) is None and parse_config_overrides(None, NeuralInterpreterConfig) == {}


def test_config_settings_are_the_configs_own():
    names = config_setting_names(NeuralInterpreterConfig)
    assert {"hidden_size", "num_functions", "truncation_tau", "num_function_iterations"} <= names
    assert not names & {"num_labels", "id2label", "return_dict"}  # PretrainedConfig's


def scripts_with_presets() -> list[Path]:
    marks = ("parse_with_presets", "parse_script_arguments")  # directly, or through ni_hf.training.run_flow
    return sorted(path for path in EXAMPLES.glob("*.py") if any(mark in path.read_text() for mark in marks))


def test_run_digits_is_among_the_scripts_with_presets():
    assert EXAMPLES / "run_digits.py" in scripts_with_presets()


# Data a script's own check asks for (it refuses a run without any).
SCRIPT_DATA = {"run_image_classification.py": ["--train_dir", "placeholder"]}


def with_required_arguments(parser: HfArgumentParser, presets, args, **kwargs):
    """parse_with_presets, with a placeholder for each required argument not in ``args``."""
    args = list(args)
    for action in parser._actions:
        if action.required and not set(action.option_strings) & set(args):
            args += [action.option_strings[0], "placeholder"]
    return parse_with_presets(parser, presets, args, **kwargs)


@pytest.mark.parametrize("script", scripts_with_presets(), ids=lambda path: path.name)
def test_every_preset_of_every_script_parses(script, monkeypatch, tmp_path):
    """Each preset of a script that parses with parse_with_presets, through its parse_args(argv) (or
    parse_arguments): the presets are the ones it passes to parse_with_presets."""
    monkeypatch.chdir(tmp_path)  # what a parse may create (TrainingArguments' output folder) stays here
    module = _scripts.load_script(script, script.stem)
    seen = []

    def recording(parser, presets, args=None, **kwargs):
        seen.append(presets)
        return with_required_arguments(parser, presets, args, **kwargs)

    from ni_hf.training import run_flow

    target = module if hasattr(module, "parse_with_presets") else run_flow
    monkeypatch.setattr(target, "parse_with_presets", recording)
    parse = getattr(module, "parse_args", None) or module.parse_arguments
    data = SCRIPT_DATA.get(script.name, [])  # what a script needs besides its required arguments
    parse(data)  # the default preset
    assert seen and seen[0], f"{script.name} passes no presets"
    for name in seen[0]:
        parsed = parse(["--preset", name, *data])
        assert any(getattr(arguments, "preset", None) == name for arguments in parsed), name
