"""ni_hf.training.run_setup: argument checks that name the flag, the exit they lead to, the memory check, the global
batch over processes, the logging set-up and the environment a run records."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from transformers import TrainingArguments

import ni_hf.training.run_setup as run_setup
from ni_hf.training.run_setup import (
    ExampleTrainingArguments,
    check_at_least,
    check_fields_left_alone,
    check_memory,
    check_positive,
    check_training_arguments,
    environment,
    exit_on_bad_arguments,
    per_device_batch_size,
    setup_logging,
)


def _args(tmp_path, **kwargs) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **kwargs)


def test_a_bad_argument_exits_with_status_2_and_its_message_on_stderr(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info, exit_on_bad_arguments("script.py"):
        raise ValueError("--batch_size must be at least 1, got 0.")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "script.py: error: --batch_size must be at least 1, got 0.\n"
    with exit_on_bad_arguments("script.py"):
        pass  # nothing raised: nothing happens


@pytest.mark.parametrize(
    ("check", "match"),
    [
        (lambda: check_at_least("--n", 0, 1), "--n must be at least 1, got 0."),
        (lambda: check_at_least("--sizes", [4, -5, 0], 1), "--sizes must be at least 1, got -5 0."),
        (lambda: check_at_least("--sizes", [], 1), "--sizes is empty"),
        (lambda: check_positive("--lr", 0.0), "--lr must be a positive number, got 0.0."),
        (lambda: check_positive("--lr", math.nan), "--lr must be a positive number, got nan."),
        (lambda: check_positive("--lr", math.inf), "--lr must be a positive number, got inf."),
        (lambda: per_device_batch_size(0, 1), "--batch_size must be at least 1, got 0."),
        (lambda: per_device_batch_size(31, 2), r"--batch_size 31 is the global batch; .* processes \(2\)"),
    ],
)
def test_range_checks_name_the_flag_and_what_was_expected(check, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check()


def test_values_in_range_pass() -> None:
    check_at_least("--n", 1, 1)
    check_at_least("--sizes", [1, 2], 1)
    check_at_least("--n", None, 1)
    check_positive("--lr", 1e-9)
    check_positive("--lr", None)
    assert per_device_batch_size(128, 4) == 32


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seed": -1}, "--seed must be between 0 and 2\\*\\*32 - 1"),
        ({"data_seed": 2**32}, "--data_seed must be between 0 and 2\\*\\*32 - 1"),
        ({"per_device_eval_batch_size": 0}, "--per_device_eval_batch_size must be at least 1, got 0"),
        ({"gradient_accumulation_steps": 0}, "--gradient_accumulation_steps must be at least 1, got 0"),
        ({"dataloader_num_workers": -1}, "--dataloader_num_workers must be at least 0, got -1"),
        ({"save_total_limit": 0}, "--save_total_limit must be at least 1, got 0"),
        ({"logging_steps": -5}, "--logging_steps must be a positive number, got -5"),
        ({"save_strategy": "steps", "save_steps": 0}, "--save_steps must be a positive number, got 0"),
        ({"learning_rate": -1.0}, "--learning_rate must be a positive number, got -1.0"),
        ({"adam_epsilon": 0.0}, "--adam_epsilon must be a positive number, got 0.0"),
        ({"adam_beta1": 1.0}, "--adam_beta1 must lie in \\[0, 1\\), got 1.0"),
        ({"weight_decay": -0.1}, "--weight_decay must be a finite number >= 0, got -0.1"),
        ({"max_grad_norm": math.nan}, "--max_grad_norm must be a finite number >= 0, got nan"),
        ({"torch_compile_backend": "inductr"}, "--torch_compile_backend 'inductr' is not a backend"),
    ],
)
def test_training_arguments_transformers_accepts_but_that_fail_later_are_refused(
    tmp_path, kwargs: dict, match: str
) -> None:
    args = _args(tmp_path, **kwargs)  # transformers itself accepts each of these
    with pytest.raises(ValueError, match=match):
        check_training_arguments(args)


def test_default_training_arguments_pass(tmp_path) -> None:
    check_training_arguments(_args(tmp_path))


def test_a_field_the_script_sets_itself_is_refused_naming_what_to_use(tmp_path) -> None:
    fields = {"learning_rate": "--adapt_learning_rate", "lr_scheduler_type": "nothing: the rate is constant"}
    check_fields_left_alone(_args(tmp_path), fields, "the script sets it")
    with pytest.raises(
        ValueError, match="--learning_rate 0.1: the script sets it; use --adapt_learning_rate."
    ):
        check_fields_left_alone(_args(tmp_path, learning_rate=0.1), fields, "the script sets it")
    with pytest.raises(ValueError, match="--lr_scheduler_type cosine: the script sets it; use nothing"):
        check_fields_left_alone(_args(tmp_path, lr_scheduler_type="cosine"), fields, "the script sets it")


def test_memory_beyond_the_device_is_refused_with_the_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_setup, "total_memory", lambda device: 8 * 2**30)
    check_memory(8 * 2**30, "cpu", "--n 1", "for the data")
    with pytest.raises(ValueError, match=r"^--n 9 need at least 9.0 GiB for the data; cpu has 8.0 GiB.$"):
        check_memory(9 * 2**30, "cpu", "--n 9", "for the data")


def test_the_cpus_memory_is_the_machines() -> None:
    import psutil

    assert run_setup.total_memory(torch.device("cpu")) == psutil.virtual_memory().total


def test_example_training_arguments_log_a_nan_keep_columns_and_pin_only_with_cuda(tmp_path) -> None:
    args = ExampleTrainingArguments(output_dir=str(tmp_path), use_cpu=True)
    assert args.logging_nan_inf_filter is False and args.remove_unused_columns is False
    assert args.dataloader_pin_memory == torch.cuda.is_available()


def test_setup_logging_logs_info_on_the_main_process_and_the_chosen_level_when_given(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    verbosity = transformers.utils.logging.get_verbosity()
    monkeypatch.setattr(logging.getLogger("ni_hf"), "level", logging.getLogger("ni_hf").level)
    script = logging.getLogger("a_script")
    setup_logging(_args(tmp_path), script)
    assert script.level == logging.INFO and logging.getLogger("ni_hf").level == logging.INFO
    setup_logging(_args(tmp_path, log_level="error"), script)
    assert script.level == logging.ERROR
    transformers.utils.logging.set_verbosity(verbosity)


def test_environment_names_where_and_with_what_a_run_ran(tmp_path) -> None:
    env = environment(_args(tmp_path, bf16=True))
    assert env["device"] == "cpu" and env["world_size"] == 1 and env["mixed_precision"] == "bf16"
    assert env["date"].endswith("+00:00") and env["cpu"] and env["cpu_count"] >= 1
    assert env["torch"] == torch.__version__ and env["torch_threads"] == torch.get_num_threads()
    assert {"platform", "python", "transformers", "ni_hf"} <= set(env)
