"""The 8 candidates of a puzzle: its answer and 7 incorrect panels, each violating a triple."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence

from .rules import _LINE_TYPE, _POSITION, SET_RELATIONS, ObjectAttribute, Panel, Value, _satisfies
from .sampling import _Frame, _realize

_MAX_CANDIDATE_TRIES = 400
_CANDIDATE_TRIES_BEFORE_FREE = 20
_CROSSED_DESIGN_TRIES = 10


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
