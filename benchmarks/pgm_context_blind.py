"""How often rules that never read the matrix find the answer of generated PGM puzzles (chance: 12.5%).

    OMP_NUM_THREADS=1 python benchmarks/pgm_context_blind.py --max-triples 4 1 --free-attributes constant random

For each regime, ``max_triples`` and ``free_attributes`` setting: the heuristics of
``ni_hf.data.pgm_generator.audit`` (object-overlap medoid, pixel medoids L1 and L2, closest to the per-pixel
median, nearest and farthest candidate to the last context panel, most frequent and rarest attribute values) on
``--num-test`` puzzles of the test split, and a small CNN trained on the 8 candidates alone of ``--num-train``
train-split puzzles, tested on as many val-split (in-distribution) and test-split puzzles as the heuristics. Each
number should sit in chance's 95% band (printed with the table; cells outside it are starred). The report (stdout,
Markdown) starts with the date, CPU, commit and command line; ``--output-json`` keeps the numbers.
``docs/pgm/context_blind.md`` holds a measured run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ni_hf.data.pgm_generator import FREE_ATTRIBUTES, REGIMES, audit, puzzle_structure, render_panels

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark import cpu_model, git_commit  # noqa: E402

PAIR_REGIMES = ("attr.rel.pairs", "attrs.pairs")  # puzzles of at least 2 triples
LABELS = {
    "object_medoid": "object medoid",
    "pixel_medoid_l1": "L1 medoid",
    "pixel_medoid_l2": "L2 medoid",
    "closest_to_median": "closest to median",
    "nearest_to_last_context": "nearest to 8th panel",
    "farthest_from_last_context": "farthest from 8th panel",
    "most_frequent_values": "most frequent values",
    "rarest_values": "rarest values",
    "cnn_val": "CNN, val",
    "cnn_test": "CNN, test",
}


def int_at_least(minimum: int, what: str = "an integer") -> Callable[[str], int]:
    """An argparse type: an int of at least ``minimum``, refused by name otherwise."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what} >= {minimum}, got {value}")
        return value

    return parse


def max_triples_value(text: str) -> int:
    """An argparse type: 1-4 triples a puzzle."""
    value = int(text)
    if not 1 <= value <= 4:
        raise argparse.ArgumentTypeError(f"expected 1-4 triples a puzzle, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--regimes", nargs="+", choices=REGIMES, default=list(REGIMES), help="DeepMind's names"
    )
    parser.add_argument(
        "--max-triples", nargs="+", type=max_triples_value, default=[4], help="settings of max_triples"
    )
    parser.add_argument(
        "--free-attributes", nargs="+", choices=FREE_ATTRIBUTES, default=["constant"], help="settings"
    )
    parser.add_argument(
        "--num-test", type=int_at_least(1), default=1000, help="puzzles a heuristic is scored on"
    )
    parser.add_argument(
        "--num-train", type=int_at_least(0), default=5000, help="CNN training puzzles (0: no CNN)"
    )
    parser.add_argument(
        "--panel-size", type=int_at_least(16, "sizes"), default=32, help="panel side in pixels"
    )
    parser.add_argument("--epochs", type=int_at_least(1), default=10, help="CNN training epochs")
    parser.add_argument("--channels", type=int_at_least(2), default=16, help="CNN width")
    parser.add_argument("--seed", type=int_at_least(0), default=0, help="the generator's seed")
    parser.add_argument("--output-json", type=Path, help="also write the report here")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def _puzzles(
    regime: str, split: str, count: int, max_triples: int, free: str, args: argparse.Namespace
) -> tuple[list[Any], np.ndarray]:
    """``count`` structures of a split and their 16 rendered panels, (count, 16, H, W)."""
    structures = [
        puzzle_structure(regime, split, i, args.seed, max_triples, free_attributes=free)
        for i in tqdm(range(count), desc=f"{regime} {split}", disable=args.quiet, leave=False)
    ]
    panels = np.stack([render_panels((*s.context, *s.candidates), args.panel_size) for s in structures])
    return structures, panels


def measure(regime: str, max_triples: int, free: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every heuristic's accuracy on the test split and the candidates-only CNN's on val and test."""
    start = time.perf_counter()
    test_structures, test_panels = _puzzles(regime, "test", args.num_test, max_triples, free, args)
    row: dict[str, Any] = {
        "regime": regime,
        "max_triples": max_triples,
        "free_attributes": free,
        "num_test": args.num_test,
        **audit.heuristic_accuracies(test_structures, list(test_panels)),
    }
    if args.num_train:
        import torch

        torch.manual_seed(args.seed)
        train_structures, train_panels = _puzzles(regime, "train", args.num_train, max_triples, free, args)
        val_structures, val_panels = _puzzles(regime, "val", args.num_test, max_triples, free, args)
        model = audit.train_candidates_only(
            train_panels[:, 8:],
            np.array([s.target for s in train_structures]),
            epochs=args.epochs,
            channels=args.channels,
            seed=args.seed,
        )
        for name, structures, panels in (
            ("val", val_structures, val_panels),
            ("test", test_structures, test_panels),
        ):
            targets = np.array([s.target for s in structures])
            row[f"cnn_{name}"] = audit.candidates_only_accuracy(model, panels[:, 8:], targets)
        row["num_train"] = args.num_train
    row["seconds"] = time.perf_counter() - start
    return row


def markdown_report(report: dict[str, Any]) -> str:
    env = report["environment"]
    low, high = report["chance_band"]
    names = [
        *audit.HEURISTICS,
        *(("cnn_val", "cnn_test") if report["rows"] and "cnn_val" in report["rows"][0] else ()),
    ]
    lines = [
        f"{env['date']} · {env['cpu']} · commit {env['commit']} · Python {env['python']}",
        f"`{env['command']}`",
        "",
        f"Chance 12.5%; its 95% band on {report['rows'][0]['num_test']:,} puzzles: {100 * low:.1f}-{100 * high:.1f}% "
        "(* outside).",
        "",
        "| regime | triples | free attributes | " + " | ".join(LABELS[n] for n in names) + " |",
        "|---|---|---|" + "---:|" * len(names),
    ]
    for row in report["rows"]:
        cells = [f"{100 * row[n]:.1f}{'*' if not low <= row[n] <= high else ''}" for n in names]
        triples = f"1-{row['max_triples']}" if row["max_triples"] > 1 else "1"
        lines.append(
            f"| {row['regime']} | {triples} | {row['free_attributes']} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = parser.parse_args(argv)
    environment = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "commit": git_commit(),
        "command": shlex.join(
            [sys.executable, *sys.argv] if argv is None else ["pgm_context_blind.py", *argv]
        ),
    }
    settings = [
        (regime, max_triples, free)
        for free in args.free_attributes
        for max_triples in args.max_triples
        for regime in args.regimes
        if not (regime in PAIR_REGIMES and max_triples < 2)
    ]
    if not settings:
        parser.error(
            f"--regimes {' '.join(args.regimes)} have puzzles of at least 2 triples: give --max-triples 2-4"
        )
    rows = []
    for regime, max_triples, free in settings:
        rows.append(measure(regime, max_triples, free, args))
        if not args.quiet:
            print(f"{regime} max_triples={max_triples} {free}: {rows[-1]['seconds']:.0f} s", file=sys.stderr)
    report = {"environment": environment, "chance_band": audit.chance_band(args.num_test), "rows": rows}
    print(markdown_report(report))
    if args.output_json is not None:
        args.output_json.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
