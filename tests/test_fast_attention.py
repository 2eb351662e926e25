"""Every registered line-of-code implementation computes the literal one, outputs and gradients (float64).

Eq. 6 is checked alone (`sdpa_attention` against `eager_attention`), every implementation one LOC at a time
(`LineOfCode` with random compatibilities, some of them 0, and a function that accepts no token), and whole models
in float64 against attn_implementation="eager". The CPU kernels of "fast" refuse what they do not compute.
"""

from __future__ import annotations

import pytest
import torch

import ni_hf
import ni_hf.kernels.fast_line_of_code as fast
from ni_hf import ALL_LINE_OF_CODE_FUNCTIONS, NeuralInterpreterForImageClassification, NeuralInterpreterModel
from ni_hf.models.neural_interpreter import modeling_neural_interpreter as modeling
from ni_hf.models.neural_interpreter.modeling_neural_interpreter import (
    eager_attention,
    eager_line_of_code,
    sdpa_attention,
)

IMPLEMENTATIONS = sorted(name for name in ALL_LINE_OF_CODE_FUNCTIONS if name != "eager")
SIZES = [
    (True, {"hidden_size": 8, "attention_head_size": 8}),  # every function reads one set: the bilinear form
    (True, {}),  # one set, q and k (the bilinear form does not pay)
    (False, {"hidden_size": 8, "attention_head_size": 8}),  # U streams: AttentionWithRecompute
]
SIZE_IDS = ["shared-bilinear", "shared-qk", "streams"]


def test_the_package_registers_fast_beside_eager_and_sdpa():
    assert {"eager", "sdpa", "fast"} <= set(ALL_LINE_OF_CODE_FUNCTIONS)
    assert ALL_LINE_OF_CODE_FUNCTIONS["fast"] is fast.fast_line_of_code


def test_the_registry_s_former_names_are_aliases_of_it(monkeypatch):
    """`ALL_ATTENTION_FUNCTIONS` and `NeuralInterpreterAttentionInterface` still work, for one release."""
    assert ni_hf.ALL_ATTENTION_FUNCTIONS is ALL_LINE_OF_CODE_FUNCTIONS
    assert "Deprecated" in ni_hf.NeuralInterpreterAttentionInterface.__doc__
    monkeypatch.setitem(ni_hf.NeuralInterpreterLineOfCodeInterface._global_mapping, "mine", lambda *a: None)
    ni_hf.NeuralInterpreterAttentionInterface.register("mine", fast.fast_line_of_code)
    assert ALL_LINE_OF_CODE_FUNCTIONS["mine"] is fast.fast_line_of_code


def _loc_and_inputs(tester, shared_input: bool, **overrides):
    """A float64 LOC with random weights, a (B, N, d) or (U, B, N, d) input, C with zeros, and its codes."""
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


def _assert_same_grads(names, other, reference):
    for name, g_other, g_reference in zip(names, other, reference, strict=True):
        if g_reference is None:
            assert g_other is None or (g_other == 0).all(), name
        else:
            torch.testing.assert_close(g_other, g_reference, atol=1e-9, rtol=1e-8, msg=name)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("shared_input,sizes", SIZES, ids=SIZE_IDS)
def test_sdpa_attention_computes_the_literal_eq6_and_its_gradients(tester, with_bias, shared_input, sizes):
    loc, x, c, codes = _loc_and_inputs(tester, shared_input, **sizes)
    x.requires_grad_()
    c.requires_grad_()
    leaves = [x, c, *loc.parameters()]
    results = []
    for attention in (eager_attention, sdpa_attention):
        bias = loc.position_bias(codes, 2) if with_bias else None
        attended, _ = attention(loc, loc.attention_norm(x), loc.function_weights(codes), c, bias, 0.0)
        results.append((attended, torch.autograd.grad(attended.square().sum(), leaves, allow_unused=True)))
    (literal, literal_grads), (other, other_grads) = results
    torch.testing.assert_close(other, literal, atol=1e-10, rtol=1e-9)
    _assert_same_grads(range(len(leaves)), other_grads, literal_grads)
    assert (other[c == 0] == 0).all()  # a query its function does not accept attends to nothing


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("shared_input,sizes", SIZES, ids=SIZE_IDS)
@pytest.mark.parametrize("chunked", [False, True], ids=["one-chunk", "chunks"])
def test_every_implementation_computes_the_literal_line_of_code_and_its_gradients(
    tester, monkeypatch, implementation, with_bias, shared_input, sizes, chunked
):
    """Eqs. 5-7: streams and every gradient, also when "fast" runs the batch in chunks (of one sample each)."""
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
    for line_of_code in (eager_line_of_code, ALL_LINE_OF_CODE_FUNCTIONS[implementation]):
        bias = loc.position_bias(codes, 2) if with_bias else None
        streams, _ = line_of_code(loc, x, c, loc.function_weights(codes), bias)
        # Weighted so that every stream element gets its own gradient, as Eq. 8's sum and the next LOC give.
        loss = (streams * torch.linspace(-1, 1, streams.numel(), dtype=torch.double).view_as(streams)).sum()
        results.append((streams, torch.autograd.grad(loss, leaves, allow_unused=True)))
    (reference, reference_grads), (other, other_grads) = results
    torch.testing.assert_close(other, reference, atol=1e-10, rtol=1e-9)
    _assert_same_grads(["x", "C", *dict(loc.named_parameters())], other_grads, reference_grads)


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
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[impl] = (out.logits, grads)
    (literal, literal_grads), (other, other_grads) = results["eager"], results[implementation]
    torch.testing.assert_close(other, literal, atol=1e-10, rtol=1e-9)
    assert other_grads.keys() == literal_grads.keys()
    for name, grad in literal_grads.items():
        torch.testing.assert_close(other_grads[name], grad, atol=1e-9, rtol=1e-8, msg=name)


