"""How much an adaptation row of Table 1 moves with the draw of the ten new functions, and why.

The paper reports one draw of ten new functions. `run_fuzzy_boolean.py --adapt_dataset_seed K` adapts to another
draw; this script reads the results of several such runs (one setting, e.g. `cls_tokens`), and reports

- each draw's mean R^2 and the mean and standard deviation of the draw means, with the paper's value in units of
  that standard deviation;
- what makes a function hard: R^2 against the variance of the function's targets on its test split (R^2 divides
  by it), over every function of every draw;
- a model of the draw-to-draw spread: fit R^2 = a + b log(variance), then draw `--simulated_draws` sets of ten
  random truth tables (Bernoulli(0.5) rows, as the data module does), predict each function's R^2 from its variance
  (on `--variance_points` uniform points) plus a residual resampled from the fit, and report the distribution of
  the draw means and the share of them within 0.01 of the paper.

    python examples/fuzzy_boolean_draws.py --results runs/fb_seed1/cls_tokens_5e-2 runs/fb_seed1/cls_tokens_5e-2_draw*
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from transformers import HfArgumentParser

from ni_hf.fuzzy_boolean import evaluate_truth_tables, make_fuzzy_boolean_tensors, sample_functions

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_fuzzy_boolean import RESULTS_JSON  # noqa: E402

logger = logging.getLogger("fuzzy_boolean_draws")


@dataclass
class DrawsArguments:
    results: list[str] = field(
        metadata={
            "help": "Output folders (or their fuzzy_boolean_results.json) of run_fuzzy_boolean.py runs."
        }
    )
    setting: str = field(
        default="cls_tokens", metadata={"help": "The adaptation setting to read from each run."}
    )
    simulated_draws: int = field(
        default=5000,
        metadata={
            "help": "Simulated draws of random truth tables (as many functions per draw as the runs have)."
        },
    )
    variance_points: int = field(
        default=4096,
        metadata={"help": "Uniform points on which a simulated function's variance is estimated."},
    )
    seed: int = field(default=0, metadata={"help": "Seed of the simulated draws."})
    output_json: str | None = field(default=None, metadata={"help": "Also write the summary here."})


def load_run(path: str, setting: str) -> dict[str, Any]:
    """One run's arguments and its per-function R^2 for `setting`."""
    file = Path(path)
    if file.is_dir():
        file = file / RESULTS_JSON
    if not file.is_file():
        raise FileNotFoundError(f"{path}: expected a run folder with {RESULTS_JSON}, or that file")
    results = json.loads(file.read_text())
    if setting not in results.get("adaptation", {}):
        raise ValueError(
            f"{file} has no '{setting}' adaptation; it has {sorted(results.get('adaptation', {}))}"
        )
    return {"path": str(file), "arguments": results["arguments"], "protocol": results["protocol"]} | results[
        "adaptation"
    ][setting]


def target_variance_on_test_split(run: dict[str, Any]) -> np.ndarray:
    """Variance of each new function's targets on the run's own test split (the SST of R^2, divided by n)."""
    args, protocol = run["arguments"], run["protocol"]
    data = make_fuzzy_boolean_tensors(
        num_pretrain_functions=args["num_pretrain_functions"],
        num_adapt_functions=args["num_adapt_functions"],
        points_per_function=protocol["points_per_function"],
        test_fraction=protocol["test_fraction"],
        seed=args["dataset_seed"],
        adapt_seed=args["adapt_dataset_seed"],
        form=args.get("function_form", "canonical"),
    )
    return data["adapt"]["test"][1].double().var(dim=0, unbiased=False).numpy()


