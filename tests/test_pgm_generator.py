"""Tests for the offline PGM puzzle generator."""

from __future__ import annotations

import functools
import itertools
import random

import numpy as np
import pytest

from ni_hf.data import pgm_generator as pgm
from ni_hf.data.pgm_generator import (
    ATTRIBUTE_PAIRS,
    FREE_ATTRIBUTES,
    HELD_OUT_ATTRIBUTE_PAIRS,
    HELD_OUT_TRIPLE_PAIRS,
    HELD_OUT_TRIPLES,
    META_TARGET_NAMES,
    REGIMES,
    SPLITS,
    TRIPLES,
    VIABLE_TRIPLE_PAIRS,
    Line,
    Panel,
    PGMGenerator,
    Shape,
    encode_triples,
    generate_puzzle,
    generator,
    puzzle_structure,
    relation_holds,
    render_panels,
    rules,
    satisfies,
    value_domain,
)

PUZZLES_PER_SPLIT = {"train": 100, "val": 50, "test": 100}


@functools.cache
def _structures(
    regime: str, split: str, free_attributes: str = "constant"
) -> tuple[pgm.PuzzleStructure, ...]:
    """The first puzzles of a regime's split (seed 0), generated once for all tests."""
    return tuple(
        puzzle_structure(regime, split, i, free_attributes=free_attributes)
        for i in range(PUZZLES_PER_SPLIT[split])
    )


def _all_puzzles(regime: str, free_attributes: str = "constant"):
    """(split, structure) for the cached puzzles of every split of a regime."""
    return [(split, s) for split in SPLITS for s in _structures(regime, split, free_attributes)]


def _object_attributes(structure: pgm.PuzzleStructure) -> set[tuple[str, str]]:
    return {t[:2] for t in structure.triples}


# --- The vocabulary --------------------------------------------------------------------------------------------


def test_the_29_triples_of_pgm_and_deepmind_meta_target_layout():
    assert len(TRIPLES) == len(set(TRIPLES)) == 29
    per_attribute = {oa: sum(t[:2] == oa for t in TRIPLES) for oa in pgm.OBJECT_ATTRIBUTES}
    assert per_attribute == {
        ("shape", "color"): 5,
        ("shape", "number"): 2,
        ("shape", "position"): 3,
        ("shape", "size"): 5,
        ("shape", "type"): 5,
        ("line", "color"): 5,
        ("line", "type"): 4,
    }
    assert META_TARGET_NAMES == (
        "shape",
        "line",
        "color",
        "number",
        "position",
        "size",
        "type",
        "progression",
        "XOR",
        "OR",
        "AND",
        "consistent_union",
    )
    assert all(name in META_TARGET_NAMES for triple in TRIPLES for name in triple)


def test_held_out_sets_have_the_sizes_of_barretts_regimes():
    assert len(HELD_OUT_TRIPLES) == 7 and {t[:2] for t in HELD_OUT_TRIPLES} == set(pgm.OBJECT_ATTRIBUTES)
    assert len(ATTRIBUTE_PAIRS) == 20 and len(HELD_OUT_ATTRIBUTE_PAIRS) == 4
    assert set(HELD_OUT_ATTRIBUTE_PAIRS) <= set(ATTRIBUTE_PAIRS)
    assert (("shape", "number"), ("shape", "position")) not in ATTRIBUTE_PAIRS
    assert set(HELD_OUT_TRIPLE_PAIRS) <= set(VIABLE_TRIPLE_PAIRS)
    assert len(HELD_OUT_TRIPLE_PAIRS) == round(0.1 * len(VIABLE_TRIPLE_PAIRS))
    structures = rules._all_structures()
    assert {s for s in structures if len(s) == 2} == set(VIABLE_TRIPLE_PAIRS)
    assert all(rules._compatible(a, b) for s in structures for a, b in itertools.combinations(s, 2))


def test_value_domains_of_interpolation_and_extrapolation_are_disjoint_halves():
    for attribute in ("color", "size"):
        for regime in ("interpolation", "extrapolation"):
            train = set(value_domain("shape", attribute, regime, "train"))
            assert set(value_domain("shape", attribute, regime, "val")) == train
            test = set(value_domain("shape", attribute, regime, "test"))
            assert not train & test and train | test == set(range(10)) and len(train) == 5
        assert value_domain("shape", attribute, "interpolation", "train") == (0, 2, 4, 6, 8)
        assert value_domain("shape", attribute, "extrapolation", "test") == (5, 6, 7, 8, 9)


