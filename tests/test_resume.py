"""A run of examples/run_digits.py killed (SIGKILL) at any moment and resumed with --resume_from_checkpoint last ends
with the weights and the train_loss of an uninterrupted run, with a persistent DataLoader worker and RandAugment; a
kill while a checkpoint is written resumes from the one before; a run that has finished is not resumed; 2-process
evaluation counts as 1-process evaluation.

Every run is a subprocess on the tiny two-task data (10 steps per epoch, so that resumed runs cross epoch ends).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import _scripts
import pytest
import torch
from _digits_runs import SCRIPT, subprocess_env, tiny_args, write_tiny_digits
from safetensors.torch import load_file
from transformers import TrainingArguments

from ni_hf.training.checkpoints import check_not_finished, whole_run_train_loss

MAX_STEPS = 24
SAVE_STEPS = 3


def resume_args(output_dir: Path, data_dir: Path, *extra: str) -> list[str]:
    """24 steps (2.4 epochs of 10), a checkpoint every 3, one persistent worker, RandAugment on (the default)."""
    return tiny_args(
        output_dir, data_dir, "--max_steps", str(MAX_STEPS), "--save_steps", str(SAVE_STEPS),
        "--save_total_limit", "2", "--dataloader_num_workers", "1", "--dataloader_persistent_workers", "true",
        "--do_eval", "false", "--disable_tqdm", "true", "--report_to", "none", *extra,
    )  # fmt: skip


def run(
    args: list[str], home: Path, kill_after_steps: int | None = None, prelude: str = ""
) -> tuple[int, str]:
    """Run the script (after ``prelude``, Python run first in its process); with ``kill_after_steps``, SIGKILL its
    process group once it has logged that many training steps. Returns the exit status and the output."""
    code = prelude + textwrap.dedent(
        f"""
        import runpy, sys
        sys.path.insert(0, {str(SCRIPT.parent)!r})
        sys.argv = [{str(SCRIPT)!r}, *sys.argv[1:]]
        runpy.run_path({str(SCRIPT)!r}, run_name="__main__")
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=subprocess_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the run and its DataLoader worker: one group to kill
    )
    timer = threading.Timer(600, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    lines, steps = [], 0
    try:
        for line in proc.stdout:
            lines.append(line)
            steps += line.startswith("{") and "'loss'" in line  # the Trainer's log of one training step
            if kill_after_steps is not None and steps == kill_after_steps:
                os.killpg(proc.pid, signal.SIGKILL)
                break
        proc.wait()
    finally:
        timer.cancel()
        proc.stdout.close()
    return proc.returncode, "".join(lines)


def read_weights(output_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(output_dir / "model.safetensors")


def train_loss(output_dir: Path) -> float:
    return json.loads((output_dir / "train_results.json").read_text())["train_loss"]


def assert_same_weights(output_dir: Path, reference: Path) -> None:
    weights, expected = read_weights(output_dir), read_weights(reference)
    assert weights.keys() == expected.keys()
    differ = [name for name in expected if not torch.equal(weights[name], expected[name])]
    assert not differ, f"{len(differ)} tensors differ from the uninterrupted run's, e.g. {differ[:3]}"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return write_tiny_digits(tmp_path_factory.mktemp("digits_data"))


@pytest.fixture(scope="module")
def uninterrupted(data_dir, tmp_path_factory) -> Path:
    """The reference: the same run, never killed."""
    base = tmp_path_factory.mktemp("uninterrupted")
    code, log = run(resume_args(base / "out", data_dir), base / "hf_home")
    assert code == 0, log[-4000:]
    return base / "out"


def test_a_run_killed_twice_and_resumed_ends_with_the_weights_of_an_uninterrupted_run(
    uninterrupted, data_dir, tmp_path
):
    output_dir, home = tmp_path / "out", tmp_path / "hf_home"
    rng = random.Random(0)
    first, second = rng.randint(5, 9), rng.randint(5, 9)  # steps logged by each run before it is killed
    code, log = run(resume_args(output_dir, data_dir), home, kill_after_steps=first)
    assert code == -signal.SIGKILL, log[-4000:]
    code, log = run(resume_args(output_dir, data_dir, "--resume_from_checkpoint", "last"), home, second)
    assert code == -signal.SIGKILL and "Resuming from" in log, log[-4000:]
    code, log = run(resume_args(output_dir, data_dir, "--resume_from_checkpoint", "last"), home)
    assert code == 0 and "Resuming from" in log, log[-4000:]
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert state["global_step"] == MAX_STEPS
    assert_same_weights(output_dir, uninterrupted)
    assert train_loss(output_dir) == pytest.approx(train_loss(uninterrupted), rel=1e-6)  # all 24 steps'


def test_train_loss_is_the_mean_over_all_steps_when_checkpoints_fall_between_logs(data_dir, tmp_path):
    """--logging_steps 5, --save_steps 3: every save logs too, so the resumed run's train_loss covers every step."""
    logging = ("--logging_steps", "5")
    reference, home = tmp_path / "uninterrupted", tmp_path / "hf_home"
    code, log = run(resume_args(reference, data_dir, *logging), home)
    assert code == 0, log[-4000:]
    logged = [e["step"] for e in json.loads((reference / "trainer_state.json").read_text())["log_history"]]
    assert {3, 5, 6, 9, 10} <= set(logged)  # the log steps and the save steps
    output_dir = tmp_path / "killed"
    code, log = run(resume_args(output_dir, data_dir, *logging), home, kill_after_steps=5)  # at step 10
    assert code == -signal.SIGKILL, log[-4000:]
    code, log = run(resume_args(output_dir, data_dir, *logging, "--resume_from_checkpoint", "last"), home)
    assert code == 0 and "Resuming from" in log, log[-4000:]
    assert_same_weights(output_dir, reference)
    assert train_loss(output_dir) == pytest.approx(train_loss(reference), rel=1e-6)
    final = json.loads((output_dir / "trainer_state.json").read_text())["log_history"][-1]
    assert final["train_loss"] == train_loss(output_dir)


def test_a_finished_run_is_not_resumed(uninterrupted, data_dir, tmp_path):
    """--resume_from_checkpoint last after the run ended at --max_steps: refused, nothing trained or overwritten."""
    output_dir = tmp_path / "finished"
    shutil.copytree(uninterrupted, output_dir)
    weights = (output_dir / "model.safetensors").read_bytes()
    code, log = run(
        resume_args(output_dir, data_dir, "--resume_from_checkpoint", "last"), tmp_path / "hf_home"
    )
    assert code != 0, log[-4000:]
    assert f"checkpoint-{MAX_STEPS} is step {MAX_STEPS}, and this run ends at step {MAX_STEPS}" in log, log[
        -4000:
    ]
    assert "has finished" in log and "Pass a larger --max_steps" in log
    assert not (output_dir / f"checkpoint-{MAX_STEPS + 1}").exists()
    assert (output_dir / "model.safetensors").read_bytes() == weights
    assert json.loads((output_dir / "trainer_state.json").read_text())["global_step"] == MAX_STEPS


def write_state(folder: Path, **state) -> Path:
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps(state))
    return folder


@pytest.mark.parametrize(
    ("saved", "arguments", "finished"),
    [
        ({"max_steps": 80, "num_train_epochs": 4}, {"max_steps": 80}, True),
        ({"max_steps": 80, "num_train_epochs": 4}, {"max_steps": 50}, True),
        ({"max_steps": 80, "num_train_epochs": 4}, {"max_steps": 120}, False),  # trains it further
        ({"max_steps": 80, "num_train_epochs": 4}, {"num_train_epochs": 4}, True),
        ({"max_steps": 80, "num_train_epochs": 4}, {"num_train_epochs": 6}, False),
    ],
)
def test_a_checkpoint_at_the_end_of_its_run_is_recognised(tmp_path, saved, arguments, finished):
    checkpoint = write_state(tmp_path / "checkpoint-80", global_step=80, **saved)
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", **arguments)
    if finished:
        with pytest.raises(ValueError, match="checkpoint-80 is step 80, and this run ends at step (80|50)"):
            check_not_finished(checkpoint, args)
    else:
        check_not_finished(checkpoint, args)
    midway = write_state(tmp_path / "checkpoint-40", global_step=40, **saved)
    check_not_finished(midway, args)


def test_whole_run_train_loss_weights_each_logged_window_by_its_steps(tmp_path, caplog):
    history = [
        {"loss": 4.0, "step": 2},
        {"loss": 1.0, "step": 6},
        {"loss": 9.0, "step": 7},
        {"train_loss": 0.1},
    ]
    checkpoint = write_state(tmp_path / "checkpoint-6", global_step=6, log_history=history)
    # steps 1-2 at 4, 3-6 at 1 (step 7 is after the checkpoint), then 4 steps at a mean of 0.5
    assert whole_run_train_loss(checkpoint, 0.5, 10) == pytest.approx((2 * 4 + 4 * 1 + 4 * 0.5) / 10)
    gap = write_state(tmp_path / "checkpoint-8", global_step=8, log_history=history)
    assert whole_run_train_loss(gap, 0.5, 10) == pytest.approx(((2 * 4 + 4 * 1 + 9) * 8 / 7 + 2 * 0.5) / 10)
    assert "checkpoint-8: step 8 was not logged" in caplog.text
    unlogged = write_state(tmp_path / "checkpoint-3", global_step=3, log_history=[])
    assert whole_run_train_loss(unlogged, 0.5, 10) == 0.5
    assert "logged no training loss: train_loss is the mean over steps 4-10 only" in caplog.text


# The process dies while it writes checkpoint-9's trainer_state.json (the Trainer's last file of a checkpoint): half
# of the file is on disk.
KILL_WHILE_SAVING = textwrap.dedent(
    """
    import os, signal
    from transformers import trainer_callback

    save_to_json = trainer_callback.TrainerState.save_to_json

    def save_half_then_die(self, json_path):
        if json_path.endswith("checkpoint-9/trainer_state.json"):
            save_to_json(self, json_path)
            text = open(json_path).read()
            open(json_path, "w").write(text[: len(text) // 2])
            os.killpg(os.getpid(), signal.SIGKILL)
        return save_to_json(self, json_path)

    trainer_callback.TrainerState.save_to_json = save_half_then_die
    """
)


def test_a_run_killed_while_writing_a_checkpoint_resumes_from_the_last_complete_one(
    uninterrupted, data_dir, tmp_path
):
    output_dir, home = tmp_path / "out", tmp_path / "hf_home"
    code, log = run(resume_args(output_dir, data_dir), home, prelude=KILL_WHILE_SAVING)
    assert code == -signal.SIGKILL, log[-4000:]
    assert (
        output_dir / "checkpoint-9" / "model.safetensors"
    ).is_file()  # the weights were written, the state not
    code, log = run(resume_args(output_dir, data_dir, "--resume_from_checkpoint", "last"), home)
    assert code == 0, log[-4000:]
    assert "Skipping" in log and "checkpoint-9: no readable trainer_state.json" in log
    assert f"Resuming from {output_dir / 'checkpoint-6'}" in log
    assert_same_weights(output_dir, uninterrupted)


@pytest.mark.slow
def test_two_process_evaluation_of_a_checkpoint_equals_one_process_evaluation(tmp_path):
    """101 test digits (not a multiple of 2 processes x batch 8): the same accuracy and eval_loss either way."""
    trained, home = tmp_path / "trained", tmp_path / "hf_home"
    train = tiny_args(
        trained, tmp_path, "--dataset_source", "sklearn", "--save_strategy", "no", "--do_eval", "false"
    )
    train.remove("--data_dir")
    train.remove(str(tmp_path))
    code, log = run(train, home)
    assert code == 0, log[-4000:]
    evaluate = ["--model_name_or_path", str(trained), "--do_train", "false", "--dataset_source", "sklearn"]
    evaluate += ["--max_eval_samples", "101", "--per_device_eval_batch_size", "8", "--use_cpu", "true"]
    results = {}
    for processes in (1, 2):
        output_dir = tmp_path / f"eval_{processes}"
        args = [*evaluate, "--output_dir", str(output_dir)]
        command = _scripts.torchrun_command(SCRIPT, *args, nproc=processes)
        proc = subprocess.run(command, env=subprocess_env(home), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        results[processes] = json.loads((output_dir / "eval_results.json").read_text())
    assert results[2]["eval_world_size"] == 2 and results[1]["eval_world_size"] == 1
    assert results[1]["eval_num_samples"] == results[2]["eval_num_samples"] == 101
    assert results[2]["eval_accuracy"] == results[1]["eval_accuracy"]
    assert results[2]["eval_loss"] == results[1]["eval_loss"]


@pytest.mark.slow
def test_the_quickstart_preset_killed_four_times_resumes_to_the_uninterrupted_weights(tmp_path):
    """The quickstart preset (its persistent worker, RandAugment and the fast path), 80 steps, killed 4 times."""
    args = ["--preset", "quickstart", "--max_steps", "80", "--save_strategy", "steps", "--save_steps", "5"]
    args += ["--save_total_limit", "2", "--seed", "42", "--disable_tqdm", "true", "--logging_steps", "1"]
    home = tmp_path / "hf_home"
    code, log = run([*args, "--output_dir", str(tmp_path / "uninterrupted")], home)
    assert code == 0, log[-4000:]
    output_dir = tmp_path / "killed"
    rng = random.Random(42)
    for attempt in range(5):
        resume = ["--resume_from_checkpoint", "last"] if attempt else []
        kill_after = rng.randint(6, 20) if attempt < 4 else None
        code, log = run([*args, "--output_dir", str(output_dir), *resume], home, kill_after)
        assert code == (-signal.SIGKILL if kill_after else 0), log[-4000:]
    assert_same_weights(output_dir, tmp_path / "uninterrupted")
    eval_loss = [
        json.loads((d / "eval_results.json").read_text())["eval_loss"]
        for d in (output_dir, tmp_path / "uninterrupted")
    ]
    assert eval_loss[0] == eval_loss[1]
