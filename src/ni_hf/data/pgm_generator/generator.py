"""Puzzles by index: the symbolic puzzle, its rendering in DeepMind's schema, and the map-style dataset."""

from __future__ import annotations

import operator
import random
from typing import Any

import numpy as np

from .candidates import _make_candidates
from .rendering import _render_candidates, render_panels
from .rules import (
    FREE_ATTRIBUTES,
    OBJECT_ATTRIBUTES,
    REGIMES,
    SPLITS,
    ObjectAttribute,
    PuzzleStructure,
    Triple,
    _allowed_structures,
    _check_bool,
    _check_choice,
    _check_int,
    _check_max_triples,
    _check_regime_split,
    encode_triples,
    value_domain,
)
from .sampling import _Frame, _realize, _sample_specs, _shows_spurious_relation

_MAX_MATRIX_ATTEMPTS = 200


def puzzle_structure(
    regime: str = "neutral",
    split: str = "train",
    index: int = 0,
    seed: int = 0,
    max_triples: int = 4,
    *,
    free_attributes: str = "constant",
) -> PuzzleStructure:
    """The symbolic puzzle ``index`` of ``(regime, split, seed)``: what ``generate_puzzle`` renders.

    ``free_attributes``: ``"constant"`` holds the attributes in no triple fixed over the nine panels and the
    candidates, ``"random"`` draws them at random for every object (Barrett et al.'s distractors); the
    puzzle's triples do not depend on it.
    """
    _check_regime_split(regime, split)
    max_triples = _check_max_triples(regime, max_triples)
    free_attributes = _check_choice("free_attributes", free_attributes, FREE_ATTRIBUTES)
    index = _check_int("index", index, 0)
    seed = _check_int("seed", seed, 0)
    state = np.random.SeedSequence([seed, REGIMES.index(regime), SPLITS.index(split), index]).generate_state(
        2
    )
    rng = random.Random(int(state[0]) << 32 | int(state[1]))
    groups = _allowed_structures(regime, split == "test", max_triples)
    group = groups[rng.randrange(len(groups))]
    triples = group[rng.randrange(len(group))]
    domains = {(o, a): value_domain(o, a, regime, split) for o, a in OBJECT_ATTRIBUTES}
    structure = _generate(triples, domains, rng, free_attributes)
    if structure is None:
        raise RuntimeError(
            f"could not generate a puzzle for {triples} ({regime}, {split}, index {index}, seed {seed})"
        )
    return structure


def _generate(
    triples: tuple[Triple, ...],
    domains: dict[ObjectAttribute, tuple[int, ...]],
    rng: random.Random,
    free_attributes: str = "constant",
) -> PuzzleStructure | None:
    """A puzzle of the structure ``triples`` with values in ``domains`` (None when attempts run out)."""
    frame = _Frame(triples, domains, free_attributes)
    for _ in range(_MAX_MATRIX_ATTEMPTS):
        specs = _sample_specs(frame, rng)
        if specs is None:
            continue
        realized = [_realize(frame, spec, rng) for spec in specs]
        matrix = [p for p in realized if p is not None]
        if len(matrix) < 9:
            continue
        if _shows_spurious_relation(frame, matrix):
            continue
        candidates = _make_candidates(frame, matrix[:8], matrix[8], specs[8], rng)
        if candidates is None:
            continue
        answer, wrong = candidates[0], candidates[1:]
        rng.shuffle(wrong)
        target = rng.randrange(8)
        wrong.insert(target, answer)
        return PuzzleStructure(triples, tuple(matrix[:8]), tuple(wrong), target)
    return None


def generate_puzzle(
    regime: str = "neutral",
    split: str = "train",
    index: int = 0,
    seed: int = 0,
    panel_size: int = 80,
    max_triples: int = 4,
    *,
    with_relations: bool = True,
    free_attributes: str = "constant",
) -> dict[str, Any]:
    """Puzzle ``index`` of ``(regime, split, seed)`` as a dict in DeepMind's PGM schema.

    Keys: ``panels`` (16, panel_size, panel_size) uint8, ``target`` (int, 0-7), ``meta_target`` (12,) uint8,
    ``relation_structure_encoded`` (4, 12) uint8 and, with ``with_relations``, the generator-only ``relations``
    (the puzzle's (object, attribute, relation) triples; absent from DeepMind's files). ``free_attributes``: see
    ``puzzle_structure``.
    """
    _check_regime_split(regime, split)
    panel_size = _check_int("panel_size", panel_size, 16)
    with_relations = _check_bool("with_relations", with_relations)
    structure = puzzle_structure(regime, split, index, seed, max_triples, free_attributes=free_attributes)
    # The candidates were drawn at LEGIBLE_PANEL_SIZE to check them: drawn apart, they come from that cache.
    panels = np.concatenate(
        (render_panels(structure.context, panel_size), _render_candidates(structure.candidates, panel_size))
    )
    meta_target, encoded = encode_triples(structure.triples)
    puzzle: dict[str, Any] = {
        "panels": panels,
        "target": structure.target,
        "meta_target": meta_target,
        "relation_structure_encoded": encoded,
    }
    if with_relations:
        puzzle["relations"] = list(structure.triples)
    return puzzle


class PGMGenerator:
    """``num_puzzles`` generated puzzles of a regime's split, indexable like a map-style dataset.

    Item ``i`` is ``generate_puzzle(regime, split, i, seed, panel_size, max_triples, free_attributes=...)``;
    ``relations`` is left out by default (``with_relations=False``) because torch's default collate cannot stack
    lists of varying length.
    """

    def __init__(
        self,
        regime: str = "neutral",
        split: str = "train",
        num_puzzles: int = 10_000,
        seed: int = 0,
        panel_size: int = 80,
        max_triples: int = 4,
        *,
        with_relations: bool = False,
        free_attributes: str = "constant",
    ) -> None:
        _check_regime_split(regime, split)
        self.regime = regime
        self.split = split
        self.num_puzzles = _check_int("num_puzzles", num_puzzles, 1)
        self.seed = _check_int("seed", seed, 0)
        self.panel_size = _check_int("panel_size", panel_size, 16)
        self.max_triples = _check_max_triples(regime, max_triples)
        self.with_relations = _check_bool("with_relations", with_relations)
        self.free_attributes = _check_choice("free_attributes", free_attributes, FREE_ATTRIBUTES)

    def __len__(self) -> int:
        return self.num_puzzles

    def __getitem__(self, index: int) -> dict[str, Any]:
        i = operator.index(index)
        if not 0 <= i < self.num_puzzles:
            raise IndexError(f"index {i} out of range: expected 0 <= index < {self.num_puzzles}")
        return generate_puzzle(
            self.regime,
            self.split,
            i,
            self.seed,
            self.panel_size,
            self.max_triples,
            with_relations=self.with_relations,
            free_attributes=self.free_attributes,
        )

    def __repr__(self) -> str:
        return (
            f"PGMGenerator(regime={self.regime!r}, split={self.split!r}, num_puzzles={self.num_puzzles}, "
            f"seed={self.seed}, panel_size={self.panel_size}, max_triples={self.max_triples}, "
            f"free_attributes={self.free_attributes!r})"
        )
