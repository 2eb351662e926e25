"""The 8 candidates of a puzzle: the answer and 7 incorrect panels that say nothing without the context.

The candidates cross 2, 4 or 8 values of the puzzle's attributes (I-RAVEN's attribute bisection tree, Hu et al.
2021), each value other than the answer's drawn from the distribution the answer's own value has given the last
context panel, and every candidate's objects are drawn on their own: no candidate is built from another's.
``docs/pgm/generator.md`` (Candidates) says why and what remains.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence

import numpy as np

from .rendering import _render_candidates
from .rules import (
    _NUMBER,
    _SET_OPERATIONS,
    _SET_UNION_MAX,
    SET_RELATIONS,
    ObjectAttribute,
    Panel,
    Value,
    _satisfies,
)
from .sampling import _Frame, _realize, _set_splits, progression_steps

# Every two candidates differ by at least MIN_VISIBLE_DIFFERENCE grey levels in some pixel when drawn at
# LEGIBLE_PANEL_SIZE pixels (more at larger sizes: a thin line's one grey step fades below it at 24 pixels and less).
LEGIBLE_PANEL_SIZE = 32
MIN_VISIBLE_DIFFERENCE = 16

_DESIGN_TRIES = 12
# Draws from the answer's distribution per attribute: enough to find 7 other values where they exist.
_POOL_DRAWS = 24


def _make_candidates(
    frame: _Frame,
    context: Sequence[Panel],
    answer: Panel,
    answer_spec: dict[ObjectAttribute, Value],
    rng: random.Random,
) -> list[Panel] | None:
    """The answer then 7 distinct, legible incorrect candidates (None when no design could be realised)."""
    pools = {key: _alternatives(frame, key, answer_spec[key], context[7], rng) for key in frame.relation}
    designs = _designs([len(pool) for pool in pools.values()])
    if not designs:
        return None
    for _ in range(_DESIGN_TRIES):
        factors = [
            (key, [answer_spec[key], *pools[key][: 2**exponent - 1]])
            for key, exponent in zip(pools, rng.choice(designs), strict=True)
            if exponent
        ]
        panels = [answer]
        for combination in itertools.islice(itertools.product(*(values for _, values in factors)), 1, None):
            spec = dict(answer_spec)
            spec.update(zip((key for key, _ in factors), combination, strict=True))
            panel = _realize(frame, spec, rng)
            if panel is None or panel in panels or _satisfies(frame.triples, context, panel):
                break
            panels.append(panel)
        if len(panels) == 8 and _legible(panels):
            return panels
        # Another try takes other values where the pools have more.
        pools = {key: _rotate(pool, rng) for key, pool in pools.items()}
    return None


def _legible(panels: Sequence[Panel]) -> bool:
    """Whether every two of ``panels`` differ by >= MIN_VISIBLE_DIFFERENCE somewhere at LEGIBLE_PANEL_SIZE."""
    images = _render_candidates(tuple(panels), LEGIBLE_PANEL_SIZE).reshape(len(panels), -1).astype(np.int16)
    first, second = np.triu_indices(len(panels), 1)
    return int(np.abs(images[first] - images[second]).max(axis=1).min()) >= MIN_VISIBLE_DIFFERENCE


def _designs(capacities: Sequence[int]) -> list[tuple[int, ...]]:
    """Exponents (e_k) with sum 3 such that attribute k has 2**e_k - 1 other values: 8 crossings in all."""
    limits = [min(3, (capacity + 1).bit_length() - 1) for capacity in capacities]
    return [e for e in itertools.product(*(range(n + 1) for n in limits)) if sum(e) == 3]


def _rotate(pool: list[Value], rng: random.Random) -> list[Value]:
    """The pool with one of its first 7 values moved to the end (the next design try draws others)."""
    if len(pool) <= 1:
        return pool
    i = rng.randrange(min(7, len(pool)))
    return [*pool[:i], *pool[i + 1 :], pool[i]]


def _alternatives(
    frame: _Frame, key: ObjectAttribute, answer: Value, last: Panel, rng: random.Random
) -> list[Value]:
    """Other values than the answer's for ``key``, best first.

    First values drawn as the answer's own is, given the last context panel ``v8`` (progression: ``v8 + d`` for
    every step ``d`` that fits; consistent union: any value; set relations: ``v7' op v8`` for fresh seventh
    panels ``v7'``), in random order; then values at the distances from ``v8`` those have (``v8 - d``, then the
    other values by distance; sets: ``v8`` with as many random elements toggled); last, for a one-valued
    relation, ``v8`` itself, then two values at once (a panel whose objects show two).
    """
    relation, domain = frame.relation[key], frame.domains[key]
    last_value = last.attributes[key]
    excluded = {answer, last_value}
    if relation in SET_RELATIONS:
        union_max = min(_SET_UNION_MAX[key], len(domain))
        third_set = _third_set_sampler(relation, domain, union_max, last_value, rng)
        conditional = _distinct_draws(third_set, excluded)
        distances = [len(v ^ last_value) for v in (answer, *conditional)]
        mirrored = _distinct_draws(
            lambda: _set_at_distance(domain, union_max, last_value, rng.choice(distances), rng),
            excluded | set(conditional),
        )
        return conditional + mirrored
    position = domain.index(last_value if isinstance(last_value, int) else min(last_value))
    if relation == "progression":
        reach = [
            position + d
            for d in progression_steps(len(domain))
            if 0 <= position - d and position + d < len(domain)
        ]
    else:
        reach = list(range(len(domain)))
    first = rng.sample(reach, len(reach))
    rest = sorted(
        (i for i in range(len(domain)) if i not in reach), key=lambda i: (abs(i - position), rng.random())
    )
    values = [v for v in (_as_value(key, domain[i]) for i in first + rest) if v not in excluded]
    # Where the values run out, the last panel's own: a candidate set missing exactly it would point at it.
    values.append(last_value)
    if key != _NUMBER:
        pairs = [frozenset(pair) for pair in itertools.combinations(domain, 2)]
        values += rng.sample(pairs, len(pairs))
    return values


def _as_value(key: ObjectAttribute, value: int) -> Value:
    """A one-valued attribute's value as a panel shows it: a count for number, else a one-element set."""
    return value if key == _NUMBER else frozenset((value,))


