"""Regenerate the pictures of README.md and docs/visualization.md from the quickstart model.

    OMP_NUM_THREADS=1 python examples/make_readme_figure.py

Uses --model (default runs/demo-quickstart, trained first by demo/quickstart.py when absent: the README quickstart's
width on scikit-learn's digits, a few minutes on 2 cores; `--model runs/quickstart` takes the model of the
README's run_digits.py command instead) and the 360 test digits of scikit-learn's split. Writes to docs/images/:
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

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(ROOT / "runs" / "demo-quickstart"))
    parser.add_argument("--output_dir", default=str(ROOT / "docs" / "images"))
    parser.add_argument(
        "--index", type=int, default=0, help="the test image whose computational path is drawn"
    )
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    if not (Path(args.model) / "config.json").is_file():
        sys.path.insert(0, str(ROOT / "demo"))
        from quickstart import train_quickstart_model

        train_quickstart_model(args.model)
    model = ni_hf.NeuralInterpreterForImageClassification.from_pretrained(args.model).eval()
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