# --- The symbolic layer ----------------------------------------------------------------------------------------


def _count_panel(n: int) -> Panel:
    return Panel(tuple(Shape(p, 0, 0, 0) for p in range(n)))


def _position_panel(cells: set[int]) -> Panel:
    return Panel(tuple(Shape(p, 0, 0, 0) for p in sorted(cells)))


def test_relation_holds_follows_the_definitions():
    progression = [_count_panel(n) for n in (1, 2, 3, 2, 3, 4, 5, 6, 7)]
    assert relation_holds(("shape", "number", "progression"), progression)
    assert not relation_holds(("shape", "number", "consistent_union"), progression)
    uneven_steps = [_count_panel(n) for n in (1, 2, 3, 1, 3, 5, 1, 2, 3)]
    assert not relation_holds(("shape", "number", "progression"), uneven_steps)
    decreasing = [_count_panel(n) for n in (3, 2, 1) * 3]
    assert not relation_holds(("shape", "number", "progression"), decreasing)
    union = [_count_panel(n) for n in (1, 5, 9, 9, 1, 5, 5, 9, 1)]
    assert relation_holds(("shape", "number", "consistent_union"), union)
    repeated = [_count_panel(n) for n in (1, 1, 5) * 3]
    assert not relation_holds(("shape", "number", "consistent_union"), repeated)

    a, b = {0, 1, 2}, {2, 3}
    for relation, third in (("XOR", a ^ b), ("OR", a | b), ("AND", a & b)):
        matrix = [_position_panel(c) for c in (a, b, third) * 3]
        holding = {r for r in ("XOR", "OR", "AND") if relation_holds(("shape", "position", r), matrix)}
        assert holding == {relation}
    # A constant set is no relation: OR and AND would hold trivially.
    constant = [_position_panel(a)] * 9
    assert not any(relation_holds(("shape", "position", r), constant) for r in ("XOR", "OR", "AND"))
    # Scalar relations need one value per panel.
    two_colours = Panel((Shape(0, 0, 0, 1), Shape(1, 0, 0, 2)))
    assert not relation_holds(("shape", "color", "progression"), [two_colours] * 9)


@pytest.mark.parametrize("free_attributes", FREE_ATTRIBUTES)
def test_correct_candidate_satisfies_every_relation_and_no_other_does(free_attributes):
    sizes = set()
    for regime in REGIMES:
        for _, structure in _all_puzzles(regime, free_attributes):
            verdicts = [satisfies(structure, candidate) for candidate in structure.candidates]
            assert verdicts == [i == structure.target for i in range(8)], (regime, structure.triples)
            assert len(set(structure.candidates)) == 8
            sizes.add(len(structure.triples))
    assert sizes == {1, 2, 3, 4}


@pytest.mark.parametrize("max_triples", [1, 2, 3, 4])
def test_max_triples_bounds_the_number_of_triples_as_in_deepminds_data(max_triples):
    """1 to ``max_triples`` triples a puzzle (2 to it in the pair regimes), every number of them drawn."""
    for regime in ("neutral", "attrs.pairs") if max_triples > 1 else ("neutral",):
        low = 2 if regime == "attrs.pairs" else 1
        sizes = {len(puzzle_structure(regime, "train", i, 5, max_triples).triples) for i in range(60)}
        assert sizes == set(range(low, max_triples + 1)), (regime, sizes)


@pytest.mark.parametrize("free_attributes", FREE_ATTRIBUTES)
def test_no_spurious_relation_on_the_complete_rows(free_attributes):
    for regime in ("neutral", "interpolation", "attr.rels"):
        for _, structure in _all_puzzles(regime, free_attributes):
            matrix = structure.matrix()
            for triple in TRIPLES:
                holds = relation_holds(triple, matrix, rows=(0, 1))
                assert holds == (triple in structure.triples), (triple, structure.triples)
            for obj, attribute, relation in structure.triples:
                if relation in ("progression", "consistent_union"):
                    rows = [[matrix[3 * r + k].attributes[obj, attribute] for k in range(3)] for r in (0, 1)]
                    assert rows[0] != rows[1], (obj, attribute, relation)


