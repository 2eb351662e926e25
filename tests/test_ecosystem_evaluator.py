"""evaluate's `evaluator("image-classification")` offline on a saved checkpoint, with the package's metric."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import evaluate
import numpy as np
import pytest
import torch
from conftest import NeuralInterpreterModelTester
from datasets import ClassLabel, Dataset, Features
from datasets import Image as ImageFeature
from evaluate import evaluator
from PIL import Image
from transformers import AutoImageProcessor, AutoModelForImageClassification, pipeline

import ni_hf
from ni_hf.training.evaluation import load_multitask_accuracy

LABELS = ["apple", "banana", "cherry", "date", "elderberry"]
NUM_IMAGES = 12
NUM_CORRECT = 8  # the labels agree with the model on the first 8 images, by construction


@pytest.fixture
def offline_hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """HF_HOME and evaluate's caches (read when evaluate is imported) in a temporary folder, offline."""
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(evaluate.config, "HF_MODULES_CACHE", home / "modules")
    monkeypatch.setattr(evaluate.config, "HF_EVALUATE_CACHE", home / "evaluate")
    monkeypatch.setattr(evaluate.config, "HF_METRICS_CACHE", home / "metrics")
    monkeypatch.setattr(evaluate.config, "DOWNLOADED_EVALUATE_PATH", str(home / "evaluate" / "downloads"))
    monkeypatch.setattr(sys, "path", [str(home / "modules"), *sys.path])
    yield home


def random_images() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)) for _ in range(NUM_IMAGES)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A saved classifier with named labels, fitted for a few steps to tell the test images apart (an untrained
    tiny model gives every image the same class, and then a wrong label mapping would go unseen)."""
    tester = NeuralInterpreterModelTester()
    config = tester.get_config(num_labels=len(LABELS), id2label=dict(enumerate(LABELS)))
    processor = tester.get_image_processor(config)
    torch.manual_seed(0)
    model = ni_hf.NeuralInterpreterForImageClassification(config)
    images = processor(images=random_images(), return_tensors="pt")["pixel_values"]
    # Both tasks' heads see every image, each with labels of its own.
    pixel_values = torch.cat([images, images])
    task_ids = torch.arange(2 * NUM_IMAGES) // NUM_IMAGES
    targets = torch.cat([torch.arange(NUM_IMAGES), 2 * torch.arange(NUM_IMAGES) + 1]) % len(LABELS)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)
    for _ in range(15):
        model(pixel_values=pixel_values, task_ids=task_ids, labels=targets).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    path = tmp_path_factory.mktemp("ckpt")
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def dataset(checkpoint) -> tuple[Dataset, float]:
    """The images labelled with the model's own prediction on the first NUM_CORRECT and a wrong label on the rest;
    the accuracy counted directly from the model's logits."""
    images = random_images()
    classifier = pipeline("image-classification", model=str(checkpoint), device=-1)
    batch = classifier.image_processor(images=images, return_tensors="pt")
    with torch.no_grad():
        predictions = classifier.model(**batch).logits.argmax(-1).tolist()
    assert len(set(predictions)) > 1, "a model that predicts one class cannot tell a wrong label mapping"
    labels = [p if i < NUM_CORRECT else (p + 1) % len(LABELS) for i, p in enumerate(predictions)]
    features = Features({"image": ImageFeature(), "label": ClassLabel(names=LABELS)})
    data = Dataset.from_dict({"image": images, "label": labels}, features=features)
    accuracy = float(np.mean(np.asarray(predictions) == np.asarray(labels)))
    assert accuracy == NUM_CORRECT / NUM_IMAGES
    return data, accuracy


