"""Tests for the fuzzy Boolean expressions data module."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ni_hf.data import fuzzy_boolean
from ni_hf.data.fuzzy_boolean import (
    FuzzyBooleanFunction,
    evaluate_truth_tables,
    fuzzy_and,
    fuzzy_not,
    fuzzy_or,
    make_fuzzy_boolean_datasets,
    make_fuzzy_boolean_tensors,
    minimal_implicants,
    minterms,
    sample_functions,
    truth_table_inputs,
)

N = 5


def _reference(table: np.ndarray, point: np.ndarray) -> float:
    """Slow reference: or-fold over the true rows of and-folds over the literals, one point at a time."""
    n = len(point)
    value = 0.0  # the empty disjunction is false
    for r in range(len(table)):
        if not table[r]:
            continue
        literals = [float(point[i]) if (r >> i) & 1 else fuzzy_not(float(point[i])) for i in range(n)]
        value = fuzzy_or(value, functools.reduce(fuzzy_and, literals, 1.0))
    return value


def _test_tables() -> np.ndarray:
    """A few random truth tables plus the all-zero, all-one and single-row tables."""
    tables = [f.truth_table for f in sample_functions(6, N, seed=123)]
    tables += [np.zeros(2**N, bool), np.ones(2**N, bool), np.eye(2**N, dtype=bool)[7]]
    return np.stack(tables)


def test_primitives_follow_definitions() -> None:
    """and/or/not match product fuzzy logic, De Morgan holds, and they reduce to Boolean logic on {0, 1}."""
    rng = np.random.default_rng(0)
    x, y = rng.random(1000), rng.random(1000)
    np.testing.assert_allclose(fuzzy_and(x, y), x * y)
    np.testing.assert_allclose(fuzzy_not(x), 1 - x)
    np.testing.assert_allclose(fuzzy_or(x, y), 1 - (1 - x) * (1 - y))
    np.testing.assert_allclose(fuzzy_or(x, y), x + y - x * y)
    np.testing.assert_allclose(fuzzy_not(fuzzy_and(x, y)), fuzzy_or(fuzzy_not(x), fuzzy_not(y)))
    np.testing.assert_allclose(fuzzy_not(fuzzy_or(x, y)), fuzzy_and(fuzzy_not(x), fuzzy_not(y)))
    for a in (0, 1):
        for b in (0, 1):
            assert fuzzy_and(a, b) == (a and b)
            assert fuzzy_or(a, b) == (a or b)
        assert fuzzy_not(a) == (not a)
    tx, ty = torch.tensor(x), torch.tensor(y)
    torch.testing.assert_close(fuzzy_or(tx, ty), torch.tensor(fuzzy_or(x, y)))


def test_truth_table_inputs_bit_order() -> None:
    """Row r has variable i equal to bit i of r (variable 0 is the least significant bit)."""
    corners = truth_table_inputs(N)
    assert corners.shape == (2**N, N)
    np.testing.assert_array_equal(corners[1], [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(corners[2**N - 2], [0, 1, 1, 1, 1])
    assert len({tuple(c) for c in corners}) == 2**N


def test_minterms_partition_of_unity_and_corners() -> None:
    """Minterms sum to 1 everywhere and are one-hot (the row's indicator) at the corners."""
    x = np.random.default_rng(1).random((500, N))
    np.testing.assert_allclose(minterms(x).sum(axis=1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(minterms(truth_table_inputs(N)), np.eye(2**N))


@pytest.mark.parametrize("as_torch", [False, True])
def test_functions_equal_truth_table_on_corners(as_torch: bool) -> None:
    """On {0, 1}^N every function equals its truth table, including constant tables."""
    corners = truth_table_inputs(N)
    for table in _test_tables():
        f = FuzzyBooleanFunction(table)
        out = f(torch.tensor(corners, dtype=torch.float32)) if as_torch else f(corners)
        out = out.numpy() if as_torch else out
        np.testing.assert_array_equal(out, table.astype(np.float64))
    np.testing.assert_array_equal(
        evaluate_truth_tables(corners, _test_tables()), _test_tables().T.astype(float)
    )


def test_vectorised_matches_reference_loop() -> None:
    """Vectorised evaluation of many functions at once matches the slow or-fold over minterms."""
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.random((40, N)), rng.integers(0, 2, (5, N)).astype(float), [[0.5] * N]])
    tables = _test_tables()
    fast = evaluate_truth_tables(x, tables)
    assert fast.shape == (len(x), len(tables))
    slow = np.array([[_reference(t, p) for t in tables] for p in x])
    np.testing.assert_allclose(fast, slow, rtol=1e-12, atol=1e-14)
    for j, table in enumerate(tables):
        np.testing.assert_allclose(FuzzyBooleanFunction(table)(x), fast[:, j], rtol=1e-14, atol=1e-15)


def test_constant_tables() -> None:
    """All-zero is the constant 0; all-one is the fuzzy OR of all minterms, 1 only on the corners."""
    x = np.random.default_rng(3).random((1000, N))
    zero = FuzzyBooleanFunction(np.zeros(2**N, bool))
    one = FuzzyBooleanFunction(np.ones(2**N, bool))
    np.testing.assert_array_equal(zero(x), 0.0)
    assert zero.to_expression() == "0"
    values = one(x)
    assert np.all(values < 1.0) and np.all(values > 0.5)
    np.testing.assert_allclose(one(np.full((1, N), 0.5)), 1 - (31 / 32) ** 32)


def test_outputs_in_unit_interval_and_non_trivial() -> None:
    """Outputs lie in [0, 1] and vary with x for non-constant tables."""
    x = np.random.default_rng(4).random((2000, N))
    for f in sample_functions(10, N, seed=5):
        values = f(x)
        assert values.shape == (2000,) and values.dtype == np.float64
        assert values.min() >= 0.0 and values.max() <= 1.0
        assert values.std() > 1e-2


def test_to_expression_and_dataclass() -> None:
    """The expression lists one product per true row; the truth table is validated and read-only."""
    table = np.zeros(2**N, bool)
    table[[0b00001, 0b10110]] = True
    f = FuzzyBooleanFunction(table)
    assert f.num_variables == N and f.true_rows == [1, 22]
    assert f.to_expression() == "(x0 & ~x1 & ~x2 & ~x3 & ~x4) | (~x0 & x1 & x2 & ~x3 & x4)"
    assert f.to_expression(list("abcde")).startswith("(a & ~b & ~c & ~d & ~e) | ")
    assert f == FuzzyBooleanFunction(table.copy()) and hash(f) == hash(FuzzyBooleanFunction(table.copy()))
    with pytest.raises(ValueError):
        f.truth_table[0] = True
    with pytest.raises(ValueError):
        FuzzyBooleanFunction(np.ones(24, bool))
    with pytest.raises(ValueError):
        f(np.zeros((3, N + 1)))


def _covered_rows(care: int, value: int) -> set[int]:
    """Rows (truth-table indices) on which the implicant (care_mask, value_bits) is 1."""
    return {r for r in range(2**N) if r & care == value & care}


def test_minimal_form_is_an_irredundant_cover_of_prime_implicants() -> None:
    """The minimal form's implicants cover exactly the true rows, each is prime, none can be dropped."""
    tables = np.concatenate([_test_tables(), [f.truth_table for f in sample_functions(30, N, seed=8)]])
    num_terms = []
    for table in tables:
        true_rows = set(np.flatnonzero(table).tolist())
        implicants = minimal_implicants(table)
        covers = [_covered_rows(care, value) for care, value in implicants]
        assert set().union(*covers) == true_rows
        assert len(implicants) <= max(len(true_rows), 1)
        for (care, value), cover in zip(implicants, covers, strict=True):
            assert cover <= true_rows
            for i in range(N):  # prime: dropping any literal covers a false row
                if (care >> i) & 1:
                    assert not _covered_rows(care & ~(1 << i), value) <= true_rows
            others = [c for c in covers if c is not cover]
            assert not true_rows <= set().union(*others)  # irredundant
        num_terms.append((len(implicants), len(true_rows)))
    terms, rows = np.sum(num_terms, axis=0)
    assert terms < 0.6 * rows  # far fewer products than the canonical form's one per true row


def test_minimal_form_values() -> None:
    """Minimal-form functions: the truth table on the corners, fuzzy OR of the implicants' products inside."""
    rng = np.random.default_rng(9)
    x = rng.random((300, N))
    corners = truth_table_inputs(N)
    rows = np.arange(2**N)
    x0, x1 = x[:, 0], x[:, 1]
    known = {
        "x0": (rows & 1 == 1, x0),
        "x0 and x1": (rows & 3 == 3, x0 * x1),
        "x0 or not x1": ((rows & 1 == 1) | (rows & 2 == 0), fuzzy_or(x0, fuzzy_not(x1))),
        "1": (np.ones(2**N, bool), np.ones(len(x))),
        "0": (np.zeros(2**N, bool), np.zeros(len(x))),
    }
    for table, expected in known.values():
        np.testing.assert_allclose(evaluate_truth_tables(x, table, "minimal")[:, 0], expected, atol=1e-14)
    f = FuzzyBooleanFunction(known["x0"][0], "minimal")
    assert (
        f.to_expression() == "(x0)"
        and FuzzyBooleanFunction(np.ones(2**N, bool), "minimal").to_expression() == "1"
    )
    assert FuzzyBooleanFunction(known["x0"][0]).to_expression().count("&") == 16 * 4
    # The canonical form of the same table is not x0 inside the cube (its minterms' OR is not their sum).
    assert np.abs(FuzzyBooleanFunction(known["x0"][0])(x) - x0).max() > 0.1
    for table in _test_tables():
        g = FuzzyBooleanFunction(table, "minimal")
        np.testing.assert_array_equal(g(corners), table.astype(float))
        out = g(torch.tensor(corners, dtype=torch.float32)).numpy()
        np.testing.assert_array_equal(out, table.astype(np.float32))
        slow = np.zeros(len(x))
        for care, value in minimal_implicants(table):
            term = np.ones(len(x))
            for i in range(N):
                if (care >> i) & 1:
                    term = fuzzy_and(term, x[:, i] if (value >> i) & 1 else fuzzy_not(x[:, i]))
            slow = fuzzy_or(slow, term)
        np.testing.assert_allclose(g(x), slow, rtol=1e-12, atol=1e-14)
    # Random minimal-form functions vary more over the cube than their canonical forms.
    tables = np.stack([f.truth_table for f in sample_functions(40, N, seed=10)])
    variance = {
        form: evaluate_truth_tables(x, tables, form).var(axis=0).mean() for form in ("canonical", "minimal")
    }
    assert variance["minimal"] > 1.5 * variance["canonical"]


def test_minimal_form_does_not_depend_on_the_hash_seed() -> None:
    """sympy's choice among minimal covers is the same in every process (torchrun ranks, reruns)."""
    # The module alone, without the package (whose import of transformers would dominate the test's time).
    module = Path(fuzzy_boolean.__file__)
    code = (
        "import importlib.util, sys;"
        f"spec = importlib.util.spec_from_file_location('fuzzy_boolean', {str(module)!r});"
        "m = importlib.util.module_from_spec(spec); sys.modules['fuzzy_boolean'] = m; spec.loader.exec_module(m);"
        "print([m.minimal_implicants(f.truth_table) for f in m.sample_functions(100, 5, seed=0)])"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1 and outputs.pop().startswith("[[(")


def test_form_changes_the_targets_only() -> None:
    """`form` keeps the truth tables and points of a seed and changes the values inside the cube."""
    canonical = make_fuzzy_boolean_tensors(points_per_function=500, seed=3)
    minimal = make_fuzzy_boolean_tensors(points_per_function=500, seed=3, form="minimal")
    for group in ("pretrain", "adapt"):
        for f, g in zip(canonical["functions"][group], minimal["functions"][group], strict=True):
            assert (f.form, g.form) == ("canonical", "minimal")
            np.testing.assert_array_equal(f.truth_table, g.truth_table)
            assert f != g
        for split in ("train", "test"):
            torch.testing.assert_close(canonical[group][split][0], minimal[group][split][0])
            assert not torch.allclose(canonical[group][split][1], minimal[group][split][1])
    datasets = make_fuzzy_boolean_datasets(points_per_function=500, seed=3, form="minimal")
    torch.testing.assert_close(datasets["adapt"]["test"][:]["labels"], minimal["adapt"]["test"][1])
    for call in (
        lambda: evaluate_truth_tables(np.zeros((2, N)), np.ones(2**N, bool), "dnf"),
        lambda: sample_functions(2, N, form="dnf"),
        lambda: FuzzyBooleanFunction(np.ones(2**N, bool), "dnf"),
        lambda: make_fuzzy_boolean_tensors(points_per_function=10, form="dnf"),
    ):
        with pytest.raises(ValueError, match=r"form must be one of \('canonical', 'minimal'\), got 'dnf'"):
            call()


def test_sample_functions_reproducible() -> None:
    """Same seed gives identical functions; different seeds give different ones; rows are ~Bernoulli(0.5)."""
    a, b, c = (sample_functions(30, N, seed=s) for s in (0, 0, 1))
    assert a == b and a != c
    frac = np.mean([f.truth_table.mean() for f in sample_functions(200, N, seed=7)])
    assert abs(frac - 0.5) < 0.02


def test_datasets_shapes_splits_and_columns() -> None:
    """Datasets have the paper's groups, 80/20 splits, and inputs/labels columns of the right widths."""
    data = make_fuzzy_boolean_datasets(points_per_function=1000, seed=0)
    assert set(data) == {"pretrain", "adapt", "functions"}
    assert len(data["functions"]["pretrain"]) == 20 and len(data["functions"]["adapt"]) == 10
    for group, width in (("pretrain", 20), ("adapt", 10)):
        dd = data[group]
        assert set(dd) == {"train", "test"}
        assert dd["train"].num_rows == 800 and dd["test"].num_rows == 200
        assert dd["train"].column_names == ["inputs", "labels"]
        batch = dd["train"][:16]
        assert batch["inputs"].shape == (16, N) and batch["inputs"].dtype == torch.float32
        assert batch["labels"].shape == (16, width) and batch["labels"].dtype == torch.float32
        assert dd["test"][0]["labels"].shape == (width,)
        x = dd["test"][:]["inputs"].double().numpy()
        expected = np.stack([f(x) for f in data["functions"][group]], axis=1)
        np.testing.assert_allclose(dd["test"][:]["labels"].numpy(), expected, rtol=1e-6, atol=1e-7)
    plain = make_fuzzy_boolean_datasets(points_per_function=100, torch_format=False)
    assert isinstance(plain["adapt"]["train"][0]["inputs"], list)


def test_tensors_match_datasets_and_seeds() -> None:
    """The tensor path gives the same data as the datasets path; seeds reproduce or change the data."""
    kwargs = {"num_pretrain_functions": 4, "num_adapt_functions": 3, "points_per_function": 500}
    tensors = make_fuzzy_boolean_tensors(seed=3, **kwargs)
    again = make_fuzzy_boolean_tensors(seed=3, **kwargs)
    other = make_fuzzy_boolean_tensors(seed=4, **kwargs)
    data = make_fuzzy_boolean_datasets(seed=3, **kwargs)
    assert tensors["functions"] == data["functions"] == again["functions"]
    assert tensors["functions"]["pretrain"] != other["functions"]["pretrain"]
    for group, width in (("pretrain", 4), ("adapt", 3)):
        for split, rows in (("train", 400), ("test", 100)):
            x, y = tensors[group][split]
            assert x.shape == (rows, N) and y.shape == (rows, width)
            assert x.dtype == y.dtype == torch.float32
            assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
            assert 0.0 <= float(y.min()) and float(y.max()) <= 1.0
            assert torch.equal(x, again[group][split][0]) and torch.equal(y, again[group][split][1])
            assert not torch.equal(x, other[group][split][0])
            assert torch.equal(x, data[group][split][:]["inputs"])
            assert torch.equal(y, data[group][split][:]["labels"])
    # The two groups use different input points.
    assert not torch.equal(tensors["pretrain"]["train"][0], tensors["adapt"]["train"][0])


def test_adapt_seed_redraws_only_the_adaptation_functions_and_points() -> None:
    kwargs = {"num_pretrain_functions": 4, "num_adapt_functions": 3, "points_per_function": 500, "seed": 3}
    base = make_fuzzy_boolean_tensors(**kwargs)
    redrawn = make_fuzzy_boolean_tensors(adapt_seed=7, **kwargs)
    again = make_fuzzy_boolean_datasets(adapt_seed=7, **kwargs)
    assert redrawn["functions"]["pretrain"] == base["functions"]["pretrain"]
    for split in ("train", "test"):
        assert all(
            torch.equal(a, b)
            for a, b in zip(redrawn["pretrain"][split], base["pretrain"][split], strict=True)
        )
        assert not torch.equal(redrawn["adapt"][split][0], base["adapt"][split][0])
        assert torch.equal(redrawn["adapt"][split][1], again["adapt"][split][:]["labels"])
    assert len(redrawn["functions"]["adapt"]) == 3
    assert set(redrawn["functions"]["adapt"]).isdisjoint(base["functions"]["adapt"])
    assert redrawn["functions"]["adapt"] == again["functions"]["adapt"]


def test_paper_sizes_are_fast() -> None:
    """The paper-sized tensors (163840 points, 20 + 10 functions) build quickly with the 131072/32768 split."""
    import time

    start = time.perf_counter()
    tensors = make_fuzzy_boolean_tensors()
    assert time.perf_counter() - start < 10.0
    assert tensors["pretrain"]["train"][1].shape == (131072, 20)
    assert tensors["adapt"]["test"][1].shape == (32768, 10)
    assert float(tensors["pretrain"]["train"][1].std(dim=0).min()) > 1e-2


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: sample_functions(2, -1), "num_variables"),
        (lambda: sample_functions(2, 2.5), "num_variables"),
        (lambda: sample_functions(-1, 3), "num_functions"),
        (lambda: truth_table_inputs(-1), "num_variables"),
        (lambda: make_fuzzy_boolean_tensors(2, -1, 3, points_per_function=10), "num_adapt_functions"),
        (lambda: make_fuzzy_boolean_tensors(2, 1, 3, points_per_function=-5), "points_per_function"),
        (lambda: make_fuzzy_boolean_tensors(2, 1, 3, points_per_function=10, seed=-1), "seed"),
        (lambda: make_fuzzy_boolean_datasets(2, 0, 3, points_per_function=10), "num_adapt_functions"),
        (lambda: FuzzyBooleanFunction(np.array([0, 1, 1, 0], bool))(torch.zeros(3, 3)), r"shape \(M, 2\)"),
        (lambda: FuzzyBooleanFunction(np.array([0, 1, 1, 0], bool))(torch.zeros(2)), r"shape \(M, 2\)"),
        (lambda: evaluate_truth_tables(np.zeros((1, 2)), np.ones((2, 2, 4))), "shape"),
        (lambda: evaluate_truth_tables(np.zeros((1, 3)), np.ones((2, 4))), r"2\*\*3 = 8 entries"),
    ],
)
def test_invalid_arguments_name_what_was_expected(call, match) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_the_constant_zero_function_is_plus_zero() -> None:
    value = FuzzyBooleanFunction(np.zeros(4, bool))(np.full((1, 2), 0.3))
    assert value[0] == 0.0 and not np.signbit(value[0])
