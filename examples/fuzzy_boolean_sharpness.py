"""Adam-preconditioned sharpness along a fuzzy-Boolean adaptation: is the 'all' collapse an edge-of-stability blow-up?

Adapting all parameters of a fully pre-trained model at the paper's RAdam lr 5e-2 collapses our model (see
examples/README.md, "Fuzzy Boolean"). An Adam-type step x <- x - lr * m / P, with the preconditioner
P = sqrt(v_hat) + eps and momentum beta1, is stable on a quadratic only while the largest eigenvalue of P^-1 H
(H the Hessian of the loss) stays below the bound (2 + 2 beta1) / ((1 - beta1) lr), 38 / lr for beta1 = 0.9
(Cohen et al., "Adaptive gradient methods at the edge of stability", 2022). This script runs the 'all' adaptation
as `run_fuzzy_boolean.py` does (same data, fresh CLS tokens, trainable set, RAdam; a plain loop with its own
shuffling, so not step-for-step the Trainer's run) and, every `--measure_every` steps, estimates that eigenvalue by
power iteration on P^-1/2 H P^-1/2, with Hessian-vector products from central differences of gradients on a
fixed probe batch of training points (float32 by default). It logs the eigenvalue beside the bound, the training loss,
the kernel bandwidths sigma, and how the top direction's squared length splits over the parameter tensors (which
parameters the sharpest direction moves).

    python examples/fuzzy_boolean_sharpness.py --pretrained_model runs/redraw/pre5120/pretrain \
        --learning_rate 5e-2 --max_steps 1024 --output_json runs/sharpness/pre5120_lr5e-2.json
"""

from __future__ import annotations

import copy
import json
import logging
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import HfArgumentParser

from ni_hf import NeuralInterpreterForSetRegression
from ni_hf.fuzzy_boolean import make_fuzzy_boolean_tensors

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_fuzzy_boolean import set_adaptation_trainable  # noqa: E402

logger = logging.getLogger("fuzzy_boolean_sharpness")


@dataclass
class SharpnessArguments:
    pretrained_model: str = field(
        metadata={"help": "A pre-trained checkpoint of run_fuzzy_boolean.py (its pretrain/)."}
    )
    learning_rate: float = field(default=5e-2, metadata={"help": "RAdam learning rate (paper: 5e-2)."})
    max_steps: int = field(
        default=1024, metadata={"help": "Adaptation steps to run (the paper's protocol: 3,072)."}
    )
    measure_every: int = field(default=128, metadata={"help": "Steps between two sharpness estimates."})
    batch_size: int = field(default=128, metadata={"help": "Training batch size (paper: 128)."})
    probe_points: int = field(default=512, metadata={"help": "Training points of the fixed probe batch."})
    probe_dtype: str = field(
        default="float32",
        metadata={"help": "dtype of the Hessian-vector products: float32, or float64 (about 2.5x slower)."},
    )
    power_iterations: int = field(default=10, metadata={"help": "Power-iteration steps per estimate."})
    points_per_function: int = field(default=163840, metadata={"help": "Data size, as the full protocol."})
    dataset_seed: int = field(
        default=0, metadata={"help": "Seed of the functions and points (as --dataset_seed)."}
    )
    seed: int = field(
        default=0, metadata={"help": "Seed of the CLS tokens (seed + 1, as the script), order, probe."}
    )
    setting: str = field(
        default="all", metadata={"help": "Adaptation setting: cls_tokens, type_inference, all."}
    )
    adapt_frozen: str | None = field(
        default=None,
        metadata={
            "help": "Regular expression of parameters kept frozen (as run_fuzzy_boolean.py --adapt_frozen)."
        },
    )
    num_threads: int | None = field(
        default=None, metadata={"help": "torch.set_num_threads (default: torch's)."}
    )
    output_json: str | None = field(default=None, metadata={"help": "Where to write the measurements."})


