"""The rules of PGM-style puzzles: objects, attributes, relations, triples, regimes and their held-out sets.

What a puzzle may contain and when a row obeys a triple; the specification is ``docs/pgm/generator.md``.
"""

from __future__ import annotations

import hashlib
import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from typing import Any

import numpy as np

Triple = tuple[str, str, str]
ObjectAttribute = tuple[str, str]
Value = int | frozenset[int]

REGIMES: tuple[str, ...] = (
    "neutral",
    "interpolation",
    "extrapolation",
    "attr.rel.pairs",
    "attr.rels",
    "attrs.pairs",
    "attrs.shape.color",
    "attrs.line.type",
)
SPLITS: tuple[str, ...] = ("train", "val", "test")
# What attributes in no triple do over the nine panels and the candidates: stay fixed, or vary at random
# (Barrett et al.'s distractors).
FREE_ATTRIBUTES: tuple[str, ...] = ("constant", "random")

OBJECTS = ("shape", "line")
ATTRIBUTES = ("color", "number", "position", "size", "type")
RELATIONS = ("progression", "XOR", "OR", "AND", "consistent_union")
SET_RELATIONS = ("XOR", "OR", "AND")
META_TARGET_NAMES: tuple[str, ...] = OBJECTS + ATTRIBUTES + RELATIONS

_VALID_RELATIONS: dict[ObjectAttribute, tuple[str, ...]] = {
    ("shape", "color"): RELATIONS,
    ("shape", "number"): ("progression", "consistent_union"),
    ("shape", "position"): SET_RELATIONS,
    ("shape", "size"): RELATIONS,
    ("shape", "type"): RELATIONS,
    ("line", "color"): RELATIONS,
    ("line", "type"): (*SET_RELATIONS, "consistent_union"),
}
OBJECT_ATTRIBUTES: tuple[ObjectAttribute, ...] = tuple(_VALID_RELATIONS)
TRIPLES: tuple[Triple, ...] = tuple((o, a, r) for (o, a), rels in _VALID_RELATIONS.items() for r in rels)

SHAPE_TYPES: tuple[str, ...] = ("triangle", "square", "pentagon", "hexagon", "circle")
LINE_TYPES: tuple[str, ...] = (
    "diagonal_up",
    "diagonal_down",
    "horizontal",
    "vertical",
    "inner_circle",
    "outer_circle",
)
NUM_COLORS = 10
NUM_SIZES = 10
COLOR_LEVELS: tuple[int, ...] = tuple(round(220 - 220 * k / (NUM_COLORS - 1)) for k in range(NUM_COLORS))
SIZE_FRACTIONS: tuple[float, ...] = tuple(0.35 + 0.55 * k / (NUM_SIZES - 1) for k in range(NUM_SIZES))

_NUMBER: ObjectAttribute = ("shape", "number")
_POSITION: ObjectAttribute = ("shape", "position")
_LINE_TYPE: ObjectAttribute = ("line", "type")
_LINE_COLOR: ObjectAttribute = ("line", "color")
_SHAPE_VALUE_ATTRIBUTES = ("type", "size", "color")
_PAIR_REGIMES = ("attr.rel.pairs", "attrs.pairs")
# Largest union of a row of a set relation: shape value sets need one shape per value, line color sets one line
# per value; a few values keep panels legible.
_SET_UNION_MAX: dict[ObjectAttribute, int] = {
    ("shape", "color"): 4,
    ("shape", "size"): 4,
    ("shape", "type"): 4,
    ("shape", "position"): 8,
    ("line", "color"): 4,
    ("line", "type"): 6,
}
_SET_OPERATIONS = {"XOR": operator.xor, "OR": operator.or_, "AND": operator.and_}


def _compatible(first: Triple, second: Triple) -> bool:
    """Whether two triples can be in one puzzle."""
    if first[:2] == second[:2] or {first[:2], second[:2]} == {_NUMBER, _POSITION}:
        return False
    for one, other in ((first, second), (second, first)):
        if (
            one == ("line", "type", "consistent_union")
            and other[:2] == _LINE_COLOR
            and other[2] in SET_RELATIONS
        ):
            return False
    return True


def _stable_order(items: Sequence[Any], salt: str) -> list[Any]:
    """Items sorted by a SHA-256 of their repr: a fixed pseudo-random order, the same on every platform."""
    return sorted(items, key=lambda item: hashlib.sha256(repr((salt, item)).encode()).hexdigest())


