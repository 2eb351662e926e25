"""The experiments' data: digit datasets, fuzzy-Boolean functions, RandAugment, PGM puzzles."""