def _distinct_draws(draw: Callable[[], Value | None], excluded: set[Value]) -> list[Value]:
    """Up to 7 distinct values from ``_POOL_DRAWS`` calls of ``draw`` (None skipped), none in ``excluded``."""
    values: list[Value] = []
    for _ in range(_POOL_DRAWS):
        value = draw()
        if value is not None and value not in excluded and value not in values:
            values.append(value)
            if len(values) == 7:
                break
    return values


def _third_set_sampler(
    relation: str, domain: tuple[int, ...], union_max: int, last: frozenset[int], rng: random.Random
) -> Callable[[], frozenset[int] | None]:
    """Draws of ``v7 op last`` for seventh panels ``v7`` drawn as the generator draws them beside ``last``."""
    outside = [v for v in domain if v not in last]
    inside = sorted(last)
    fitting = [
        (a, c)
        for a, b, c, _ in _set_splits(len(domain), union_max, relation)
        if b + c == len(last) and a <= len(outside)
    ]
    operation = _SET_OPERATIONS[relation]

    def draw() -> frozenset[int] | None:
        if not fitting:
            return None
        a, c = fitting[rng.randrange(len(fitting))]
        return operation(frozenset(rng.sample(inside, c) + rng.sample(outside, a)), last)

    return draw


def _set_at_distance(
    domain: tuple[int, ...], union_max: int, last: frozenset[int], distance: int, rng: random.Random
) -> frozenset[int] | None:
    """``last`` with ``distance`` random elements of ``domain`` toggled (None when empty or too large)."""
    value = last ^ frozenset(rng.sample(domain, min(distance, len(domain))))
    return value if value and len(value) <= union_max else None
