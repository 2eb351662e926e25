"""Sampling a puzzle's matrix: the values its triples give the nine panels, then the objects that show them."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, cast

from .rules import (
    _LINE_COLOR,
    _LINE_TYPE,
    _NUMBER,
    _POSITION,
    _SET_OPERATIONS,
    _SET_UNION_MAX,
    _SHAPE_VALUE_ATTRIBUTES,
    LINE_TYPES,
    SET_RELATIONS,
    TRIPLES,
    Line,
    ObjectAttribute,
    Panel,
    Shape,
    Triple,
    Value,
    relation_holds,
)


@dataclass
class _Frame:
    """What every panel of one puzzle shares: its triples, value domains and held-constant values."""

    triples: tuple[Triple, ...]
    domains: dict[ObjectAttribute, tuple[int, ...]]
    free_attributes: str = "constant"
    relation: dict[ObjectAttribute, str] = field(init=False)
    has_shapes: bool = field(init=False)
    has_lines: bool = field(init=False)
    constants: dict[ObjectAttribute, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.relation = {t[:2]: t[2] for t in self.triples}
        self.has_shapes = any(t[0] == "shape" for t in self.triples)
        self.has_lines = any(t[0] == "line" for t in self.triples)


@cache
def progression_steps(count: int) -> tuple[int, ...]:
    """The steps a progression over ``count`` values takes: 1-4, leaving two starts for the complete rows."""
    return tuple(d for d in range(1, 5) if count - 2 * d >= 2)


def _sample_scalars(
    relation: str, domain: tuple[int, ...], rng: random.Random, need: Sequence[int] | None = None
) -> list[int] | None:
    """Nine values obeying progression or consistent union, each >= ``need`` (None when none fit)."""
    need = need or (0,) * 9
    if relation == "progression":
        count = len(domain)
        steps = progression_steps(count)
        # Steps weighted by their number of starts: every (start, step) of a row is equally likely, so that
        # given its middle value a row's last value is equally likely to be any that a step reaches.
        step = rng.choices(steps, [count - 2 * d for d in steps])[0]
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
    if frame.has_shapes and not _sample_shape_values(frame, specs, rng):
        return None
    if frame.has_lines and not _sample_line_values(frame, specs, rng):
        return None
    return specs


def _put(specs: list[dict[ObjectAttribute, Value]], key: ObjectAttribute, values: Sequence[Value]) -> None:
    """Set ``key`` to ``values[i]`` in panel ``i``'s spec."""
    for spec, value in zip(specs, values, strict=True):
        spec[key] = value


def _sample_value_sets(
    frame: _Frame, key: ObjectAttribute, rng: random.Random
) -> list[frozenset[int]] | None:
    """Nine value sets of ``key`` obeying its relation (one-element sets for progression and consistent union)."""
    relation, domain = frame.relation[key], frame.domains[key]
    if relation in SET_RELATIONS:
        return _sample_sets(relation, domain, _SET_UNION_MAX[key], rng)
    scalars = _sample_scalars(relation, domain, rng)
    return None if scalars is None else [frozenset((v,)) for v in scalars]


def _sample_shape_values(
    frame: _Frame, specs: list[dict[ObjectAttribute, Value]], rng: random.Random
) -> bool:
    """The shapes' type, size and color, then their positions or number (False when none fit)."""
    need = [1] * 9
    for attribute in _SHAPE_VALUE_ATTRIBUTES:
        key = ("shape", attribute)
        if key not in frame.relation:
            frame.constants[key] = rng.choice(frame.domains[key])
            continue
        sets = _sample_value_sets(frame, key, rng)
        if sets is None:
            return False
        _put(specs, key, sets)
        need = [max(n, len(s)) for n, s in zip(need, sets, strict=True)]
    if _POSITION in frame.relation:
        positions = _sample_sets(
            frame.relation[_POSITION], frame.domains[_POSITION], _SET_UNION_MAX[_POSITION], rng, need
        )
        if positions is None:
            return False
        _put(specs, _POSITION, positions)
    elif _NUMBER in frame.relation:
        numbers = _sample_scalars(frame.relation[_NUMBER], frame.domains[_NUMBER], rng, need)
        if numbers is None:
            return False
        _put(specs, _NUMBER, numbers)
    else:
        low = max(need)
        frame.constants[_POSITION] = frozenset(rng.sample(range(9), rng.randint(low, min(9, low + 3))))
    return True


