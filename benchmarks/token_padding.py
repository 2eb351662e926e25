"""Would padding the set to a rounder size speed up the attention's batched matmuls on CPU?

The digits preset attends over N = 67 tokens (64 patches + 3 CLS tokens). GEMM kernels often prefer sizes that are
multiples of 4 or 8, so padding the keys with zero tokens (masked out of the softmax) could pay. This times the six
batched matmuls of one LOC's attention in the bilinear form (`modeling_neural_interpreter._BilinearAttention`:
the logits (h A) h^T, the two products of its backward, P @ [C v, C] and the two of its backward) at batch 128
for a key count n of 67 and padded alternatives, float32, median of `--repeats` runs after two warm-ups.

    PYTHONPATH=src python benchmarks/token_padding.py --threads 1 2
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def time_products(n: int, args: argparse.Namespace) -> dict[str, float]:
    """Milliseconds per product with n keys (queries stay at args.tokens)."""
    b, q, u, h, d, dv = args.batch_size, args.tokens, args.functions, args.heads, args.hidden, args.value_head
    mixed = torch.randn(b, q * u * h, d)  # h A, rows (i, u, h)
    keys = torch.randn(b, n, d)
    logits = torch.empty(b, q * u * h, n)
    grad_logits = torch.randn(b, q * u * h, n)
    probs = torch.randn(b * u * h, q, n)
    columns = torch.randn(b * u * h, n, dv + 1)
    grad_out = torch.randn(b * u * h, q, dv + 1)
    products = {
        "logits": lambda: torch.bmm(mixed, keys.transpose(1, 2), out=logits),
        "dL/d(hA)": lambda: torch.bmm(grad_logits, keys),
        "dL/dh": lambda: torch.bmm(grad_logits.transpose(1, 2), mixed),
        "P @ V": lambda: torch.bmm(probs, columns),
        "dL/dP": lambda: torch.bmm(grad_out, columns.transpose(1, 2)),
        "dL/dV": lambda: torch.bmm(probs.transpose(1, 2), grad_out),
    }
    return {name: median_ms(fn, args.repeats) for name, fn in products.items()}


def main(argv: list[str] | None = None) -> dict[int, dict[int, dict[str, float]]]:
    """Print one Markdown table per thread count; return {threads: {n: {product: ms}}}."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[1], help="torch thread counts to time in turn"
    )
    parser.add_argument(
        "--keys", type=int, nargs="+", default=[67, 68, 72, 80], help="key counts n to compare"
    )
    parser.add_argument("--tokens", type=int, default=67, help="queries N (the digits preset: 64 + 3)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--functions", type=int, default=5)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=192)
    parser.add_argument("--value-head", type=int, default=48, help="dv = hidden / heads")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    if any(n < args.tokens for n in args.keys):
        parser.error(f"--keys must be >= --tokens ({args.tokens}): padding adds keys, it never drops any")
    results = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        print(
            f"## {threads} thread(s), batch {args.batch_size}, N = {args.tokens} queries, float32 (ms, median)"
        )
        rows = {n: time_products(n, args) for n in args.keys}
        names = list(next(iter(rows.values())))
        print("| keys n | " + " | ".join(names) + " | total |")
        print("|---" * (len(names) + 2) + "|")
        for n, times in rows.items():
            cells = " | ".join(f"{times[name]:.1f}" for name in names)
            print(f"| {n} | {cells} | {sum(times.values()):.1f} |")
        results[threads] = rows
    return results


if __name__ == "__main__":
    main()
