"""Regenerate the pictures of README.md and docs/visualization.md from the quickstart model.

    OMP_NUM_THREADS=1 python examples/make_readme_figure.py

Uses --model (default runs/quickstart, the model of README command 1, `run_digits.py --preset quickstart`, which
demo/quickstart.py runs first when the folder holds no model: a few minutes on 2 cores) and the 360 test digits of
scikit-learn's split. Writes to docs/images/:
computational_path.png (test image --index), type_space.png (types of the first 64 test images, PCA),
function_usage.png (all 360, by true class) and attention.png (Eq. 6's weights of function 1, head 0, for the CLS
token of test image --index at the last function iteration). Needs the `vis` extra.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from ni_hf import visualization as vis
from ni_hf.data.digits import SKLEARN_TASK, load_task_split
from ni_hf.training.run_setup import exit_on_bad_arguments

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "demo"), str(ROOT / "examples")]
from quickstart import QUICKSTART_OUTPUT_DIR, train_quickstart_model  # noqa: E402
from visualize_routing import check_output_dir, load_model  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(QUICKSTART_OUTPUT_DIR), help="a Neural Interpreter checkpoint")
    parser.add_argument("--output_dir", default=str(ROOT / "docs" / "images"))
    parser.add_argument(
        "--index", type=int, default=0, help="the test image whose computational path is drawn"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(0)
    if (
        Path(args.model).absolute() == QUICKSTART_OUTPUT_DIR
        and not (QUICKSTART_OUTPUT_DIR / "config.json").is_file()
    ):
        train_quickstart_model(QUICKSTART_OUTPUT_DIR)
    with exit_on_bad_arguments():
        out = check_output_dir(args.output_dir)
        model, processor = load_model(args.model)
        if SKLEARN_TASK not in model.config.task_names:
            raise ValueError(
                f"--model {args.model}: its tasks {list(model.config.task_names)} do not include {SKLEARN_TASK}, "
                "whose test digits this script draws."
            )
        data = load_task_split(SKLEARN_TASK, "test", "sklearn")
        if not 0 <= args.index < len(data):
            raise ValueError(
                f"--index {args.index}: the test split has {len(data)} images (0..{len(data) - 1})."
            )
    pixels = processor(images=list(data["image"]), return_tensors="pt")["pixel_values"]
    labels = np.asarray(data["label"])
    task_ids = [model.config.task_names.index(SKLEARN_TASK)] * len(labels)
    out.mkdir(parents=True, exist_ok=True)

    trace = vis.trace_routing(model, pixels, task_ids, output_attentions=True)
    accuracy = float((trace.predictions == labels).mean())
    i = args.index
    vis.save_figure(vis.plot_computational_path(trace, i), out / "computational_path.png")
    first = vis.trace_routing(model, pixels[:64], task_ids[:64])
    vis.save_figure(vis.plot_type_space(first, labels[:64], method="pca"), out / "type_space.png")
    usage = vis.FunctionUsage.from_trace(trace, labels)
    vis.save_figure(vis.plot_function_usage(usage), out / "function_usage.png")
    function = min(1, trace.num_functions - 1)
    vis.save_figure(vis.plot_attention(trace, i, len(trace.steps) - 1, function, 0), out / "attention.png")
    print(usage.to_markdown())
    print(
        f"test accuracy {accuracy:.2%}; image {i}: label {labels[i]}, prediction {trace.predictions[i]}; "
        f"pictures in {out}"
    )


if __name__ == "__main__":
    main()
