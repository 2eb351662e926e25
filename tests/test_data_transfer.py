"""How the example scripts' batches reach a GPU: pinned memory and non-blocking copies by default there."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _scripts import load_script

from ni_hf.training import data_transfer
from ni_hf.training.data_transfer import batch_transfer_note, default_non_blocking_copies

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPTS = {
    "run_digits": "DigitsTrainingArguments",
    "run_image_classification": "ImageClassificationTrainingArguments",
    "run_fuzzy_boolean": "FuzzyBooleanTrainingArguments",
    "run_digits_adaptation": "AdaptationTrainingArguments",
}


def _args(**overrides) -> SimpleNamespace:
    fields = {"accelerator_config": None, "dataloader_pin_memory": True, "use_cpu": False}
    return SimpleNamespace(**{**fields, **overrides})


def test_pinned_batches_on_a_gpu_are_copied_asynchronously():
    args = _args()
    assert default_non_blocking_copies(args, cuda_available=True)
    assert args.accelerator_config == {"non_blocking": True}


@pytest.mark.parametrize(
    "overrides, cuda_available",
    [
        ({"accelerator_config": {"non_blocking": False}}, True),  # the user's own choice stands
        ({"accelerator_config": "accelerate.json"}, True),
        ({"dataloader_pin_memory": False}, True),  # pageable memory: transformers warns, and nothing overlaps
        ({"use_cpu": True}, True),
        ({}, False),
    ],
)
def test_a_users_accelerator_config_unpinned_batches_and_the_cpu_are_left_alone(overrides, cuda_available):
    args = _args(**overrides)
    before = args.accelerator_config
    assert not default_non_blocking_copies(args, cuda_available=cuda_available)
    assert args.accelerator_config is before


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_each_scripts_training_arguments_turn_on_non_blocking_copies_where_cuda_is(
    script, monkeypatch, tmp_path
):
    module = load_script(EXAMPLES / f"{script}.py", script)
    cls = getattr(module, SCRIPTS[script])
    monkeypatch.setattr(data_transfer, "_cuda_available", lambda: True)
    on_gpu = cls(output_dir=str(tmp_path), dataloader_pin_memory=True)
    assert (
        on_gpu.accelerator_config.non_blocking
    )  # an AcceleratorConfig by now: set before transformers converted it
    chosen = cls(
        output_dir=str(tmp_path), dataloader_pin_memory=True, accelerator_config={"non_blocking": False}
    )
    assert not chosen.accelerator_config.non_blocking
    monkeypatch.setattr(data_transfer, "_cuda_available", lambda: False)
    assert not cls(output_dir=str(tmp_path), dataloader_pin_memory=True).accelerator_config.non_blocking


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_each_script_pins_batches_by_default_only_where_cuda_is(script):
    module = load_script(EXAMPLES / f"{script}.py", script)
    default = next(
        f.default
        for f in dataclasses.fields(getattr(module, SCRIPTS[script]))
        if f.name == "dataloader_pin_memory"
    )
    assert default is torch.cuda.is_available()  # no pin-memory warning on a CPU-only machine


def test_the_log_line_says_whether_a_step_waits_for_the_one_before():
    assert batch_transfer_note(SimpleNamespace(device=torch.device("cpu"))) is None
    cuda = torch.device("cuda", 0)
    fast = SimpleNamespace(
        device=cuda, accelerator_config=SimpleNamespace(non_blocking=True), dataloader_pin_memory=True
    )
    assert "asynchronous" in batch_transfer_note(fast)
    for pinned, non_blocking in [(True, False), (False, True), (False, False)]:
        slow = SimpleNamespace(
            device=cuda,
            accelerator_config=SimpleNamespace(non_blocking=non_blocking),
            dataloader_pin_memory=pinned,
        )
        assert "blocking copies" in batch_transfer_note(slow) and "waits" in batch_transfer_note(slow)


@pytest.mark.parametrize(
    "use_cpu, cuda_available, cores, local_world_size, expected",
    [
        (False, True, 16, 1, 8),  # at most 8
        (False, True, 64, 8, 7),  # eight GPUs: the node's cores shared, one kept for each training loop
        (False, True, 2, 1, 1),
        (False, True, 1, 1, 0),  # a worker would take the loop's only core
        (False, True, 8, 8, 0),
        (True, True, 16, 1, 0),  # --use_cpu: workers would take the training step's cores
        (False, False, 16, 1, 0),
    ],
)
def test_default_workers_feed_a_gpu_from_the_processes_share_of_cores(
    use_cpu, cuda_available, cores, local_world_size, expected
):
    workers = data_transfer.default_dataloader_workers(
        use_cpu, cuda_available=cuda_available, cores=cores, local_world_size=local_world_size
    )
    assert workers == expected


@pytest.mark.parametrize("script", ["run_digits", "run_image_classification", "run_digits_adaptation"])
def test_the_image_scripts_default_to_workers_on_a_gpu_and_none_on_the_cpu(script, monkeypatch, tmp_path):
    module = load_script(EXAMPLES / f"{script}.py", script)
    cls = getattr(module, SCRIPTS[script])
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setattr(data_transfer, "_cuda_available", lambda: False)
    assert cls(output_dir=str(tmp_path)).dataloader_num_workers == 0
    monkeypatch.setattr(data_transfer, "_cuda_available", lambda: True)
    expected = data_transfer.default_dataloader_workers(False, cuda_available=True)
    assert cls(output_dir=str(tmp_path)).dataloader_num_workers == expected
    assert cls(output_dir=str(tmp_path), use_cpu=True).dataloader_num_workers == 0
    assert (
        cls(output_dir=str(tmp_path), dataloader_num_workers=3).dataloader_num_workers == 3
    )  # the user's choice


def test_compile_for_static_batches_sets_accelerates_switch_unless_the_user_did(monkeypatch):
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "")  # so that teardown restores what was there before
    monkeypatch.delenv("ACCELERATE_DYNAMO_USE_DYNAMIC")
    assert not data_transfer.compile_for_static_batches(SimpleNamespace(torch_compile=False))
    assert "ACCELERATE_DYNAMO_USE_DYNAMIC" not in os.environ
    assert data_transfer.compile_for_static_batches(SimpleNamespace(torch_compile=True))
    assert os.environ["ACCELERATE_DYNAMO_USE_DYNAMIC"] == "false"
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "true")
    assert not data_transfer.compile_for_static_batches(SimpleNamespace(torch_compile=True))
    assert os.environ["ACCELERATE_DYNAMO_USE_DYNAMIC"] == "true"
