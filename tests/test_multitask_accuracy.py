"""Tests for the multi-task accuracy metric (numpy helper and offline ``evaluate`` module)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ni_hf.training.evaluation import (
    MULTITASK_ACCURACY_DIR,
    compute_multitask_accuracy,
    load_multitask_accuracy,
    make_compute_metrics,
    multitask_accuracy_path,
)

# Hand-made example: task 0 gets 2/4 right, task 1 1/2, task 2 1/3; overall 4/9.
PREDICTIONS = [1, 2, 3, 4, 5, 5, 0, 0, 0]
REFERENCES = [1, 2, 0, 0, 5, 6, 0, 1, 2]
TASK_IDS = [0, 0, 0, 0, 1, 1, 2, 2, 2]
TASK_NAMES = ["mnist", "mnistm", "svhn"]
EXPECTED = {"accuracy": 4 / 9, "accuracy_mnist": 0.5, "accuracy_mnistm": 0.5, "accuracy_svhn": 1 / 3}


def _assert_results(results: dict[str, float], expected: dict[str, float]) -> None:
    """Check keys and values (NaN-aware) of a metric result."""
    assert set(results) == set(expected)
    for key, value in expected.items():
        if math.isnan(value):
            assert math.isnan(results[key]), key
        else:
            assert results[key] == pytest.approx(value), key


@pytest.fixture
def offline_hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point HF_HOME and evaluate's caches (read at import time) at a temporary folder, offline."""
    import evaluate.config

    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(evaluate.config, "HF_MODULES_CACHE", home / "modules")
    monkeypatch.setattr(evaluate.config, "HF_EVALUATE_CACHE", home / "evaluate")
    monkeypatch.setattr(evaluate.config, "HF_METRICS_CACHE", home / "metrics")
    monkeypatch.setattr(evaluate.config, "DOWNLOADED_EVALUATE_PATH", str(home / "evaluate" / "downloads"))
    # evaluate imports the copied script as package "evaluate_modules" found on sys.path: make it the tmp one.
    monkeypatch.setattr(sys, "path", [str(home / "modules"), *sys.path])
    saved = {name: mod for name, mod in sys.modules.items() if name.split(".")[0] == "evaluate_modules"}
    for name in saved:
        del sys.modules[name]
    yield home
    for name in [name for name in sys.modules if name.split(".")[0] == "evaluate_modules"]:
        del sys.modules[name]
    sys.modules.update(saved)


def test_numpy_hand_example() -> None:
    """Overall and per-task accuracy of the hand-made example."""
    _assert_results(compute_multitask_accuracy(PREDICTIONS, REFERENCES, TASK_IDS, TASK_NAMES), EXPECTED)


def test_numpy_default_names_and_missing_task() -> None:
    """Without names keys are accuracy_task<i>; a task with no samples gives NaN."""
    results = compute_multitask_accuracy([1, 0, 2], [1, 1, 2], [0, 0, 2])
    _assert_results(
        results, {"accuracy": 2 / 3, "accuracy_task0": 0.5, "accuracy_task1": math.nan, "accuracy_task2": 1.0}
    )
    named = compute_multitask_accuracy(np.array([3]), np.array([3]), np.array([1]), ["a", "b", "c"])
    _assert_results(
        named, {"accuracy": 1.0, "accuracy_a": math.nan, "accuracy_b": 1.0, "accuracy_c": math.nan}
    )


def test_numpy_empty_and_errors() -> None:
    """Empty input gives NaN; malformed input raises ValueError."""
    assert math.isnan(compute_multitask_accuracy([], [], [])["accuracy"])
    with pytest.raises(ValueError, match="same length"):
        compute_multitask_accuracy([1, 2], [1], [0, 0])
    with pytest.raises(ValueError, match="no name"):
        compute_multitask_accuracy([1], [1], [3], ["a", "b"])
    with pytest.raises(ValueError, match="unique"):
        compute_multitask_accuracy([1], [1], [0], ["a", "a"])
    with pytest.raises(ValueError, match="non-negative"):
        compute_multitask_accuracy([1], [1], [-1])


def test_metric_script_is_self_contained() -> None:
    """The metric script sits where the package ships it and imports nothing from ni_hf."""
    script = MULTITASK_ACCURACY_DIR / "multitask_accuracy.py"
    assert script.is_file()
    assert Path(multitask_accuracy_path()) == MULTITASK_ACCURACY_DIR
    assert "ni_hf" not in "".join(
        line for line in script.read_text().splitlines() if line.startswith(("import", "from"))
    )


def test_evaluate_load_offline(offline_hf_home: Path) -> None:
    """evaluate.load of the bundled folder works offline and caches the module under HF_HOME."""
    metric = load_multitask_accuracy()
    assert set(metric.features) == {"predictions", "references", "task_ids"}
    assert all(str(metric.features[name].dtype) == "int64" for name in metric.features)
    _assert_results(
        metric.compute(
            predictions=PREDICTIONS, references=REFERENCES, task_ids=TASK_IDS, task_names=TASK_NAMES
        ),
        EXPECTED,
    )
    # Incremental batches and default task names.
    metric.add_batch(predictions=PREDICTIONS[:4], references=REFERENCES[:4], task_ids=TASK_IDS[:4])
    metric.add_batch(predictions=PREDICTIONS[4:], references=REFERENCES[4:], task_ids=TASK_IDS[4:])
    _assert_results(
        metric.compute(),
        {"accuracy": 4 / 9, "accuracy_task0": 0.5, "accuracy_task1": 0.5, "accuracy_task2": 1 / 3},
    )
    cached = list((offline_hf_home / "modules" / "evaluate_modules").rglob("multitask_accuracy.py"))
    assert cached, "the metric script was not copied under $HF_HOME/modules"


