"""An offline generator of PGM-style puzzles (Procedurally Generated Matrices, Barrett et al. 2018).

Each puzzle is a 3x3 matrix of panels whose rows obey one to four ``(object, attribute, relation)`` triples; the
ninth panel is missing and must be picked among 8 candidates. Puzzles come in the schema of DeepMind's release
(``"panels"`` (16, H, W) uint8: the 8 context panels row-major then the 8 candidates; ``"target"``;
``"meta_target"``; ``"relation_structure_encoded"``), rendered at any panel size from 16 pixels up, with no
download. ``generate_puzzle`` adds the generator-only ``"relations"`` (the puzzle's triples) unless
``with_relations=False``, ``PGMGenerator`` (a map-style dataset without torch) only with ``with_relations=True``.
The symbolic layer: ``puzzle_structure`` gives the puzzle as ``Panel`` objects (``Shape`` and ``Line`` values,
``Panel.attributes`` the value of each (object, attribute)), ``satisfies`` checks a candidate in the ninth place
against every triple of the puzzle and ``relation_holds`` one triple on chosen rows.

Objects, attributes and their values (indices into these discrete sets are what relations act on):

* ``shape``: ``type`` (5: triangle, square, pentagon, hexagon, circle, ordered by number of sides), ``size``
  (10 radii, ``SIZE_FRACTIONS`` of half a grid cell), ``color`` (10 grey levels, ``COLOR_LEVELS``, from light
  grey 220 to black 0; shapes have a black outline), ``number`` (1-9 shapes) and ``position`` (the set of
  occupied cells of a 3x3 grid covering the panel);
* ``line``: ``type`` (6 strokes that overlay: the two diagonals, whose union is a diagonal cross, a horizontal
  and a vertical line through the centre, an inner and an outer concentric circle) and ``color`` (the same 10
  grey levels).

Relations, applied to each row ``(v1, v2, v3)`` of the matrix:

* ``progression``: ``v2 - v1 == v3 - v2 == d > 0``, with the same step ``d`` in every row (values increase;
  generated steps are 1 or 2 allowed values, and the two complete rows start at different values);
* ``consistent_union``: each row holds three distinct values, the same set in every row (generated: the two
  complete rows in different orders);
* ``XOR`` / ``OR`` / ``AND``: set-valued attributes, ``v3 = v1 op v2`` with ``v1 != v2`` and ``v3`` non-empty.
  The value of an attribute of a panel is the set of values its objects show (the occupied cells for
  ``position``, the line types drawn for line ``type``, the grey levels of the shapes for shape ``color``...);
  generated rows also have ``v1 & v2``, ``v1 - v2`` and ``v2 - v1`` non-empty, so that the three operations give
  three different third panels. ``progression`` and ``consistent_union`` need one value per panel (all shapes
  of a panel share it; ``number`` is the count of shapes).

``TRIPLES`` holds the 29 triples of PGM: shape color/size/type with all five relations, shape number with
progression and consistent union, shape position with XOR/OR/AND, line color with all five relations and line
type with XOR/OR/AND/consistent union. A puzzle takes at most one triple per (object, attribute), never both shape
number and shape position (positions fix the number), and never line type consistent union (one line per panel)
with a set relation on line color (which needs several lines). The number of triples is uniform in
``[1 or 2, max_triples]`` and the structure uniform among the allowed ones of that size.

Attributes in no triple: an object type in no triple is not drawn; the other attributes of a drawn object are
held constant over the nine panels ("distractors off"), except that shape positions vary at random when shape
number is in a relation and the number follows the positions when shape position is. Every generated matrix is
checked to show no spurious relation: no triple outside the puzzle holds on the two complete rows.

Candidates: the answer and 7 incorrect candidates made by changing the answer's values of attributes in triples
of the puzzle. They are the 8 crossings of 2 values of three attributes, 4 and 2 values of two, or 8 values of
one (a set attribute gets its values by toggling elements), as in I-RAVEN's attribute bisection tree (Hu et al.
2021): every value shows in equally many candidates, so the answer is not the candidate the others are built
around, and each incorrect candidate changes a value that a relation fixes. Where the puzzle's attributes have too
few values for that (one triple on the 5 shape types, the 6 line types, or the 5 colors or sizes a split of
interpolation/extrapolation allows), candidates grow as a tree as in RAVEN-FAIR (Benny et al. 2021), each changing
one value of a random earlier one, also changing a held-constant attribute when the values run out; each is kept
if it is new and violates a relation. The target position is uniform in 0-7.

Generalisation regimes (``REGIMES``, DeepMind's names and order) constrain what each split may contain; ``val`` is
drawn from the train distribution (in-distribution), ``test`` from the held-out one:

* ``neutral``: no constraint;
* ``interpolation``: every puzzle has a color or size triple; all color and size values (of every object, in
  relations or held constant, candidates included) are the even-indexed ones in train/val, the odd-indexed ones
  in test;
* ``extrapolation``: the same with the lower half of the values (0-4) in train/val, the upper half (5-9) in test;
* ``attr.rel.pairs``: puzzles of >= 2 triples; ``HELD_OUT_TRIPLE_PAIRS`` (10% of the ``VIABLE_TRIPLE_PAIRS``,
  pairs of triples that can share a puzzle) never occur together in train/val, and every test puzzle holds one;
* ``attr.rels``: ``HELD_OUT_TRIPLES`` (7 of the 29, one per (object, attribute)) never occur in train/val, and
  every test puzzle holds at least one;
* ``attrs.pairs``: puzzles of >= 2 triples; of the 20 ``ATTRIBUTE_PAIRS`` ((object, attribute) pairs that can
  co-occur), the 4 ``HELD_OUT_ATTRIBUTE_PAIRS`` never co-occur in train/val, and every test puzzle has one;
* ``attrs.shape.color`` / ``attrs.line.type``: no shape-color (line-type) triple in train/val, at least one in
  every test puzzle.

The held-out sets are fixed (chosen by a SHA-256 ordering of the names), not drawn from ``seed``.

Determinism: puzzle ``index`` of ``(regime, split, seed)`` is drawn from ``numpy.random.SeedSequence([seed,
regime_index, split_index, index])`` (``regime_index`` its place in ``REGIMES``), whose state seeds a Python
``random.Random`` for the many small draws; it does not depend on the order puzzles are asked for, nor on
``panel_size``: the same puzzle renders at every size (identical arrays need the same Python and Pillow). Rendering draws with PIL at ``panel_size * k`` pixels (k
>= 2, at least 160 pixels, the size of DeepMind's release) and box-filters down by ``k``, so that small panels
keep size and grey differences.

Checked against DeepMind's repository (google-deepmind/abstract-reasoning-matrices, README): the 12-bit layout
``META_TARGET_NAMES`` (shape, line, color, number, position, size, type, progression, XOR, OR, AND,
consistent_union), ``meta_target`` as the OR of the rows of the (4, 12) structure array (called ``meta_matrix``
there and stored as ``relation_structure_encoded`` in the .npz files, as TensorFlow Datasets' loader reads them),
the regime names and their definitions, 29 triples, 20 attribute pairs, 7 held-out triples one per attribute.

Differences from DeepMind's generator (its repository holds only the description of the data, no generator
code): our own renderer and value sets (6 line types, 10 sizes spanning 35-90% of half a cell); no distractor
attributes (held-constant ones instead); our definitions of the set relations on multi-object panels and of
consistent union (three distinct values); our candidate construction and distribution of the number of triples;
347 viable triple pairs (pairs that can share a puzzle) against Barrett's 400 (presumably ``C(29, 2) - 6``, which
also counts pairs on the same attribute), so 35 pairs are held out instead of 40; the ``"relations"`` key is
generator-only (DeepMind's files hold ``relation_structure`` instead).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import operator
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Any, cast

import numpy as np
from PIL import Image, ImageDraw

__all__ = [
    "ATTRIBUTE_PAIRS",
    "COLOR_LEVELS",
    "HELD_OUT_ATTRIBUTE_PAIRS",
    "HELD_OUT_TRIPLES",
    "HELD_OUT_TRIPLE_PAIRS",
    "LINE_TYPES",
    "META_TARGET_NAMES",
    "NUM_COLORS",
    "NUM_SIZES",
    "OBJECT_ATTRIBUTES",
    "PGMGenerator",
    "Line",
    "Panel",
    "PuzzleStructure",
    "REGIMES",
    "SHAPE_TYPES",
    "SIZE_FRACTIONS",
    "SPLITS",
    "Shape",
    "TRIPLES",
    "VIABLE_TRIPLE_PAIRS",
    "encode_triples",
    "generate_puzzle",
    "puzzle_structure",
    "relation_holds",
    "render_panel",
    "render_panels",
    "satisfies",
    "value_domain",
]

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
_MAX_MATRIX_ATTEMPTS = 200
_MAX_CANDIDATE_TRIES = 400
_CANDIDATE_TRIES_BEFORE_FREE = 20
_CROSSED_DESIGN_TRIES = 10
_RENDER_MIN = 160  # DeepMind's release size


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


@dataclass
class _Frame:
    """What every panel of one puzzle shares: its triples, value domains and held-constant values."""

    triples: tuple[Triple, ...]
    domains: dict[ObjectAttribute, tuple[int, ...]]
    relation: dict[ObjectAttribute, str] = field(init=False)
    has_shapes: bool = field(init=False)
    has_lines: bool = field(init=False)
    constants: dict[ObjectAttribute, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.relation = {t[:2]: t[2] for t in self.triples}
        self.has_shapes = any(t[0] == "shape" for t in self.triples)
        self.has_lines = any(t[0] == "line" for t in self.triples)

    def free_attributes(self) -> list[ObjectAttribute]:
        """The held-constant attributes of the drawn objects."""
        free = []
        if self.has_shapes:
            free += [("shape", a) for a in _SHAPE_VALUE_ATTRIBUTES if ("shape", a) not in self.relation]
            if _POSITION in self.constants:
                free.append(_POSITION)
        if self.has_lines:
            free += [k for k in (_LINE_COLOR, _LINE_TYPE) if k not in self.relation]
        return free


def _sample_scalars(
    relation: str, domain: tuple[int, ...], rng: random.Random, need: Sequence[int] | None = None
) -> list[int] | None:
    """Nine values obeying progression or consistent union, each >= ``need`` (None when none fit)."""
    need = need or (0,) * 9
    if relation == "progression":
        count = len(domain)
        step = rng.choice([d for d in (1, 2) if count - 2 * d >= 2])
        starts = [
            [
                p
                for p in range(count - 2 * step)
                if all(domain[p + k * step] >= need[3 * r + k] for k in range(3))
            ]
            for r in range(3)
        ]
        first = rng.choice(starts[0]) if starts[0] else None
        # Equal first rows would make consistent union fit the two complete rows too.
        second = [p for p in starts[1] if p != first]
        if first is None or not second or not starts[2]:
            return None
        chosen = (first, rng.choice(second), rng.choice(starts[2]))
        return [domain[p + k * step] for p in chosen for k in range(3)]
    union = rng.sample(domain, 3)
    values: list[int] = []
    for r in range(3):
        orders = [o for o in itertools.permutations(union) if all(o[k] >= need[3 * r + k] for k in range(3))]
        if r == 1:
            # Two complete rows in one order would show constant columns rather than a union.
            orders = [o for o in orders if list(o) != values]
        if not orders:
            return None
        values.extend(rng.choice(orders))
    return values


@cache
def _set_splits(domain_size: int, union_max: int, relation: str) -> tuple[tuple[int, int, int, int], ...]:
    """(only-in-1, only-in-2, in-both, size of the third set) of every row a set relation can have."""
    top = min(domain_size, union_max)
    splits = []
    for a, b, c in itertools.product(range(1, top + 1), repeat=3):
        if a + b + c <= top:
            third = {"XOR": a + b, "OR": a + b + c, "AND": c}[relation]
            splits.append((a, b, c, third))
    return tuple(splits)


def _sample_sets(
    relation: str,
    domain: tuple[int, ...],
    union_max: int,
    rng: random.Random,
    need: Sequence[int] | None = None,
) -> list[frozenset[int]] | None:
    """Nine sets whose rows obey a set relation, each of size >= ``need`` (None when none fit)."""
    operation = _SET_OPERATIONS[relation]
    splits = _set_splits(len(domain), union_max, relation)
    sets: list[frozenset[int]] = []
    for r in range(3):
        if need is not None:
            n1, n2, n3 = need[3 * r : 3 * r + 3]
            fitting = [s for s in splits if s[0] + s[2] >= n1 and s[1] + s[2] >= n2 and s[3] >= n3]
        else:
            fitting = list(splits)
        if not fitting:
            return None
        a, b, c, _ = rng.choice(fitting)
        picked = rng.sample(domain, a + b + c)
        both = picked[a + b :]
        first, second = frozenset(picked[:a] + both), frozenset(picked[a : a + b] + both)
        sets += [first, second, operation(first, second)]
    return sets


def _sample_specs(frame: _Frame, rng: random.Random) -> list[dict[ObjectAttribute, Value]] | None:
    """The values of the puzzle's attributes in the nine panels, and the held-constant ones (in ``frame``)."""
    specs: list[dict[ObjectAttribute, Value]] = [{} for _ in range(9)]
    frame.constants = {}

    def put(key: ObjectAttribute, values: Sequence[Value]) -> None:
        for spec, value in zip(specs, values, strict=True):
            spec[key] = value

    def sample_value_sets(key: ObjectAttribute) -> list[frozenset[int]] | None:
        relation, domain = frame.relation[key], frame.domains[key]
        if relation in SET_RELATIONS:
            return _sample_sets(relation, domain, _SET_UNION_MAX[key], rng)
        scalars = _sample_scalars(relation, domain, rng)
        return None if scalars is None else [frozenset((v,)) for v in scalars]

    if frame.has_shapes:
        need = [1] * 9
        for attribute in _SHAPE_VALUE_ATTRIBUTES:
            key = ("shape", attribute)
            if key not in frame.relation:
                frame.constants[key] = rng.choice(frame.domains[key])
                continue
            sets = sample_value_sets(key)
            if sets is None:
                return None
            put(key, sets)
            need = [max(n, len(s)) for n, s in zip(need, sets, strict=True)]
        if _POSITION in frame.relation:
            positions = _sample_sets(
                frame.relation[_POSITION], frame.domains[_POSITION], _SET_UNION_MAX[_POSITION], rng, need
            )
            if positions is None:
                return None
            put(_POSITION, positions)
        elif _NUMBER in frame.relation:
            numbers = _sample_scalars(frame.relation[_NUMBER], frame.domains[_NUMBER], rng, need)
            if numbers is None:
                return None
            put(_NUMBER, numbers)
        else:
            low = max(need)
            frame.constants[_POSITION] = frozenset(rng.sample(range(9), rng.randint(low, min(9, low + 3))))
    if frame.has_lines:
        need = [1] * 9
        if _LINE_COLOR in frame.relation:
            sets = sample_value_sets(_LINE_COLOR)
            if sets is None:
                return None
            put(_LINE_COLOR, sets)
            need = [len(s) for s in sets]
        else:
            frame.constants[_LINE_COLOR] = rng.choice(frame.domains[_LINE_COLOR])
        relation = frame.relation.get(_LINE_TYPE)
        if relation is None:
            low = max(need)
            count = rng.randint(low, min(len(LINE_TYPES), low + 2))
            frame.constants[_LINE_TYPE] = frozenset(rng.sample(frame.domains[_LINE_TYPE], count))
        else:
            sets = (
                sample_value_sets(_LINE_TYPE)
                if relation == "consistent_union"
                else _sample_sets(relation, frame.domains[_LINE_TYPE], _SET_UNION_MAX[_LINE_TYPE], rng, need)
            )
            if sets is None:
                return None
            put(_LINE_TYPE, sets)
    return specs


