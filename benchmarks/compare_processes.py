"""Steps of the package at a git revision against the working tree's, each in fresh processes that take turns.

`compare_revisions.py` runs both models in one process, so they share one malloc heap: how many pages a step of one
model faults in depends on what the other allocated and freed (benchmarks/RESULTS.md, 2026-11-28). For a change to
what a step allocates, this script gives each model a process of its own instead: per round, one process with the
revision's `src/` (from `git archive`) and one with the working tree's, each building the digits preset with the same
seed and running one warm-up step and `--steps` timed steps (a training step: forward, backward, RAdam; or an
inference forward without grad) on the same random batch. It prints the median step time, minor page faults and
peak RSS of every process, then the ratio of the medians over all rounds.

    python benchmarks/compare_processes.py --revision 494805b [--mode inference] [--threads 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child(args: argparse.Namespace) -> None:
    """Build the model from whatever `ni_hf` PYTHONPATH gives, run the steps, print one JSON line."""
    import resource
    import time

    import torch

    from ni_hf import NeuralInterpreterConfig, NeuralInterpreterForImageClassification

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    overrides = {key: int(value) for key, value in (item.split("=", 1) for item in args.override)}
    config = NeuralInterpreterConfig.from_paper(args.preset, **overrides)
    model = NeuralInterpreterForImageClassification(config)
    optimizer = torch.optim.RAdam(model.parameters(), lr=1e-4)
    pixels = torch.randn(args.batch_size, 3, model.config.image_size, model.config.image_size)
    labels = torch.randint(0, model.config.num_labels, (args.batch_size,))
    model.train(args.mode == "training")
    times, faults = [], []
    for _ in range(args.steps + 1):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        if args.mode == "training":
            optimizer.zero_grad(set_to_none=True)
            model(pixel_values=pixels, labels=labels).loss.backward()
            optimizer.step()
        else:
            with torch.no_grad():
                model(pixel_values=pixels)
        times.append(time.perf_counter() - start)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    result = {
        "step_s": statistics.median(times[1:]),
        "faults": statistics.median(faults[1:]),
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print(json.dumps(result))


def run_child(src: Path, args: argparse.Namespace) -> dict[str, float]:
    argv = [sys.executable, __file__, "--_child", "--mode", args.mode, "--threads", str(args.threads)]
    argv += ["--steps", str(args.steps), "--batch-size", str(args.batch_size), "--preset", args.preset]
    argv += [f"--override={item}" for item in args.override]
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict[str, list[dict[str, float]]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--revision", help="Git revision whose src/ is compared with the working tree's.")
    parser.add_argument("--mode", choices=("training", "inference"), default="training")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in every process.")
    parser.add_argument(
        "--steps", type=int, default=5, help="Timed steps per process, after one warm-up step."
    )
    parser.add_argument("--rounds", type=int, default=3, help="Process pairs, the revision's first in each.")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--preset", default="digits")
    parser.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE", help="Config field (int)."
    )
    parser.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._child:
        child(args)
        return {}
    if not args.revision:
        parser.error("--revision is required")
    results: dict[str, list[dict[str, float]]] = {args.revision: [], "working tree": []}
    with tempfile.TemporaryDirectory() as directory:
        archive = Path(directory) / "src.tar"
        subprocess.run(
            ["git", "archive", "--output", str(archive), args.revision, "src"], cwd=REPO, check=True
        )
        with tarfile.open(archive) as tar:
            tar.extractall(directory, filter="data")
        sources = {args.revision: Path(directory) / "src", "working tree": REPO / "src"}
        for round_ in range(1, args.rounds + 1):
            for name, src in sources.items():
                result = run_child(src, args)
                results[name].append(result)
                print(
                    f"round {round_} {name}: {args.mode} step {result['step_s']:.3f} s (median of {args.steps}), "
                    f"{result['faults']:,.0f} minor page faults a step, peak RSS {result['max_rss_mib']:,.0f} MiB",
                    flush=True,
                )
    medians = {name: statistics.median(r["step_s"] for r in runs) for name, runs in results.items()}
    print(
        f"working tree / {args.revision}: {medians[args.revision] / medians['working tree']:.3f}x the images/s"
    )
    return results


if __name__ == "__main__":
    main()
