#!/usr/bin/env python
"""Images/s of run_digits.py's training input pipeline in one process: what one DataLoader worker delivers.

    PYTHONPATH=src python benchmarks/input_pipeline.py [--data-dir ../shared/data] [--tasks mnist mnistm]
        [--source local|sklearn|hub] [--batch-size 128] [--batches 40] [--threads 1] [--step-rate 5985]
        [--output-json FILE]

Compiled with CUDA graphs, a digits training step on one H200 ran at 5,985 images/s (batch 128,
benchmarks/RESULTS.md, 2026-11-27); end to end, training keeps that rate only if the DataLoader's worker processes
deliver batches as fast. Each worker runs examples/run_digits.py's dataset transform (decode, resize to 32x32 RGB,
scale and normalize; RandAugment too, where it runs with workers by default) and transformers' default collator.
This script runs that same pipeline in this process, as one worker does (a DataLoader without workers, shuffled
like the Trainer's, `--threads` torch threads), with RandAugment and without, and prints the median images/s over
`--batches` batches and how many workers the step rate `--step-rate` needs at that speed (if the workers get a
core each: a GPU machine with 16 cores runs 8 workers beside the training process).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from transformers import default_data_collator

from ni_hf import NeuralInterpreterImageProcessor
from ni_hf.augmentation import BatchRandAugment
from ni_hf.digits_data import load_digits_tasks

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples"))
import run_digits  # noqa: E402  (examples/ is no package: the script's own transform and defaults)

H200_STEP_RATE = 5985.0
"""Images/s of the compiled digits training step with CUDA graphs on one H200 (RESULTS.md, 2026-11-27)."""


def build_augmentation(processor: NeuralInterpreterImageProcessor) -> BatchRandAugment:
    """RandAugment as run_digits.py builds it with its default arguments."""
    data_args = run_digits.DataArguments()
    return BatchRandAugment(
        num_ops=data_args.randaugment_num_ops,
        magnitude=data_args.randaugment_magnitude,
        probability=data_args.randaugment_probability,
        policy=run_digits.select_randaugment_policy(data_args.randaugment_operations),
        image_mean=processor.image_mean,
        image_std=processor.image_std,
        image_size=32,
        patch_size=4,
    )


def time_pipeline(dataset, batch_size: int, batches: int, warmup: int, seed: int) -> list[float]:
    """Seconds per batch of `batches` batches after `warmup`, drawn as the Trainer draws them (shuffled)."""
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        collate_fn=default_data_collator,
        num_workers=0,
        generator=torch.Generator().manual_seed(seed),
    )
    needed = warmup + batches
    if len(loader) < needed:
        raise ValueError(
            f"{needed} batches of {batch_size} asked for, the training split has {len(dataset)} images "
            f"({len(loader)} batches): pass fewer --batches or a smaller --batch-size."
        )
    times = []
    iterator = iter(loader)
    for index in range(needed):
        start = time.perf_counter()
        batch = next(iterator)
        elapsed = time.perf_counter() - start
        if batch["pixel_values"].shape[0] != batch_size:
            raise RuntimeError(f"a batch of {batch['pixel_values'].shape[0]} images, expected {batch_size}")
        if index >= warmup:
            times.append(elapsed)
    return times


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shared = REPO.parent / "shared" / "data"
    p.add_argument(
        "--data-dir",
        default=str(shared) if shared.is_dir() else None,
        help="Parquet data in the Hub layout (default ../shared/data when it exists).",
    )
    p.add_argument(
        "--source",
        default=None,
        choices=["local", "sklearn", "hub"],
        help="Data source (default: local with a --data-dir, else sklearn's 8x8 digits).",
    )
    p.add_argument(
        "--tasks", nargs="+", default=None, help="Tasks (default: mnist mnistm; sklearn: its one task)."
    )
    p.add_argument("--batch-size", type=int, default=128, help="Images per batch (the training batch).")
    p.add_argument("--batches", type=int, default=40, help="Timed batches per pipeline.")
    p.add_argument("--warmup", type=int, default=3, help="Untimed batches first.")
    p.add_argument("--threads", type=int, default=1, help="torch threads (a DataLoader worker has one).")
    p.add_argument("--step-rate", type=float, default=H200_STEP_RATE, help="Training images/s to feed.")
    p.add_argument("--seed", type=int, default=0, help="Shuffling and augmentation seed.")
    p.add_argument("--output-json", default=None, help="Also write the results here.")
    args = p.parse_args(argv)
    source = args.source or ("local" if args.data_dir else "sklearn")
    tasks = args.tasks or (["sklearn_digits"] if source == "sklearn" else ["mnist", "mnistm"])
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    raw, names = load_digits_tasks(
        tasks, source=source, data_dir=args.data_dir if source == "local" else None
    )
    train = raw["train"]
    processor = NeuralInterpreterImageProcessor(size={"height": 32, "width": 32}, patch_size=4)
    print(
        f"{len(train)} training images of {', '.join(names)} ({source}), batch {args.batch_size}, "
        f"{args.batches} timed batches, {torch.get_num_threads()} torch thread(s)",
        flush=True,
    )
    results = {}
    for label, augmentation in (("no RandAugment", None), ("RandAugment", build_augmentation(processor))):
        train.set_transform(run_digits.DigitsTransform(processor, None, augmentation))
        times = time_pipeline(train, args.batch_size, args.batches, args.warmup, args.seed)
        rate = args.batch_size / statistics.median(times)
        spread = (args.batch_size / max(times), args.batch_size / min(times))
        workers = math.ceil(args.step_rate / rate)
        results[label] = {"images_per_second": rate, "range": spread, "workers_for_step_rate": workers}
        print(
            f"  {label:15s} {rate:8.0f} images/s per worker [{spread[0]:.0f}-{spread[1]:.0f}]; "
            f"{workers} workers for {args.step_rate:,.0f} images/s",
            flush=True,
        )
    report = {
        "source": source,
        "tasks": names,
        "batch_size": args.batch_size,
        "batches": args.batches,
        "threads": torch.get_num_threads(),
        "step_rate": args.step_rate,
        "pipelines": results,
    }
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