def _assign(
    keys: Sequence[int], values: frozenset[int], previous: dict[int, int], rng: random.Random
) -> list[int]:
    """A value from ``values`` for each key, every value used, keeping ``previous`` ones where allowed."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return [ordered[0]] * len(keys)
    out = [previous[k] if previous.get(k) in values else ordered[rng.randrange(len(ordered))] for k in keys]
    counts: dict[int, int] = {}
    for v in out:
        counts[v] = counts.get(v, 0) + 1
    for missing in ordered:
        if counts.get(missing):
            continue
        spare = [i for i, v in enumerate(out) if counts[v] > 1]
        i = spare[rng.randrange(len(spare))]
        counts[out[i]] -= 1
        out[i] = missing
        counts[missing] = 1
    return out


def _realize(
    frame: _Frame, spec: dict[ObjectAttribute, Value], rng: random.Random, base: Panel | None = None
) -> Panel | None:
    """The objects of a panel with the attribute values ``spec`` (None when they do not fit together)."""
    shapes: tuple[Shape, ...] = ()
    lines: tuple[Line, ...] = ()
    if frame.has_shapes:
        if _POSITION in spec:
            cells = sorted(cast(frozenset[int], spec[_POSITION]))
        elif _NUMBER in spec:
            count = cast(int, spec[_NUMBER])
            old = [s.position for s in base.shapes] if base is not None else []
            if base is None:
                cells = sorted(rng.sample(range(9), count))
            elif len(old) >= count:
                cells = old if len(old) == count else sorted(rng.sample(old, count))
            else:
                free = [c for c in range(9) if c not in old]
                cells = sorted(old + rng.sample(free, count - len(old)))
        else:
            cells = sorted(frame.constants[_POSITION])
        columns = []
        for attribute in _SHAPE_VALUE_ATTRIBUTES:
            key = ("shape", attribute)
            values = cast(frozenset[int] | None, spec.get(key))
            if values is None:
                columns.append([frame.constants[key]] * len(cells))
                continue
            if len(values) > len(cells):
                return None
            previous = {s.position: getattr(s, attribute) for s in base.shapes} if base is not None else {}
            columns.append(_assign(cells, values, previous, rng))
        shapes = tuple(Shape(*fields) for fields in zip(cells, *columns, strict=True))
    if frame.has_lines:
        types = sorted(cast(frozenset[int], spec.get(_LINE_TYPE, frame.constants.get(_LINE_TYPE))))
        colors = cast(frozenset[int] | None, spec.get(_LINE_COLOR))
        if colors is None:
            assigned = [frame.constants[_LINE_COLOR]] * len(types)
        elif len(colors) > len(types):
            return None
        else:
            previous = {line.type: line.color for line in base.lines} if base is not None else {}
            assigned = _assign(types, colors, previous, rng)
        lines = tuple(Line(t, c) for t, c in zip(types, assigned, strict=True))
    return Panel(shapes, lines)


def _shows_spurious_relation(frame: _Frame, panels: Sequence[Panel]) -> bool:
    """Whether a triple outside the puzzle holds on the two complete rows."""
    for triple in TRIPLES:
        if triple in frame.triples:
            continue
        if (triple[0] == "shape" and not frame.has_shapes) or (triple[0] == "line" and not frame.has_lines):
            continue
        if relation_holds(triple, panels, rows=(0, 1)):
            return True
    return False


def _current(frame: _Frame, spec: dict[ObjectAttribute, Value], key: ObjectAttribute) -> Value:
    """The value of ``key`` in a panel: from its spec, else the held-constant one (as a set)."""
    if key in spec:
        return spec[key]
    constant = frame.constants[key]
    return constant if isinstance(constant, frozenset) else frozenset((constant,))


def _mutate(
    frame: _Frame, spec: dict[ObjectAttribute, Value], key: ObjectAttribute, rng: random.Random
) -> dict[ObjectAttribute, Value]:
    """A copy of ``spec`` with the value of ``key`` changed."""
    value = _current(frame, spec, key)
    domain = frame.domains[key]
    changed = dict(spec)
    if isinstance(value, int):
        changed[key] = rng.choice([v for v in domain if v != value])
    elif frame.relation.get(key) in SET_RELATIONS or (
        key not in frame.relation and key in (_POSITION, _LINE_TYPE)
    ):
        inside = sorted(value)
        outside = [v for v in domain if v not in value]
        moves = (["add", "swap"] if outside else []) + (["remove"] if len(inside) > 1 else [])
        move = rng.choice(moves)
        new = set(value)
        if move in ("remove", "swap"):
            new.discard(rng.choice(inside))
        if move in ("add", "swap"):
            new.add(rng.choice(outside))
        changed[key] = frozenset(new)
    else:
        (only,) = value
        changed[key] = frozenset((rng.choice([v for v in domain if v != only]),))
    return changed


def _make_candidates(
    frame: _Frame,
    context: Sequence[Panel],
    answer: Panel,
    answer_spec: dict[ObjectAttribute, Value],
    rng: random.Random,
) -> list[Panel] | None:
    """The answer then 7 distinct incorrect candidates (None when too few could be made)."""
    crossed = _crossed_candidates(frame, context, answer, answer_spec, rng)
    return crossed if crossed is not None else _grown_candidates(frame, context, answer, answer_spec, rng)


def _crossed_candidates(
    frame: _Frame,
    context: Sequence[Panel],
    answer: Panel,
    answer_spec: dict[ObjectAttribute, Value],
    rng: random.Random,
) -> list[Panel] | None:
    """The answer then the 7 other crossings of 2, 4 or 8 values of the puzzle's attributes (8 in all)."""
    keys = list(frame.relation)
    # A set attribute gives 2**e values by toggling e elements, a one-valued one 2**e distinct values.
    limits = [
        3 if frame.relation[k] in SET_RELATIONS else min(3, int(math.log2(len(frame.domains[k]))))
        for k in keys
    ]
    exponents = [e for e in itertools.product(*(range(n + 1) for n in limits)) if sum(e) == 3]
    if not exponents:
        return None
    for _ in range(_CROSSED_DESIGN_TRIES):
        factors: list[tuple[ObjectAttribute, list[Value]]] = []
        for key, e in zip(keys, rng.choice(exponents), strict=True):
            if e == 0:
                continue
            value, domain = answer_spec[key], frame.domains[key]
            if isinstance(value, int):
                options: list[Value] = [value, *rng.sample([v for v in domain if v != value], 2**e - 1)]
            elif frame.relation[key] in SET_RELATIONS:
                toggles = rng.sample(domain, e)
                options = [
                    value ^ frozenset(t for j, t in enumerate(toggles) if mask >> j & 1)
                    for mask in range(2**e)
                ]
            else:
                (only,) = value
                options = [
                    value,
                    *(frozenset((v,)) for v in rng.sample([v for v in domain if v != only], 2**e - 1)),
                ]
            factors.append((key, options))
        if any(isinstance(v, frozenset) and not v for _, options in factors for v in options):
            continue
        panels = [answer]
        for combination in itertools.islice(itertools.product(*(o for _, o in factors)), 1, None):
            spec = dict(answer_spec)
            spec.update(zip((k for k, _ in factors), combination, strict=True))
            panel = _realize(frame, spec, rng, answer)
            if panel is None or _satisfies(frame.triples, context, panel):
                break
            panels.append(panel)
        if len(panels) == 8:
            return panels
    return None


