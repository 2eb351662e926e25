"""Context-blind checks: how often a rule that reads the candidates, not the matrix, picks the answer.

Chance is 1 in 8. Each heuristic scores the 8 candidates and picks the highest score, a tie sharing its credit
(a tie of k candidates that holds the answer counts 1/k). The heuristics are the checks of the RAVEN literature
(I-RAVEN, Hu et al. 2021; RAVEN-FAIR, Benny et al. 2021) for an answer that sits at the centre of its candidates;
``train_candidates_only`` trains a small CNN that sees the 8 candidates and nothing else. ``docs/pgm/context_blind.md``
holds the measured numbers and ``benchmarks/pgm_context_blind.py`` the command.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .rendering import render_panels
from .rules import OBJECT_ATTRIBUTES, Panel, PuzzleStructure

HeuristicFn = Callable[[PuzzleStructure, np.ndarray], np.ndarray]


def _objects(panel: Panel) -> Counter:
    """A panel's objects as a multiset."""
    return Counter((*panel.shapes, *panel.lines))


def object_medoid(structure: PuzzleStructure, panels: np.ndarray) -> np.ndarray:
    """Objects each candidate shares with the other 7 (the answer built from the others' objects wins)."""
    objects = [_objects(c) for c in structure.candidates]
    return np.array(
        [
            sum(sum((mine & other).values()) for j, other in enumerate(objects) if j != i)
            for i, mine in enumerate(objects)
        ],
        dtype=np.float64,
    )


def _candidate_pixels(panels: np.ndarray) -> np.ndarray:
    """The 8 candidates' pixels as (8, H * W) float64."""
    return panels[8:16].reshape(8, -1).astype(np.float64)


def pixel_medoid_l1(structure: PuzzleStructure, panels: np.ndarray) -> np.ndarray:
    """Minus the summed L1 distance of each candidate to the other 7."""
    x = _candidate_pixels(panels)
    return -np.abs(x[:, None] - x[None]).sum(axis=(1, 2))


def pixel_medoid_l2(structure: PuzzleStructure, panels: np.ndarray) -> np.ndarray:
    """Minus the summed L2 distance of each candidate to the other 7."""
    x = _candidate_pixels(panels)
    return -np.sqrt(((x[:, None] - x[None]) ** 2).sum(axis=2)).sum(axis=1)


def closest_to_median(structure: PuzzleStructure, panels: np.ndarray) -> np.ndarray:
    """Minus each candidate's L1 distance to the per-pixel median of the 8."""
    x = _candidate_pixels(panels)
    return -np.abs(x - np.median(x, axis=0)).sum(axis=1)


def nearest_to_last_context(structure: PuzzleStructure, panels: np.ndarray) -> np.ndarray:
    """Minus each candidate's L1 distance to the eighth context panel (the one left of the gap)."""
    x = _candidate_pixels(panels)
    return -np.abs(x - panels[7].reshape(-1).astype(np.float64)).sum(axis=1)


def farthest_from_last_context(structure: PuzzleStructure, panels: np.ndarray) -> np.ndarray:
    """Each candidate's L1 distance to the eighth context panel."""
    return -nearest_to_last_context(structure, panels)


def _value_counts(structure: PuzzleStructure) -> np.ndarray:
    """For each candidate, how many candidates share its value of each (object, attribute), summed."""
    values = [[c.attributes[k] for k in OBJECT_ATTRIBUTES] for c in structure.candidates]
    return np.array(
        [sum(v == w for other in values for v, w in zip(mine, other, strict=True)) for mine in values],
        dtype=np.float64,
    )


def most_frequent_values(structure: PuzzleStructure, panels: np.ndarray) -> np.ndarray:
    """How often each candidate's attribute values occur among the 8 (I-RAVEN's check on RAVEN)."""
    return _value_counts(structure)


def rarest_values(structure: PuzzleStructure, panels: np.ndarray) -> np.ndarray:
    """Minus ``most_frequent_values``: the odd one out."""
    return -_value_counts(structure)


HEURISTICS: dict[str, HeuristicFn] = {
    "object_medoid": object_medoid,
    "pixel_medoid_l1": pixel_medoid_l1,
    "pixel_medoid_l2": pixel_medoid_l2,
    "closest_to_median": closest_to_median,
    "nearest_to_last_context": nearest_to_last_context,
    "farthest_from_last_context": farthest_from_last_context,
    "most_frequent_values": most_frequent_values,
    "rarest_values": rarest_values,
}


def credit(scores: np.ndarray, target: int) -> float:
    """1/k when the answer is among the k best-scored candidates, else 0 (a random pick among ties)."""
    best = np.flatnonzero(scores >= scores.max() - 1e-9 * max(1.0, abs(float(scores.max()))))
    return 1.0 / len(best) if target in best else 0.0


