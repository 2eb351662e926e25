#!/usr/bin/env python
"""The baselines beside an image-classification result: chance, the most frequent class, and a logistic
regression on the raw pixels, on exactly the rows examples/run_image_classification.py trains and evaluates on.

    python benchmarks/image_classification_baselines.py --dataset_name ../shared/data/fashion_mnist \
        --image_size 28 --max_train_samples 10000 --max_eval_samples 2000 --seed 42

The rows come from ``ni_hf.data.images.load_image_tasks`` with the script's defaults (its seeded subsets and
validation split); the pixels are the processor's (resized to ``--image_size``, gray, scaled to [0, 1]).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from ni_hf.data.images import ImageDatasetSource, load_image_tasks


def pixels(split, image_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, image_size**2) gray pixels in [0, 1] and (N,) labels of a loaded split."""
    rows = split.with_format(None)
    images = [image.convert("L").resize((image_size, image_size)) for image in rows["image"]]
    return np.stack([np.asarray(image, dtype=np.float32).ravel() / 255 for image in images]), np.asarray(
        rows["label"]
    )


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dataset_name", required=True, help="A dataset as run_image_classification.py takes it."
    )
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--max_train_samples", type=int, default=None)
    parser.add_argument("--max_eval_samples", type=int, default=None)
    parser.add_argument("--train_val_split", type=float, default=0.15)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    from sklearn.linear_model import LogisticRegression

    data, (task,) = load_image_tasks(
        ImageDatasetSource(dataset_name=args.dataset_name),
        train_val_split=args.train_val_split,
        max_train_samples=args.max_train_samples,
        max_eval_samples=args.max_eval_samples,
        seed=args.seed,
    )
    x_train, y_train = pixels(data["train"], args.image_size)
    x_eval, y_eval = pixels(data["validation"], args.image_size)
    start = time.perf_counter()
    logistic = LogisticRegression(max_iter=1000).fit(x_train, y_train)
    results = {
        "chance": 1 / task.num_labels,
        "most_frequent_class": float(np.mean(y_eval == np.bincount(y_train).argmax())),
        "logistic_regression_on_pixels": float(logistic.score(x_eval, y_eval)),
        "logistic_regression_seconds": time.perf_counter() - start,
        "train_rows": len(y_train),
        "eval_rows": len(y_eval),
    }
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