def _grown_candidates(
    frame: _Frame,
    context: Sequence[Panel],
    answer: Panel,
    answer_spec: dict[ObjectAttribute, Value],
    rng: random.Random,
) -> list[Panel] | None:
    """The answer then 7 distinct incorrect candidates grown from it as a tree (None when too few were made)."""
    pool = [(answer_spec, answer)]
    seen = {frozenset(answer_spec.items())}
    drawn = {answer}
    relational = list(frame.relation)
    free = frame.free_attributes()
    for tries in range(_MAX_CANDIDATE_TRIES):
        if len(pool) == 8:
            return [panel for _, panel in pool]
        spec, panel = pool[rng.randrange(len(pool))]
        changed = _mutate(frame, spec, relational[rng.randrange(len(relational))], rng)
        if tries >= _CANDIDATE_TRIES_BEFORE_FREE and free:
            changed = _mutate(frame, changed, free[rng.randrange(len(free))], rng)
        key = frozenset(changed.items())
        if key in seen:
            continue
        seen.add(key)
        candidate = _realize(frame, changed, rng, panel)
        # Specs differ but panels can match, when a change brought a held-constant value back.
        if candidate is None or candidate in drawn or _satisfies(frame.triples, context, candidate):
            continue
        drawn.add(candidate)
        pool.append((changed, candidate))
    return [panel for _, panel in pool] if len(pool) == 8 else None


