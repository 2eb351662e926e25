"""A Neural Interpreter of the README quickstart's width (4 functions, 4 function iterations) on scikit-learn's digits.

A short plain-PyTorch loop with the quickstart's settings (AdamW 3e-3, betas (0.9, 0.99), batch 64, 30 epochs,
linear decay), used when no trained checkpoint is at hand: by the demo and by examples/make_readme_figure.py.
Random shifts of up to 2 pixels stand in for run_digits.py's RandAugment.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

import ni_hf
from ni_hf.data.digits import SKLEARN_TASK, load_digits_tasks

QUICKSTART_OVERRIDES = dict(
    hidden_size=64,
    code_dim=64,
    attention_head_size=32,
    type_inference_hidden_size=64,
    patch_size=8,
    num_function_iterations=4,
    num_functions=4,
    hidden_dropout_prob=0.1,
)


def _pixels(processor: ni_hf.NeuralInterpreterImageProcessor, images: list) -> torch.Tensor:
    """Images -> normalised (B, 3, 32, 32) float pixels."""
    return torch.from_numpy(np.stack(processor(images=images, do_patchify=False)["pixel_values"])).float()


def _shift(pixels: torch.Tensor, generator: torch.Generator, max_shift: int = 2) -> torch.Tensor:
    """Translate each image by up to max_shift pixels, filling with the background (the minimum value)."""
    padded = torch.nn.functional.pad(pixels, (max_shift,) * 4, value=float(pixels.min()))
    size = pixels.shape[-1]
    offsets = torch.randint(0, 2 * max_shift + 1, (len(pixels), 2), generator=generator)
    return torch.stack(
        [
            p[:, int(i) : int(i) + size, int(j) : int(j) + size]
            for p, (i, j) in zip(padded, offsets, strict=True)
        ]
    )


def train_quickstart_model(
    output_dir: str | Path,
    epochs: int = 30,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> dict[str, float]:
    """Train the quickstart Neural Interpreter on sklearn digits, save model + processor; return test accuracy and time."""
    torch.manual_seed(seed)
    data, task_names = load_digits_tasks([SKLEARN_TASK], source="sklearn", seed=seed)
    config = ni_hf.NeuralInterpreterConfig.from_paper(
        "digits", task_names=task_names, id2label={i: str(i) for i in range(10)}, **QUICKSTART_OVERRIDES
    )
    model = ni_hf.NeuralInterpreterForImageClassification(config)
    processor = ni_hf.NeuralInterpreterImageProcessor(
        size={"height": config.image_size, "width": config.image_size}, patch_size=config.patch_size
    )
    train_x = _pixels(processor, list(data["train"]["image"]))
    train_y = torch.tensor(list(data["train"]["label"]))
    test_x = _pixels(processor, list(data["test"]["image"]))
    test_y = torch.tensor(list(data["test"]["label"]))

    batch_size = 64
    steps_per_epoch = -(-len(train_x) // batch_size)
    total = epochs * steps_per_epoch
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=3e-3, betas=(0.9, 0.99), weight_decay=0.0
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / total)
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    model.train()
    for epoch in range(epochs):
        order = torch.randperm(len(train_x), generator=generator)
        for step in range(steps_per_epoch):
            idx = order[step * batch_size : (step + 1) * batch_size]
            x = _shift(train_x[idx], generator)
            loss = model(
                pixel_values=x, task_ids=torch.zeros(len(idx), dtype=torch.long), labels=train_y[idx]
            ).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        if (epoch + 1) % 5 == 0 or epoch + 1 == epochs:
            log(f"epoch {epoch + 1}/{epochs}: loss {loss.item():.3f} ({time.perf_counter() - start:.0f} s)")
    seconds = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        logits = model(pixel_values=test_x, task_ids=torch.zeros(len(test_x), dtype=torch.long)).logits
    accuracy = float((logits.argmax(-1) == test_y).float().mean())
    log(f"test accuracy {accuracy:.2%} on {len(test_x)} held-out digits after {seconds:.0f} s of training")
    model.save_pretrained(output_dir)
    processor.save_pretrained(output_dir)
    return {"test_accuracy": accuracy, "train_seconds": seconds}


if __name__ == "__main__":
    import sys

    train_quickstart_model(sys.argv[1] if len(sys.argv) > 1 else "runs/demo-quickstart")
