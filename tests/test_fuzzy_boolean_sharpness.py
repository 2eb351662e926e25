"""Tests of examples/fuzzy_boolean_sharpness.py: the preconditioned-sharpness estimate, RAdam's terms, a smoke run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest
import torch
from _scripts import load_script

from ni_hf import NeuralInterpreterConfig, NeuralInterpreterForSetRegression

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "fuzzy_boolean_sharpness.py"


@pytest.fixture(scope="module")
def sharp() -> ModuleType:
    return load_script(SCRIPT, "fuzzy_boolean_sharpness")


class Quadratic(torch.nn.Module):
    """loss = 1/2 w^T A w - b^T w, whatever the inputs: its Hessian is A."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("a", a)
        self.register_buffer("b", b)
        self.w = torch.nn.Parameter(torch.zeros(a.shape[0]))
        self.unused = torch.nn.Parameter(torch.zeros(3))

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(loss=0.5 * self.w @ self.a @ self.w - self.b @ self.w)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-6), (torch.float32, 1e-3)])
def test_sharpness_is_the_top_eigenvalue_of_the_preconditioned_hessian(
    sharp: ModuleType, dtype: torch.dtype, tolerance: float
) -> None:
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    a = q @ np.diag([40.0, 9.0, 5.0, 2.0, 1.0, 0.5]) @ q.T
    p = rng.uniform(0.5, 2.0, size=6)
    model = Quadratic(torch.tensor(a, dtype=torch.float32), torch.ones(6))
    with torch.no_grad():
        model.w.normal_()  # not at the minimum: the gradient is not zero, the Hessian still A
    precond = {"w": torch.tensor(p, dtype=torch.float64)}
    estimate, _ = sharp.preconditioned_top_eigenpair(
        model, precond, torch.zeros(1), torch.zeros(1), 200, torch.Generator().manual_seed(0), dtype
    )
    scaled = a / np.sqrt(np.outer(p, p))  # P^-1/2 A P^-1/2
    expected = np.linalg.eigvalsh(scaled).max()
    assert estimate == pytest.approx(expected, rel=tolerance)
    assert expected != pytest.approx(np.linalg.eigvalsh(a).max(), rel=0.05)  # the preconditioner mattered


class TwoTensorQuadratic(torch.nn.Module):
    """loss = 1/2 (a^T diag(da) a + b^T diag(db) b): two parameter tensors with their own curvatures."""

    def __init__(self, da: list[float], db: list[float]) -> None:
        super().__init__()
        self.register_buffer("da", torch.tensor(da))
        self.register_buffer("db", torch.tensor(db))
        self.a = torch.nn.Parameter(torch.ones(len(da)))
        self.b = torch.nn.Parameter(torch.ones(len(db)))

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(loss=0.5 * (self.da * self.a**2).sum() + 0.5 * (self.db * self.b**2).sum())


@pytest.mark.parametrize("pb, expected_top", [(1.0, "b"), (100.0, "a")])
def test_top_direction_lies_in_the_tensor_whose_preconditioned_curvature_is_largest(
    sharp: ModuleType, pb: float, expected_top: str
) -> None:
    # Curvature 3 in a, 30 in b; dividing b's by a preconditioner of 100 moves the top direction into a.
    model = TwoTensorQuadratic([3.0, 1.0, 0.5], [30.0, 2.0])
    precond = {"a": torch.ones(3, dtype=torch.float64), "b": torch.full((2,), pb, dtype=torch.float64)}
    eigenvalue, vector = sharp.preconditioned_top_eigenpair(
        model, precond, torch.zeros(1), torch.zeros(1), 100, torch.Generator().manual_seed(0), torch.float64
    )
    assert eigenvalue == pytest.approx(30.0 / pb if expected_top == "b" else 3.0, rel=1e-6)
    shares = sharp.eigenvector_shares(vector)
    assert list(shares) == [expected_top, "a" if expected_top == "b" else "b"]  # largest first
    assert shares[expected_top] == pytest.approx(1.0, abs=1e-6)
    assert sum(shares.values()) == pytest.approx(1.0)


def test_preconditioner_and_rectification_match_torch_radam(sharp: ModuleType) -> None:
    model = Quadratic(torch.eye(4), torch.ones(4))
    opt = torch.optim.RAdam(model.parameters(), lr=0.01, betas=(0.9, 0.999), eps=1e-8)
    moved = []
    for _ in range(12):
        before = model.w.detach().clone()
        opt.zero_grad(set_to_none=True)
        # A constant gradient of -1 in every coordinate: m_hat = -1, v_hat = 1, so a step moves w by lr * r_t.
        model.w.grad = -torch.ones(4)
        opt.step()
        moved.append(float((model.w.detach() - before)[0]))
    precond = sharp.adam_preconditioner(opt, model)
    assert set(precond) == {"w"}  # "unused" has no gradient, no state, no part in the stability
    torch.testing.assert_close(precond["w"], torch.full((4,), 1 + 1e-8, dtype=torch.float64))
    for step, delta in enumerate(moved, start=1):
        r_t = sharp.radam_rectification(step, 0.999)
        # While r_t = 0 RAdam takes the momentum step lr * m_hat; afterwards lr * r_t * m_hat / (sqrt(v_hat) + eps).
        assert delta == pytest.approx(0.01 * (r_t if r_t > 0 else 1.0), rel=1e-4), step
    assert sharp.radam_rectification(5, 0.999) == 0.0
    assert 0 < sharp.radam_rectification(6, 0.999) < sharp.radam_rectification(100, 0.999) < 1
    assert sharp.radam_rectification(10**6, 0.999) == pytest.approx(1.0, abs=1e-3)


def test_smoke_run_writes_measurements(sharp: ModuleType, tmp_path: Path) -> None:
    config = NeuralInterpreterConfig.from_paper(
        "fuzzy_boolean", hidden_size=16, code_dim=16, attention_head_size=8, type_inference_hidden_size=16
    )
    torch.manual_seed(0)
    NeuralInterpreterForSetRegression(config).save_pretrained(tmp_path / "pretrain")
    out = tmp_path / "sharpness.json"
    threads = torch.get_num_threads()
    try:
        result = sharp.main(
            [
                "--pretrained_model",
                str(tmp_path / "pretrain"),
                "--points_per_function",
                "80",
                "--batch_size",
                "16",
                "--max_steps",
                "8",
                "--measure_every",
                "4",
                "--probe_points",
                "16",
                "--power_iterations",
                "3",
                "--num_threads",
                "1",
                "--output_json",
                str(out),
            ]
        )
    finally:
        torch.set_num_threads(threads)
    assert [m["step"] for m in result["measurements"]] == [4, 8]
    assert len(result["losses"]) == 8 and all(math.isfinite(x) for x in result["losses"])
    for m in result["measurements"]:
        assert math.isfinite(m["preconditioned_sharpness"]) and m["preconditioned_sharpness"] > 0
    at_4, at_8 = result["measurements"]
    assert at_4["stability_bound"] == math.inf  # step 4: RAdam still takes momentum steps (r_t = 0)
    assert at_8["stability_bound"] == pytest.approx(38 / (5e-2 * sharp.radam_rectification(8, 0.999)))
    assert result["trainable_parameters"]["task_tokens"] == 10 * 16
    for m in result["measurements"]:
        assert len(m["sigma"]) == config.num_scripts
        assert sum(m["top_direction_shares"].values()) == pytest.approx(1.0)
    assert json.loads(out.read_text())["measurements"] == result["measurements"]