def _check_regime_split(regime: str, split: str) -> None:
    """Raise ValueError for an unknown regime or split."""
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; expected one of {REGIMES}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")


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


def puzzle_structure(
    regime: str = "neutral", split: str = "train", index: int = 0, seed: int = 0, max_triples: int = 4
) -> PuzzleStructure:
    """The symbolic puzzle ``index`` of ``(regime, split, seed)``: what ``generate_puzzle`` renders."""
    _check_regime_split(regime, split)
    max_triples = _check_max_triples(regime, max_triples)
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
    structure = _generate(triples, domains, rng)
    if structure is None:
        raise RuntimeError(
            f"could not generate a puzzle for {triples} ({regime}, {split}, index {index}, seed {seed})"
        )
    return structure


def _generate(
    triples: tuple[Triple, ...], domains: dict[ObjectAttribute, tuple[int, ...]], rng: random.Random
) -> PuzzleStructure | None:
    """A puzzle of the structure ``triples`` with values in ``domains`` (None when attempts run out)."""
    frame = _Frame(triples, domains)
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


@dataclass(frozen=True)
class _Geometry:
    """Drawing coordinates for one render size."""

    size: int
    centres: tuple[tuple[float, float], ...]
    radii: tuple[float, ...]
    unit_polygons: tuple[tuple[tuple[float, float], ...], ...]
    insets: tuple[float, ...]
    outline: int
    line_width: int


