#!/usr/bin/env python
"""Accuracy and routing density of a trained digits checkpoint, per task, on the first N local test images.

    PYTHONPATH=src python benchmarks/checkpoint_report.py CHECKPOINT [--data-dir ../shared/data] [--num-images 3000]

For each task of the checkpoint's config: top-1 accuracy (float32, eager, on the CPU unless --device says
otherwise) on the first --num-images test images of <data-dir>/<task>, and the fraction of (function, token)
pairs with C > 0 per function iteration (`ni_hf.evaluation.routing_density`) on the first 128 of them.
"""

from __future__ import annotations

import argparse
import json

import torch

from ni_hf import NeuralInterpreterForImageClassification, NeuralInterpreterImageProcessor
from ni_hf.digits_data import load_task_split
from ni_hf.evaluation import routing_density


def main(argv: list[str] | None = None) -> dict[str, dict]:
    """Print and return, per task, the accuracy and the routing density of the checkpoint."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="Folder of a saved NeuralInterpreterForImageClassification.")
    p.add_argument("--data-dir", default="../shared/data", help="Local Parquet data (<task>/test.parquet).")
    p.add_argument("--num-images", type=int, default=3000, help="Test images per task (the first ones).")
    p.add_argument("--batch-size", type=int, default=250, help="Images per forward.")
    p.add_argument("--device", default="cpu", help="Device to evaluate on.")
    p.add_argument("--output-json", default=None, help="Also write the report here.")
    args = p.parse_args(argv)

    model = NeuralInterpreterForImageClassification.from_pretrained(args.checkpoint).to(args.device).eval()
    processor = NeuralInterpreterImageProcessor.from_pretrained(args.checkpoint)
    report = {}
    for task_id, task in enumerate(model.config.task_names):
        data = load_task_split(task, "test", source="local", data_dir=args.data_dir)
        data = data.select(range(min(args.num_images, len(data))))
        correct, first = 0, None
        for start in range(0, len(data), args.batch_size):
            rows = data[start : start + args.batch_size]
            pixels = processor(images=rows["image"], return_tensors="pt")["pixel_values"].to(args.device)
            task_ids = torch.full((len(pixels),), task_id, device=args.device)
            with torch.no_grad():
                predicted = model(pixel_values=pixels, task_ids=task_ids).logits.argmax(-1).cpu()
            correct += (predicted == torch.tensor(rows["label"])).sum().item()
            if first is None:
                first = {"pixel_values": pixels[:128], "task_ids": task_ids[:128]}
        density = routing_density(model, [first])
        report[task] = {
            "accuracy": correct / len(data),
            "num_images": len(data),
            "density_per_iteration": [round(d, 4) for d in density["per_iteration"]],
            "density_mean": round(density["mean"], 4),
            "functions_per_token": round(density["functions_per_token_mean"], 2),
        }
        print(task, json.dumps(report[task]), flush=True)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
