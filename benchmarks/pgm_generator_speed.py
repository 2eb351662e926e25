"""How long the offline PGM-style generator (``ni_hf.data.pgm_generator``) takes for N puzzles on one core.

    python benchmarks/pgm_generator_speed.py --num-puzzles 10000 --regimes neutral extrapolation --panel-sizes 32 80

Each (regime, panel size) makes puzzles 0..N-1 of the train split in this one process, as one DataLoader worker
does (``PGMGenerator[i]``: the structure, the 16 panels rendered and the meta targets), and reports seconds in all,
puzzles/s and milliseconds per puzzle; ``--free-attributes random`` times Barrett et al.'s distractors. The report (stdout, Markdown) starts with the date, CPU, commit and command
line; ``--output-json`` keeps the numbers.
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

from tqdm.auto import tqdm

from ni_hf.data.pgm_generator import FREE_ATTRIBUTES, REGIMES, PGMGenerator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark import cpu_model, git_commit  # noqa: E402


def int_at_least(minimum: int, what: str = "an integer") -> Callable[[str], int]:
    """An argparse type: an int of at least ``minimum``, refused by name otherwise."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what} >= {minimum}, got {value}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--num-puzzles", type=int_at_least(1), default=10_000, help="puzzles per (regime, size)"
    )
    parser.add_argument("--regimes", nargs="+", choices=REGIMES, default=["neutral"], help="DeepMind's names")
    parser.add_argument(
        "--panel-sizes",
        nargs="+",
        type=int_at_least(16, "sizes"),
        default=[32, 80],
        help="panel side in pixels",
    )
    parser.add_argument(
        "--max-triples", type=int_at_least(1), default=4, help="relations per puzzle, at most"
    )
    parser.add_argument(
        "--free-attributes", choices=FREE_ATTRIBUTES, default="constant", help="attributes in no triple"
    )
    parser.add_argument("--seed", type=int, default=0, help="the generator's seed")
    parser.add_argument("--output-json", type=Path, help="also write the report here")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def time_generator(regime: str, panel_size: int, args: argparse.Namespace) -> dict[str, Any]:
    """Seconds for puzzles 0..N-1 of the train split of ``regime`` at ``panel_size``."""
    puzzles = PGMGenerator(
        regime,
        "train",
        args.num_puzzles,
        args.seed,
        panel_size,
        args.max_triples,
        free_attributes=args.free_attributes,
    )
    start = time.perf_counter()
    for i in tqdm(range(len(puzzles)), desc=f"{regime} {panel_size}x{panel_size}", disable=args.quiet):
        puzzles[i]
    seconds = time.perf_counter() - start
    return {
        "regime": regime,
        "panel_size": panel_size,
        "max_triples": args.max_triples,
        "free_attributes": args.free_attributes,
        "num_puzzles": args.num_puzzles,
        "seconds": seconds,
        "puzzles_per_second": args.num_puzzles / seconds,
        "ms_per_puzzle": 1000 * seconds / args.num_puzzles,
    }


def markdown_report(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        f"{env['date']} · {env['cpu']} · commit {env['commit']} · Python {env['python']}",
        f"`{env['command']}`",
        f"load average {', '.join(f'{x:.1f}' for x in env['load_average'])}" if env["load_average"] else "",
        "",
        "| regime | panel | puzzles | seconds | puzzles/s | ms per puzzle |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['regime']} | {row['panel_size']}x{row['panel_size']} | {row['num_puzzles']:,} | "
            f"{row['seconds']:.1f} | {row['puzzles_per_second']:.0f} | {row['ms_per_puzzle']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    environment = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "commit": git_commit(),
        "command": shlex.join(
            [sys.executable, *sys.argv] if argv is None else ["pgm_generator_speed.py", *argv]
        ),
    }
    rows = [time_generator(regime, size, args) for regime in args.regimes for size in args.panel_sizes]
    report = {"environment": environment, "rows": rows}
    print(markdown_report(report))
    if args.output_json is not None:
        args.output_json.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