def test_every_kind_of_structure_can_be_generated():
    structures = rules._all_structures()
    for regime, split in (("neutral", "train"), ("interpolation", "test")):
        domains = {(o, a): value_domain(o, a, regime, split) for o, a in pgm.OBJECT_ATTRIBUTES}
        for k, triples in enumerate(structures[::20]):
            structure = generator._generate(triples, domains, random.Random(k))
            assert structure is not None, triples
            assert satisfies(structure, structure.answer)


def test_free_attributes_are_constant_or_vary_at_random():
    """Attributes in no triple: one value over the 8 context panels when constant, several when random."""
    shown = {mode: [] for mode in FREE_ATTRIBUTES}
    for mode in FREE_ATTRIBUTES:
        for structure in _structures("neutral", "train", mode):
            for key in pgm.OBJECT_ATTRIBUTES:
                if key in _object_attributes(structure) or key[0] not in {t[0] for t in structure.triples}:
                    continue
                if key in (("shape", "number"), ("shape", "position")) and _object_attributes(structure) & {
                    ("shape", "number"),
                    ("shape", "position"),
                }:
                    continue  # positions follow the number, the number the positions
                values = {panel.attributes[key] for panel in (*structure.context, *structure.candidates)}
                shown[mode].append(len(values))
    assert shown["constant"] and set(shown["constant"]) == {1}
    assert sum(n > 1 for n in shown["random"]) > 0.9 * len(shown["random"])
    # The same triples either way: the option changes the panels, not the puzzle's structure.
    assert [s.triples for s in _structures("neutral", "train", "random")] == [
        s.triples for s in _structures("neutral", "train")
    ]


def test_targets_cover_all_eight_positions():
    targets = [s.target for split in SPLITS for s in _structures("neutral", split)]
    assert set(targets) == set(range(8))


# --- Regimes ---------------------------------------------------------------------------------------------------


def test_attr_rels_holds_out_seven_triples_from_train_and_val():
    for split, structure in _all_puzzles("attr.rels"):
        held = set(structure.triples) & set(HELD_OUT_TRIPLES)
        assert bool(held) == (split == "test"), (split, structure.triples)


def test_attrs_pairs_holds_out_attribute_pairs_from_train_and_val():
    for split, structure in _all_puzzles("attrs.pairs"):
        assert len(structure.triples) >= 2
        present = _object_attributes(structure)
        held = any(set(pair) <= present for pair in HELD_OUT_ATTRIBUTE_PAIRS)
        assert held == (split == "test"), (split, structure.triples)


def test_attr_rel_pairs_holds_out_triple_pairs_from_train_and_val():
    for split, structure in _all_puzzles("attr.rel.pairs"):
        assert len(structure.triples) >= 2
        held = any(set(pair) <= set(structure.triples) for pair in HELD_OUT_TRIPLE_PAIRS)
        assert held == (split == "test"), (split, structure.triples)


@pytest.mark.parametrize(
    ("regime", "key"), [("attrs.shape.color", ("shape", "color")), ("attrs.line.type", ("line", "type"))]
)
def test_held_out_attribute_regimes(regime, key):
    for split, structure in _all_puzzles(regime):
        assert (key in _object_attributes(structure)) == (split == "test"), (split, structure.triples)


@pytest.mark.parametrize("free_attributes", FREE_ATTRIBUTES)
@pytest.mark.parametrize("regime", ["interpolation", "extrapolation"])
def test_color_and_size_values_stay_in_their_split(regime, free_attributes):
    for split, structure in _all_puzzles(regime, free_attributes):
        assert _object_attributes(structure) & {("shape", "color"), ("shape", "size"), ("line", "color")}
        allowed = set(value_domain("shape", "color", regime, split))
        for panel in (*structure.context, *structure.candidates):
            for attribute in (("shape", "color"), ("shape", "size"), ("line", "color")):
                assert panel.attributes[attribute] <= allowed, (split, attribute, panel)