def adam_preconditioner(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """P = sqrt(v / (1 - beta2^t)) + eps of every parameter the optimizer has moved (float64), by name.

    Parameters without optimizer state (never given a gradient, such as the unused patch embedding) are left out:
    the optimizer does not move them, so they take no part in its stability. (torch's RAdam divides by
    (sqrt(v) + eps) / sqrt(1 - beta2^t), i.e. adds eps / sqrt(1 - beta2^t) instead of eps: at most 3e-8 from step 128
    on, far below the sqrt(v_hat) of the trained weights.)
    """
    group = optimizer.param_groups[0]
    beta2, eps = group["betas"][1], group["eps"]
    out = {}
    for name, p in model.named_parameters():
        state = optimizer.state.get(p, {})
        if "exp_avg_sq" in state:
            v_hat = state["exp_avg_sq"] / (1 - beta2 ** float(state["step"]))
            out[name] = v_hat.sqrt().add_(eps).double()
    return out


def radam_rectification(step: int, beta2: float) -> float:
    """RAdam's variance rectification r_t of step t (1 in the limit; 0 while it takes plain momentum steps)."""
    rho_inf = 2 / (1 - beta2) - 1
    rho_t = rho_inf - 2 * step * beta2**step / (1 - beta2**step)
    if rho_t <= 5:
        return 0.0
    return math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))


def preconditioned_top_eigenpair(
    model: torch.nn.Module,
    precond: dict[str, torch.Tensor],
    inputs: torch.Tensor,
    labels: torch.Tensor,
    iterations: int,
    generator: torch.Generator,
    dtype: torch.dtype = torch.float32,
) -> tuple[float, dict[str, torch.Tensor]]:
    """Largest eigenvalue of P^-1/2 H P^-1/2 (= of P^-1 H) and its unit eigenvector, by power iteration.

    H is the Hessian of the mean loss ``model(inputs=..., labels=...).loss`` in the parameters named in ``precond``.
    The model is copied to ``dtype``; each Hessian-vector product is a central difference of two gradients, over a
    parameter step of length 1e-3. The eigenvector is in the preconditioned coordinates P^1/2 theta, by name.
    """
    probe = copy.deepcopy(model).to(dtype).eval()
    named = dict(probe.named_parameters())
    params = [named[name] for name in precond]
    theta = [p.detach().clone() for p in params]
    x, y = inputs.to(dtype), labels.to(dtype)

    def gradient_at(direction: list[torch.Tensor], scale: float) -> list[torch.Tensor]:
        with torch.no_grad():
            for p, t, d in zip(params, theta, direction, strict=True):
                p.copy_(t + scale * d)
        loss = probe(inputs=x, labels=y).loss
        return list(torch.autograd.grad(loss, params))

    inv_sqrt = [pc.rsqrt().to(dtype) for pc in precond.values()]
    v = [torch.randn(t.shape, generator=generator, dtype=dtype) for t in theta]
    norm = math.sqrt(sum(float((a * a).sum()) for a in v))
    v = [a / norm for a in v]
    eigenvalue = float("nan")
    for _ in range(iterations):
        d = [a * s for a, s in zip(v, inv_sqrt, strict=True)]
        d_norm = math.sqrt(sum(float((a * a).sum()) for a in d))
        eps = 1e-3 / d_norm  # a step of length 1e-3 in parameter space
        g_plus, g_minus = gradient_at(d, eps), gradient_at(d, -eps)
        mv = [(gp - gm) / (2 * eps) * s for gp, gm, s in zip(g_plus, g_minus, inv_sqrt, strict=True)]
        eigenvalue = sum(float((a * b).sum()) for a, b in zip(v, mv, strict=True))
        norm = math.sqrt(sum(float((a * a).sum()) for a in mv))
        v = [a / norm for a in mv]
    return eigenvalue, dict(zip(precond, v, strict=True))


