#!/usr/bin/env python
"""Inference of a preset in eager PyTorch against its ONNX export run by ONNX Runtime (see benchmarks/README.md).

The model is exported with ``torch.onnx.export(..., dynamo=True)`` (a dynamic batch dimension), loaded into an
``onnxruntime.InferenceSession`` with as many intra-op threads as torch uses, and both run the same random patches
in turns: warm-up rounds, then repeats; median and min/max images/s per runner, the speed-up over eager PyTorch,
and the largest logit difference between them. Needs ``pip install -e ".[onnx]"`` (onnx, onnxscript, onnxruntime).

Run from the repository root, e.g. ``PYTHONPATH=src python benchmarks/export_inference.py --preset digits``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.export import Dim

from ni_hf import NeuralInterpreterConfig, NeuralInterpreterForImageClassification

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark import environment, parse_overrides  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Eager PyTorch vs ONNX Runtime inference of a Neural Interpreter preset (images/s).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--preset", default="digits", help="NeuralInterpreterConfig.from_paper preset (image models)."
    )
    p.add_argument(
        "--override",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Config override.",
    )
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--repeats", type=int, default=7, help="Timed repeats (the runners take turns in each).")
    p.add_argument("--warmup", type=int, default=2, help="Untimed rounds before the repeats.")
    p.add_argument(
        "--threads", type=int, default=None, help="Threads of torch and ONNX Runtime (default: torch's)."
    )
    p.add_argument("--seed", type=int, default=0, help="Seed of the weights and of the random patches.")
    p.add_argument("--output-json", default=None, help="Write the results to this JSON file.")
    p.add_argument("--append-results", default=None, help="Append the Markdown table to this file.")
    return p


def export_onnx(model: torch.nn.Module, example: torch.Tensor, path: Path) -> float:
    """Export with a dynamic batch dimension; returns the seconds it took."""
    start = time.perf_counter()
    torch.onnx.export(
        model,
        (),
        str(path),
        kwargs={"pixel_values": example},
        input_names=["pixel_values"],
        output_names=["logits"],
        dynamic_shapes={"pixel_values": {0: Dim("batch", min=1, max=65536)}},
        dynamo=True,
        verbose=False,
    )
    return time.perf_counter() - start


def time_runners(
    runners: dict[str, Callable[[], Any]], batch_size: int, warmup: int, repeats: int
) -> dict[str, dict[str, float]]:
    """Images/s of each runner over `repeats` rounds in which the runners take turns."""
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    for round_ in range(warmup + repeats):
        for name, run in runners.items():
            start = time.perf_counter()
            run()
            if round_ >= warmup:
                seconds[name].append(time.perf_counter() - start)
    return {
        name: {
            "images_per_s_median": batch_size / statistics.median(s),
            "images_per_s_min": batch_size / max(s),
            "images_per_s_max": batch_size / min(s),
        }
        for name, s in seconds.items()
    }


def markdown(results: dict[str, Any]) -> str:
    env, runs = results["environment"], results["runners"]
    eager = runs["pytorch-eager"]["images_per_s_median"]
    lines = [
        f"### Inference, eager PyTorch vs ONNX Runtime: {results['preset']} preset, batch {results['batch_size']}, "
        f"float32, CPU ({env['date']})",
        "",
        f"`{env['command']}`; {env['cpu']} ({env['cpu_usable_cores']} usable cores), {results['threads']} threads, "
        f"torch {env['torch']}, commit {env['commit']}"
        + f", onnxruntime {results['onnxruntime']}, {results['repeats']} repeats after "
        f"{results['warmup']} warm-up rounds; export took {results['export_seconds']:.1f} s, the ONNX files "
        f"(graph and weights) are {results['onnx_megabytes']:.2f} MB; largest |logit difference| {results['max_abs_logit_difference']:.2e}.",
        "",
        "| runner | images/s (median) | min - max | vs eager PyTorch |",
        "|---|---|---|---|",
    ]
    for name, r in runs.items():
        lines.append(
            f"| {name} | {r['images_per_s_median']:.1f} | {r['images_per_s_min']:.1f} - {r['images_per_s_max']:.1f} "
            f"| {r['images_per_s_median'] / eager:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Export the preset, check both runners give the same logits, time them in turns, report; return the results."""
    args = build_parser().parse_args(argv)
    if args.batch_size < 1 or args.repeats < 1 or args.warmup < 0:
        raise SystemExit("--batch-size and --repeats must be at least 1, --warmup at least 0.")
    ort = _import_onnxruntime()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    args.device = torch.device("cpu")  # for benchmark.environment

    torch.manual_seed(args.seed)
    config = NeuralInterpreterConfig.from_paper(args.preset, **parse_overrides(args.overrides))
    model = NeuralInterpreterForImageClassification(config).eval()
    pixels = torch.randn(args.batch_size, config.num_patches, config.patch_dim)
    print(f"Exporting the {args.preset} preset to ONNX ...", file=sys.stderr)
    session, export_seconds, onnx_megabytes = onnx_session(ort, model, pixels, threads)
    feed = {"pixel_values": pixels.numpy()}

    def run_eager() -> torch.Tensor:
        with torch.inference_mode():
            return model(pixel_values=pixels).logits

    def run_onnx() -> Any:
        return session.run(["logits"], feed)[0]

    difference = (torch.from_numpy(run_onnx()) - run_eager()).abs().max().item()
    print(f"Timing {args.repeats} repeats after {args.warmup} warm-up rounds ...", file=sys.stderr)
    runners = time_runners(
        {"pytorch-eager": run_eager, "onnxruntime": run_onnx}, args.batch_size, args.warmup, args.repeats
    )
    results = {
        "environment": environment(args),
        "preset": args.preset,
        "overrides": args.overrides,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "threads": threads,
        "onnxruntime": ort.__version__,
        "export_seconds": export_seconds,
        "onnx_megabytes": onnx_megabytes,
        "max_abs_logit_difference": difference,
        "runners": runners,
    }
    write_results(results, args.output_json, args.append_results)
    return results


def _import_onnxruntime() -> Any:
    """``onnxruntime``, after checking that the exporter's ``onnxscript`` is there too; else exit naming the extra."""
    try:
        import onnxruntime as ort
        import onnxscript  # noqa: F401  (torch.onnx.export(dynamo=True) needs it)
    except ImportError as err:
        raise SystemExit(f'{err}: install the ONNX extra, pip install -e ".[onnx]".') from err
    return ort


def onnx_session(
    ort: Any, model: torch.nn.Module, pixels: torch.Tensor, threads: int
) -> tuple[Any, float, float]:
    """Export ``model`` to a temporary folder and load it into an ONNX Runtime session of ``threads`` intra-op
    threads; returns the session, the export's seconds and the ONNX files' megabytes."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        export_seconds = export_onnx(model, pixels, path)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        # ONNX Runtime's threads spin after each run by default, which would slow the PyTorch run that follows.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        onnx_megabytes = sum(f.stat().st_size for f in Path(tmp).iterdir()) / 1e6  # + external data
    return session, export_seconds, onnx_megabytes


def write_results(results: dict[str, Any], output_json: str | None, append_results: str | None) -> None:
    """Print the Markdown table; write the results as JSON and append the table to a file where asked."""
    table = markdown(results)
    print(table)
    if output_json:
        Path(output_json).write_text(json.dumps(results, indent=2) + "\n")
    if append_results:
        with open(append_results, "a") as f:
            f.write("\n" + table)


if __name__ == "__main__":
    main()
