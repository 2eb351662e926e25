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
The checkpoint is an image classifier with its image processor (config.json, the weights and
preprocessor_config.json); one whose weights do not fit a Neural Interpreter is refused (``--allow_mismatched_weights``
draws it anyway). Every bad argument is refused by name (exit status 2) before anything is written. Needs the `vis`
extra (matplotlib).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

import ni_hf
from ni_hf import visualization as vis
from ni_hf.data.digits import SKLEARN_TASK, canonical_task_name, load_task_split, resolve_dataset_source
from ni_hf.training.checkpoints import load_checked, read_checkpoint_config
from ni_hf.training.paths import check_model_path
from ni_hf.training.run_setup import exit_on_bad_arguments

MODEL_CLASS = ni_hf.NeuralInterpreterForImageClassification
# The Neural Interpreters this script does not draw, and what in ni_hf.visualization draws them.
OTHER_MODELS = {
    "NeuralInterpreterForMultipleChoice": "trace_routing(model, pixel_values) on PGM puzzles, or "
    "write_pgm_routing_card_assets",
    "NeuralInterpreterForSetRegression": "trace_routing(model, inputs=...) and plot_set_path",
}
DATASET_ONLY = ("dataset_source", "data_dir", "split", "max_samples")  # options that only --dataset reads


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
    parser.add_argument("--split", default=None, help="the dataset's split (default: test)")
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
    for name in DATASET_ONLY:
        if args.images and getattr(args, name) is not None:
            parser.error(f"--{name} is for --dataset; --images draws the image files given.")
    args.split = "test" if args.split is None else args.split
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


def check_output_dir(path: str) -> Path:
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ValueError(
            f"--output_dir {path}: is a file; expected a folder for the pictures and routing.json."
        )
    return folder


def check_checkpoint_config(path: str, option: str = "--model") -> None:
    """A local folder holds a readable config.json; a Neural Interpreter this script does not draw is refused."""
    config_file = Path(path) / "config.json"
    if Path(path).is_dir():
        if not config_file.is_file():
            raise ValueError(
                f"{option} {path}: the folder holds no config.json; expected a saved image classifier "
                "(model.save_pretrained writes config.json and the weights, its image processor's save_pretrained "
                "preprocessor_config.json)."
            )
        try:
            json.loads(config_file.read_text())
        except (UnicodeDecodeError, ValueError) as error:
            raise ValueError(f"{option} {path}: {config_file} is not valid JSON ({error}).") from error
    for name in read_checkpoint_config(path, option).get("architectures") or []:
        if name in OTHER_MODELS:
            raise ValueError(
                f"{option} {path}: a {name} checkpoint (config.json's architectures); this script draws image "
                f"classifiers ({MODEL_CLASS.__name__}). Draw it with ni_hf.visualization: {OTHER_MODELS[name]}."
            )


def load_model(name: str, allow_mismatched_weights: bool = False) -> tuple[Any, Any]:
    """--model's image classifier and its image processor; what cannot be read is an error naming --model."""
    path = check_model_path(name, "--model")
    check_checkpoint_config(path)
    try:
        model = load_checked(MODEL_CLASS, path, allow_mismatched_weights, option="--model").eval()
    except OSError as error:  # no weights file, or a Hub id that cannot be reached
        raise ValueError(f"--model {name}: {error}") from error
    if Path(path).is_dir() and not (Path(path) / "preprocessor_config.json").is_file():
        raise ValueError(
            f"--model {name}: the folder holds no preprocessor_config.json; save the image processor the "
            "model was trained with beside it (NeuralInterpreterImageProcessor(...).save_pretrained(folder))."
        )
    try:
        processor = ni_hf.NeuralInterpreterImageProcessor.from_pretrained(path)
    except OSError as error:
        raise ValueError(f"--model {name}: no image processor could be read ({error})") from error
    return model, processor


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


def check_disabled_functions(functions: list[int] | None, config: ni_hf.NeuralInterpreterConfig) -> None:
    bad = [u for u in functions or [] if not 0 <= u < config.num_functions]
    if bad:
        raise ValueError(
            f"--disabled_functions {' '.join(map(str, bad))}: the model has functions 0..{config.num_functions - 1}."
        )


