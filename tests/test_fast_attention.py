"""Every registered implementation of Eq. 6 computes the literal formula, outputs and gradients (float64).

The kernels are checked one LOC at a time (`LineOfCode` with random compatibilities, some of them 0, and a function
that accepts no token), and whole models in float64 against attn_implementation="eager".
"""

from __future__ import annotations

import pytest
import torch

import ni_hf.kernels.fast_line_of_code as fast
from ni_hf import ALL_ATTENTION_FUNCTIONS, NeuralInterpreterForImageClassification, NeuralInterpreterModel
from ni_hf.models.neural_interpreter.modeling_neural_interpreter import (
    ALL_LINE_OF_CODE_FUNCTIONS,
    eager_attention,
)

IMPLEMENTATIONS = sorted(name for name in ALL_ATTENTION_FUNCTIONS if name != "eager")


def test_fast_is_registered_by_the_package_and_the_default():
    assert {"eager", "sdpa", "fast"} <= set(ALL_ATTENTION_FUNCTIONS)
    assert ALL_ATTENTION_FUNCTIONS["fast"] is fast.fast_attention


def _loc_and_inputs(tester, shared_input: bool, **overrides):
    """A float64 LOC with random weights, a (B, N, d) or (U, B, N, d) input, C with zeros, and its biases."""
    torch.manual_seed(0)
    config = tester.get_config(**overrides)
    loc = NeuralInterpreterModel(config).scripts[0].locs[0].double()
    u, b, n = config.num_functions, 3, config.num_task_tokens + config.num_patches
    x = torch.randn((b, n, config.hidden_size) if shared_input else (u, b, n, config.hidden_size))
    c = torch.rand(u, b, n, dtype=torch.double)
    c[0, 0, 2] = 0.0  # one rejected token
    c[1] = 0.0  # a function that accepts no token
    codes = torch.randn(u, config.code_dim, dtype=torch.double)
    return loc, x.double(), c, codes


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize(
    "shared_input,sizes",
    [
        (True, {"hidden_size": 8, "attention_head_size": 8}),  # the fast path's bilinear form
        (True, {}),  # shared input, q and k (the bilinear form does not pay)
        (False, {"hidden_size": 8, "attention_head_size": 8}),  # streams: AttentionWithRecompute
    ],
    ids=["shared-bilinear", "shared-qk", "streams"],
)
def test_every_implementation_computes_the_literal_eq6_and_its_gradients(
    tester, implementation, with_bias, shared_input, sizes
):
    loc, x, c, codes = _loc_and_inputs(tester, shared_input, **sizes)
    x.requires_grad_()
    c.requires_grad_()
    leaves = [x, c, *(p for p in loc.parameters())]
    results = []
    for attention in (eager_attention, ALL_ATTENTION_FUNCTIONS[implementation]):
        weights = loc.function_weights(codes)
        bias = loc.position_bias(codes, 2) if with_bias else None
        attended, _ = attention(loc, loc.attention_norm(x), weights, c, bias, 0.0)
        grads = torch.autograd.grad(attended.square().sum(), leaves, allow_unused=True)
        results.append((attended, grads))
    (literal, literal_grads), (other, other_grads) = results
    assert torch.isfinite(other).all()
    torch.testing.assert_close(other, literal, atol=1e-10, rtol=1e-9)
    for g_other, g_literal in zip(other_grads, literal_grads, strict=True):
        if g_literal is None:
            assert g_other is None or (g_other == 0).all()
        else:
            torch.testing.assert_close(g_other, g_literal, atol=1e-9, rtol=1e-8)
    assert (other[c == 0] == 0).all()  # a query its function does not accept attends to nothing


def test_fast_path_takes_the_bilinear_form_where_every_function_reads_one_set(tester, monkeypatch):
    calls = []
    apply = fast.BilinearAttention.apply
    monkeypatch.setattr(fast.BilinearAttention, "apply", lambda *a: calls.append(1) or apply(*a))
    for shared_input, expected in ((True, [1]), (False, [])):
        calls.clear()
        loc, x, c, codes = _loc_and_inputs(tester, shared_input, hidden_size=8, attention_head_size=8)
        fast.fast_attention(loc, loc.attention_norm(x), loc.function_weights(codes), c, None)
        assert calls == expected


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("bilinear", [False, True], ids=["qk", "bilinear"])
def test_whole_models_agree_with_the_literal_model_in_float64(tester, implementation, bilinear):
    """Logits and every parameter's gradient, training mode without dropout, sparse routing."""
    overrides = {"hidden_size": 8, "attention_head_size": 8} if bilinear else {}
    config = tester.get_config(truncation_tau=0.9, **overrides)
    torch.manual_seed(0)
    model = NeuralInterpreterForImageClassification(config).double().train()
    inputs = tester.prepare_inputs(config)
    inputs["pixel_values"] = inputs["pixel_values"].double()
    results = {}
    for impl in ("eager", implementation):
        model.set_attn_implementation(impl)
        model.zero_grad()
        out = model(**inputs)
        out.loss.backward()
        results[impl] = (
            out.logits,
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        )
    (literal, literal_grads), (other, other_grads) = results["eager"], results[implementation]
    torch.testing.assert_close(other, literal, atol=1e-10, rtol=1e-9)
    assert other_grads.keys() == literal_grads.keys()
    for name, grad in literal_grads.items():
        torch.testing.assert_close(other_grads[name], grad, atol=1e-9, rtol=1e-8, msg=name)


