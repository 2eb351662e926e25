"""Regenerate the pictures of README.md and docs/visualization.md from the quickstart model.

    OMP_NUM_THREADS=1 python examples/make_readme_figure.py

Uses --model (default runs/quickstart, the model of README command 1, `run_digits.py --preset quickstart`, which
demo/quickstart.py runs first when the folder holds no model: a few minutes on 2 cores) and the 360 test digits of
scikit-learn's split. Writes to docs/images/:
computational_path.png (test image --index), type_space.png (types of the first 64 test images, PCA),
function_usage.png (all 360, by true class) and attention.png (Eq. 6's weights of function 1, head 0, for the first
image's CLS token at the last function iteration). Needs the `vis` extra.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

import ni_hf
from ni_hf import visualization as vis
from ni_hf.data.digits import SKLEARN_TASK, load_task_split
from ni_hf.training.checkpoints import load_checked

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "demo"))
from quickstart import QUICKSTART_OUTPUT_DIR, train_quickstart_model  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(QUICKSTART_OUTPUT_DIR), help="a Neural Interpreter checkpoint")
    parser.add_argument("--output_dir", default=str(ROOT / "docs" / "images"))
    parser.add_argument(
        "--index", type=int, default=0, help="the test image whose computational path is drawn"
    )
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    if (
        Path(args.model).absolute() == QUICKSTART_OUTPUT_DIR
        and not (QUICKSTART_OUTPUT_DIR / "config.json").is_file()
    ):
        train_quickstart_model(QUICKSTART_OUTPUT_DIR)
    model = load_checked(ni_hf.NeuralInterpreterForImageClassification, args.model, option="--model").eval()
    processor = ni_hf.NeuralInterpreterImageProcessor.from_pretrained(args.model)
    data = load_task_split(SKLEARN_TASK, "test", "sklearn")
    pixels = processor(images=list(data["image"]), return_tensors="pt")["pixel_values"]
    labels = np.asarray(data["label"])
    task_ids = [model.config.task_names.index(SKLEARN_TASK)] * len(labels)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)

    trace = vis.trace_routing(model, pixels, task_ids, output_attentions=True)
    accuracy = float((trace.predictions == labels).mean())
    i = args.index
    vis.save_figure(vis.plot_computational_path(trace, i), out / "computational_path.png")
    first = vis.trace_routing(model, pixels[:64], task_ids[:64])
    vis.save_figure(vis.plot_type_space(first, labels[:64], method="pca"), out / "type_space.png")
    usage = vis.FunctionUsage.from_trace(trace, labels)
    vis.save_figure(vis.plot_function_usage(usage), out / "function_usage.png")
    vis.save_figure(vis.plot_attention(trace, i, len(trace.steps) - 1, 1, 0), out / "attention.png")
    print(usage.to_markdown())
    print(
        f"test accuracy {accuracy:.2%}; image {i}: label {labels[i]}, prediction {trace.predictions[i]}; "
        f"pictures in {out}"
    )


if __name__ == "__main__":
    main()