def test_evaluate_module_matches_numpy(offline_hf_home: Path) -> None:
    """The evaluate module and the numpy helper agree on random data."""
    import evaluate

    rng = np.random.default_rng(0)
    preds, refs, tids = rng.integers(0, 10, 500), rng.integers(0, 10, 500), rng.integers(0, 4, 500)
    metric = evaluate.load(multitask_accuracy_path())
    names = ["a", "b", "c", "d"]
    _assert_results(
        metric.compute(predictions=preds, references=refs, task_ids=tids, task_names=names),
        compute_multitask_accuracy(preds, refs, tids, names),
    )


@pytest.mark.slow
def test_fresh_process_caches_under_hf_home(tmp_path: Path) -> None:
    """A fresh interpreter with HF_HOME set loads the metric offline and caches it under HF_HOME.

    Slow (about 6 s): ``import evaluate`` pulls in transformers' pipelines in the new process.
    """
    home = tmp_path / "hf_home"
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    for var in ("HF_MODULES_CACHE", "HF_EVALUATE_CACHE", "HF_METRICS_CACHE"):
        env.pop(var, None)
    code = (
        "import evaluate, sys; m = evaluate.load(sys.argv[1]); "
        "print(m.compute(predictions=[1, 0], references=[1, 1], task_ids=[0, 1])['accuracy'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, multitask_accuracy_path()],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == "0.5"
    assert list((home / "modules" / "evaluate_modules").rglob("multitask_accuracy.py"))


def test_make_compute_metrics() -> None:
    """The Trainer compute_metrics takes logits and (labels, task_ids) label_ids; from logits it adds the mean
    cross-entropy over samples, and with task names the sample counts."""
    logits = np.eye(10)[PREDICTIONS] + 0.01
    eval_pred = SimpleNamespace(predictions=(logits,), label_ids=(np.array(REFERENCES), np.array(TASK_IDS)))
    counts = {"num_samples": len(REFERENCES)}
    counts |= {f"num_samples_{name}": TASK_IDS.count(i) for i, name in enumerate(TASK_NAMES)}
    loss = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(REFERENCES)).item()
    _assert_results(make_compute_metrics(TASK_NAMES)(eval_pred), EXPECTED | counts | {"loss": loss})
    class_ids = SimpleNamespace(predictions=np.array(PREDICTIONS), label_ids=eval_pred.label_ids)
    _assert_results(make_compute_metrics(TASK_NAMES)(class_ids), EXPECTED | counts)
    with pytest.raises(ValueError, match="label_names"):
        make_compute_metrics(TASK_NAMES)(SimpleNamespace(predictions=logits, label_ids=np.array(REFERENCES)))


def test_make_compute_metrics_maps_the_models_task_ids_to_the_datas() -> None:
    """A model that knows the tasks in another order (or more of them) reports per data task."""
    model_task_ids = [3, 0, 1]  # mnist is the model's task 3, mnistm its 0, svhn its 1
    model_ids = np.array([model_task_ids[t] for t in TASK_IDS])
    eval_pred = SimpleNamespace(
        predictions=np.array(PREDICTIONS), label_ids=(np.array(REFERENCES), model_ids)
    )
    results = make_compute_metrics(TASK_NAMES, model_task_ids)(eval_pred)
    assert {k: results[k] for k in EXPECTED} == pytest.approx(EXPECTED)


def test_non_integer_predictions_are_refused_not_truncated() -> None:
    import pytest

    from ni_hf.training.evaluation import compute_multitask_accuracy

    with pytest.raises(ValueError, match="predictions must be integer"):
        compute_multitask_accuracy([1.7, 0], [1, 0], [0, 0])
    with pytest.raises(ValueError, match="task_ids must be integer"):
        compute_multitask_accuracy([1, 1], [1, 1], [0.5, 1.0])
    assert compute_multitask_accuracy([1.0, 0.0], [1, 0], [0, 0])["accuracy"] == 1.0


def test_evaluate_multitask_accuracy_is_the_models_own_argmax_per_task(tester) -> None:
    """Batches over several datasets (uneven last batch) give the accuracy of the model's argmax, per task."""
    from ni_hf import NeuralInterpreterForImageClassification
    from ni_hf.training.evaluation import evaluate_multitask_accuracy

    config = tester.get_config()
    model = NeuralInterpreterForImageClassification(config).eval()
    rng = np.random.default_rng(0)
    tests = []
    for task_id, size in enumerate((5, 3)):
        pixels = rng.standard_normal((size, config.num_patches, config.patch_dim)).astype(np.float32)
        labels = rng.integers(0, config.num_labels, size)
        tests.append({"pixel_values": list(pixels), "labels": labels.tolist(), "task_ids": [task_id] * size})

    class Rows:  # a dataset's slicing: rows [a:b] as a dict of columns
        def __init__(self, columns: dict) -> None:
            self.columns = columns

        def __len__(self) -> int:
            return len(self.columns["labels"])

        def __getitem__(self, rows: slice) -> dict:
            return {name: values[rows] for name, values in self.columns.items()}

    result = evaluate_multitask_accuracy(model, [Rows(t) for t in tests], ["a", "b"], batch_size=2)
    correct = []
    for test in tests:
        with torch.no_grad():
            logits = model(
                pixel_values=torch.from_numpy(np.stack(test["pixel_values"])),
                task_ids=torch.tensor(test["task_ids"]),
            ).logits
        correct.append(logits.argmax(-1).numpy() == np.array(test["labels"]))
    assert result["accuracy_a"] == pytest.approx(correct[0].mean())
    assert result["accuracy_b"] == pytest.approx(correct[1].mean())
    assert result["accuracy"] == pytest.approx(np.concatenate(correct).mean())