def test_fast_is_sdpa_under_attention_dropout_and_off_the_cpu(tester, monkeypatch):
    seen = []
    monkeypatch.setattr(fast, "sdpa_attention", lambda *a: seen.append(1) or (a[1], None))
    loc, x, c, codes = _loc_and_inputs(tester, shared_input=True)
    fast.fast_attention(loc, x, loc.function_weights(codes), c, None, 0.1)
    assert seen == [1]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    fast.fast_attention(loc, x, loc.function_weights(codes), c, None, 0.0)
    assert seen == [1, 1]


def test_bilinear_form_is_chosen_where_it_costs_fewer_flops():
    """Digits preset (d 192 < 2 x 128, N 67): yes. Fuzzy-Boolean preset (d 128 > 2 x 32, N 25): no."""
    assert fast.bilinear_attention_pays(192, 128, 67)
    assert not fast.bilinear_attention_pays(128, 32, 25)
    assert not fast.bilinear_attention_pays(16, 4, 20)


def test_bilinear_form_is_left_to_batches_large_enough_to_repay_forming_its_matrices():
    """Forming A_uh costs d^2 d_h per call: the digits preset's batch 1 and 2 take q and k instead."""
    assert [fast.bilinear_attention_pays(192, 128, 67, b) for b in (1, 2, 3, 128)] == [
        False,
        False,
        True,
        True,
    ]
    assert not any(fast.bilinear_attention_pays(128, 32, 25, b) for b in (1, 10**6))


def test_fast_is_registered_for_the_whole_line_of_code():
    assert ALL_LINE_OF_CODE_FUNCTIONS["fast"] is fast.fast_line_of_code


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize(
    "shared_input,sizes",
    [
        (True, {"hidden_size": 8, "attention_head_size": 8}),
        (True, {}),
        (False, {"hidden_size": 8, "attention_head_size": 8}),
    ],
    ids=["shared-bilinear", "shared-qk", "streams"],
)
@pytest.mark.parametrize("chunked", [False, True], ids=["one-chunk", "chunks"])
def test_fast_line_of_code_computes_the_reference_loc_and_its_gradients(
    tester, monkeypatch, with_bias, shared_input, sizes, chunked
):
    """Eqs. 5-7 with the gated ModLins, the MLP's LayerNorm and GELU inside Functions: streams and every gradient,
    also when the batch runs in chunks (of one sample each here)."""
    if chunked:
        monkeypatch.setattr(fast, "CHUNK_NUMBERS", 1)
    loc, x, c, codes = _loc_and_inputs(tester, shared_input, **sizes)
    if chunked:
        assert len(fast._batch_chunks(x, c, loc)) == 3
    loc.train()
    x.requires_grad_()
    c.requires_grad_()
    leaves = [x, c, *loc.parameters()]
    results = []
    for implementation in ("eager", "fast"):
        loc.config._attn_implementation = implementation
        bias = loc.position_bias(codes, 2) if with_bias else None
        streams, _ = loc(x, c, loc.function_weights(codes), bias)
        # Weighted so that every stream element gets its own gradient, as Eq. 8's sum and the next LOC give.
        loss = (streams * torch.linspace(-1, 1, streams.numel(), dtype=torch.double).view_as(streams)).sum()
        results.append((streams, torch.autograd.grad(loss, leaves, allow_unused=True)))
    (reference, reference_grads), (fused, fused_grads) = results
    torch.testing.assert_close(fused, reference, atol=1e-10, rtol=1e-9)
    for name, g_fused, g_reference in zip(
        ["x", "C", *dict(loc.named_parameters())], fused_grads, reference_grads, strict=True
    ):
        if g_reference is None:
            assert g_fused is None or (g_fused == 0).all(), name
        else:
            torch.testing.assert_close(g_fused, g_reference, atol=1e-9, rtol=1e-8, msg=name)


def test_fast_line_of_code_steps_aside_under_dropout_compilers_and_autocast(tester, monkeypatch):
    loc, x, c, codes = _loc_and_inputs(tester, shared_input=True)
    weights = loc.function_weights(codes)
    assert fast.fast_line_of_code(loc, x, c, weights, None) is not None
    loc.train()
    loc.config.hidden_dropout_prob = 0.1
    assert fast.fast_line_of_code(loc, x, c, weights, None) is None
    loc.eval()  # dropout does not act in evaluation
    assert fast.fast_line_of_code(loc, x, c, weights, None) is not None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fast.fast_line_of_code(loc, x, c, weights, None) is None
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert fast.fast_line_of_code(loc, x, c, weights, None) is None


def test_fast_line_of_code_refuses_gradients_of_gradients(tester):
    loc, x, c, codes = _loc_and_inputs(tester, shared_input=False)
    loc.config._attn_implementation = "fast"
    x.requires_grad_()
    streams, _ = loc(x, c, loc.function_weights(codes))
    with pytest.raises(RuntimeError, match="attn_implementation='eager' or 'sdpa'"):
        torch.autograd.grad(streams.square().sum(), x, create_graph=True)
