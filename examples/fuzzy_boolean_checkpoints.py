"""What changes between the saved checkpoints of a fuzzy-Boolean run: the set's size, and the parameters that moved.

Adapting all parameters of a fully pre-trained model at the paper's RAdam lr 5e-2 collapses our model to a constant
prediction (see examples/README.md, "Fuzzy Boolean"). `run_fuzzy_boolean.py --monitor_set_norm true` shows when:
the set's norm after each function iteration, and the share of it that depends on the input. This script looks
between checkpoints saved around that moment (`--save_strategy steps --save_steps 8`): for the pre-trained model
and each `checkpoint-*` in step order it reports the same two quantities on a fixed probe of uniform points, the
kernel bandwidths sigma, and the parameter tensors that moved most since the previous one (relative change of
their norm, and the norm of the change).

    python examples/run_fuzzy_boolean.py --protocol full --pretrained_model runs/fb_full_1127/full/pretrain \
        --settings all --adapt_max_steps 448 --save_strategy steps --save_steps 8 --output_dir runs/fb_steps
    python examples/fuzzy_boolean_checkpoints.py --run_dir runs/fb_steps/adapt-all \
        --reference runs/fb_full_1127/full/pretrain --output_json runs/fb_steps/checkpoints.json
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import HfArgumentParser

from ni_hf import NeuralInterpreterForSetRegression

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_fuzzy_boolean import SetNormMonitor  # noqa: E402

logger = logging.getLogger("fuzzy_boolean_checkpoints")


@dataclass
class CheckpointArguments:
    run_dir: str = field(
        metadata={
            "help": "A folder holding the Trainer's checkpoint-<step> folders (e.g. <output_dir>/adapt-all)."
        }
    )
    reference: str | None = field(
        default=None,
        metadata={
            "help": "A model to report first, as step 0 (e.g. the pre-trained model the run started from)."
        },
    )
    probe_points: int = field(
        default=256, metadata={"help": "Uniform points in [0, 1]^N of the fixed probe."}
    )
    top: int = field(
        default=6, metadata={"help": "Parameter tensors listed per checkpoint, largest change first."}
    )
    seed: int = field(default=0, metadata={"help": "Seed of the probe points."})
    num_threads: int = field(default=0, metadata={"help": "torch threads (0: torch's default)."})
    output_json: str | None = field(default=None, metadata={"help": "Write every row as JSON here."})


def checkpoints_in_step_order(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every ``checkpoint-<step>`` folder in ``run_dir``, by step."""
    found = [
        (int(m.group(1)), path)
        for path in run_dir.iterdir()
        if path.is_dir() and (m := re.fullmatch(r"checkpoint-(\d+)", path.name))
    ]
    if not found:
        raise FileNotFoundError(
            f"No checkpoint-<step> folders in {run_dir}; save them with --save_strategy steps --save_steps N."
        )
    return sorted(found)


def parameter_changes(
    previous: dict[str, torch.Tensor], current: dict[str, torch.Tensor], top: int
) -> list[dict[str, Any]]:
    """The ``top`` tensors by relative change |after - before| / |before| (from zero: infinite if it moved)."""
    rows = []
    for name, value in current.items():
        before = previous[name]
        norm_before, change = before.norm().item(), (value - before).norm().item()
        if norm_before > 0:
            relative = change / norm_before
        else:
            relative = math.inf if change > 0 else 0.0
        rows.append(
            {
                "name": name,
                "norm_before": round(norm_before, 4),
                "norm": round(value.norm().item(), 4),
                "change_norm": round(change, 4),
                "relative_change": round(relative, 4) if math.isfinite(relative) else relative,
            }
        )
    rows.sort(key=lambda row: (row["relative_change"], row["change_norm"]), reverse=True)
    return rows[:top]


def describe_model(model: NeuralInterpreterForSetRegression, probe: torch.Tensor) -> dict[str, Any]:
    """Set norm and input share after each function iteration, and the kernel bandwidths sigma."""
    sigmas = [
        round(float(p.detach().reshape(-1)[0]), 4)
        for name, p in model.named_parameters()
        if name.endswith("sigma")
    ]
    return {**SetNormMonitor(probe).measure(model), "sigma": sigmas}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    (args,) = HfArgumentParser(CheckpointArguments).parse_args_into_dataclasses(args=argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    entries: list[tuple[int, Path]] = checkpoints_in_step_order(Path(args.run_dir))
    if args.reference is not None:
        entries.insert(0, (0, Path(args.reference)))
    rows: list[dict[str, Any]] = []
    previous: dict[str, torch.Tensor] | None = None
    probe = None
    for step, path in tqdm(entries, desc="checkpoints"):
        model = NeuralInterpreterForSetRegression.from_pretrained(path).eval()
        if probe is None:
            generator = torch.Generator().manual_seed(args.seed)
            probe = torch.rand(args.probe_points, model.config.num_input_variables, generator=generator)
        # The CLS tokens are replaced between pre-training and adaptation: compare only what both have.
        current = {name: p.detach().clone() for name, p in model.named_parameters()}
        row: dict[str, Any] = {"step": step, "path": str(path), **describe_model(model, probe)}
        if previous is not None:
            shared = {k: v for k, v in current.items() if k in previous and previous[k].shape == v.shape}
            row["moved_most"] = parameter_changes(previous, shared, args.top)
        previous = current
        rows.append(row)
        logger.info(
            "step %d: set norm %s, input share %s, sigma %s%s",
            step,
            [round(n, 2) for n in row["norm"]],
            [round(s, 4) for s in row["input_share"]],
            row["sigma"],
            "".join(
                f"\n    {c['name']}: norm {c['norm_before']} -> {c['norm']}, |change| {c['change_norm']} "
                f"({c['relative_change']} of the norm before)"
                for c in row.get("moved_most", [])
            ),
        )
    if args.output_json:
        Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output_json).write_text(json.dumps(rows, indent=1))
        logger.info("Wrote %s", args.output_json)
    return rows


if __name__ == "__main__":
    main()