def test_fast_takes_the_bilinear_form_only_where_every_function_reads_one_set(tester, monkeypatch):
    calls = []
    apply = fast.BilinearAttention.apply
    monkeypatch.setattr(fast.BilinearAttention, "apply", lambda *a: calls.append(1) or apply(*a))
    for shared_input, expected in ((True, [1]), (False, [])):
        calls.clear()
        loc, x, c, codes = _loc_and_inputs(tester, shared_input, hidden_size=8, attention_head_size=8)
        fast.fast_line_of_code(loc, x, c, loc.function_weights(codes), None)
        assert calls == expected


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


def test_fast_refuses_what_its_cpu_kernels_do_not_compute_and_names_sdpa(tester, monkeypatch):
    loc, x, c, codes = _loc_and_inputs(tester, shared_input=True)
    weights = loc.function_weights(codes)
    streams, attention_weights = fast.fast_line_of_code(loc, x, c, weights, None)
    assert streams.shape == (c.shape[0], *x.shape) and attention_weights is None
    with pytest.raises(
        RuntimeError, match='runs on a CPU only, and the model is on meta: use attn_implementation="sdpa"'
    ):
        fast.fast_line_of_code(loc, x.to("meta"), c.to("meta"), weights, None)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(RuntimeError, match="autocast"):
        fast.fast_line_of_code(loc, x, c, weights, None)
    loc.train()
    loc.config.hidden_dropout_prob = 0.1
    with pytest.raises(RuntimeError, match="has no dropout"):
        fast.fast_line_of_code(loc, x, c, weights, None)
    with (
        torch.no_grad()
    ):  # no training step (MC-dropout sampling): handed over to sdpa, which applies dropout
        torch.manual_seed(1)
        handed_over = fast.fast_line_of_code(loc, x, c, weights, None)[0]
        torch.manual_seed(1)
        torch.testing.assert_close(handed_over, modeling.sdpa_line_of_code(loc, x, c, weights, None)[0])
    loc.eval()  # dropout does not act in evaluation
    fast.fast_line_of_code(loc, x, c, weights, None)
    loc.config.hidden_dropout_prob = 0.0
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(RuntimeError, match="torch.compile"):
        fast.fast_line_of_code(loc, x, c, weights, None)


def test_fast_refuses_gradients_of_gradients(tester):
    loc, x, c, codes = _loc_and_inputs(tester, shared_input=False)
    x.requires_grad_()
    streams, _ = fast.fast_line_of_code(loc, x, c, loc.function_weights(codes), None)
    with pytest.raises(RuntimeError, match="attn_implementation='eager' or 'sdpa'"):
        torch.autograd.grad(streams.square().sum(), x, create_graph=True)


@pytest.mark.parametrize(
    "no_gradients", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inference_mode"]
)
def test_fast_applies_dropout_when_sampling_in_training_mode_without_gradients(tester, no_gradients):
    """MC-dropout: model.train() under no_grad or inference_mode samples different logits with "fast", the same
    samples as "sdpa" from the same seed."""
    config = tester.get_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    torch.manual_seed(0)
    model = NeuralInterpreterForImageClassification(config).train()
    pixel_values = tester.prepare_inputs(config)["pixel_values"]
    samples = {}
    for implementation in ("fast", "sdpa"):
        model.set_attn_implementation(implementation)
        with no_gradients():
            torch.manual_seed(3)
            first = model(pixel_values=pixel_values).logits
            second = model(pixel_values=pixel_values).logits
        samples[implementation] = first
        assert not torch.equal(first, second), implementation
    torch.testing.assert_close(samples["fast"], samples["sdpa"])