def test_neutral_splits_draw_from_every_value_and_triple():
    colours, triples = set(), set()
    for _, structure in _all_puzzles("neutral"):
        triples |= set(structure.triples)
        for panel in structure.context:
            colours |= panel.attributes[("shape", "color")] | panel.attributes[("line", "color")]
    assert triples == set(TRIPLES) and colours == set(range(10))


# --- Determinism -----------------------------------------------------------------------------------------------


def _same(first: dict, second: dict) -> bool:
    return (
        np.array_equal(first["panels"], second["panels"])
        and first["target"] == second["target"]
        and np.array_equal(first["meta_target"], second["meta_target"])
        and np.array_equal(first["relation_structure_encoded"], second["relation_structure_encoded"])
    )


def test_a_seed_gives_the_same_puzzles_in_any_order():
    generator = PGMGenerator("neutral", "train", num_puzzles=6, seed=3, panel_size=32)
    forward = [generator[i] for i in range(6)]
    backward = [generator[i] for i in reversed(range(6))][::-1]
    assert all(_same(a, b) for a, b in zip(forward, backward, strict=True))
    direct = [generate_puzzle("neutral", "train", i, 3, 32) for i in (4, 1)]
    assert _same(direct[0], forward[4]) and _same(direct[1], forward[1])
    assert not any(_same(forward[i], forward[j]) for i, j in itertools.combinations(range(6), 2))


def test_another_seed_split_or_regime_gives_other_puzzles():
    reference = generate_puzzle("neutral", "train", 0, 0, 32)
    for regime, split, seed in (("neutral", "train", 1), ("neutral", "val", 0), ("attr.rels", "train", 0)):
        assert not _same(reference, generate_puzzle(regime, split, 0, seed, 32))


def test_the_puzzle_does_not_depend_on_panel_size():
    for i in range(5):
        small, large = generate_puzzle(index=i, panel_size=16), generate_puzzle(index=i, panel_size=80)
        assert small["target"] == large["target"] and small["relations"] == large["relations"]


# --- Encoding and rendering ------------------------------------------------------------------------------------


def test_meta_target_is_the_or_of_the_relation_structure_and_matches_the_triples():
    for i in range(40):
        puzzle = generate_puzzle("neutral", "test", i, panel_size=16)
        encoded, meta = puzzle["relation_structure_encoded"], puzzle["meta_target"]
        assert encoded.shape == (4, 12) and encoded.dtype == np.uint8
        assert meta.shape == (12,) and meta.dtype == np.uint8
        assert np.array_equal(meta, encoded.max(axis=0))
        relations = puzzle["relations"]
        for row, triple in enumerate(relations):
            assert {META_TARGET_NAMES[j] for j in np.flatnonzero(encoded[row])} == set(triple)
        assert not encoded[len(relations) :].any()
        expected = {name for triple in relations for name in triple}
        assert {META_TARGET_NAMES[j] for j in np.flatnonzero(meta)} == expected
    assert np.array_equal(encode_triples([("line", "type", "XOR")])[0], [0, 1, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0])


@pytest.mark.parametrize("panel_size", [16, 23, 32, 80, 160])
def test_panels_render_at_several_sizes(panel_size):
    for i in range(8):
        puzzle = generate_puzzle("neutral", "train", i, panel_size=panel_size)
        panels = puzzle["panels"]
        assert panels.shape == (16, panel_size, panel_size) and panels.dtype == np.uint8
        assert isinstance(puzzle["target"], int) and 0 <= puzzle["target"] < 8
        assert (panels[:, 0, 0] == 255).all()  # white background
        assert (panels.reshape(16, -1).min(axis=1) < 255).all()  # every panel shows something
        candidates = panels[8:].reshape(8, -1)
        for a, b in itertools.combinations(range(8), 2):
            assert not np.array_equal(candidates[a], candidates[b]), (panel_size, i, a, b)