def eigenvector_shares(vector: dict[str, torch.Tensor]) -> dict[str, float]:
    """Share of a direction's squared length in each parameter tensor, largest first (the shares sum to 1)."""
    mass = {name: float((v.double() ** 2).sum()) for name, v in vector.items()}
    total = sum(mass.values()) or 1.0
    return dict(sorted(((n, m / total) for n, m in mass.items()), key=lambda item: -item[1]))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    (args,) = HfArgumentParser(SharpnessArguments).parse_args_into_dataclasses(args=argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    data = make_fuzzy_boolean_tensors(points_per_function=args.points_per_function, seed=args.dataset_seed)
    train_x, train_y = data["adapt"]["train"]
    model = NeuralInterpreterForSetRegression.from_pretrained(args.pretrained_model)
    torch.manual_seed(args.seed + 1)
    model.neural_interpreter.reset_task_tokens([f"f{20 + i}" for i in range(train_y.shape[1])])
    counts = set_adaptation_trainable(model, args.setting, args.adapt_frozen)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.RAdam(params, lr=args.learning_rate, betas=(0.9, 0.999), eps=1e-8)
    beta1, beta2 = 0.9, 0.999
    logger.info(
        "Setting %r, %d trainable parameters, RAdam lr %g, %d steps of %d; estimate every %d steps on %d probe points",
        args.setting,
        sum(counts.values()),
        args.learning_rate,
        args.max_steps,
        args.batch_size,
        args.measure_every,
        args.probe_points,
    )

    generator = torch.Generator().manual_seed(args.seed)
    probe_x, probe_y = train_x[: args.probe_points], train_y[: args.probe_points]
    order = torch.randperm(train_x.shape[0], generator=generator)
    position, records, losses = 0, [], []
    model.train()
    progress = tqdm(range(1, args.max_steps + 1), desc="adaptation", unit="step")
    for step in progress:
        if position + args.batch_size > order.numel():
            order, position = torch.randperm(train_x.shape[0], generator=generator), 0
        index = order[position : position + args.batch_size]
        position += args.batch_size
        loss = model(inputs=train_x[index], labels=train_y[index]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if step % args.measure_every == 0:
            start = time.perf_counter()
            sharpness, direction = preconditioned_top_eigenpair(
                model,
                adam_preconditioner(optimizer, model),
                probe_x,
                probe_y,
                args.power_iterations,
                generator,
                getattr(torch, args.probe_dtype),
            )
            rect = radam_rectification(step, beta2)
            # While RAdam takes plain momentum steps (r_t = 0) the preconditioner bound does not apply.
            bound = (2 + 2 * beta1) / ((1 - beta1) * args.learning_rate * rect) if rect > 0 else math.inf
            window = losses[-args.measure_every :]
            shares = eigenvector_shares(direction)
            record = {
                "step": step,
                "epoch": step * args.batch_size / train_x.shape[0],
                "preconditioned_sharpness": sharpness,
                "stability_bound": bound,
                "ratio_to_bound": sharpness / bound,
                "train_loss_mean": sum(window) / len(window),
                "train_loss_max": max(window),
                "parameter_norm": math.sqrt(sum(float((p.detach() ** 2).sum()) for p in params)),
                "sigma": [float(script.sigma.detach()) for script in model.neural_interpreter.scripts],
                "top_direction_shares": shares,
                "seconds": time.perf_counter() - start,
            }
            records.append(record)
            logger.info(
                "step %d (epoch %.3f): lambda_max(P^-1 H) %.4g, bound 38/(lr r_t) %.4g (ratio %.3f); "
                "training loss mean %.3g, max %.3g over the last %d steps; |theta| %.2f",
                step,
                record["epoch"],
                sharpness,
                bound,
                record["ratio_to_bound"],
                record["train_loss_mean"],
                record["train_loss_max"],
                len(window),
                record["parameter_norm"],
            )
            logger.info(
                "  top direction by parameter tensor: %s",
                ", ".join(f"{n} {share:.3f}" for n, share in list(shares.items())[:6]),
            )
    result = {
        "arguments": asdict(args),
        "trainable_parameters": counts,
        "measurements": records,
        "losses": losses,
    }
    if args.output_json:
        Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output_json).write_text(json.dumps(result, indent=2))
        logger.info("Wrote %s", args.output_json)
    return result


if __name__ == "__main__":
    main()
