"""Fine-tuning a checkpoint on a new label set the way transformers does it for any model:
`AutoModelForImageClassification.from_pretrained(CKPT, num_labels=N, ignore_mismatched_sizes=True)`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import NeuralInterpreterModelTester
from transformers import AutoModelForImageClassification

import ni_hf

NEW_LABELS = ["ant", "bee", "cricket", "dragonfly", "earwig", "firefly", "gnat"]
ID2LABEL = dict(enumerate(NEW_LABELS))
LABEL2ID = {name: i for i, name in ID2LABEL.items()}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A saved two-task classifier of 5 labels (the tester's) with its image processor and copied code."""
    return NeuralInterpreterModelTester().save_image_classifier(tmp_path_factory.mktemp("ckpt"))


def load_with_new_labels(checkpoint: Path, **kwargs) -> ni_hf.NeuralInterpreterForImageClassification:
    return AutoModelForImageClassification.from_pretrained(
        checkpoint,
        num_labels=len(NEW_LABELS),
        id2label=ID2LABEL,
        label2id=LABEL2ID,
        ignore_mismatched_sizes=True,
        **kwargs,
    )


def test_new_label_set_gives_fresh_heads_of_n_labels_and_keeps_the_backbone(checkpoint):
    saved = ni_hf.NeuralInterpreterForImageClassification.from_pretrained(checkpoint)
    model = load_with_new_labels(checkpoint)
    assert isinstance(model, ni_hf.NeuralInterpreterForImageClassification)
    assert model.config.num_labels == model.num_labels == len(NEW_LABELS)
    assert model.config.id2label == ID2LABEL and model.config.label2id == LABEL2ID
    assert len(model.classifier) == saved.config.num_tasks
    for head in model.classifier:
        assert head.linear.weight.shape == (len(NEW_LABELS), saved.config.hidden_size)
        assert head.linear.bias.shape == (len(NEW_LABELS),)
        assert torch.isfinite(head.linear.weight).all() and head.linear.weight.abs().sum() > 0
    backbone = model.neural_interpreter.state_dict()
    for name, tensor in saved.neural_interpreter.state_dict().items():
        assert torch.equal(backbone[name], tensor), name
    tester = NeuralInterpreterModelTester()
    logits = model(**tester.prepare_inputs(model.config)).logits
    assert logits.shape == (tester.batch_size, len(NEW_LABELS))


def test_without_ignore_mismatched_sizes_the_heads_mismatch_is_refused_as_transformers_does(checkpoint):
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        AutoModelForImageClassification.from_pretrained(checkpoint, num_labels=len(NEW_LABELS))


def test_new_label_set_trains_saves_and_reloads_with_its_labels(checkpoint, tmp_path):
    torch.manual_seed(0)
    model = load_with_new_labels(checkpoint).train()
    tester = NeuralInterpreterModelTester(batch_size=6)
    inputs = tester.prepare_inputs(model.config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    model.eval().save_pretrained(tmp_path)
    reloaded = AutoModelForImageClassification.from_pretrained(tmp_path).eval()
    assert reloaded.config.id2label == ID2LABEL and reloaded.config.label2id == LABEL2ID
    with torch.no_grad():
        expected = model(pixel_values=inputs["pixel_values"], task_ids=inputs["task_ids"]).logits
        got = reloaded(pixel_values=inputs["pixel_values"], task_ids=inputs["task_ids"]).logits
    torch.testing.assert_close(got, expected)


def test_new_task_names_give_one_fresh_cls_token_and_head_per_task(checkpoint):
    model = load_with_new_labels(checkpoint, task_names=["insects", "spiders", "mites"])
    assert model.config.task_names == ["insects", "spiders", "mites"]
    assert model.neural_interpreter.task_tokens.shape[0] == 3
    assert len(model.classifier) == 3
    tester = NeuralInterpreterModelTester()
    inputs = tester.prepare_inputs(model.config)
    assert model(pixel_values=inputs["pixel_values"], task_ids=torch.tensor([2, 1, 0])).logits.shape == (
        tester.batch_size,
        len(NEW_LABELS),
    )


@pytest.mark.slow  # a fresh Python importing torch and transformers: about 10 s alone, a minute on a busy machine
def test_new_label_set_through_the_checkpoints_own_code_without_the_package(checkpoint, tmp_path):
    """What a user of a Hub checkpoint runs: remote code in a process where `ni_hf` cannot be imported."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["ni_hf"] = None  # importing the package fails: only the checkpoint's copied code can run
        import torch
        from transformers import AutoModelForImageClassification
        model = AutoModelForImageClassification.from_pretrained(
            {str(checkpoint)!r}, num_labels=7, ignore_mismatched_sizes=True, trust_remote_code=True
        )
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        assert [tuple(head.linear.weight.shape) for head in model.classifier] == [(7, 16), (7, 16)]
        images = torch.randn(2, 3, 8, 8)
        out = model(pixel_values=images, task_ids=torch.tensor([0, 1]), labels=torch.tensor([6, 0]))
        out.loss.backward()
        print("logits", tuple(out.logits.shape))
        """
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "logits (2, 7)" in proc.stdout
