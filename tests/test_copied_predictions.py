"""Trainer.predict keeps every batch's logits when the model returns them in a buffer its next call overwrites.

A model run through CUDA graphs does exactly that (its outputs are static buffers that each replay rewrites). This
CPU stand-in returns one reused buffer, so the plain Trainer silently loses the earlier batches while the mixin
keeps them.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import Trainer, TrainingArguments
from transformers.modeling_outputs import SequenceClassifierOutput

from ni_hf.training.evaluation import CopiedPredictionsMixin


class StaticOutputModel(torch.nn.Module):
    """Logits = 2 * inputs, written into the same buffer at every call (as a CUDA graph's replay does)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(2.0))
        self.register_buffer("logits", torch.zeros(2, 3), persistent=False)
        self.register_buffer("loss", torch.zeros(()), persistent=False)

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor | None = None) -> SequenceClassifierOutput:
        with torch.no_grad():
            self.logits.copy_(inputs * self.scale)
            self.loss.copy_((self.logits - labels).square().mean())
        return SequenceClassifierOutput(loss=self.loss, logits=self.logits)


class CopyingTrainer(CopiedPredictionsMixin, Trainer):
    pass


def _predict(trainer_cls: type[Trainer], tmp_path) -> tuple[np.ndarray, np.ndarray]:
    inputs = torch.arange(18, dtype=torch.float32).reshape(6, 3)
    dataset = [{"inputs": row, "labels": row} for row in inputs]
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_eval_batch_size=2,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    output = trainer_cls(model=StaticOutputModel(), args=args).predict(dataset)
    return output.predictions, (2 * inputs).numpy()


def test_copied_predictions_keep_every_batch_of_a_static_output_model(tmp_path):
    predictions, expected = _predict(CopyingTrainer, tmp_path)
    np.testing.assert_array_equal(predictions, expected)


def test_plain_trainer_loses_batches_of_a_static_output_model(tmp_path):
    """The stand-in reproduces the failure: without the mixin the earlier batches' logits are overwritten."""
    predictions, expected = _predict(Trainer, tmp_path)
    assert predictions.shape == expected.shape
    assert not np.array_equal(predictions, expected)