@cache
def _geometry(size: int) -> _Geometry:
    """Cell centres, radii, polygon outlines and stroke widths for ``size``-pixel panels."""
    cell = size / 3
    polygons = []
    for sides in (3, 4, 5, 6):
        # Even-sided polygons sit on a flat edge, odd ones point up.
        start = -math.pi / 2 + (math.pi / sides if sides % 2 == 0 else 0.0)
        polygons.append(
            tuple(
                (math.cos(start + 2 * math.pi * k / sides), math.sin(start + 2 * math.pi * k / sides))
                for k in range(sides)
            )
        )
    return _Geometry(
        size=size,
        centres=tuple(((c % 3 + 0.5) * cell, (c // 3 + 0.5) * cell) for c in range(9)),
        radii=tuple(f * cell / 2 for f in SIZE_FRACTIONS),
        unit_polygons=tuple(polygons),
        # The circumradius lost by moving every edge of a regular polygon inwards by 1.
        insets=tuple(1 / math.cos(math.pi / sides) for sides in (3, 4, 5, 6)),
        outline=max(1, round(size / 80)),
        line_width=max(1, round(size / 55)),
    )


def _draw_panel(draw: ImageDraw.ImageDraw, panel: Panel, geometry: _Geometry, left: float = 0.0) -> None:
    """Draw a panel's lines, then its shapes over them, with its left edge at x = ``left``."""
    size, width = geometry.size, geometry.line_width
    near, far, middle = 0.08 * size, 0.92 * size, size / 2
    for line in panel.lines:
        fill = COLOR_LEVELS[line.color]
        if line.type < 4:
            (x0, y0), (x1, y1) = (
                ((near, far), (far, near)),
                ((near, near), (far, far)),
                ((near, middle), (far, middle)),
                ((middle, near), (middle, far)),
            )[line.type]
            draw.line(((left + x0, y0), (left + x1, y1)), fill=fill, width=width)
        else:
            r = (0.22 if line.type == 4 else 0.42) * size
            x = left + middle
            draw.ellipse((x - r, middle - r, x + r, middle + r), outline=fill, width=width)
    outline = geometry.outline
    for shape in panel.shapes:
        x, y = geometry.centres[shape.position]
        x += left
        r = geometry.radii[shape.size]
        fill = COLOR_LEVELS[shape.color]
        # A black shape, then the fill inset by the outline width: PIL's wide polygon outlines are slow.
        if shape.type == 4:
            draw.ellipse((x - r, y - r, x + r, y + r), fill=0)
            inner = r - outline
            draw.ellipse((x - inner, y - inner, x + inner, y + inner), fill=fill)
        else:
            unit, inset = geometry.unit_polygons[shape.type], geometry.insets[shape.type]
            draw.polygon([(x + r * u, y + r * v) for u, v in unit], fill=0)
            inner = r - outline * inset
            draw.polygon([(x + inner * u, y + inner * v) for u, v in unit], fill=fill)


def _render_factor(panel_size: int) -> int:
    """The supersampling factor: panels are drawn at >= 160 pixels and at least twice their size."""
    return max(2, -(-_RENDER_MIN // panel_size))


def render_panel(panel: Panel, panel_size: int = 80) -> np.ndarray:
    """A panel as a (panel_size, panel_size) uint8 image: white background, darker objects."""
    return render_panels([panel], panel_size)[0]


def render_panels(panels: Sequence[Panel], panel_size: int = 80) -> np.ndarray:
    """Panels as a (len(panels), panel_size, panel_size) uint8 array, drawn side by side on one canvas."""
    panel_size = _check_int("panel_size", panel_size, 16)
    factor = _render_factor(panel_size)
    size = panel_size * factor
    image = Image.new("L", (size * len(panels), size), 255)
    draw = ImageDraw.Draw(image)
    geometry = _geometry(size)
    for i, panel in enumerate(panels):
        _draw_panel(draw, panel, geometry, float(i * size))
    strip = np.asarray(image.reduce(factor))
    return np.ascontiguousarray(strip.reshape(panel_size, len(panels), panel_size).transpose(1, 0, 2))


def generate_puzzle(
    regime: str = "neutral",
    split: str = "train",
    index: int = 0,
    seed: int = 0,
    panel_size: int = 80,
    max_triples: int = 4,
    *,
    with_relations: bool = True,
) -> dict[str, Any]:
    """Puzzle ``index`` of ``(regime, split, seed)`` as a dict in DeepMind's PGM schema.

    Keys: ``panels`` (16, panel_size, panel_size) uint8, ``target`` (int, 0-7), ``meta_target`` (12,) uint8,
    ``relation_structure_encoded`` (4, 12) uint8 and, with ``with_relations``, the generator-only ``relations``
    (the puzzle's (object, attribute, relation) triples; absent from DeepMind's files).
    """
    _check_regime_split(regime, split)
    panel_size = _check_int("panel_size", panel_size, 16)
    structure = puzzle_structure(regime, split, index, seed, max_triples)
    panels = render_panels((*structure.context, *structure.candidates), panel_size)
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

    Item ``i`` is ``generate_puzzle(regime, split, i, seed, panel_size, max_triples)``; ``relations`` is left out
    by default (``with_relations=False``) because torch's default collate cannot stack lists of varying length.
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
    ) -> None:
        _check_regime_split(regime, split)
        self.regime = regime
        self.split = split
        self.num_puzzles = _check_int("num_puzzles", num_puzzles, 1)
        self.seed = _check_int("seed", seed, 0)
        self.panel_size = _check_int("panel_size", panel_size, 16)
        self.max_triples = _check_max_triples(regime, max_triples)
        self.with_relations = with_relations

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
        )

    def __repr__(self) -> str:
        return (
            f"PGMGenerator(regime={self.regime!r}, split={self.split!r}, num_puzzles={self.num_puzzles}, "
            f"seed={self.seed}, panel_size={self.panel_size}, max_triples={self.max_triples})"
        )
