"""The 8 candidates of a puzzle: the answer and 7 incorrect panels that say nothing without the context.

The candidates cross 2, 4 or 8 values of the puzzle's attributes (I-RAVEN's attribute bisection tree, Hu et al.
2021); the values of one attribute other than the answer's are drawn as the answer's own is, given the last
context panel where that allows enough of them, else over all puzzles; every candidate's objects are drawn on
their own: no candidate is built from another's. ``docs/pgm/generator.md`` (Candidates) says why and what remains.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from functools import cache

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
from .sampling import _Frame, _realize, _sample_sets, _set_splits, progression_steps

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
    for _ in range(_DESIGN_TRIES):
        pools = {key: _alternatives(frame, key, answer_spec[key], context[7], rng) for key in frame.relation}
        # Designs whose values all come from the answer's distribution given the last panel first.
        designs = _designs([len(given) for given, _ in pools.values()]) or _designs(
            [max(len(given), len(anywhere)) for given, anywhere in pools.values()]
        )
        if not designs:
            return None
        factors = []
        for key, exponent in zip(pools, rng.choice(designs), strict=True):
            if exponent:
                given, anywhere = pools[key]
                # All of a factor's values from one distribution: a mix would set the answer's kind apart.
                pool = given if len(given) >= 2**exponent - 1 else anywhere
                factors.append((key, [answer_spec[key], *pool[: 2**exponent - 1]]))
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


def _alternatives(
    frame: _Frame, key: ObjectAttribute, answer: Value, last: Panel, rng: random.Random
) -> tuple[list[Value], list[Value]]:
    """Values other than the answer's for ``key``: drawn as the answer's is given the last panel, and at all.

    Given the last context panel ``v8`` (the answer's own distribution there): progression ``v8 + d`` for every
    step ``d`` that fits, consistent union any value but ``v8``'s, set relations ``v7' op v8`` for fresh seventh
    panels ``v7'``. At all (the answer's distribution over puzzles): a progression's last values weighted by how
    often a row ends on them (then the values none ends on), any value for consistent union, a fresh row's third
    set for set relations; then, for a one-valued relation, two values at once (a panel whose objects show two).
    Each list in the order to take from it.
    """
    relation, domain = frame.relation[key], frame.domains[key]
    last_value = last.attributes[key]
    if relation in SET_RELATIONS:
        union_max = min(_SET_UNION_MAX[key], len(domain))
        given = _distinct_draws(
            _third_set_sampler(relation, domain, union_max, last_value, rng), {answer, last_value}
        )
        anywhere = _distinct_draws(lambda: _sample_sets(relation, domain, union_max, rng)[8], {answer})
        return given, anywhere
    position = domain.index(last_value if isinstance(last_value, int) else min(last_value))
    if relation == "progression":
        steps = progression_steps(len(domain))
        reach = [position + d for d in steps if 0 <= position - d and position + d < len(domain)]
        ends = _progression_ends(len(domain))
        anywhere_indices = _weighted_order(
            [i for i in range(len(domain)) if ends[i]], [e for e in ends if e], rng
        )
    else:
        reach = [i for i in range(len(domain)) if i != position]
        anywhere_indices = rng.sample(range(len(domain)), len(domain))
    given = [v for v in (_as_value(key, domain[i]) for i in rng.sample(reach, len(reach))) if v != answer]
    rest = [i for i in rng.sample(range(len(domain)), len(domain)) if i not in anywhere_indices]
    anywhere = [v for v in (_as_value(key, domain[i]) for i in anywhere_indices + rest) if v != answer]
    if key != _NUMBER:
        pairs = [frozenset(pair) for pair in itertools.combinations(domain, 2)]
        anywhere += rng.sample(pairs, len(pairs))
    return given, anywhere


@cache
def _progression_ends(count: int) -> tuple[int, ...]:
    """How many (start, step) rows of a progression over ``count`` values end on each value."""
    ends = [0] * count
    for step in progression_steps(count):
        for start in range(count - 2 * step):
            ends[start + 2 * step] += 1
    return tuple(ends)


def _weighted_order(items: list[int], weights: list[int], rng: random.Random) -> list[int]:
    """``items`` in the order of a weighted draw without replacement."""
    items, weights, order = list(items), list(weights), []
    while items:
        i = rng.choices(range(len(items)), weights)[0]
        order.append(items.pop(i))
        weights.pop(i)
    return order


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