def chance_band(num_puzzles: int, chance: float = 1 / 8, z: float = 1.96) -> tuple[float, float]:
    """The normal approximation of the 95% band of chance accuracy over ``num_puzzles`` puzzles."""
    half = z * math.sqrt(chance * (1 - chance) / num_puzzles)
    return chance - half, chance + half


def heuristic_accuracies(
    structures: Sequence[PuzzleStructure],
    panels: Sequence[np.ndarray],
    heuristics: Sequence[str] | None = None,
) -> dict[str, float]:
    """Each heuristic's accuracy on the puzzles (``panels[i]``: the 16 rendered panels of ``structures[i]``)."""
    names = list(HEURISTICS) if heuristics is None else list(heuristics)
    unknown = [n for n in names if n not in HEURISTICS]
    if unknown:
        raise ValueError(f"unknown heuristics {unknown}; expected names from {tuple(HEURISTICS)}")
    if len(structures) != len(panels) or not structures:
        raise ValueError(
            f"expected as many panel arrays as structures (>= 1), got {len(panels)} and {len(structures)}"
        )
    totals = dict.fromkeys(names, 0.0)
    for structure, image in zip(structures, panels, strict=True):
        for name in names:
            totals[name] += credit(HEURISTICS[name](structure, image), structure.target)
    return {name: total / len(structures) for name, total in totals.items()}


def render_structures(structures: Sequence[PuzzleStructure], panel_size: int) -> list[np.ndarray]:
    """The 16 panels (context then candidates) of each structure at ``panel_size``."""
    return [render_panels((*s.context, *s.candidates), panel_size) for s in structures]


def train_candidates_only(
    train_panels: np.ndarray,
    train_targets: np.ndarray,
    *,
    epochs: int = 12,
    batch_size: int = 64,
    learning_rate: float = 2e-3,
    seed: int = 0,
    channels: int = 32,
) -> Any:
    """A small CNN trained to find the answer among the 8 candidates alone ((N, 8, H, W) uint8, targets (N,)).

    Each candidate is embedded by a 4-layer CNN that sees it beside the mean of the 8 (two channels); two
    permutation-equivariant attention layers over the 8 embeddings let it compare candidates (a medoid or an
    odd one out is within its reach); a linear layer scores each. Returns the trained ``torch.nn.Module`` (in eval mode) mapping (B, 8, H, W) to (B, 8) logits.
    """
    import torch
    from torch import nn

    if train_panels.ndim != 4 or train_panels.shape[1] != 8 or len(train_panels) != len(train_targets):
        raise ValueError(
            f"train_panels must be (N, 8, H, W) with N targets, got {train_panels.shape} and {len(train_targets)}"
        )
    torch.manual_seed(seed)
    model = _candidates_only_model(channels, torch, nn)
    x = torch.from_numpy(train_panels)
    y = torch.from_numpy(np.asarray(train_targets, dtype=np.int64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=1e-4)
    steps = epochs * math.ceil(len(x) / batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=learning_rate, total_steps=steps)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=generator).split(batch_size):
            loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    return model.eval()


def _candidates_only_model(channels: int, torch: Any, nn: Any) -> Any:
    """The candidates-only scorer: (B, 8, H, W) uint8 to (B, 8) logits."""

    class CandidatesOnlyScorer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers: list[Any] = []
            width = 2
            for out in (channels // 2, channels, channels, 2 * channels):
                layers += [nn.Conv2d(width, out, 3, stride=2, padding=1), nn.BatchNorm2d(out), nn.ReLU()]
                width = out
            self.encoder = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
            layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True)
            self.compare = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.score = nn.Linear(width, 1)

        def forward(self, panels: Any) -> Any:
            batch, count, height, width = panels.shape
            pixels = 1.0 - panels.float() / 255.0
            mean = pixels.mean(dim=1, keepdim=True).expand_as(pixels)
            pairs = torch.stack((pixels, mean), dim=2).reshape(batch * count, 2, height, width)
            embedded = self.encoder(pairs).reshape(batch, count, -1)
            return self.score(self.compare(embedded)).squeeze(-1)

    return CandidatesOnlyScorer()


def candidates_only_accuracy(
    model: Any, panels: np.ndarray, targets: np.ndarray, batch_size: int = 256
) -> float:
    """The accuracy of ``train_candidates_only``'s model on (N, 8, H, W) candidates."""
    import torch

    correct = 0
    with torch.no_grad():
        for start in range(0, len(panels), batch_size):
            logits = model(torch.from_numpy(panels[start : start + batch_size]))
            correct += int((logits.argmax(dim=1).numpy() == targets[start : start + batch_size]).sum())
    return correct / len(panels)