def test_evaluator_gives_the_directly_counted_accuracy_with_the_package_metric(
    checkpoint, dataset, offline_hf_home
):
    data, accuracy = dataset
    config = ni_hf.NeuralInterpreterConfig.from_pretrained(checkpoint)
    task_evaluator = evaluator("image-classification")
    # The package's metric also reads each sample's task; the pipeline runs the config's default task on all.
    task_evaluator.METRIC_KWARGS = {
        "task_ids": [config.default_task] * len(data),
        "task_names": config.task_names,
    }
    results = task_evaluator.compute(
        model_or_pipeline=str(checkpoint),
        data=data,
        metric=load_multitask_accuracy(),
        label_mapping={name: i for i, name in enumerate(LABELS)},
    )
    assert results["accuracy"] == pytest.approx(accuracy)
    assert results[f"accuracy_{config.task_names[config.default_task]}"] == pytest.approx(accuracy)
    assert any(offline_hf_home.rglob("multitask_accuracy.py")), "the metric was not cached under HF_HOME"


def test_evaluator_on_another_task_through_the_model_and_its_default_task(
    checkpoint, dataset, offline_hf_home
):
    """The pipeline reads no task ids: the task to evaluate is the model's `config.default_task`."""
    data, _ = dataset
    model = AutoModelForImageClassification.from_pretrained(checkpoint).eval()
    processor = AutoImageProcessor.from_pretrained(checkpoint)
    with torch.no_grad():
        batch = processor(images=list(data["image"]), return_tensors="pt")
        predictions = model(**batch, task_ids=torch.ones(len(data), dtype=torch.long)).logits.argmax(-1)
    assert len(set(predictions.tolist())) > 1
    accuracy = (predictions == torch.tensor(list(data["label"]))).float().mean().item()
    model.config.default_task = 1
    task_evaluator = evaluator("image-classification")
    task_evaluator.METRIC_KWARGS = {"task_ids": [1] * len(data), "task_names": model.config.task_names}
    results = task_evaluator.compute(
        model_or_pipeline=model,
        feature_extractor=processor,
        data=data,
        metric=load_multitask_accuracy(),
        label_mapping={name: i for i, name in enumerate(LABELS)},
    )
    assert results["accuracy"] == pytest.approx(accuracy)
    assert results[f"accuracy_{model.config.task_names[1]}"] == pytest.approx(accuracy)


@pytest.mark.xfail(
    strict=True,
    raises=ValueError,
    reason="ni_hf's multitask_accuracy requires `task_ids`, which evaluator('image-classification') does not pass "
    "(it hands the metric predictions and references only): 'Evaluation module inputs are missing: ['task_ids']'",
)
def test_evaluator_takes_the_package_metric_as_it_takes_accuracy(checkpoint, dataset, offline_hf_home):
    data, accuracy = dataset
    results = evaluator("image-classification").compute(
        model_or_pipeline=str(checkpoint),
        data=data,
        metric=load_multitask_accuracy(),
        label_mapping={name: i for i, name in enumerate(LABELS)},
    )
    assert results["accuracy"] == pytest.approx(accuracy)


def test_a_prebuilt_pipeline_is_refused_by_evaluate_on_transformers_5_or_gives_the_same_accuracy(
    checkpoint, dataset, offline_hf_home
):
    """evaluate 0.4.6 checks `isinstance(model_or_pipeline, transformers.TFPreTrainedModel)`, a class transformers 5
    removed, for anything but a name or a model: docs/ecosystem.md passes the checkpoint's path instead."""
    data, accuracy = dataset
    classifier = pipeline("image-classification", model=str(checkpoint), device=-1)
    task_evaluator = evaluator("image-classification")
    task_evaluator.METRIC_KWARGS = {"task_ids": [0] * len(data)}
    try:
        results = task_evaluator.compute(
            model_or_pipeline=classifier,
            data=data,
            metric=load_multitask_accuracy(),
            label_mapping={name: i for i, name in enumerate(LABELS)},
        )
    except AttributeError as error:
        assert "TFPreTrainedModel" in str(error)
    else:  # an evaluate that no longer asks for TensorFlow's class
        assert results["accuracy"] == pytest.approx(accuracy)