HELD_OUT_TRIPLES: tuple[Triple, ...] = tuple(
    (o, a, _stable_order(rels, f"attr.rels:{o}.{a}")[0]) for (o, a), rels in _VALID_RELATIONS.items()
)
ATTRIBUTE_PAIRS: tuple[tuple[ObjectAttribute, ObjectAttribute], ...] = tuple(
    pair for pair in itertools.combinations(OBJECT_ATTRIBUTES, 2) if set(pair) != {_NUMBER, _POSITION}
)
HELD_OUT_ATTRIBUTE_PAIRS: tuple[tuple[ObjectAttribute, ObjectAttribute], ...] = tuple(
    sorted(_stable_order(ATTRIBUTE_PAIRS, "attrs.pairs")[:4], key=ATTRIBUTE_PAIRS.index)
)
VIABLE_TRIPLE_PAIRS: tuple[tuple[Triple, Triple], ...] = tuple(
    pair for pair in itertools.combinations(TRIPLES, 2) if _compatible(*pair)
)
HELD_OUT_TRIPLE_PAIRS: tuple[tuple[Triple, Triple], ...] = tuple(
    sorted(
        _stable_order(VIABLE_TRIPLE_PAIRS, "attr.rel.pairs")[: round(0.1 * len(VIABLE_TRIPLE_PAIRS))],
        key=VIABLE_TRIPLE_PAIRS.index,
    )
)


@dataclass(frozen=True)
class Shape:
    """One shape: grid cell (0-8, row-major) and the indices of its type, size and color."""

    position: int
    type: int
    size: int
    color: int


@dataclass(frozen=True)
class Line:
    """One line stroke: the index of its type in ``LINE_TYPES`` and of its color."""

    type: int
    color: int


@dataclass(frozen=True)
class Panel:
    """The objects of one panel, shapes sorted by position and lines by type."""

    shapes: tuple[Shape, ...] = ()
    lines: tuple[Line, ...] = ()

    @cached_property
    def attributes(self) -> dict[ObjectAttribute, Value]:
        """Each (object, attribute)'s value: the number of shapes, else the set of values its objects show."""
        return {
            ("shape", "color"): frozenset(s.color for s in self.shapes),
            _NUMBER: len(self.shapes),
            _POSITION: frozenset(s.position for s in self.shapes),
            ("shape", "size"): frozenset(s.size for s in self.shapes),
            ("shape", "type"): frozenset(s.type for s in self.shapes),
            _LINE_COLOR: frozenset(line.color for line in self.lines),
            _LINE_TYPE: frozenset(line.type for line in self.lines),
        }


@dataclass(frozen=True)
class PuzzleStructure:
    """A puzzle as symbols: its triples, the 8 context panels, the 8 candidates and the target index."""

    triples: tuple[Triple, ...]
    context: tuple[Panel, ...]
    candidates: tuple[Panel, ...]
    target: int

    @property
    def answer(self) -> Panel:
        """The correct candidate."""
        return self.candidates[self.target]

    def matrix(self, candidate: int | None = None) -> tuple[Panel, ...]:
        """The nine panels with candidate ``candidate`` (default: the answer) in the ninth place."""
        return (*self.context, self.candidates[self.target if candidate is None else candidate])


