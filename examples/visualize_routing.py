"""Draw what a trained Neural Interpreter computes: computational paths, types, function usage, Eq. 6 weights.

A checkpoint (local folder or Hub id) and images (files) or a digits dataset split in; PNG files and a JSON of the
numbers out. Every number comes from the model's own forward pass (`ni_hf.visualization.trace_routing`).

    python examples/visualize_routing.py --model runs/quickstart --dataset sklearn_digits --dataset_source sklearn \
        --output_dir runs/routing
    python examples/visualize_routing.py --model CKPT --images a.png b.png --task mnist --output_dir out --attention

Writes path_<i>.png (the computational path of the first --num_drawn images), types.png (types of the first batch
in 2-D, --projection pca or tsne), usage.png (function usage over all images), attention_<i>.png (--attention: Eq.
6's weights of every function and head for the first image's CLS token, at the last function iteration) and
routing.json (per drawn image: prediction, label, C of every function iteration (K, U, N); usage over all images).
A checkpoint whose weights do not fit a Neural Interpreter is refused (``--allow_mismatched_weights`` draws it
anyway). Needs the `vis` extra (matplotlib).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

import ni_hf
from ni_hf import visualization as vis
from ni_hf.data.digits import SKLEARN_TASK, canonical_task_name, load_task_split, resolve_dataset_source
from ni_hf.training.checkpoints import load_checked
from ni_hf.training.paths import check_model_path
from ni_hf.training.run_setup import exit_on_bad_arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="checkpoint folder or Hub id")
    parser.add_argument(
        "--allow_mismatched_weights",
        action="store_true",
        help="draw a checkpoint whose weights leave parameters of the model missing or have other shapes",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--images", nargs="+", help="image files")
    source.add_argument("--dataset", help="a digits task (mnist, mnistm, svhn, sklearn_digits, ...)")
    parser.add_argument(
        "--dataset_source",
        choices=["hub", "local", "sklearn"],
        default=None,
        help="default: local with --data_dir, sklearn for sklearn_digits, else hub (ni_hf.data.digits)",
    )
    parser.add_argument(
        "--data_dir", default=None, help="for --dataset_source local: <data_dir>/<task>/test.parquet"
    )
    parser.add_argument("--split", default="test")
    parser.add_argument("--max_samples", type=int, default=None)
    parser.add_argument(
        "--task", default=None, help="the model's task (name or id); default: the dataset's, or 0"
    )
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--num_drawn", type=int, default=4, help="images whose computational path is drawn")
    parser.add_argument("--projection", choices=["pca", "tsne"], default="pca")
    parser.add_argument(
        "--attention", action="store_true", help="also draw Eq. 6's weights for the first image"
    )
    parser.add_argument("--num_function_iterations", type=int, default=None)
    parser.add_argument("--disabled_functions", type=int, nargs="*", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name, minimum in (
        ("batch_size", 1),
        ("num_drawn", 0),
        ("max_samples", 1),
        ("num_function_iterations", 1),
    ):
        value = getattr(args, name)
        if value is not None and value < minimum:
            parser.error(f"--{name} must be at least {minimum}, got {value}.")
    return args


def dataset_source(args: argparse.Namespace) -> str:
    """--dataset_source, else local with --data_dir, sklearn for scikit-learn's digits, else hub."""
    if (
        args.dataset_source is None
        and args.data_dir is None
        and canonical_task_name(args.dataset) == SKLEARN_TASK
    ):
        return "sklearn"
    return resolve_dataset_source(args.dataset_source, args.data_dir)


def model_task_id(config: ni_hf.NeuralInterpreterConfig, task: str | None, dataset: str | None) -> int:
    """The model's task id from --task (name or index), else the dataset's name if the model has it, else 0."""
    for name in (task, dataset):
        if name is None:
            continue
        if name in config.task_names:
            return list(config.task_names).index(name)
        if name.isdigit() and int(name) < len(config.task_names):
            return int(name)
        if name is task:
            raise ValueError(f"--task {name!r} is not one of the model's tasks {list(config.task_names)}.")
    return 0


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    with exit_on_bad_arguments():
        path = check_model_path(args.model, "--model")
        source = None if args.images else dataset_source(args)
        model_class = ni_hf.NeuralInterpreterForImageClassification
        model = load_checked(model_class, path, args.allow_mismatched_weights, option="--model").eval()
        task_id = model_task_id(model.config, args.task, args.dataset)
    processor = ni_hf.NeuralInterpreterImageProcessor.from_pretrained(path)

    if args.images:
        names = list(args.images)
        images = [Image.open(p) for p in names]
        labels = None
    else:
        with exit_on_bad_arguments():
            try:
                data = load_task_split(args.dataset, args.split, source, args.data_dir, args.max_samples)
            except FileNotFoundError as error:  # a local folder without the task: name the flag that chose it
                raise ValueError(f"--data_dir {args.data_dir}: {error}") from error
        images = list(data["image"])
        labels = np.asarray(data["label"], dtype=np.int64)
        names = [f"{args.dataset}/{args.split}/{i}" for i in range(len(images))]

    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    options = dict(
        num_function_iterations=args.num_function_iterations, disabled_functions=args.disabled_functions
    )
    usage = None
    samples = []
    for start in tqdm(range(0, len(images), args.batch_size), desc="Routing", unit="batch"):
        stop = min(start + args.batch_size, len(images))
        pixels = processor(images=images[start:stop], return_tensors="pt")["pixel_values"]
        first = start == 0
        trace = vis.trace_routing(
            model, pixels, [task_id] * (stop - start), output_attentions=first and args.attention, **options
        )
        batch_labels = None if labels is None else labels[start:stop]
        batch_usage = vis.FunctionUsage.from_trace(trace, batch_labels)
        usage = batch_usage if usage is None else usage + batch_usage
        for i in range(stop - start):
            if start + i >= args.num_drawn:
                break
            index = start + i
            vis.save_figure(vis.plot_computational_path(trace, i), output_dir / f"path_{index}.png")
            samples.append(
                {
                    "image": names[index],
                    "prediction": trace.class_names[int(trace.predictions[i])],
                    "probability": float(trace.probabilities[i].max()),
                    "label": None if batch_labels is None else trace.class_names[int(batch_labels[i])],
                    "compatibilities": np.round(trace.compatibilities[:, i], 6).tolist(),  # (K, U, N)
                }
            )
        if first:
            vis.save_figure(
                vis.plot_type_space(trace, batch_labels, args.projection, args.seed), output_dir / "types.png"
            )
            if args.attention:
                last = len(trace.steps) - 1
                for u in range(trace.num_functions):
                    for h in range(trace.attentions.shape[4]):
                        path = output_dir / (
                            "attention_0.png" if u == h == 0 else f"attention_0_f{u}_h{h}.png"
                        )
                        vis.save_figure(vis.plot_attention(trace, 0, last, u, h), path)
    vis.save_figure(vis.plot_function_usage(usage), output_dir / "usage.png")
    numbers = {
        "model": args.model,
        "task": model.config.task_names[task_id],
        "steps": [list(s) for s in usage.steps],
        "num_task_tokens": model.config.num_task_tokens,
        "samples": samples,
        "usage": usage.to_dict(),
    }
    (output_dir / "routing.json").write_text(json.dumps(numbers) + "\n")
    print(usage.to_markdown())
    print(f"Pictures and routing.json in {output_dir}")
    return numbers


if __name__ == "__main__":
    main()
