"""transformers' own examples/pytorch/image-classification/run_image_classification.py on an ni_hf checkpoint,
with the command docs/ecosystem.md gives, on a tiny image folder of a new label set.

That script needs torchvision, whose wheel does not work beside the CPU build of torch this project installs, and
it is not part of the transformers package: the test runs where both are at hand and skips otherwise.
- NI_HF_TRANSFORMERS_EXAMPLES: the script, or a transformers checkout that holds it (at the installed version's
  tag, `v{transformers.__version__}`).
- NI_HF_EXAMPLES_PYTHON: the Python that runs it (default: this one); it needs torch, torchvision, transformers,
  datasets, evaluate and accelerate, and not ni_hf (the checkpoint's copied code runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import NeuralInterpreterModelTester
from PIL import Image
from transformers import AutoModelForImageClassification

SCRIPT = Path("examples/pytorch/image-classification/run_image_classification.py")
CLASSES = ["cat", "dog", "fox"]

# `evaluate.load("accuracy")` (in the script) fetches the metric from the Hub; offline, evaluate takes a folder
# `accuracy/accuracy.py` in the working directory instead. This one counts as the Hub's does.
ACCURACY_METRIC = """
import datasets
import evaluate
import numpy as np


class Accuracy(evaluate.Metric):
    def _info(self):
        features = datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")})
        return evaluate.MetricInfo(description="accuracy", citation="", inputs_description="", features=features)

    def _compute(self, predictions, references):
        return {"accuracy": float(np.mean(np.asarray(predictions) == np.asarray(references)))}
"""


def find_script() -> Path:
    """The script NI_HF_TRANSFORMERS_EXAMPLES names (the file or a checkout holding it), or skip."""
    location = os.environ.get("NI_HF_TRANSFORMERS_EXAMPLES")
    if not location:
        pytest.skip(
            "set NI_HF_TRANSFORMERS_EXAMPLES to transformers' run_image_classification.py (or a checkout of "
            "transformers at the installed version's tag) to run it on an ni_hf checkpoint"
        )
    path = Path(location)
    script = path if path.is_file() else path / SCRIPT
    if not script.is_file():
        pytest.fail(
            f"NI_HF_TRANSFORMERS_EXAMPLES={location} is neither the script nor a checkout holding {SCRIPT}"
        )
    return script


def examples_python() -> str:
    """The Python NI_HF_EXAMPLES_PYTHON names (default: this one), if its torchvision works; skip otherwise."""
    python = os.environ.get("NI_HF_EXAMPLES_PYTHON", sys.executable)
    check = (
        "import torch, torchvision; from torchvision.transforms import RandomResizedCrop; import transformers"
    )
    proc = subprocess.run([python, "-c", check], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"the script needs a working torchvision beside torch in {python}: {reason}")
    return python


def write_image_folder(root: Path, per_class: int, seed: int) -> Path:
    """ROOT/<class>/<i>.png, 8 x 8 RGB: the layout `--train_dir` and `--validation_dir` read (imagefolder)."""
    rng = np.random.default_rng(seed)
    for name in CLASSES:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
    return root


def script_command(python: str, script: Path, checkpoint: Path, data: Path, output: Path) -> list[str]:
    """The command of docs/ecosystem.md, at test size."""
    return [
        python,
        str(script),
        "--model_name_or_path", str(checkpoint),
        "--trust_remote_code", "True",
        "--ignore_mismatched_sizes", "True",
        "--train_dir", str(data / "train"),
        "--validation_dir", str(data / "validation"),
        "--output_dir", str(output),
        "--do_train", "--do_eval",
        "--remove_unused_columns", "False",
        "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "4",
        "--max_steps", "3",
        "--learning_rate", "1e-3",
        "--save_strategy", "no",
        "--report_to", "none",
        "--use_cpu", "True",
        "--seed", "0",
    ]  # fmt: skip


def test_transformers_run_image_classification_trains_an_ni_hf_checkpoint_on_new_labels(tmp_path):
    script = find_script()
    python = examples_python()
    checkpoint = NeuralInterpreterModelTester().save_image_classifier(tmp_path / "checkpoint")
    data = tmp_path / "data"
    write_image_folder(data / "train", per_class=4, seed=0)
    write_image_folder(data / "validation", per_class=2, seed=1)
    (tmp_path / "accuracy").mkdir()
    (tmp_path / "accuracy" / "accuracy.py").write_text(textwrap.dedent(ACCURACY_METRIC))
    output = tmp_path / "output"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf_home"),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": "",  # the checkpoint's own code, not this checkout's ni_hf
    }
    command = script_command(python, script, checkpoint, data, output)
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]

    results = json.loads((output / "eval_results.json").read_text())
    assert 0.0 <= results["eval_accuracy"] <= 1.0 and np.isfinite(results["eval_loss"])
    assert json.loads((output / "train_results.json").read_text())["train_loss"] > 0
    config = json.loads((output / "config.json").read_text())
    assert sorted(config["id2label"].values()) == CLASSES
    model = AutoModelForImageClassification.from_pretrained(output).eval()
    assert [head.linear.out_features for head in model.classifier] == [len(CLASSES)] * len(model.classifier)
    with torch.no_grad():
        logits = model(pixel_values=torch.randn(2, 3, 8, 8)).logits
    assert logits.shape == (2, len(CLASSES)) and torch.isfinite(logits).all()