def _sample_line_values(frame: _Frame, specs: list[dict[ObjectAttribute, Value]], rng: random.Random) -> bool:
    """The lines' colors, then their types (False when none fit)."""
    need = [1] * 9
    if _LINE_COLOR in frame.relation:
        sets = _sample_value_sets(frame, _LINE_COLOR, rng)
        if sets is None:
            return False
        _put(specs, _LINE_COLOR, sets)
        need = [len(s) for s in sets]
    else:
        frame.constants[_LINE_COLOR] = rng.choice(frame.domains[_LINE_COLOR])
    relation = frame.relation.get(_LINE_TYPE)
    if relation is None:
        low = max(need)
        count = rng.randint(low, min(len(LINE_TYPES), low + 2))
        frame.constants[_LINE_TYPE] = frozenset(rng.sample(frame.domains[_LINE_TYPE], count))
        return True
    sets = (
        _sample_value_sets(frame, _LINE_TYPE, rng)
        if relation == "consistent_union"
        else _sample_sets(relation, frame.domains[_LINE_TYPE], _SET_UNION_MAX[_LINE_TYPE], rng, need)
    )
    if sets is None:
        return False
    _put(specs, _LINE_TYPE, sets)
    return True


def _assign(keys: Sequence[int], values: frozenset[int], rng: random.Random) -> list[int] | None:
    """A random value from ``values`` for each key, every value used (None when there are fewer keys)."""
    if len(values) > len(keys):
        return None
    ordered = sorted(values)
    out = ordered + [ordered[rng.randrange(len(ordered))] for _ in range(len(keys) - len(ordered))]
    rng.shuffle(out)
    return out


def _realize(frame: _Frame, spec: dict[ObjectAttribute, Value], rng: random.Random) -> Panel | None:
    """The objects of a panel with the attribute values ``spec`` (None when they do not fit together)."""
    shapes = _realize_shapes(frame, spec, rng) if frame.has_shapes else ()
    lines = _realize_lines(frame, spec, rng) if frame.has_lines else ()
    if shapes is None or lines is None:
        return None
    return Panel(shapes, lines)


def _realize_shapes(
    frame: _Frame, spec: dict[ObjectAttribute, Value], rng: random.Random
) -> tuple[Shape, ...] | None:
    """A panel's shapes: cells from its position or number, then each shape's type, size and color."""
    sets = [cast(frozenset[int], spec[("shape", a)]) for a in _SHAPE_VALUE_ATTRIBUTES if ("shape", a) in spec]
    if _POSITION in spec:
        cells = sorted(cast(frozenset[int], spec[_POSITION]))
    elif _NUMBER in spec:
        cells = sorted(rng.sample(range(9), cast(int, spec[_NUMBER])))
    elif frame.free_attributes == "random":
        low = max(map(len, sets), default=1)
        cells = sorted(rng.sample(range(9), rng.randint(low, min(9, low + 3))))
    else:
        cells = sorted(frame.constants[_POSITION])
    columns = []
    for attribute in _SHAPE_VALUE_ATTRIBUTES:
        key = ("shape", attribute)
        if key in spec:
            column = _assign(cells, cast(frozenset[int], spec[key]), rng)
            if column is None:
                return None
        elif frame.free_attributes == "random":
            column = [rng.choice(frame.domains[key]) for _ in cells]
        else:
            column = [frame.constants[key]] * len(cells)
        columns.append(column)
    return tuple(Shape(*fields) for fields in zip(cells, *columns, strict=True))


def _realize_lines(
    frame: _Frame, spec: dict[ObjectAttribute, Value], rng: random.Random
) -> tuple[Line, ...] | None:
    """A panel's lines: their types, then each line's color."""
    colors = cast(frozenset[int] | None, spec.get(_LINE_COLOR))
    if _LINE_TYPE in spec:
        types = sorted(cast(frozenset[int], spec[_LINE_TYPE]))
    elif frame.free_attributes == "random":
        low = len(colors) if colors is not None else 1
        types = sorted(rng.sample(frame.domains[_LINE_TYPE], rng.randint(low, min(len(LINE_TYPES), low + 2))))
    else:
        types = sorted(frame.constants[_LINE_TYPE])
    if colors is not None:
        assigned = _assign(types, colors, rng)
        if assigned is None:
            return None
    elif frame.free_attributes == "random":
        assigned = [rng.choice(frame.domains[_LINE_COLOR]) for _ in types]
    else:
        assigned = [frame.constants[_LINE_COLOR]] * len(types)
    return tuple(Line(t, c) for t, c in zip(types, assigned, strict=True))


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