def value_domain(obj: str, attribute: str, regime: str = "neutral", split: str = "train") -> tuple[int, ...]:
    """The value indices an attribute may take in a split of a regime (number: counts 1-9)."""
    if attribute == "number":
        return tuple(range(1, 10))
    if attribute == "position":
        return tuple(range(9))
    if attribute == "type":
        return tuple(range(len(SHAPE_TYPES if obj == "shape" else LINE_TYPES)))
    count = NUM_COLORS if attribute == "color" else NUM_SIZES
    test = split == "test"
    if regime == "interpolation":
        return tuple(range(int(test), count, 2))
    if regime == "extrapolation":
        return tuple(range(count // 2, count)) if test else tuple(range(count // 2))
    return tuple(range(count))


def _as_scalar(value: Value) -> int | None:
    """The single value of a panel's attribute, or None when it has not exactly one."""
    if isinstance(value, int):
        return value
    if len(value) != 1:
        return None
    (only,) = value
    return only


def relation_holds(triple: Triple, panels: Sequence[Panel], rows: Sequence[int] = (0, 1, 2)) -> bool:
    """Whether the rows ``rows`` of the 3x3 matrix ``panels`` (row-major) obey ``triple``."""
    obj, attribute, relation = triple
    key = (obj, attribute)
    values = [[panels[3 * row + k].attributes[key] for k in range(3)] for row in rows]
    if relation in SET_RELATIONS:
        operation = _SET_OPERATIONS[relation]
        for first, second, third in values:
            if isinstance(first, int) or first == second or not third or third != operation(first, second):
                return False
        return True
    scalars = [[_as_scalar(v) for v in row] for row in values]
    if any(v is None for row in scalars for v in row):
        return False
    if relation == "progression":
        steps = {b - a for a, b, _ in scalars} | {c - b for _, b, c in scalars}
        return len(steps) == 1 and steps.pop() > 0
    if relation == "consistent_union":
        sets = {frozenset(row) for row in scalars}
        return len(sets) == 1 and all(len(set(row)) == 3 for row in scalars)
    raise ValueError(f"unknown relation {relation!r}; expected one of {RELATIONS}")


def satisfies(structure: PuzzleStructure, candidate: Panel) -> bool:
    """Whether the 3x3 matrix of ``structure``'s context with ``candidate`` ninth obeys every triple of it."""
    return _satisfies(structure.triples, structure.context, candidate)


def _satisfies(triples: Sequence[Triple], context: Sequence[Panel], candidate: Panel) -> bool:
    """Whether context plus candidate obey every triple."""
    panels = (*context, candidate)
    return all(relation_holds(t, panels) for t in triples)


def encode_triples(triples: Sequence[Triple]) -> tuple[np.ndarray, np.ndarray]:
    """The (12,) meta target and the (4, 12) relation structure of up to four triples, in DeepMind's layout."""
    if len(triples) > 4:
        raise ValueError(f"at most 4 triples can be encoded, got {len(triples)}")
    encoded = np.zeros((4, len(META_TARGET_NAMES)), dtype=np.uint8)
    for row, triple in enumerate(triples):
        if tuple(triple) not in TRIPLES:
            raise ValueError(f"{triple!r} is not one of the 29 TRIPLES")
        encoded[row, [META_TARGET_NAMES.index(name) for name in triple]] = 1
    return encoded.max(axis=0), encoded


def _structure_allowed(regime: str, test: bool, structure: tuple[Triple, ...]) -> bool:
    """Whether a structure may appear in the test split (``test``) or in train/val of ``regime``."""
    if regime == "neutral":
        return True
    if regime in ("interpolation", "extrapolation"):
        return any(a in ("color", "size") for _, a, _ in structure)
    if regime in _PAIR_REGIMES and len(structure) < 2:
        return False
    if regime == "attr.rels":
        held = any(t in HELD_OUT_TRIPLES for t in structure)
    elif regime == "attrs.pairs":
        present = {t[:2] for t in structure}
        held = any(set(pair) <= present for pair in HELD_OUT_ATTRIBUTE_PAIRS)
    elif regime == "attr.rel.pairs":
        held = any(first in structure and second in structure for first, second in HELD_OUT_TRIPLE_PAIRS)
    elif regime == "attrs.shape.color":
        held = any(t[:2] == ("shape", "color") for t in structure)
    elif regime == "attrs.line.type":
        held = any(t[:2] == _LINE_TYPE for t in structure)
    else:
        raise ValueError(f"unknown regime {regime!r}; expected one of {REGIMES}")
    return held == test


@cache
def _all_structures() -> tuple[tuple[Triple, ...], ...]:
    """Every set of 1-4 pairwise compatible triples, each in ``TRIPLES`` order."""
    structures = []
    for size in range(1, 5):
        for keys in itertools.combinations(OBJECT_ATTRIBUTES, size):
            if _NUMBER in keys and _POSITION in keys:
                continue
            for relations in itertools.product(*(_VALID_RELATIONS[k] for k in keys)):
                structure = tuple((*k, r) for k, r in zip(keys, relations, strict=True))
                if ("line", "type", "consistent_union") in structure and _LINE_COLOR in keys:
                    if not _compatible(
                        ("line", "type", "consistent_union"), structure[keys.index(_LINE_COLOR)]
                    ):
                        continue
                structures.append(structure)
    return tuple(structures)


@cache
def _allowed_structures(
    regime: str, test: bool, max_triples: int
) -> tuple[tuple[tuple[Triple, ...], ...], ...]:
    """The allowed structures of a regime's split, grouped by size (empty groups left out)."""
    groups = [
        tuple(s for s in _all_structures() if len(s) == size and _structure_allowed(regime, test, s))
        for size in range(1, max_triples + 1)
    ]
    return tuple(group for group in groups if group)


def _check_regime_split(regime: str, split: str) -> None:
    """Raise ValueError for an unknown regime or split."""
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; expected one of {REGIMES}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else a ValueError naming them."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def _check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a bool, else a ValueError."""
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` as an int in [low, high], else a ValueError naming what was expected."""
    expected = f"an integer >= {low}" if high is None else f"an integer in {low}-{high}"
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be {expected}, got {value}")
    return value


def _check_max_triples(regime: str, max_triples: Any) -> int:
    """``max_triples`` checked against 1-4 and the regime's minimum."""
    max_triples = _check_int("max_triples", max_triples, 1, 4)
    if regime in _PAIR_REGIMES and max_triples < 2:
        raise ValueError(f"regime {regime!r} has puzzles of at least 2 triples; max_triples must be 2-4")
    return max_triples
