"""An offline generator of PGM-style puzzles (Procedurally Generated Matrices, Barrett et al. 2018).

Each puzzle is a 3x3 matrix of panels whose rows obey one to four ``(object, attribute, relation)`` triples; the
ninth panel is missing and must be picked among 8 candidates. Puzzles come in the schema of DeepMind's release
(``panels``, ``target``, ``meta_target``, ``relation_structure_encoded``) at any panel size from 16 pixels up, with
no download. The specification (objects, relations, candidates, regimes, determinism, differences from
DeepMind's data) is ``docs/pgm/generator.md``.

Modules: ``rules`` (the vocabulary, the triples, the regimes and when a row obeys a triple), ``sampling`` (the
matrix's values and objects), ``candidates`` (the answer and 7 incorrect panels), ``rendering`` (the images),
``generator`` (puzzles by index and the map-style dataset ``PGMGenerator``).
"""

from .candidates import LEGIBLE_PANEL_SIZE, MIN_VISIBLE_DIFFERENCE
from .generator import PGMGenerator, generate_puzzle, puzzle_structure
from .rendering import render_panel, render_panels
from .rules import (
    ATTRIBUTE_PAIRS,
    ATTRIBUTES,
    COLOR_LEVELS,
    FREE_ATTRIBUTES,
    HELD_OUT_ATTRIBUTE_PAIRS,
    HELD_OUT_TRIPLE_PAIRS,
    HELD_OUT_TRIPLES,
    LINE_TYPES,
    META_TARGET_NAMES,
    NUM_COLORS,
    NUM_SIZES,
    OBJECT_ATTRIBUTES,
    OBJECTS,
    REGIMES,
    RELATIONS,
    SET_RELATIONS,
    SHAPE_TYPES,
    SIZE_FRACTIONS,
    SPLITS,
    TRIPLES,
    VIABLE_TRIPLE_PAIRS,
    Line,
    Panel,
    PuzzleStructure,
    Shape,
    encode_triples,
    relation_holds,
    satisfies,
    value_domain,
)

__all__ = [
    "ATTRIBUTES",
    "ATTRIBUTE_PAIRS",
    "COLOR_LEVELS",
    "FREE_ATTRIBUTES",
    "HELD_OUT_ATTRIBUTE_PAIRS",
    "HELD_OUT_TRIPLES",
    "HELD_OUT_TRIPLE_PAIRS",
    "LEGIBLE_PANEL_SIZE",
    "LINE_TYPES",
    "MIN_VISIBLE_DIFFERENCE",
    "META_TARGET_NAMES",
    "NUM_COLORS",
    "NUM_SIZES",
    "OBJECTS",
    "OBJECT_ATTRIBUTES",
    "PGMGenerator",
    "Line",
    "Panel",
    "PuzzleStructure",
    "REGIMES",
    "RELATIONS",
    "SET_RELATIONS",
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
