"""A training step of the modeling code at a git revision against the working tree's, in one process.

Both models are built from the same config with the same weights, so the script first checks that they give the same
gradients on a small batch, counts the forward and forward + backward FLOPs of each (FlopCounterMode, at the timed
batch size: the execution path that runs, bilinear form included), then times training steps (forward, backward,
RAdam) taking turns, and reports per model the median wall time, CPU time, system time and minor page faults of a
step (getrusage). Taking turns in one process puts machine noise and the allocator's state on both alike.

    PYTHONPATH=src python benchmarks/compare_revisions.py --revision 79af920 [--threads 1] [--steps 4]

Only `modeling_neural_interpreter.py` is taken from the revision; the configuration is the working tree's.
"""

from __future__ import annotations

import argparse
import importlib.util
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch
from torch.utils.flop_counter import FlopCounterMode

import ni_hf.modeling_neural_interpreter as working_tree
from ni_hf import NeuralInterpreterConfig

REPO = Path(__file__).resolve().parents[1]
MODELING = "src/ni_hf/modeling_neural_interpreter.py"


def modeling_at(revision: str, directory: Path) -> ModuleType:
    """`modeling_neural_interpreter.py` as it was at `revision`, imported as a module of its own."""
    source = subprocess.run(
        ["git", "show", f"{revision}:{MODELING}"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout
    source = source.replace(
        "from .configuration_neural_interpreter import", "from ni_hf.configuration_neural_interpreter import"
    )
    path = directory / "modeling_at_revision.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("modeling_at_revision", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--revision", required=True, help="Git revision whose modeling file is compared.")
    parser.add_argument("--preset", default="digits")
    parser.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE", help="Config field (int)."
    )
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--steps", type=int, default=4, help="Timed steps per model, after one warm-up step each."
    )
    args = parser.parse_args(argv)
    overrides = {key: int(value) for key, value in (item.split("=", 1) for item in args.override)}
    torch.set_num_threads(args.threads)
    config = NeuralInterpreterConfig.from_paper(args.preset, **overrides)
    b = args.batch_size

    with tempfile.TemporaryDirectory() as directory:
        modules = {
            f"revision {args.revision}": modeling_at(args.revision, Path(directory)),
            "working tree": working_tree,
        }
        torch.manual_seed(0)
        models = {
            name: module.NeuralInterpreterForImageClassification(config) for name, module in modules.items()
        }
        first, *others = models.values()
        for model in others:
            model.load_state_dict(first.state_dict())
        optimizers = {name: torch.optim.RAdam(model.parameters(), lr=1e-4) for name, model in models.items()}
        pixels = torch.randn(b, config.num_channels, config.image_size, config.image_size)
        task_ids = torch.randint(0, config.num_tasks, (b,))
        labels = torch.randint(0, config.num_labels, (b,))

        def loss(name: str, n: int) -> torch.Tensor:
            return models[name](pixel_values=pixels[:n], task_ids=task_ids[:n], labels=labels[:n]).loss

        gradients = {}
        for name, model in models.items():
            loss(name, min(b, 4)).backward()
            gradients[name] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
            model.zero_grad(set_to_none=True)
        reference = next(iter(gradients.values()))
        difference = max((g - reference).abs().max().item() for g in gradients.values())
        print(
            f"max |gradient difference| on {min(b, 4)} images: {difference:.3g} (largest gradient {reference.abs().max().item():.3g})"
        )

        results: dict[str, dict[str, float]] = {}
        for name in models:
            with FlopCounterMode(display=False) as forward, torch.no_grad():
                loss(name, b)
            with FlopCounterMode(display=False) as training:
                loss(name, b).backward()
            models[name].zero_grad(set_to_none=True)
            results[name] = {
                "max_gradient_difference": (gradients[name] - reference).abs().max().item(),
                "forward_gflop_per_image": forward.get_total_flops() / b / 1e9,
                "training_gflop_per_image": training.get_total_flops() / b / 1e9,
            }

        def step(name: str) -> None:
            loss(name, b).backward()
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)

        for name in models:
            step(name)
        samples: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in models}
        names = list(models)
        for repeat in range(args.steps):
            for name in names if repeat % 2 == 0 else names[::-1]:
                before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                step(name)
                wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
                system = after.ru_stime - before.ru_stime
                samples[name].append(
                    (
                        wall,
                        after.ru_utime - before.ru_utime + system,
                        system,
                        after.ru_minflt - before.ru_minflt,
                    )
                )
    for name, rows in samples.items():
        wall, cpu, system, faults = (statistics.median(column) for column in zip(*rows, strict=True))
        results[name].update(
            wall_s=wall, cpu_s=cpu, system_s=system, minor_page_faults=faults, images_per_s=b / wall
        )
        r = results[name]
        print(
            f"{name}: forward {r['forward_gflop_per_image']:.3f} GFLOP/img, forward + backward "
            f"{r['training_gflop_per_image']:.3f}; step {wall:.2f} s wall ({b / wall:.2f} img/s), {cpu:.2f} s CPU, "
            f"{system:.2f} s system, {faults:,.0f} minor page faults (median of {len(rows)})"
        )
    old, new = (results[name]["wall_s"] for name in names)
    print(f"working tree / revision: {old / new:.3f}x the training images/s")
    return results


if __name__ == "__main__":
    main()