def simulated_variances(num_draws: int, num_functions: int, num_points: int, seed: int) -> np.ndarray:
    """Target variances of `num_draws` x `num_functions` random fuzzy Boolean functions of 5 variables."""
    rng = np.random.default_rng(seed)
    out = np.empty((num_draws, num_functions))
    for i in range(num_draws):
        tables = np.stack([f.truth_table for f in sample_functions(num_functions, 5, seed=rng)])
        out[i] = evaluate_truth_tables(rng.random((num_points, 5)), tables).var(axis=0)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    (args,) = HfArgumentParser(DrawsArguments).parse_args_into_dataclasses(args=argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    runs = [load_run(p, args.setting) for p in args.results]
    paper = runs[0]["paper_r2_mean"]
    draws = []
    for run in runs:
        r2 = np.asarray(run["r2_per_function"])
        draws.append(
            {
                "adapt_dataset_seed": run["arguments"]["adapt_dataset_seed"],
                "r2": r2,
                "variance": target_variance_on_test_split(run),
            }
        )
        logger.info(
            "%s (adapt_dataset_seed %s): R^2 %.4f ± %.4f, min %.4f",
            run["path"],
            draws[-1]["adapt_dataset_seed"],
            r2.mean(),
            r2.std(),
            r2.min(),
        )
    means = np.array([d["r2"].mean() for d in draws])
    r2 = np.concatenate([d["r2"] for d in draws])
    log_var = np.log(np.concatenate([d["variance"] for d in draws]))
    summary: dict[str, Any] = {
        "setting": args.setting,
        "paper_r2_mean": paper,
        "draws": [
            {
                "adapt_dataset_seed": d["adapt_dataset_seed"],
                "r2_mean": float(d["r2"].mean()),
                "r2_std": float(d["r2"].std()),
            }
            for d in draws
        ],
        "mean_of_draw_means": float(means.mean()),
    }
    if len(draws) > 1:
        spread = float(means.std(ddof=1))
        summary |= {
            "std_of_draw_means": spread,
            "paper_in_draw_stds": float((paper - means.mean()) / spread),
            "draws_within_0.01_of_paper": int(np.sum(np.abs(means - paper) <= 0.01)),
        }
    design = np.stack([np.ones_like(log_var), log_var], axis=1)
    coef, *_ = np.linalg.lstsq(design, r2, rcond=None)
    residuals = r2 - design @ coef
    sim_var = simulated_variances(args.simulated_draws, len(draws[0]["r2"]), args.variance_points, args.seed)
    rng = np.random.default_rng(args.seed + 1)
    sim_means = (coef[0] + coef[1] * np.log(sim_var) + rng.choice(residuals, size=sim_var.shape)).mean(axis=1)
    summary |= {
        "functions": len(r2),
        "corr_r2_log_variance": float(np.corrcoef(r2, log_var)[0, 1]),
        "fit_intercept": float(coef[0]),
        "fit_slope_per_log_variance": float(coef[1]),
        "fit_explained_share": float(1 - residuals.var() / r2.var()),
        "fit_residual_std": float(residuals.std()),
        "simulated_draw_means_mean": float(sim_means.mean()),
        "simulated_draw_means_std": float(sim_means.std()),
        "simulated_share_within_0.01_of_paper": float(np.mean(np.abs(sim_means - paper) <= 0.01)),
    }
    print(f"\n{args.setting}: {len(draws)} draws of {len(draws[0]['r2'])} new functions (paper {paper})")
    for d in summary["draws"]:
        print(f"  adapt_dataset_seed {d['adapt_dataset_seed']}: {d['r2_mean']:.4f} ± {d['r2_std']:.4f}")
    print(
        f"draw means: {means.mean():.4f}"
        + (
            f" ± {summary['std_of_draw_means']:.4f} (std over draws); the paper is "
            f"{summary['paper_in_draw_stds']:+.2f} of those stds away; draws within 0.01 of it: "
            f"{summary['draws_within_0.01_of_paper']} of {len(draws)}"
            if len(draws) > 1
            else ""
        )
    )
    print(
        f"{len(r2)} functions: corr(R^2, log variance of the targets) = {summary['corr_r2_log_variance']:+.2f}; "
        f"fit R^2 = {coef[0]:.4f} + {coef[1]:.4f} log(variance) explains {summary['fit_explained_share']:.2f} "
        f"of the spread (residual std {residuals.std():.4f})"
    )
    print(
        f"model, {args.simulated_draws} simulated draws: mean {sim_means.mean():.4f} ± {sim_means.std():.4f}; "
        f"within 0.01 of the paper: {summary['simulated_share_within_0.01_of_paper']:.4f}"
    )
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