def read_images(paths: list[str]) -> list[Image.Image]:
    images = []
    for path in paths:
        try:
            image = Image.open(path)
            image.load()  # a truncated file is refused here, not in the middle of the batches
        except OSError as error:  # no such file, a folder, not an image, truncated
            raise ValueError(f"--images {path}: cannot be read as an image ({error}).") from error
        images.append(image)
    return images


def load_inputs(
    args: argparse.Namespace, source: str | None, num_classes: int
) -> tuple[list, Any, list[str]]:
    """The images to draw, their labels (None for --images) and their names."""
    if args.images:
        return read_images(args.images), None, list(args.images)
    try:
        data = load_task_split(args.dataset, args.split, source, args.data_dir, args.max_samples)
    except FileNotFoundError as error:  # a local folder without the task: name the flag that chose it
        raise ValueError(f"--data_dir {args.data_dir}: {error}") from error
    labels = np.asarray(data["label"], dtype=np.int64)
    if len(labels) == 0:
        raise ValueError(f"--dataset {args.dataset}: its {args.split} split holds no images.")
    bad = sorted(set(labels[(labels < 0) | (labels >= num_classes)].tolist()))
    if bad:
        raise ValueError(
            f"--dataset {args.dataset}: labels {bad} are not classes of the model (0..{num_classes - 1})."
        )
    return list(data["image"]), labels, [f"{args.dataset}/{args.split}/{i}" for i in range(len(labels))]


def sample_numbers(trace: vis.RoutingTrace, i: int, name: str, labels: Any) -> dict[str, Any]:
    """What routing.json keeps of a drawn image: prediction, label and C of every function iteration (K, U, N)."""
    return {
        "image": name,
        "prediction": trace.class_names[int(trace.predictions[i])],
        "probability": float(trace.probabilities[i].max()),
        "label": None if labels is None else trace.class_names[int(labels[i])],
        "compatibilities": np.round(trace.compatibilities[:, i], 6).tolist(),
    }


def draw_first_batch(
    trace: vis.RoutingTrace, labels: Any, args: argparse.Namespace, output_dir: Path
) -> None:
    """The types of the first batch in 2-D, and with --attention Eq. 6's W of every function and head."""
    vis.save_figure(vis.plot_type_space(trace, labels, args.projection, args.seed), output_dir / "types.png")
    if not args.attention:
        return
    last = len(trace.steps) - 1
    for u in range(trace.num_functions):
        for h in range(trace.attentions.shape[4]):
            path = output_dir / ("attention_0.png" if u == h == 0 else f"attention_0_f{u}_h{h}.png")
            vis.save_figure(vis.plot_attention(trace, 0, last, u, h), path)


def draw_routing(
    model: Any, processor: Any, inputs: tuple[list, Any, list[str]], task_id: int, args: argparse.Namespace
) -> tuple[vis.FunctionUsage, list[dict[str, Any]]]:
    """Trace every batch: the paths of the first --num_drawn images, the first batch's types, the usage of all."""
    images, labels, names = inputs
    output_dir = Path(args.output_dir)
    options = dict(
        num_function_iterations=args.num_function_iterations, disabled_functions=args.disabled_functions
    )
    usage, samples = None, []
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
        for i in range(min(stop, args.num_drawn) - start):
            vis.save_figure(vis.plot_computational_path(trace, i), output_dir / f"path_{start + i}.png")
            samples.append(sample_numbers(trace, i, names[start + i], batch_labels))
        if first:
            draw_first_batch(trace, batch_labels, args, output_dir)
    return usage, samples


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    with exit_on_bad_arguments():
        output_dir = check_output_dir(args.output_dir)
        source = None if args.images else dataset_source(args)
        model, processor = load_model(args.model, args.allow_mismatched_weights)
        task_id = model_task_id(model.config, args.task, args.dataset)
        check_disabled_functions(args.disabled_functions, model.config)
        inputs = load_inputs(args, source, model.config.num_labels)
    output_dir.mkdir(parents=True, exist_ok=True)
    usage, samples = draw_routing(model, processor, inputs, task_id, args)
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
