"""Tiny runs of examples/run_digits.py for the tests: a two-task data set in the local Parquet layout, a tiny model,
and the environment of a subprocess run."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "run_digits.py"
TINY_CONFIG = (
    "hidden_size=16,code_dim=8,num_function_iterations=1,num_functions=2,num_attention_heads=2,"
    "attention_head_size=4,type_inference_hidden_size=8,type_dim=4"
)
TRAIN_PER_TASK = 40
EVAL_PER_TASK = 19  # 2 tasks x 19 = 38 test samples: not a multiple of 2 processes x batch 4


def write_tiny_digits(root: Path) -> Path:
    """Two small tasks in the Hub Parquet layout under ``root``: sklearn digits as 8x8 gray 'mnist' and 16x16 RGB
    'mnist_m' (40 training and 19 test images each)."""
    from datasets import ClassLabel, Dataset, Features, Image
    from sklearn.datasets import load_digits

    bunch = load_digits()
    gray = np.round(bunch.images * (255 / 16)).astype(np.uint8)
    features = Features({"image": Image(), "label": ClassLabel(names=[str(i) for i in range(10)])})
    rng = np.random.default_rng(0)
    for folder, offset in (("mnist", 0), ("mnist_m", 400)):
        for split, start, size in (("train", offset, TRAIN_PER_TASK), ("test", offset + 200, EVAL_PER_TASK)):
            images = gray[start : start + size]
            if folder == "mnist_m":  # 16x16 RGB on a coloured background: another "domain"
                background = rng.integers(0, 80, size=(len(images), 1, 1, 3))
                rgb = np.clip(images[..., None].astype(np.int16) + background, 0, 255).astype(np.uint8)
                images = rgb.repeat(2, axis=1).repeat(2, axis=2)
            ds = Dataset.from_dict(
                {"image": list(images), "label": bunch.target[start : start + size].tolist()},
                features=features,
            )
            (root / folder).mkdir(parents=True, exist_ok=True)
            ds.to_parquet(root / folder / f"{split}.parquet")
    return root


def tiny_args(output_dir: Path, data_dir: Path, *extra: str) -> list[str]:
    """Arguments of a few-second run on the two tiny tasks (a later flag in ``extra`` replaces an earlier one)."""
    return [
        "--output_dir", str(output_dir), "--data_dir", str(data_dir), "--config_overrides", TINY_CONFIG,
        "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8", "--max_steps", "4",
        "--eval_strategy", "no", "--save_strategy", "steps", "--save_steps", "2", "--logging_steps", "1",
        "--seed", "0", "--use_cpu", "true", "--max_eval_samples", str(EVAL_PER_TASK),
        *extra,
    ]  # fmt: skip


def subprocess_env(home: Path) -> dict[str, str]:
    """The environment of a script run in a subprocess: the package from src/, offline, one thread, caches in
    ``home``, output unbuffered (a test reads it while the run goes on)."""
    return {
        **os.environ,
        "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "HF_HOME": str(home),
        "PYTHONUNBUFFERED": "1",
    }