@pytest.mark.parametrize("free_attributes", FREE_ATTRIBUTES)
def test_every_two_candidates_differ_visibly_from_32_pixels_up(free_attributes):
    """At LEGIBLE_PANEL_SIZE every two candidates differ by >= MIN_VISIBLE_DIFFERENCE grey levels in a pixel."""
    assert (pgm.LEGIBLE_PANEL_SIZE, pgm.MIN_VISIBLE_DIFFERENCE) == (32, 16)
    for panel_size in (32, 48, 80):
        smallest = 255
        for regime in ("neutral", "interpolation", "attrs.line.type"):
            for structure in _structures(regime, "train", free_attributes)[:60]:
                images = render_panels(structure.candidates, panel_size).reshape(8, -1).astype(int)
                for a, b in itertools.combinations(range(8), 2):
                    smallest = min(smallest, int(np.abs(images[a] - images[b]).max()))
        assert smallest >= pgm.MIN_VISIBLE_DIFFERENCE, (panel_size, smallest)


def test_shapes_are_drawn_in_their_cells():
    size = 48
    centres = [(int((c // 3 + 0.5) * size / 3), int((c % 3 + 0.5) * size / 3)) for c in range(9)]
    checked = 0
    for structure in _structures("neutral", "train")[:40]:
        if any(t[0] == "line" for t in structure.triples):
            continue
        images = render_panels(structure.context, size)
        for panel, image in zip(structure.context, images, strict=True):
            occupied = {s.position for s in panel.shapes}
            for cell, (y, x) in enumerate(centres):
                assert (image[y, x] < 255) == (cell in occupied)
            checked += 1
    assert checked > 0


def test_lines_are_drawn():
    image = render_panels([Panel(lines=(Line(0, 9),)), Panel()], 32)
    assert image[0].min() < 128 and (image[1] == 255).all()


# --- The dataset class and bad arguments -----------------------------------------------------------------------


def test_pgm_generator_is_a_map_style_dataset():
    import torch

    generator = PGMGenerator("attr.rels", "test", num_puzzles=3, seed=2, panel_size=16)
    assert len(generator) == 3
    items = list(generator)  # __getitem__ ends iteration with IndexError
    assert len(items) == 3 and "relations" not in items[0]
    assert _same(items[2], generate_puzzle("attr.rels", "test", 2, 2, 16))
    assert generator[np.int64(1)]["target"] == items[1]["target"]
    batch = next(iter(torch.utils.data.DataLoader(generator, batch_size=3)))
    assert batch["panels"].shape == (3, 16, 16, 16) and batch["relation_structure_encoded"].shape == (
        3,
        4,
        12,
    )
    assert "relations" in PGMGenerator(num_puzzles=1, panel_size=16, with_relations=True)[0]


def test_bad_arguments_name_what_was_expected():
    with pytest.raises(ValueError, match="unknown regime 'nope'.*neutral"):
        generate_puzzle(regime="nope")
    with pytest.raises(ValueError, match="unknown split 'dev'.*train.*val.*test"):
        generate_puzzle(split="dev")
    with pytest.raises(ValueError, match="panel_size must be an integer >= 16"):
        generate_puzzle(panel_size=15)
    for bad in (0, 5):
        with pytest.raises(ValueError, match="max_triples must be an integer in 1-4"):
            generate_puzzle(max_triples=bad)
    with pytest.raises(ValueError, match="at least 2 triples"):
        generate_puzzle("attrs.pairs", max_triples=1)
    with pytest.raises(ValueError, match="index must be an integer >= 0"):
        generate_puzzle(index=-1)
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        generate_puzzle(seed=-1)
    for bad in ("constants", None, 1):
        with pytest.raises(ValueError, match=r"free_attributes must be one of \('constant', 'random'\)"):
            generate_puzzle(free_attributes=bad)
        with pytest.raises(ValueError, match="free_attributes must be one of"):
            PGMGenerator(free_attributes=bad)
    with pytest.raises(ValueError, match="with_relations must be True or False, got 'yes'"):
        PGMGenerator(with_relations="yes")
    with pytest.raises(ValueError, match="unknown regime"):
        PGMGenerator(regime="attr.rel")
    with pytest.raises(ValueError, match="num_puzzles must be an integer >= 1"):
        PGMGenerator(num_puzzles=0)
    with pytest.raises(ValueError, match="panel_size"):
        PGMGenerator(panel_size=8)
    generator = PGMGenerator(num_puzzles=2, panel_size=16)
    for bad in (2, -1):
        with pytest.raises(IndexError, match="expected 0 <= index < 2"):
            generator[bad]
