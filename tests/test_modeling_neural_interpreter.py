"""Tests of the Neural Interpreter models (transformers' ModelTester pattern plus behaviour tests)."""

from __future__ import annotations

import copy
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import ni_hf
from ni_hf import (
    NeuralInterpreterConfig,
    NeuralInterpreterForImageClassification,
    NeuralInterpreterForSetRegression,
    NeuralInterpreterModel,
    modeling_neural_interpreter,
)
from ni_hf.modeling_neural_interpreter import (
    EAGER_FORMULATIONS,
    LineOfCode,
    RelativePositionalBias,
    _AttentionOutput,
    _AttentionWithRecompute,
    _BilinearAttention,
    _GatedModLin,
    _GatedModLinSum,
    _NormModLin,
    _thread_split,
    bilinear_attention_pays,
    enable_activation_checkpointing,
    function_bmm,
    function_weight_grad,
    modulated_attention_aligned,
    modulated_attention_bilinear,
    modulated_attention_columns,
    modulated_attention_eager,
    modulated_attention_eager_bilinear,
    modulated_attention_fused,
    modulated_attention_matmul,
    modulated_attention_sdpa,
    modulated_attention_sdpa_kernel,
    patchify,
    set_eager_formulation,
)


class NeuralInterpreterModelTester:
    """Tiny configs and `create_and_check_*` methods, as in transformers' test suite."""

    def __init__(self, batch_size: int = 3, **overrides) -> None:
        self.batch_size = batch_size
        self.settings = dict(
            hidden_size=16,
            code_dim=8,
            num_scripts=2,
            num_function_iterations=[2, 1],
            num_loc_layers=2,
            num_functions=3,
            num_attention_heads=2,
            attention_head_size=4,
            type_inference_hidden_size=12,
            type_dim=6,
            truncation_tau=1.4,
            image_size=8,
            patch_size=2,
            num_channels=3,
            task_names=["a", "b"],
            num_labels=5,
        )
        self.settings.update(overrides)

    def get_config(self, **overrides) -> NeuralInterpreterConfig:
        return NeuralInterpreterConfig(**{**self.settings, **overrides})

    def prepare_inputs(self, config: NeuralInterpreterConfig) -> dict[str, torch.Tensor]:
        b = self.batch_size
        return {
            "pixel_values": torch.randn(b, config.num_patches, config.patch_dim),
            "task_ids": torch.arange(b) % config.num_tasks,
            "labels": torch.arange(b) % config.num_labels,
        }

    def set_size(self, config: NeuralInterpreterConfig) -> int:
        return config.num_task_tokens + config.num_patches

    def create_and_check_model(self, config: NeuralInterpreterConfig) -> None:
        model = NeuralInterpreterModel(config).eval()
        inputs = self.prepare_inputs(config)
        out = model(pixel_values=inputs["pixel_values"], output_hidden_states=True, output_routing=True)
        n = self.set_size(config)
        assert out.last_hidden_state.shape == (self.batch_size, n, config.hidden_size)
        assert out.pooler_output.shape == (self.batch_size, config.num_tasks, config.hidden_size)
        iterations = sum(config.iterations_per_script)
        assert len(out.hidden_states) == iterations + 1
        assert len(out.compatibilities) == iterations
        assert out.compatibilities[0].shape == (self.batch_size, config.num_functions, n)
        assert out.types[0].shape == (self.batch_size, n, config.type_dim)

    def create_and_check_for_image_classification(self, config: NeuralInterpreterConfig) -> None:
        model = NeuralInterpreterForImageClassification(config).eval()
        out = model(**self.prepare_inputs(config))
        assert out.logits.shape == (self.batch_size, config.num_labels)
        assert out.loss.ndim == 0 and torch.isfinite(out.loss)

    def create_and_check_for_set_regression(self, config: NeuralInterpreterConfig) -> None:
        model = NeuralInterpreterForSetRegression(config).eval()
        x = torch.rand(self.batch_size, config.num_input_variables)
        y = torch.rand(self.batch_size, config.num_tasks)
        out = model(inputs=x, labels=y)
        assert out.predictions.shape == (self.batch_size, config.num_tasks)
        assert torch.isfinite(out.loss)


@pytest.fixture
def tester() -> NeuralInterpreterModelTester:
    torch.manual_seed(0)
    return NeuralInterpreterModelTester()


# --- shapes for every input kind ------------------------------------------------------------------


def test_model_output_shapes(tester):
    tester.create_and_check_model(tester.get_config())


def test_image_classification_output_shapes(tester):
    tester.create_and_check_for_image_classification(tester.get_config())


def test_shared_task_tokens_and_head(tester):
    config = tester.get_config(share_task_tokens=True)
    tester.create_and_check_for_image_classification(config)
    model = NeuralInterpreterForImageClassification(config)
    assert model.neural_interpreter.task_tokens.shape[0] == 1 and len(model.classifier) == 1


def test_set_regression_output_shapes(tester):
    tester.create_and_check_for_set_regression(tester.get_config(use_relative_positional_bias=False))


def test_images_and_patches_give_the_same_output(tester):
    config = tester.get_config()
    model = NeuralInterpreterModel(config).eval()
    images = torch.randn(2, config.num_channels, config.image_size, config.image_size)
    from_images = model(pixel_values=images).last_hidden_state
    from_patches = model(pixel_values=patchify(images, config.patch_size)).last_hidden_state
    torch.testing.assert_close(from_images, from_patches)


def test_patchify_layout_is_row_major_patches_of_row_col_channel():
    images = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)
    patches = patchify(images, 2)
    assert patches.shape == (2, 4, 12)
    # patch 1 is the top-right one; its element (row 1, col 0, channel 2) is pixel (2, 1, 2) of the image
    assert patches[0, 1, (1 * 2 + 0) * 3 + 2] == images[0, 2, 1, 2]


def test_inputs_embeds_set_of_vectors(tester):
    config = tester.get_config()
    model = NeuralInterpreterModel(config).eval()
    out = model(inputs_embeds=torch.randn(2, 7, config.hidden_size), output_routing=True)
    assert out.last_hidden_state.shape == (2, config.num_task_tokens + 7, config.hidden_size)
    assert out.compatibilities[0].shape == (2, config.num_functions, config.num_task_tokens + 7)


def test_paper_digits_preset_parameter_count():
    """The reference's 643,059 minus its 14,808 unused weights = 628,251 (shared CLS token and head)."""
    shared = NeuralInterpreterForImageClassification(
        NeuralInterpreterConfig.from_paper("digits", share_task_tokens=True)
    )
    assert sum(p.numel() for p in shared.parameters()) == 628_251
    assert sum(p.numel() for p in shared.parameters() if p.requires_grad) == 628_131  # signatures frozen
    per_task = NeuralInterpreterForImageClassification(NeuralInterpreterConfig.from_paper("digits"))
    # two more CLS tokens (2 x 192) and two more LayerNorm + Linear heads (2 x (384 + 1930))
    assert sum(p.numel() for p in per_task.parameters()) == 628_251 + 2 * 192 + 2 * (384 + 1930)


# --- attention: eager vs sdpa ------------------------------------------------------------------------


def _attention_inputs(u=3, b=2, h=2, n=6, hd=4, dv=5, reject_all_for=1):
    torch.manual_seed(1)
    q, k = torch.randn(b, u, h, n, hd), torch.randn(b, u, h, n, hd)
    v = torch.randn(b, u, h, n, dv)
    c = torch.rand(u, b, n) * 0.9 + 0.1
    c[0, 0, 2] = 0.0  # one rejected key
    c[reject_all_for] = 0.0  # a function that accepts no token at all
    bias = torch.randn(u, h, n, n)
    return q, k, v, c, bias


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize(
    "attention", [modulated_attention_sdpa_kernel, modulated_attention_matmul, modulated_attention_sdpa]
)
def test_fast_attention_paths_match_literal_formula_and_its_gradients(attention, with_bias):
    """The SDPA kernel (GPU path), the matmul path (CPU) and the dispatcher all compute Eq. 6 exactly."""
    q, k, v, c, bias = _attention_inputs()
    bias = bias if with_bias else None
    leaves = [t.requires_grad_() for t in (q, k, v, c)]
    results = []
    for fn in (modulated_attention_eager, attention):
        out = fn(q, k, v, c, bias, scale=0.5, eps=1e-6, dropout=0.0)
        grads = torch.autograd.grad(out.square().sum(), leaves)
        results.append((out, grads))
    (eager, eager_grads), (fast, fast_grads) = results
    assert torch.isfinite(fast).all() and torch.isfinite(eager).all()
    torch.testing.assert_close(fast, eager, atol=1e-5, rtol=1e-5)
    for name, g_fast, g_eager in zip("qkvc", fast_grads, eager_grads, strict=True):
        assert torch.isfinite(g_fast).all(), name
        torch.testing.assert_close(g_fast, g_eager, atol=1e-4, rtol=1e-4, msg=name)
    rejected = (c == 0).transpose(0, 1)[:, :, None, :]  # (B, U, 1, N): queries with C_ui = 0 get exactly 0
    assert (fast[rejected.expand(-1, -1, fast.shape[2], -1)] == 0).all()


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("alignment", [4, 8, 6])  # 6 tokens: padded to 8, to 8, and not at all
def test_token_aligned_attention_computes_eq6_and_its_gradients(with_bias, alignment):
    """Padding the tokens (C = 0, key logits -inf) changes the layout only: outputs and gradients as unpadded."""
    q, k, v, c, bias = _attention_inputs()
    bias = bias.requires_grad_() if with_bias else None
    leaves = [t.requires_grad_() for t in (q, k, v, c)] + ([bias] if with_bias else [])
    results = []
    for fn, kwargs in (
        (modulated_attention_eager, {}),
        (modulated_attention_aligned, {"alignment": alignment}),
    ):
        out = fn(q, k, v, c, bias, scale=0.5, eps=1e-6, dropout=0.0, **kwargs)
        results.append((out, torch.autograd.grad(out.square().sum(), leaves)))
    (eager, eager_grads), (aligned, aligned_grads) = results
    assert aligned.shape == eager.shape
    torch.testing.assert_close(aligned, eager, atol=1e-6, rtol=1e-6)
    for g_aligned, g_eager in zip(aligned_grads, eager_grads, strict=True):
        assert torch.isfinite(g_aligned).all()
        torch.testing.assert_close(g_aligned, g_eager, atol=1e-5, rtol=1e-5)  # summed in another order


def test_token_aligned_attention_takes_projections_of_padded_tokens():
    """q, k, v projected from padded tokens (their padded rows arbitrary): Eq. 6 on the real tokens as unpadded."""
    q, k, v, c, bias = _attention_inputs()
    n, pad = c.shape[-1], -c.shape[-1] % 8
    assert pad > 0
    padded = [torch.cat([t, torch.randn(*t.shape[:-2], pad, t.shape[-1])], dim=-2) for t in (q, k, v)]
    leaves = [t.requires_grad_() for t in (*padded, c, bias)]
    out = modulated_attention_aligned(*padded, c, bias, scale=0.5, eps=1e-6, dropout=0.0, alignment=8)
    expected = modulated_attention_eager(q, k, v, c, bias, scale=0.5, eps=1e-6, dropout=0.0)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    grads = torch.autograd.grad(out.square().sum(), leaves)
    for grad in grads[:3]:  # the padded rows get no gradient: they do not reach the output
        assert torch.isfinite(grad).all() and (grad[..., n:, :] == 0).all()


def _eager_model_and_inputs(tester):
    import ni_hf.modeling_neural_interpreter as modeling

    config = tester.get_config(truncation_tau=0.9)
    torch.manual_seed(0)
    model = NeuralInterpreterForImageClassification(config).eval()
    model.set_attn_implementation("eager")
    return modeling, config, model, tester.prepare_inputs(config)


def _record_calls(monkeypatch, module, name: str, measure=lambda first: tuple(first.shape)) -> list:
    """Wrap ``module.<name>`` to record ``measure(first argument)`` of every call (by default its shape)."""
    records, function = [], getattr(module, name)

    def recording(first, *args, **kwargs):
        records.append(measure(first))
        return function(first, *args, **kwargs)

    monkeypatch.setattr(module, name, recording)
    return records


def _record_query_tokens(monkeypatch, module, name: str) -> list[int]:
    """Wrap ``module.<name>`` (an attention function) to record the token count of every call's query."""
    return _record_calls(monkeypatch, module, name, lambda query: query.shape[-2])


def _logits_and_grads_per_setting(model, inputs, apply_setting, settings):
    """The model's logits and parameter gradients once per setting, `apply_setting(model, setting)` first."""
    results = []
    for setting in settings:
        apply_setting(model, setting)
        model.zero_grad()
        out = model(**inputs)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((out.logits.detach(), grads))
    return results


def test_a_model_with_token_aligned_locs_computes_the_same_function(tester, monkeypatch):
    """The LOCs' `token_alignment` (a GPU layout experiment of the benchmark) leaves logits and gradients as they are."""
    modeling, config, model, inputs = _eager_model_and_inputs(tester)
    token_counts = _record_query_tokens(monkeypatch, modeling, "modulated_attention_aligned")
    results = _logits_and_grads_per_setting(model, inputs, modeling.set_token_alignment, (1, 8))
    (logits, grads), (aligned_logits, aligned_grads) = results
    # every LOC ran it, on query rows projected from tokens padded to a multiple of 8 (67 -> 72 in the digits preset)
    assert token_counts and all(
        n % 8 == 0 and n > config.num_task_tokens + config.num_patches for n in token_counts
    )
    with pytest.raises(ValueError, match="positive number of tokens"):
        modeling.set_token_alignment(model, 0)
    torch.testing.assert_close(aligned_logits, logits, atol=1e-5, rtol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(aligned_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize(
    "n, dv", [(6, 5), (8, 7), (5, 9)]
)  # keys and columns padded, neither, both by 3 and 6
def test_fused_attention_computes_eq6_and_its_gradients(with_bias, n, dv):
    """SDPA on keys and [C v, C] columns padded to multiples of 8: Eq. 6 and its gradients, bias included."""
    q, k, _, c, bias = _attention_inputs(n=n)
    v = torch.randn(*k.shape[:-1], dv)
    leaves = [t.double().requires_grad_() for t in (q, k, v, c, bias)]
    q, k, v, c, bias = leaves
    bias = bias if with_bias else None
    calls = []

    def recording_sdpa(query, key, value, attn_mask=None, **kwargs):
        calls.append((key.shape[-2], value.shape[-1]))
        return sdpa(query, key, value, attn_mask=attn_mask, **kwargs)

    sdpa = torch.nn.functional.scaled_dot_product_attention
    with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", recording_sdpa):
        out = modulated_attention_fused(q, k, v, c, bias, scale=0.5, eps=1e-6, dropout=0.0)
    assert calls == [(-(-n // 8) * 8, -(-(dv + 1) // 8) * 8)]
    expected = modulated_attention_eager(q, k, v, c, bias, scale=0.5, eps=1e-6, dropout=0.0)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-10)
    used = leaves if with_bias else leaves[:4]
    grads = torch.autograd.grad(out.square().sum(), used)
    expected_grads = torch.autograd.grad(expected.square().sum(), used)
    for name, grad, expected_grad in zip("qkvcb", grads, expected_grads, strict=False):
        assert torch.isfinite(grad).all(), name
        torch.testing.assert_close(grad, expected_grad, atol=1e-10, rtol=1e-8, msg=name)


def test_a_model_with_fused_attention_computes_the_same_function(tester, monkeypatch):
    """`set_fused_attention` (a GPU experiment of the benchmark) routes every LOC through SDPA; same function."""
    modeling, config, model, inputs = _eager_model_and_inputs(tester)
    calls = _record_query_tokens(monkeypatch, modeling, "modulated_attention_fused")
    results = _logits_and_grads_per_setting(model, inputs, modeling.set_fused_attention, (False, True))
    loc_calls = config.num_loc_layers * sum(config.num_function_iterations)
    assert len(calls) == loc_calls  # every LOC call (LOCs x function iterations) ran it
    # with token alignment on too it takes precedence, and pads only its keys and columns, not the tokens
    modeling.set_token_alignment(model, 8)
    model(**inputs)
    assert len(calls) == 2 * loc_calls and set(calls) == {config.num_task_tokens + config.num_patches}
    (logits, grads), (fused_logits, fused_grads) = results
    torch.testing.assert_close(fused_logits, logits, atol=1e-5, rtol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(fused_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("with_bias", [False, True])
def test_eager_bilinear_logits_compute_eq6_and_its_gradients(with_bias):
    """Logits (h A_uh) . h with A_uh = W_q,uh^T W_k,uh in plain ops: Eq. 6 and its gradients (h, W_q, W_k, v, C, bias)."""
    torch.manual_seed(3)
    u, b, heads, n, d, dh, dv = 3, 2, 2, 6, 5, 4, 3
    _, _, v, c, bias = _attention_inputs(u=u, b=b, h=heads, n=n, hd=dh, dv=dv)
    hidden = torch.randn(b, n, d, dtype=torch.double)
    wq, wk = torch.randn(u, heads * dh, d) / 2, torch.randn(u, heads * dh, d) / 2
    leaves = [t.double().requires_grad_() for t in (wq, wk, v, c, bias)]
    wq, wk, v, c, bias = leaves
    leaves = [hidden.requires_grad_(), *leaves[: 4 + with_bias]]
    bias = bias if with_bias else None

    def split(w: torch.Tensor) -> torch.Tensor:  # (B, U, H, N, d_h), as the LOC's heads
        return torch.einsum("bnd,uod->buno", hidden, w).unflatten(-1, (heads, dh)).permute(0, 1, 3, 2, 4)

    expected = modulated_attention_eager(split(wq), split(wk), v, c, bias, scale=0.5, eps=1e-6, dropout=0.0)
    got = modulated_attention_eager_bilinear(hidden, wq, wk, v, c, bias, scale=0.5, eps=1e-6, dropout=0.0)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-10)
    grads = torch.autograd.grad(got.square().sum(), leaves)
    expected_grads = torch.autograd.grad(expected.square().sum(), leaves)
    for name, grad, expected_grad in zip(
        ["h", "wq", "wk", "v", "c", "bias"], grads, expected_grads, strict=False
    ):
        torch.testing.assert_close(grad, expected_grad, atol=1e-10, rtol=1e-8, msg=name)


@pytest.mark.parametrize("alignment", [1, 8], ids=["unpadded", "tokens-aligned"])
def test_a_model_with_bilinear_logits_computes_the_same_function(tester, monkeypatch, alignment):
    """`set_bilinear_logits` (a GPU experiment of the benchmark) forms the logits of every first LOC of a function
    iteration (the one whose functions all read one h) in the bilinear form, also on tokens padded for alignment;
    same function."""
    modeling, config, model, inputs = _eager_model_and_inputs(tester)
    modeling.set_token_alignment(model, alignment)
    tokens = config.num_task_tokens + config.num_patches
    calls = _record_calls(monkeypatch, modeling, "modulated_attention_eager_bilinear")  # shapes of h
    results = _logits_and_grads_per_setting(model, inputs, modeling.set_bilinear_logits, (False, True))
    assert config.num_loc_layers > 1  # so the LOCs that read U streams are exercised too (they keep q and k)
    assert len(calls) == sum(config.num_function_iterations)
    assert {shape[1] for shape in calls} == {-(-tokens // alignment) * alignment}
    (logits, grads), (bilinear_logits, bilinear_grads) = results
    torch.testing.assert_close(bilinear_logits, logits, atol=1e-5, rtol=1e-5)
    assert bilinear_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(bilinear_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_columns_formulation_computes_eq6_as_the_eager_formulation_does() -> None:
    """softmax(q k^T + bias) @ [C v, C] / (eps + C total) in plain ops: the eager formulation's outputs and gradients,
    with zero compatibilities and a token no function reads; it refuses attention dropout by name."""
    torch.manual_seed(0)
    b, u, h, n = 2, 3, 2, 7
    query, key = (torch.randn(b, u, h, n, 5, dtype=torch.float64, requires_grad=True) for _ in range(2))
    value = torch.randn(b, u, h, n, 4, dtype=torch.float64, requires_grad=True)
    compatibilities = torch.rand(u, b, n, dtype=torch.float64)
    compatibilities[compatibilities < 0.3] = 0.0
    compatibilities[:, 0, 2] = 0.0  # a token no function reads
    compatibilities.requires_grad_(True)
    bias = torch.randn(u, h, n, n, dtype=torch.float64, requires_grad=True)
    inputs = (query, key, value, compatibilities, bias)
    weights = torch.randn(b, u, h, n, 4, dtype=torch.float64)
    results = []
    for attention in (modulated_attention_eager, modulated_attention_columns):
        out = attention(*inputs, scale=0.5, eps=1e-6, dropout=0.0)
        results.append((out, torch.autograd.grad((out * weights).sum(), inputs)))
    (eager, eager_grads), (columns, columns_grads) = results
    torch.testing.assert_close(columns, eager)
    for got, want in zip(columns_grads, eager_grads, strict=True):
        torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="dropout"):
        modulated_attention_columns(*inputs, scale=0.5, eps=1e-6, dropout=0.1)
    # the 4 + 1 columns padded with zeros to 8 for aligned GEMM rows: the same outputs and gradients
    products = _ProductShapes()
    with products:
        out = modulated_attention_columns(*inputs, scale=0.5, eps=1e-6, dropout=0.0, column_alignment=8)
    assert (b * u * h, n, 8) in products.second_operands
    torch.testing.assert_close(out, eager)
    for got, want in zip(torch.autograd.grad((out * weights).sum(), inputs), eager_grads, strict=True):
        torch.testing.assert_close(got, want)


class _ProductShapes(TorchDispatchMode):
    """Records the shape of the second operand of every batched matrix product dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.second_operands: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.bmm.default:
            self.second_operands.append(tuple(args[1].shape))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("alignment", [1, 8], ids=["unpadded", "tokens-aligned"])
@pytest.mark.parametrize("bilinear", [False, True], ids=["q-k", "bilinear"])
def test_a_model_with_columns_attention_computes_the_same_function(tester, monkeypatch, bilinear, alignment):
    """`set_columns_attention` (a GPU experiment of the benchmark) computes Eq. 6 without N x N modulated weights in
    every LOC, after q.k or after bilinear logits, also on tokens padded for alignment; same function."""
    modeling, config, model, inputs = _eager_model_and_inputs(tester)
    modeling.set_bilinear_logits(model, bilinear)
    modeling.set_token_alignment(model, alignment)
    tokens = config.num_task_tokens + config.num_patches
    calls = _record_calls(
        monkeypatch, modeling, "_modulated_attention_columns_from_logits"
    )  # shapes of logits
    results = _logits_and_grads_per_setting(model, inputs, modeling.set_columns_attention, (False, True))
    assert len(calls) == config.num_loc_layers * sum(config.num_function_iterations)
    assert {shape[-1] for shape in calls} == {-(-tokens // alignment) * alignment}  # the keys, padded or not
    (logits, grads), (columns_logits, columns_grads) = results
    torch.testing.assert_close(columns_logits, logits, atol=1e-5, rtol=1e-5)
    assert columns_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(columns_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    # with attention dropout in training the LOCs keep the eager formulation (dropout acts on W there)
    calls.clear()
    model.config.attention_probs_dropout_prob = 0.1
    model.train()(**inputs)
    assert calls == []


def test_matmul_path_reads_strided_query_and_key_views():
    """The LOC hands over permuted views of one projection; the result must not depend on the memory layout."""
    q, k, v, c, bias = _attention_inputs()
    strided = [t.permute(0, 3, 1, 2, 4).contiguous().permute(0, 2, 3, 1, 4) for t in (q, k, v)]
    assert not strided[0].is_contiguous()
    expected = modulated_attention_eager(q, k, v, c, bias, scale=0.5, eps=1e-6, dropout=0.0)
    got = modulated_attention_matmul(*strided, c, bias, scale=0.5, eps=1e-6, dropout=0.0)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("with_bias", [False, True])
def test_bilinear_attention_matches_literal_formula_and_its_gradients(with_bias):
    """q.k = h W_q^T W_k h^T: the bilinear form gives Eq. 6 and its gradients (h, W_q, W_k, W_v, b_v, C, bias)."""
    torch.manual_seed(2)
    u, b, heads, n, d, dh, dv = 3, 2, 2, 6, 5, 4, 3
    hidden = torch.randn(b, n, d)
    wq, wk = torch.randn(u, heads * dh, d) / 2, torch.randn(u, heads * dh, d) / 2
    wv, bv = torch.randn(u, heads * dv, d) / 2, torch.randn(u, heads * dv)
    _, _, _, c, bias = _attention_inputs(u=u, b=b, h=heads, n=n, hd=dh, dv=dv)
    bias = bias if with_bias else None
    leaves = [t.requires_grad_() for t in (hidden, wq, wk, wv, bv, c)] + (
        [bias.requires_grad_()] if with_bias else []
    )

    def split(w: torch.Tensor, size: int) -> torch.Tensor:  # (B, U, H, N, size), as the LOC's heads
        return torch.einsum("bnd,uod->buno", hidden, w).unflatten(-1, (heads, size)).permute(0, 1, 3, 2, 4)

    v = split(wv, dv) + bv.view(u, heads, 1, dv)
    literal = modulated_attention_eager(
        split(wq, dh), split(wk, dh), v, c, bias, scale=1.0, eps=1e-6, dropout=0.0
    )
    bilinear = modulated_attention_bilinear(hidden, wq, wk, wv, bv, c, bias, heads, eps=1e-6)
    torch.testing.assert_close(bilinear, literal, atol=1e-5, rtol=1e-5)
    expected = torch.autograd.grad(literal.square().sum(), leaves)
    got = torch.autograd.grad(bilinear.square().sum(), leaves)
    for name, g_got, g_expected in zip(
        ["h", "wq", "wk", "wv", "bv", "c", "bias"], got, expected, strict=False
    ):
        torch.testing.assert_close(g_got, g_expected, atol=1e-4, rtol=1e-4, msg=name)
    rejected = (c == 0).transpose(0, 1)[:, :, None, :]
    assert (bilinear[rejected.expand(-1, -1, heads, -1)] == 0).all()


@pytest.mark.parametrize("with_bias", [False, True])
def test_bilinear_attention_function_has_exact_gradients(with_bias):
    torch.manual_seed(0)
    b, u, h, n, d, dv = 2, 3, 2, 5, 4, 3
    hidden = torch.randn(b, n, d, dtype=torch.double)
    bilinear = torch.randn(u * h * d, d, dtype=torch.double) / 2
    value_weight = torch.randn(u * h * dv, d, dtype=torch.double) / 2
    value_bias = torch.randn(u * h * dv, dtype=torch.double)
    c_key = torch.rand(b, u, 1, n, 1, dtype=torch.double)
    c_key[0, 0, 0, 1] = 0.0
    inputs = [t.requires_grad_() for t in (hidden, bilinear, value_weight, value_bias, c_key)]
    if with_bias:
        inputs.append(torch.randn(u, h, n, n, dtype=torch.double, requires_grad=True))
        assert torch.autograd.gradcheck(lambda *a: _BilinearAttention.apply(*a, h, True, None), inputs)
    else:
        assert torch.autograd.gradcheck(lambda *a: _BilinearAttention.apply(*a, None, h, True, None), inputs)
        # a value projection without bias
        assert torch.autograd.gradcheck(
            lambda x, w, wv, c: _BilinearAttention.apply(x, w, wv, None, c, None, h, True, None),
            [hidden, bilinear, value_weight, c_key],
        )


def test_bilinear_form_is_chosen_where_it_costs_fewer_flops():
    """Digits preset (d 192 < 2 x 128, N 67): yes. Fuzzy-Boolean preset (d 128 > 2 x 32, N 25): no."""
    assert bilinear_attention_pays(192, 128, 67)
    assert not bilinear_attention_pays(128, 32, 25)
    assert not bilinear_attention_pays(16, 4, 20)


def test_bilinear_form_is_left_to_batches_large_enough_to_repay_forming_its_matrices():
    """Forming A_uh costs d^2 d_h per call: the digits preset's batch 1 and 2 take q and k instead."""
    assert [bilinear_attention_pays(192, 128, 67, b) for b in (1, 2, 3, 128)] == [False, False, True, True]
    assert not any(bilinear_attention_pays(128, 32, 25, b) for b in (1, 10**6))


def test_a_single_image_costs_the_digits_presets_forward_flops_of_an_image_in_a_batch():
    """Batch 1 (as under `pipeline`) within the issue's 2.2 GFLOP per image; it was 3.5 with the bilinear form."""
    from torch.utils.flop_counter import FlopCounterMode

    model = NeuralInterpreterForImageClassification(NeuralInterpreterConfig.from_paper("digits")).eval()
    per_image = {}
    for batch_size in (1, 16):
        pixels = torch.randn(batch_size, model.config.num_patches, model.config.patch_dim)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(pixel_values=pixels)
        per_image[batch_size] = counter.get_total_flops() / batch_size
    assert per_image[1] <= 2.2e9
    assert per_image[1] <= 1.1 * per_image[16]


def test_models_using_the_bilinear_form_agree_with_eager(tester, monkeypatch):
    """A config where the bilinear form pays: sdpa (bilinear in each iteration's first LOC) == eager, gradients too."""
    calls = []
    original = modeling_neural_interpreter.modulated_attention_bilinear

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(modeling_neural_interpreter, "modulated_attention_bilinear", counting)
    config = tester.get_config(hidden_size=8, attention_head_size=8, truncation_tau=0.9)
    torch.manual_seed(0)
    model = NeuralInterpreterForImageClassification(config).eval()
    inputs = tester.prepare_inputs(config)
    results = {}
    for impl in ("eager", "sdpa"):
        model.set_attn_implementation(impl)
        model.zero_grad()
        out = model(**inputs)
        out.loss.backward()
        results[impl] = (
            out.logits,
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        )
    # 3 function iterations (2 + 1), each with one first LOC reading a shared set; the second LOCs do not.
    assert len(calls) == sum(config.num_function_iterations)
    torch.testing.assert_close(results["sdpa"][0], results["eager"][0], atol=1e-5, rtol=1e-5)
    assert results["sdpa"][1].keys() == results["eager"][1].keys()
    for name, grad in results["eager"][1].items():
        torch.testing.assert_close(results["sdpa"][1][name], grad, atol=1e-4, rtol=1e-4, msg=name)
    calls.clear()
    model.train()  # with attention dropout the bilinear form is not used
    model.config.attention_probs_dropout_prob = 0.1
    model(**inputs)
    assert calls == []


# --- memory-lean custom autograd Functions: exact gradients (float64 finite differences) -------------------


@pytest.mark.parametrize("with_bias", [False, True])
def test_attention_with_recompute_has_exact_gradients(with_bias):
    torch.manual_seed(0)
    b, u, h, n, dh, dv = 2, 3, 2, 5, 4, 3
    q, k = torch.randn(b, u, h, n, dh, dtype=torch.double), torch.randn(b, u, h, n, dh, dtype=torch.double)
    v = torch.randn(b, u, h, n, dv, dtype=torch.double)
    c_key = torch.rand(b, u, 1, n, 1, dtype=torch.double)
    c_key[0, 0, 0, 1] = 0.0
    bias = torch.randn(u, h, n, n, dtype=torch.double) if with_bias else None
    inputs = [t.requires_grad_() for t in (q, k, v, c_key)] + ([bias.requires_grad_()] if with_bias else [])
    if with_bias:
        assert torch.autograd.gradcheck(lambda *a: _AttentionWithRecompute.apply(*a, 0.7), inputs)
    else:
        assert torch.autograd.gradcheck(lambda *a: _AttentionWithRecompute.apply(*a, None, 0.7), inputs)


@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gated_mod_lin_has_exact_gradients(gelu, with_bias):
    torch.manual_seed(0)
    u, b, n, d_in, d_out = 3, 2, 4, 5, 6
    x = torch.randn(u, b, n, d_in, dtype=torch.double, requires_grad=True)
    weight = torch.randn(u, d_out, d_in, dtype=torch.double, requires_grad=True)
    bias = torch.randn(d_out, dtype=torch.double, requires_grad=True) if with_bias else None
    gate = torch.rand(u, b, n, 1, dtype=torch.double)
    gate[0, 0, 0] = 0.0  # a rejected token still gets its gate gradient
    gate.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x, w, g: _GatedModLin.apply(x, w, bias, g, gelu), (x, weight, gate)
    )
    if with_bias:
        assert torch.autograd.gradcheck(lambda b_: _GatedModLin.apply(x, weight, b_, gate, gelu), (bias,))


def _with_threads(monkeypatch, threads: int) -> None:
    """Make `_thread_split` see `threads` CPU threads (the thread pool itself is left as it is)."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)


@pytest.mark.parametrize(
    ("functions", "rows", "threads", "expected"),
    [
        (5, 8576, 1, 1),  # one thread: nothing to balance
        (5, 8576, 2, 2),  # the digits preset at batch 128 on 2 threads: 10 matrices, 5 per thread
        (4, 8576, 2, 1),  # already a multiple of the threads
        (5, 768, 4, 4),
        (6, 768, 4, 2),  # 12 matrices on 4 threads
        (5, 769, 2, 1),  # rows that do not divide
        (5, 200, 2, 1),  # chunks below MIN_SPLIT_ROWS
    ],
)
def test_thread_split_gives_every_thread_as_many_function_matrices(
    monkeypatch, functions, rows, threads, expected
):
    _with_threads(monkeypatch, threads)
    assert _thread_split(torch.empty(functions, rows, 4)) == expected


def test_thread_split_leaves_views_it_cannot_reshape_and_other_devices_alone(monkeypatch):
    _with_threads(monkeypatch, 2)
    assert _thread_split(torch.empty(1, 8576, 4).expand(5, -1, -1)) == 1  # a stride-0 function dimension
    assert _thread_split(torch.empty(5, 4, 8576).transpose(1, 2)) == 1
    assert _thread_split(torch.empty(5, 8576, 4, device="meta")) == 1


class _BatchedProducts(TorchDispatchMode):
    """Records the batch count of every bmm / baddbmm."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.bmm, torch.ops.aten.baddbmm):
            self.batches.append(args[-1].shape[0])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("threads", [2, 4])
def test_thread_balanced_function_products_equal_plain_batched_products(monkeypatch, threads):
    torch.manual_seed(0)
    u, m, k, n = 3, 512, 6, 5
    a = torch.randn(u, m, k, dtype=torch.double, requires_grad=True)
    b = torch.randn(u, k, n, dtype=torch.double, requires_grad=True)
    bias = torch.randn(u, 1, n, dtype=torch.double, requires_grad=True)
    c = torch.randn(u, m, n, dtype=torch.double)
    _with_threads(monkeypatch, threads)
    with _BatchedProducts() as products:
        y, y_bias, w = function_bmm(a, b), function_bmm(a, b, bias), function_weight_grad(a, c)
    assert products.batches == [u * threads] * 3  # each function's rows in `threads` chunks
    torch.testing.assert_close(y, torch.bmm(a, b))
    torch.testing.assert_close(y_bias, torch.baddbmm(bias, a, b))
    with torch.no_grad():  # into a given buffer, as `_Workspace` buffers are given, through the same split
        for given_bias, expected in ((None, y), (bias, y_bias)):
            out = torch.full((u, m, n), float("nan"), dtype=torch.double)
            assert function_bmm(a, b, given_bias, out=out).data_ptr() == out.data_ptr()
            torch.testing.assert_close(out, expected)
    torch.testing.assert_close(w, torch.bmm(a.transpose(1, 2), c))
    assert torch.autograd.gradcheck(lambda *t: function_bmm(*t), (a[:, :256], b, bias))


def test_a_model_computes_the_same_function_with_its_products_split_for_the_threads(tester, monkeypatch):
    """Outputs and gradients of a training step, with the per-function products split for 2 threads or not."""
    monkeypatch.setattr(modeling_neural_interpreter, "MIN_SPLIT_ROWS", 1)
    config = tester.get_config(truncation_tau=0.9)
    torch.manual_seed(0)
    model = NeuralInterpreterForImageClassification(config).eval()  # no dropout: the same function twice
    inputs = NeuralInterpreterModelTester(batch_size=4).prepare_inputs(config)  # 4 x 18 tokens: even rows
    results = []
    for threads in (1, 2):
        _with_threads(monkeypatch, threads)
        with _BatchedProducts() as products:
            results.append(_logits_and_gradients(model, inputs))
        split = 2 * config.num_functions in products.batches
        assert split == (threads == 2)
    (logits, grads), (split_logits, split_grads) = results
    torch.testing.assert_close(split_logits, logits, atol=1e-6, rtol=1e-5)
    assert split_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(split_grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_norm_mod_lin_has_exact_gradients():
    torch.manual_seed(0)
    u, b, n, d_in, d_out = 3, 2, 4, 5, 6
    x = torch.randn(u, b, n, d_in, dtype=torch.double, requires_grad=True)
    norm_weight = torch.randn(d_in, dtype=torch.double, requires_grad=True)
    norm_bias = torch.randn(d_in, dtype=torch.double, requires_grad=True)
    weight = torch.randn(u, d_out, d_in, dtype=torch.double, requires_grad=True)
    bias = torch.randn(d_out, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *a: _NormModLin.apply(a[0], a[1], a[2], 1e-5, a[3], a[4], None),
        (x, norm_weight, norm_bias, weight, bias),
    )


def test_norm_mod_lin_normalises_a_bf16_stream_in_the_weights_float32_like_autocast():
    """Under autocast the stream can be bf16 while the LayerNorm weights stay float32. CUDA's layer-norm kernels
    take no mixed dtypes (the bf16 backward failed on an H100), so the norm runs on x in float32, as autocast's
    layer_norm does, and dL/dx comes back in x's dtype."""
    torch.manual_seed(0)
    u, b, n, d_in, d_out = 2, 3, 4, 8, 5
    x = torch.randn(u, b, n, d_in).to(torch.bfloat16).requires_grad_()
    norm = torch.nn.LayerNorm(d_in)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    weight = torch.randn(u, d_out, d_in, requires_grad=True)
    bias = torch.randn(d_out, requires_grad=True)
    out = _NormModLin.apply(x, norm.weight, norm.bias, norm.eps, weight, bias, None)
    assert out.dtype == torch.float32
    out.square().sum().backward()
    params = (norm.weight, norm.bias, weight, bias)
    grads = [p.grad.clone() for p in params]
    for param in params:
        param.grad = None

    reference_x = x.detach().float().requires_grad_()
    reference = norm(reference_x) @ weight.transpose(1, 2).unsqueeze(1) + bias
    torch.testing.assert_close(out.detach(), reference.detach())
    reference.square().sum().backward()
    assert x.grad.dtype == torch.bfloat16
    torch.testing.assert_close(x.grad, reference_x.grad.to(torch.bfloat16))
    for grad, param in zip(grads, params, strict=True):
        assert grad.dtype == torch.float32
        torch.testing.assert_close(grad, param.grad)


@pytest.mark.parametrize("shared_input", [True, False])
@pytest.mark.parametrize("with_bias", [False, True])
def test_attention_output_has_exact_gradients(with_bias, shared_input):
    """x + gate * ModLin(Eq. 6's division of A @ [C v, C], heads merged), recomputed in the backward; x is the
    (B, N, d) input every function shares, or (U, B, N, d) streams."""
    torch.manual_seed(0)
    b, u, h, n, dv, d_out = 2, 3, 2, 4, 3, 5
    columns = torch.randn(b, u, h, n, dv + 1, dtype=torch.double)
    columns[..., -1] = (
        torch.rand(b, u, h, n, dtype=torch.double) + 0.5
    )  # row sums of C-weighted probabilities
    c_key = torch.rand(b, u, 1, n, 1, dtype=torch.double)
    c_key[0, 1, 0, 2] = 0.0  # a query that its function rejects
    weight = torch.randn(u, d_out, h * dv, dtype=torch.double)
    bias = torch.randn(d_out, dtype=torch.double) if with_bias else None
    gate = c_key[:, :, 0].transpose(0, 1).clone()  # (U, B, N, 1), as the LOC passes C_ui twice
    x = torch.randn(*(() if shared_input else (u,)), b, n, d_out, dtype=torch.double)
    inputs = [t.requires_grad_() for t in (x, columns, c_key, weight, gate)]
    if with_bias:
        inputs.append(bias.requires_grad_())
    assert torch.autograd.gradcheck(
        lambda x_, c, ck, w, g, *b_: _AttentionOutput.apply(
            x_, c, ck, 1e-3, w, b_[0] if b_ else None, g, None
        ),
        inputs,
    )


@pytest.mark.parametrize("with_bias", [False, True])
def test_gated_mod_lin_sum_has_exact_gradients(with_bias):
    """sum_u C_u (a_u + C_u ModLin(GELU(x_u); c_u)), without keeping the streams."""
    torch.manual_seed(0)
    u, b, n, d = 3, 2, 4, 5
    a = torch.randn(u, b, n, d, dtype=torch.double, requires_grad=True)
    x = torch.randn(u, b, n, d, dtype=torch.double, requires_grad=True)
    weight = torch.randn(u, d, d, dtype=torch.double, requires_grad=True)
    gate = torch.rand(u, b, n, 1, dtype=torch.double)
    gate[1, 0, 3] = 0.0
    gate.requires_grad_()
    inputs = [a, x, weight, gate]
    if with_bias:
        inputs.append(torch.randn(d, dtype=torch.double, requires_grad=True))
    assert torch.autograd.gradcheck(
        lambda a_, x_, w, g, *b_: _GatedModLinSum.apply(a_, x_, w, b_[0] if b_ else None, g), inputs
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.double])
def test_gated_mod_lin_sum_backward_keeps_the_shared_gradient_expanded(dtype):
    """dL/dy of sum_u C_u y_u is one (B, N, d) for all functions: outside the reused float32 CPU buffers (GPUs,
    compiled graphs, other dtypes) the backward reads it as an expanded view. A (U, B, N, d) copy of it moved 0.41 GB
    more per compiled training step of the digits preset (benchmarks/memory_traffic.py, 2026-11-28)."""
    torch.manual_seed(0)
    u, b, n, d = 3, 2, 4, 5
    a, x = (torch.randn(u, b, n, d, dtype=dtype, requires_grad=True) for _ in range(2))
    weight = torch.randn(u, d, d, dtype=dtype, requires_grad=True)
    gate = torch.rand(u, b, n, 1, dtype=dtype, requires_grad=True)
    out = _GatedModLinSum.apply(a, x, weight, None, gate)
    with _CloneShapes() as clones:
        out.backward(torch.randn_like(out))
    assert (u, b, n, d) not in clones.shapes, clones.shapes
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (a, x, weight, gate))


@pytest.mark.parametrize("hidden_size,head_size", [(16, 4), (8, 8)])  # the q/k path and the bilinear form
def test_lean_training_keeps_neither_eq6_output_nor_the_streams(tester, hidden_size, head_size):
    """Per LOC, the backward keeps three (U, B, N, d)-sized tensors: v, a and the MLP's hidden layer.

    Eq. 6's normalised output is redone from the attention's columns and the streams are never formed, so
    neither is kept (before: five, with the merged heads and the streams). The bilinear form keeps v too (it
    redid v until 2026-11-28).
    """
    config = tester.get_config(
        hidden_size=hidden_size,
        attention_head_size=head_size,
        num_scripts=1,
        num_function_iterations=1,
        num_loc_layers=1,
    )
    model = NeuralInterpreterForImageClassification(config).train()
    inputs = tester.prepare_inputs(config)
    u, b, n, d = config.num_functions, tester.batch_size, tester.set_size(config), config.hidden_size
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept[t.untyped_storage().data_ptr()] = t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(**inputs).loss  # what the forward keeps; the backward's recomputations are transient
    assert bilinear_attention_pays(hidden_size, head_size, n, b) == (head_size == 8)  # both paths covered
    assert list(kept.values()).count(u * b * n * d) == 3
    loss.backward()


def _logits_and_gradients(
    model: torch.nn.Module, inputs: dict
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward and backward from zeroed gradients: the logits and every parameter's gradient."""
    model.zero_grad()
    out = model(**inputs)
    out.loss.backward()
    return out.logits, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_lean_equals_plain(lean: tuple, plain: tuple) -> None:
    (lean_logits, lean_grads), (plain_logits, plain_grads) = lean, plain
    torch.testing.assert_close(lean_logits, plain_logits, atol=1e-5, rtol=1e-5)
    assert lean_grads.keys() == plain_grads.keys()
    for name, grad in plain_grads.items():
        torch.testing.assert_close(lean_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_lean_loc_equals_the_plain_composition_in_outputs_and_gradients(tester):
    """Training with dropout takes the plain LOC (addcmul, nn.LayerNorm, F.gelu); p ~ 0 makes it comparable."""
    config = tester.get_config(hidden_dropout_prob=1e-12, truncation_tau=0.9)
    torch.manual_seed(0)
    model = NeuralInterpreterForImageClassification(config)
    inputs = tester.prepare_inputs(config)
    # eval: the lean Functions; train with dropout > 0: the plain modules
    lean = _logits_and_gradients(model.eval(), inputs)
    _assert_lean_equals_plain(lean, _logits_and_gradients(model.train(), inputs))


def test_switching_off_the_lean_functions_gives_the_same_outputs_and_gradients(tester, monkeypatch):
    """LEAN_CUSTOM_FUNCTIONS = False (benchmarks/diagnose_compile.py) runs the plain LOC, without dropout too."""
    import ni_hf.modeling_neural_interpreter as modeling

    config = tester.get_config(truncation_tau=0.9)
    torch.manual_seed(0)
    model = NeuralInterpreterForImageClassification(config).train()
    inputs = tester.prepare_inputs(config)
    calls, apply = [], modeling._AttentionOutput.apply
    monkeypatch.setattr(modeling._AttentionOutput, "apply", lambda *a: calls.append(1) or apply(*a))
    results = []
    for lean in (True, False):
        monkeypatch.setattr(modeling, "LEAN_CUSTOM_FUNCTIONS", lean)
        calls.clear()
        results.append(_logits_and_gradients(model, inputs))
        assert bool(calls) == lean  # the custom Function runs exactly when the switch is on
    _assert_lean_equals_plain(*results)


def test_sdpa_compiled_on_an_accelerator_runs_the_eager_formulation(monkeypatch):
    """The workaround for inductor's CUDA miscompile of the "sdpa" LOCs (benchmarks/RESULTS.md, 2026-11-27)."""
    import ni_hf.modeling_neural_interpreter as modeling

    choose = modeling.attention_implementation
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert choose("sdpa", cuda, compiling=True) == "eager"
    assert choose(None, cuda, compiling=True) == "eager"  # no implementation set means "sdpa"
    assert choose("sdpa", cuda, compiling=False) == "sdpa"  # eager mode keeps SDPA's kernel
    assert choose("sdpa", cpu, compiling=True) == "sdpa"  # the CPU paths compile right
    assert choose("eager", cpu, compiling=False) == "eager"
    monkeypatch.setattr(modeling, "EAGER_ATTENTION_WHEN_COMPILED_ON_ACCELERATOR", False)
    assert choose("sdpa", cuda, compiling=True) == "sdpa"  # the switch the diagnosis scripts turn off


def test_each_loc_runs_the_attention_that_attention_implementation_picks(tester, monkeypatch):
    """The LOCs ask `attention_implementation` with their device and compile state, and run what it returns."""
    import ni_hf.modeling_neural_interpreter as modeling

    config = tester.get_config(truncation_tau=0.9)
    torch.manual_seed(0)
    model = NeuralInterpreterForImageClassification(config).eval()  # "sdpa"
    inputs = tester.prepare_inputs(config)
    with torch.no_grad():
        reference = model(**inputs).logits
    asked = []

    def pick_eager(requested, device, compiling):
        asked.append((requested, device.type, compiling))
        return "eager"

    monkeypatch.setattr(modeling, "attention_implementation", pick_eager)
    called = []
    eager = modeling.ATTENTION_FUNCTIONS["eager"]
    monkeypatch.setitem(
        modeling.ATTENTION_FUNCTIONS, "eager", lambda *a, **k: called.append(1) or eager(*a, **k)
    )
    loc_calls = []
    for module in model.modules():
        if isinstance(module, modeling.LineOfCode):
            module.register_forward_hook(lambda *_: loc_calls.append(1))
    with torch.no_grad():
        logits = model(**inputs).logits
    assert asked and set(asked) == {("sdpa", "cpu", False)}
    assert loc_calls and len(called) == len(loc_calls)  # every LOC ran the picked (eager) attention
    torch.testing.assert_close(logits, reference, atol=1e-5, rtol=1e-4)  # the same function


@pytest.mark.parametrize("model_class", [NeuralInterpreterModel, NeuralInterpreterForImageClassification])
def test_eager_and_sdpa_models_agree_on_outputs_and_gradients(tester, model_class):
    config = tester.get_config(truncation_tau=0.9)  # sparse routing: many rejected pairs
    torch.manual_seed(0)
    model = model_class(config).eval()
    inputs = tester.prepare_inputs(config)
    if model_class is NeuralInterpreterModel:
        inputs = {"pixel_values": inputs["pixel_values"]}
    results = {}
    for impl in ("eager", "sdpa"):
        model.set_attn_implementation(impl)
        model.zero_grad()
        out = model(**inputs)
        value = out.loss if out.get("loss") is not None else out.last_hidden_state.square().mean()
        value.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[impl] = (out[1] if model_class is not NeuralInterpreterModel else out[0], grads)
    torch.testing.assert_close(results["sdpa"][0], results["eager"][0], atol=1e-5, rtol=1e-5)
    assert results["sdpa"][1].keys() == results["eager"][1].keys()
    for name, grad in results["eager"][1].items():
        torch.testing.assert_close(results["sdpa"][1][name], grad, atol=1e-4, rtol=1e-4, msg=name)


# --- LOC and routing properties ----------------------------------------------------------------------


def test_loc_leaves_a_stream_unchanged_where_compatibility_is_zero(tester):
    config = tester.get_config()
    loc = NeuralInterpreterModel(config).scripts[0].locs[0].eval()  # initialised weights
    u, b, n = config.num_functions, 2, config.num_task_tokens + config.num_patches
    x = torch.randn(u, b, n, config.hidden_size)
    c = torch.rand(u, b, n)
    c[1, 0, 3] = 0.0
    c[2] = 0.0
    codes = torch.randn(u, config.code_dim)
    for impl in ("eager", "sdpa"):
        config._attn_implementation = impl
        y = loc(x, c, codes, loc.position_bias(codes, config.num_task_tokens))
        torch.testing.assert_close(y[1, 0, 3], x[1, 0, 3], rtol=0, atol=0)
        torch.testing.assert_close(y[2], x[2], rtol=0, atol=0)
        assert not torch.allclose(y[0], x[0])


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_token_no_function_accepts_comes_out_zero_without_nan(tester, impl):
    config = tester.get_config(truncation_tau=0.0)  # a distance is 0 only for a perfect type match
    model = NeuralInterpreterForImageClassification(config)
    model.set_attn_implementation(impl)
    inputs = tester.prepare_inputs(config)
    out = model(**inputs, output_routing=True, output_hidden_states=True)
    assert all((c == 0).all() for c in out.compatibilities)
    assert (out.hidden_states[1] == 0).all()  # no function accepts any token: y_i = 0
    assert torch.isfinite(out.logits).all()
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_compatibilities_are_normalised_and_truncated(tester):
    config = tester.get_config(truncation_tau=1.0)
    model = NeuralInterpreterModel(config).eval()
    out = model(**{"pixel_values": tester.prepare_inputs(config)["pixel_values"]}, output_routing=True)
    script = model.scripts[0]
    types = out.types[0]
    distance = 1 - torch.einsum(
        "bnt,ut->bun", types, torch.nn.functional.normalize(script.signatures, dim=-1)
    )
    c = out.compatibilities[0]
    assert (c[distance > config.truncation_tau] == 0).all()
    assert (c[distance <= config.truncation_tau] > 0).all()
    sums = c.sum(1)
    accepted = (distance <= config.truncation_tau).any(1)
    torch.testing.assert_close(sums[accepted], torch.ones_like(sums[accepted]), atol=1e-5, rtol=0)


def _attentions_and_routing(model, config, inputs, **kwargs):
    out = model(**inputs, output_attentions=True, output_routing=True, **kwargs)
    iterations = sum(config.iterations_per_script)
    assert len(out.attentions) == iterations * config.num_loc_layers
    return out


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_output_attentions_are_the_weights_the_eager_forward_multiplies_the_values_with(
    tester, monkeypatch, impl
):
    """Every LOC's W (B, U, H, N, N), computed apart, equals the W that the eager formulation forms inside forward."""
    config = tester.get_config(truncation_tau=0.9, num_loc_layers=2)
    torch.manual_seed(0)
    model = NeuralInterpreterForImageClassification(config).eval()
    model.set_attn_implementation("eager")
    formed = []
    weights = modeling_neural_interpreter.modulated_attention_weights
    monkeypatch.setattr(
        modeling_neural_interpreter,
        "modulated_attention_weights",
        lambda *a: formed.append(weights(*a)) or formed[-1],
    )
    inputs = tester.prepare_inputs(config)
    out = _attentions_and_routing(model, config, inputs)
    assert len(formed) == 2 * len(out.attentions)  # attention_weights, then the eager forward, per LOC
    b, n = tester.batch_size, tester.set_size(config)
    for returned, apart, inside in zip(out.attentions, formed[0::2], formed[1::2], strict=True):
        assert returned.shape == (b, config.num_functions, config.num_attention_heads, n, n)
        torch.testing.assert_close(returned, apart, atol=0, rtol=0)
        torch.testing.assert_close(returned, inside, atol=1e-6, rtol=1e-5)
    # The other implementations return the same weights: they are formed apart, in the literal form.
    model.set_attn_implementation(impl)
    again = model(**inputs, output_attentions=True)
    for w, w_again in zip(out.attentions, again.attentions, strict=True):
        torch.testing.assert_close(w_again, w, atol=1e-6, rtol=1e-5)


def test_a_function_attends_only_between_tokens_it_accepts(tester):
    """W_uhij = 0 where C_ui = 0 or C_uj = 0 (Eq. 6), and each row of W sums to at most 1."""
    config = tester.get_config(truncation_tau=0.9)
    torch.manual_seed(0)
    model = NeuralInterpreterModel(config).eval()
    out = _attentions_and_routing(
        model, config, {"pixel_values": tester.prepare_inputs(config)["pixel_values"]}
    )
    c = out.compatibilities[0][:, :, None]  # (B, U, 1, N): the first iteration's, its one LOC
    w = out.attentions[0]
    assert (c == 0).any() and (c > 0).any()  # the test sees both kinds of token
    assert (w.masked_select((c == 0).unsqueeze(-1).expand_as(w)) == 0).all()  # rejected queries
    assert (w.masked_select((c == 0).unsqueeze(-2).expand_as(w)) == 0).all()  # rejected keys
    assert (w >= 0).all() and (w.sum(-1) <= 1 + 1e-6).all()


def test_output_attentions_follow_the_config_and_the_tuple_convention(tester, monkeypatch):
    config = tester.get_config()
    model = NeuralInterpreterForImageClassification(config).eval()
    inputs = tester.prepare_inputs(config)
    calls = []
    method = modeling_neural_interpreter.LineOfCode.attention_weights
    monkeypatch.setattr(
        modeling_neural_interpreter.LineOfCode, "attention_weights", lambda *a: calls.append(1) or method(*a)
    )
    assert model(**inputs).attentions is None and not calls  # not asked: not computed
    attentions = model(**inputs, output_attentions=True).attentions
    plain = model(**inputs, return_dict=False)
    with_attentions = model(**inputs, return_dict=False, output_attentions=True)
    assert len(with_attentions) == len(plain) + 1
    for w, w_tuple in zip(attentions, with_attentions[2], strict=True):  # (loss, logits, attentions)
        torch.testing.assert_close(w_tuple, w)
    model.set_attn_implementation("eager")
    config.output_attentions = True  # transformers' config flag (it asks for the eager implementation)
    assert len(model(**inputs).attentions) == len(attentions)
    regression = NeuralInterpreterForSetRegression(
        tester.get_config(use_relative_positional_bias=False)
    ).eval()
    x = torch.rand(2, regression.config.num_input_variables)
    assert (
        regression(inputs=x, output_attentions=True).attentions[0].shape[-1]
        == regression.config.num_tasks + x.shape[1]
    )


def test_truncated_pairs_get_zero_gradient_unless_straight_through(tester):
    for straight_through in (False, True):
        config = tester.get_config(truncation_tau=0.5, straight_through=straight_through, kernel_eps=0.0)
        script = NeuralInterpreterModel(config).scripts[0]
        types = torch.nn.functional.normalize(torch.randn(2, 5, config.type_dim), dim=-1).requires_grad_()
        c = script.compatibilities(types, None)
        weights = torch.randn_like(c)
        (c * weights).sum().backward()
        fully_rejected = (c == 0).all(0)  # tokens no function accepts: every C~ truncated
        if fully_rejected.any():
            grad_rejected = types.grad[fully_rejected]
            assert (grad_rejected == 0).all() != straight_through


def test_patch_order_equivariance_without_positional_bias(tester):
    config = tester.get_config(use_relative_positional_bias=False)
    model = NeuralInterpreterModel(config).eval()
    x = torch.randn(2, config.num_patches, config.patch_dim)
    perm = torch.randperm(config.num_patches)
    t = config.num_task_tokens
    out = model(pixel_values=x).last_hidden_state
    out_perm = model(pixel_values=x[:, perm]).last_hidden_state
    torch.testing.assert_close(out_perm[:, t:], out[:, t:][:, perm], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_perm[:, :t], out[:, :t], atol=1e-5, rtol=1e-5)


def test_positional_bias_breaks_patch_order_equivariance(tester):
    config = tester.get_config(use_relative_positional_bias=True)
    model = NeuralInterpreterModel(config).eval()
    x = torch.randn(2, config.num_patches, config.patch_dim)
    perm = torch.randperm(config.num_patches)
    out = model(pixel_values=x).last_hidden_state[:, config.num_task_tokens :]
    out_perm = model(pixel_values=x[:, perm]).last_hidden_state[:, config.num_task_tokens :]
    assert not torch.allclose(out_perm, out[:, perm], atol=1e-4)


class _CloneShapes(TorchDispatchMode):
    """Records the shape of every tensor that aten.clone makes (a copy into another memory order)."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # torch's signature
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket is torch.ops.aten.clone:
            self.shapes.append(tuple(out.shape))
        return out


def test_eager_attention_multiplies_the_projected_heads_without_copying_them(tester):
    """The eager formulation's q k^T and A v take the (B, U, H, N, .) heads as views (token-major projections):
    no head-major copy of q, k or v (the GPU's compiled path; each was a full copy per function iteration). One LOC
    per function, as in the paper's presets: a later LOC's input differs per function, and its heads are copied."""
    config = tester.get_config(num_function_iterations=[1, 1], num_loc_layers=1)
    model = NeuralInterpreterModel(config).eval()
    model.set_attn_implementation("eager")
    b, u, h = 2, config.num_functions, config.num_attention_heads
    with torch.no_grad(), _CloneShapes() as clones:
        model(pixel_values=torch.randn(b, config.num_patches, config.patch_dim))
    assert not [shape for shape in clones.shapes if shape[:3] == (b, u, h)], clones.shapes


def test_positional_bias_is_the_offset_tables_read_at_each_patch_pair(tester):
    """bias[u, h, p, q] = row[r_q - r_p] + col[c_q - c_p] + function term, for patches p, q; 0 with a task token."""
    config = tester.get_config(use_relative_positional_bias=True)
    module = RelativePositionalBias(config)
    for weight in module.parameters():
        nn.init.normal_(weight)
    codes = torch.randn(3, config.code_dim)
    t, g = 2, config.grid_size
    bias = module(codes, num_prefix_tokens=t)
    row_table = module.row_head_keys(module.row_offset_embeddings)
    col_table = module.col_head_keys(module.col_offset_embeddings)
    function_bias = module.row_function_keys(codes) + module.col_function_keys(codes)
    expected = torch.zeros(3, config.num_attention_heads, t + g * g, t + g * g)
    for p in range(g * g):
        for q in range(g * g):
            (rp, cp), (rq, cq) = divmod(p, g), divmod(q, g)
            pair = row_table[rq - rp + g - 1] + col_table[cq - cp + g - 1]
            expected[:, :, t + p, t + q] = pair + function_bias
    torch.testing.assert_close(bias, expected, atol=0, rtol=0)
    # and the gradients of the tables are those of the written-out sum
    weights = torch.randn_like(bias)
    grads = torch.autograd.grad((bias * weights).sum(), list(module.parameters()))
    expected_grads = torch.autograd.grad((expected * weights).sum(), list(module.parameters()))
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


def test_every_sample_sees_all_task_tokens(tester):
    """A sample's logits for task 0 are the same whatever other samples' tasks are: task ids only pick heads."""
    config = tester.get_config()
    model = NeuralInterpreterForImageClassification(config).eval()
    x = torch.randn(2, config.num_patches, config.patch_dim)
    a = model(pixel_values=x, task_ids=torch.tensor([0, 0])).logits
    b = model(pixel_values=x, task_ids=torch.tensor([0, 1])).logits
    torch.testing.assert_close(a[0], b[0])
    assert not torch.allclose(a[1], b[1])


# --- training: gradients and freezing -------------------------------------------------------------------


def test_gradients_reach_every_trainable_parameter_and_no_frozen_one(tester):
    # With one last iteration, the last LOC's positional bias only moves patch outputs, which no loss reads.
    config = tester.get_config(
        freeze_signatures=True,
        freeze_codes=False,
        freeze_patch_embedding=True,
        num_function_iterations=[2, 2],
    )
    model = NeuralInterpreterForImageClassification(config).train()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert any("signatures" in n for n in frozen) and any("patch_embedding" in n for n in frozen)
    assert not any("codes" in n for n in frozen)
    # every task's head must get a gradient: give each task a sample
    inputs = tester.prepare_inputs(config)
    model(**inputs).loss.backward()
    for name, p in model.named_parameters():
        if name in trainable:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None, name


def test_set_regression_gradients_reach_every_parameter(tester):
    config = tester.get_config(use_relative_positional_bias=False, freeze_signatures=False)
    model = NeuralInterpreterForSetRegression(config).train()
    out = model(inputs=torch.rand(4, config.num_input_variables), labels=torch.rand(4, config.num_tasks))
    out.loss.backward()
    # DDP without find_unused_parameters needs exactly this: every trainable tensor gets a gradient.
    unused = {"neural_interpreter.patch_embedding.weight", "neural_interpreter.patch_embedding.bias"}
    for name, p in model.named_parameters():
        if name in unused:
            assert not p.requires_grad and p.grad is None, name
        else:
            assert p.requires_grad and p.grad is not None and p.grad.abs().sum() > 0, name
    assert model.get_input_embeddings() is model.input_projection


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("bilinear", [False, True])
def test_gradient_checkpointing_gives_the_same_gradients(tester, bilinear, reentrant):
    config = tester.get_config(**({"hidden_size": 8, "attention_head_size": 8} if bilinear else {}))
    model = NeuralInterpreterForImageClassification(config).train()
    inputs = tester.prepare_inputs(config)
    model(**inputs).loss.backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    enable_activation_checkpointing(model, {"use_reentrant": reentrant})
    model(**inputs).loss.backward()
    for n, g in reference.items():
        torch.testing.assert_close(dict(model.named_parameters())[n].grad, g, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("bilinear", [False, True])
def test_code_modulations_are_formed_once_per_forward_not_per_function_iteration(
    tester, monkeypatch, bilinear
):
    """W diag(LayerNorm(W_c c_u)) of every ModLin, and A_uh of the bilinear form, are the same in every function
    iteration: formed once per forward (one per ModLin, one A per script's first LOC), however many iterations
    run. The same model with every LOC call forming its own gives the same loss and gradients."""
    import ni_hf.modeling_neural_interpreter as modeling

    overrides = {"hidden_size": 8, "attention_head_size": 8} if bilinear else {}
    config = tester.get_config(num_function_iterations=[3, 2], **overrides)
    torch.manual_seed(0)
    model = NeuralInterpreterForImageClassification(config).train()
    params = [p for p in model.parameters() if p.requires_grad]
    inputs = tester.prepare_inputs(config)
    modulations = _record_calls(monkeypatch, modeling.ModLin, "function_weights", lambda module: id(module))
    formed = _record_calls(monkeypatch, modeling, "bilinear_weight")
    loss = model(**inputs).loss
    modlins = [id(m) for m in model.modules() if isinstance(m, modeling.ModLin)]
    assert sorted(modulations) == sorted(modlins)  # each ModLin once
    assert len(formed) == (config.num_scripts if bilinear else 0)
    grads = torch.autograd.grad(loss, params)

    # Every LOC call forms its own weights (what the LOCs did before 2026-11-29).
    monkeypatch.setattr(
        modeling.NeuralInterpreterScript, "function_weights", lambda self, h: (None,) * len(self.locs)
    )
    modulations.clear()
    formed.clear()
    reference = model(**inputs).loss
    loc_calls = sum(config.iterations_per_script) * config.num_loc_layers
    assert len(modulations) == loc_calls * len(modlins) // (config.num_scripts * config.num_loc_layers)
    assert len(formed) == (sum(config.iterations_per_script) if bilinear else 0)
    torch.testing.assert_close(loss, reference, atol=0, rtol=0)
    for got, want in zip(grads, torch.autograd.grad(reference, params), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def _bilinear_model_and_batches(tester, sizes):
    """A tiny config in which the bilinear form pays (d = d_h), in training mode, and one batch per size."""
    config = tester.get_config(hidden_size=8, attention_head_size=8, truncation_tau=0.9)
    torch.manual_seed(0)
    model = NeuralInterpreterForImageClassification(config).train()
    batches = []
    for size in sizes:
        tester.batch_size = size
        batches.append(tester.prepare_inputs(config))
    return model, batches


@pytest.mark.parametrize("checkpointing", [False, True])
def test_reused_cpu_buffers_give_the_results_of_fresh_tensors(tester, monkeypatch, checkpointing):
    """The custom Functions write their transients into reused buffers (the bilinear form's, the gated ModLins'
    backwards): batches of other sizes, one after another, with or without activation checkpointing (which redoes
    forwards inside the backward), match fresh tensors. Two roles sharing a buffer would make them differ. The
    LOCs' biases are drawn away from their zero init, so that the gated ModLins' g . b in dL/dC (a product and a
    sum on the reused buffers, a matrix-vector product without them) counts."""
    model, batches = _bilinear_model_and_batches(tester, (3, 2, 3))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".locs." in name and name.endswith("bias"):
                parameter.normal_(std=0.5)
    if checkpointing:
        enable_activation_checkpointing(model)

    def run() -> list:
        results = []
        for inputs in batches:
            model.zero_grad()
            out = model(**inputs)
            out.loss.backward()
            results.append((out.logits, [p.grad.clone() for p in model.parameters() if p.grad is not None]))
        return results

    modeling_neural_interpreter.release_workspace()
    reused = run()
    assert modeling_neural_interpreter._WORKSPACE.buffers  # the buffers were used
    # dL/dC reaches type inference (not every pair truncated), so the gated backwards' dL/dC is compared too.
    assert model.neural_interpreter.scripts[0].type_inference.layers[-1].weight.grad.abs().max() > 1e-3
    # No reuse at all: neither the workspace nor the pool of kept tensors.
    monkeypatch.setattr(modeling_neural_interpreter, "_cpu_float32", lambda *tensors: False)
    fresh = run()
    for (logits, grads), (fresh_logits, fresh_grads) in zip(reused, fresh, strict=True):
        torch.testing.assert_close(logits, fresh_logits, atol=0, rtol=0)
        for g, f in zip(grads, fresh_grads, strict=True):
            torch.testing.assert_close(g, f, atol=1e-7, rtol=1e-6)


def test_reused_cpu_buffers_give_the_inference_results_of_fresh_tensors(tester, monkeypatch):
    """Without grad, a LOC's streams a, its MLP's hidden layer and the attention's columns go into reused buffers
    (`_output_buffer`): batches of other sizes, one after another, give the logits of fresh tensors, exactly."""
    model, batches = _bilinear_model_and_batches(tester, (3, 2, 3))
    model.eval()

    def run() -> list:
        with torch.no_grad():
            return [model(**inputs).logits for inputs in batches]

    modeling_neural_interpreter.release_workspace()
    reused = run()
    assert {"LOC a", "LOC hidden", "LOC attention"} <= modeling_neural_interpreter._WORKSPACE.buffers.keys()
    # No reuse at all: neither the workspace nor the pool of kept tensors.
    monkeypatch.setattr(modeling_neural_interpreter, "_cpu_float32", lambda *tensors: False)
    for logits, fresh in zip(reused, run(), strict=True):
        torch.testing.assert_close(logits, fresh, atol=0, rtol=0)


def test_training_after_a_forward_under_inference_mode(tester):
    """A forward under torch.inference_mode() makes the reused CPU buffers inference tensors, which take no in-place
    writes outside it: the training step after it must not fail, and computes the gradients it computes alone."""
    model, (inputs,) = _bilinear_model_and_batches(tester, (3,))
    modeling_neural_interpreter.release_workspace()
    model(**inputs).loss.backward()
    alone = _gradients(model)

    modeling_neural_interpreter.release_workspace()
    with torch.inference_mode():
        model(**inputs)
    assert any(b.is_inference() for b in modeling_neural_interpreter._WORKSPACE.buffers.values())
    model(**inputs).loss.backward()
    for g, ref in zip(_gradients(model), alone, strict=True):
        torch.testing.assert_close(g, ref, atol=0, rtol=0)
    with torch.inference_mode():  # and back: buffers made outside inference mode serve it as well
        model(**inputs)


def _gradients(model) -> list[torch.Tensor]:
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return grads


def test_kept_h_a_buffers_are_reused_by_the_next_step_but_never_while_a_graph_holds_them(tester):
    """The bilinear form keeps h A for its backward in pooled buffers: a buffer is handed out again only after the
    graph that holds it is gone, so two graphs alive at once (each backward run after both forwards) give the
    gradients of two separate steps, and the step after that takes its buffers from the pool, not new memory."""
    model, (first, second) = _bilinear_model_and_batches(tester, (3, 3))
    separate = []
    for inputs in (first, second):
        model(**inputs).loss.backward()
        separate.append(_gradients(model))

    modeling_neural_interpreter.release_workspace()
    loss_first, loss_second = model(**first).loss, model(**second).loss
    assert not modeling_neural_interpreter._KEPT.free  # both graphs hold their buffers
    loss_second.backward()
    second_grads = _gradients(model)
    loss_first.backward()
    first_grads = _gradients(model)
    for together, alone in zip((first_grads, second_grads), separate, strict=True):
        for g, ref in zip(together, alone, strict=True):
            torch.testing.assert_close(g, ref, atol=0, rtol=0)

    del loss_first, loss_second  # the graphs, and with them the kept tensors
    pooled = {b.data_ptr() for bases in modeling_neural_interpreter._KEPT.free.values() for b in bases}
    assert pooled, "the buffers went back to the pool"
    model(**first).loss.backward()
    after = {b.data_ptr() for bases in modeling_neural_interpreter._KEPT.free.values() for b in bases}
    assert after == pooled  # the step took the pooled buffers and gave the same ones back
    ni_hf.release_workspace()
    assert not modeling_neural_interpreter._KEPT.free


def test_kept_h_a_survives_retain_graph_and_a_step_in_between(tester):
    """backward(retain_graph=True), a whole other step, then a second backward of the first graph: h A of the first
    graph is still the one its forward computed (the buffer was not handed to the step in between)."""
    model, (first, other) = _bilinear_model_and_batches(tester, (3, 3))
    model(**first).loss.backward()
    reference = _gradients(model)

    loss = model(**first).loss
    loss.backward(retain_graph=True)
    _gradients(model)
    model(**other).loss.backward()
    _gradients(model)
    loss.backward()
    for g, ref in zip(_gradients(model), reference, strict=True):
        torch.testing.assert_close(g, ref, atol=0, rtol=0)


# --- forward options ------------------------------------------------------------------------------------


def test_fewer_function_iterations_run_and_change_the_output(tester):
    config = tester.get_config()
    model = NeuralInterpreterForImageClassification(config).eval()
    inputs = tester.prepare_inputs(config)
    full = model(**inputs, output_routing=True)
    fewer = model(**inputs, num_function_iterations=[1, 1], output_routing=True)
    assert len(fewer.compatibilities) == 2 and len(full.compatibilities) == 3
    assert not torch.allclose(full.logits, fewer.logits)
    same = model(**inputs, num_function_iterations=config.iterations_per_script)
    torch.testing.assert_close(same.logits, full.logits)


def test_disabled_functions_get_zero_compatibility_and_change_the_output(tester):
    config = tester.get_config(truncation_tau=1.99)
    model = NeuralInterpreterForImageClassification(config).eval()
    inputs = tester.prepare_inputs(config)
    full = model(**inputs)
    dropped = model(**inputs, disabled_functions=[1], output_routing=True)
    assert all((c[:, 1] == 0).all() for c in dropped.compatibilities)
    assert not torch.allclose(full.logits, dropped.logits)
    per_script = model(**inputs, disabled_functions={0: [0, 2]}, output_routing=True)
    assert (per_script.compatibilities[0][:, [0, 2]] == 0).all()
    assert (per_script.compatibilities[2][:, 0] > 0).any()  # script 1 untouched


def test_return_dict_false_gives_tuples(tester):
    config = tester.get_config()
    model = NeuralInterpreterForImageClassification(config).eval()
    out = model(**tester.prepare_inputs(config), return_dict=False)
    assert isinstance(out, tuple) and out[1].shape[-1] == config.num_labels


def test_default_task_is_used_without_task_ids(tester):
    config = tester.get_config(default_task=1)
    model = NeuralInterpreterForImageClassification(config).eval()
    x = tester.prepare_inputs(config)["pixel_values"]
    torch.testing.assert_close(
        model(pixel_values=x).logits,
        model(pixel_values=x, task_ids=torch.ones(x.shape[0], dtype=torch.long)).logits,
    )


def test_outer_residual_option_adds_the_input(tester):
    config = tester.get_config(outer_residual=True, truncation_tau=0.0)
    model = NeuralInterpreterModel(config).eval()
    out = model(pixel_values=tester.prepare_inputs(config)["pixel_values"], output_hidden_states=True)
    torch.testing.assert_close(out.hidden_states[1], out.hidden_states[0])  # nothing routed: y = x


def test_training_reduces_the_loss(tester):
    config = tester.get_config()
    torch.manual_seed(0)
    model = NeuralInterpreterForImageClassification(config).train()
    inputs = NeuralInterpreterModelTester(batch_size=8).prepare_inputs(config)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    first = model(**inputs).loss.item()
    for _ in range(20):
        opt.zero_grad()
        model(**inputs).loss.backward()
        opt.step()
    assert model(**inputs).loss.item() < 0.5 * first


# --- errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"truncation_tau": 2.0}, "truncation_tau"),
        ({"truncation_tau": -0.1}, "truncation_tau"),
        ({"patch_size": 3}, "must divide"),
        ({"hidden_size": 15}, "divisible"),
        ({"num_functions": 0}, "num_functions"),
        ({"num_function_iterations": [1]}, "num_function_iterations"),
        ({"task_names": ["a", "a"]}, "task_names"),
        ({"default_task": 5}, "default_task"),
        ({"sigma_init": 0.0}, "sigma_init"),
        ({"input_position_embedding_std": -1.0}, "input_position_embedding_std"),
        ({"input_position_embedding_placement": "layerwise"}, "every_loc"),
        ({"hidden_dropout_prob": 1.0}, "hidden_dropout_prob"),
    ],
)
def test_bad_configs_raise_clear_errors(tester, overrides, match):
    with pytest.raises(ValueError, match=match):
        tester.get_config(**overrides)


@pytest.mark.parametrize("std", [0.02, 1.0])
def test_set_inputs_positional_embeddings_start_at_the_configured_scale(tester, std):
    config = tester.get_config(
        input_position_embedding_std=std,
        num_input_variables=64,
        hidden_size=32,
        use_relative_positional_bias=False,
    )
    model = NeuralInterpreterForSetRegression(config)
    assert model.input_position_embeddings.std().item() == pytest.approx(std, rel=0.1)
    reloaded = NeuralInterpreterConfig.from_dict(config.to_dict())
    assert reloaded.input_position_embedding_std == std


def test_positions_every_loc_are_hidden_from_the_first_type_inference_but_reach_the_outputs(tester, tmp_path):
    """With `every_loc`, equal inputs get equal first types (no positions yet) yet distinct outputs."""
    torch.manual_seed(0)
    config = tester.get_config(
        num_input_variables=4,
        input_position_embedding_placement="every_loc",
        num_function_iterations=1,
        use_relative_positional_bias=False,
    )
    model = NeuralInterpreterForSetRegression(config).eval()
    inputs = torch.full((2, 4), 0.3)
    out = model(inputs=inputs, output_routing=True, output_hidden_states=True)
    first_types = out.types[0][:, config.num_task_tokens :]
    torch.testing.assert_close(first_types, first_types[:, :1].expand_as(first_types))
    last = out.hidden_states[-1][:, config.num_task_tokens :]
    assert (last[:, 1:] - last[:, :1]).abs().amax() > 1e-3
    model.save_pretrained(tmp_path)
    reloaded = NeuralInterpreterForSetRegression.from_pretrained(tmp_path).eval()
    assert reloaded.config.input_position_embedding_placement == "every_loc"
    torch.testing.assert_close(reloaded(inputs=inputs).predictions, out.predictions)
    with pytest.raises(ValueError, match="loc_position_embeddings"):
        model.neural_interpreter(
            inputs_embeds=torch.randn(2, 4, config.hidden_size), loc_position_embeddings=torch.randn(3, 7)
        )


def test_image_classifier_refuses_every_loc_positions_it_could_not_apply(tester):
    """Patches carry no learned absolute positions, so "every_loc" would change nothing: a clear error instead."""
    with pytest.raises(ValueError, match="use_relative_positional_bias"):
        NeuralInterpreterForImageClassification(
            tester.get_config(input_position_embedding_placement="every_loc")
        )


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(ValueError, match="digits"):
        NeuralInterpreterConfig.from_paper("imagenet")


def test_bad_inputs_raise_clear_errors(tester):
    config = tester.get_config()
    model = NeuralInterpreterForImageClassification(config).eval()
    good = tester.prepare_inputs(config)
    with pytest.raises(ValueError, match="patches"):
        model(pixel_values=torch.randn(2, 5, config.patch_dim))
    with pytest.raises(ValueError, match="Images must have shape"):
        model(pixel_values=torch.randn(2, 3, 7, 7))
    with pytest.raises(ValueError, match="task_ids"):
        model(pixel_values=good["pixel_values"], task_ids=torch.tensor([0, 1, 7]))
    with pytest.raises(ValueError, match="task_ids"):
        model(pixel_values=good["pixel_values"], task_ids=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="labels"):
        model(pixel_values=good["pixel_values"], labels=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="disabled_functions"):
        model(pixel_values=good["pixel_values"], disabled_functions=[9])
    with pytest.raises(ValueError, match="num_function_iterations"):
        model(pixel_values=good["pixel_values"], num_function_iterations=[1])
    with pytest.raises(ValueError, match="exactly one"):
        model.neural_interpreter()
    with pytest.raises(ValueError, match="inputs_embeds"):
        model.neural_interpreter(inputs_embeds=torch.randn(2, 4, config.hidden_size + 1))


@pytest.mark.parametrize("token_alignment", [1, 8])
@pytest.mark.parametrize("formulation", EAGER_FORMULATIONS)
def test_every_eager_formulation_gives_the_literal_outputs_and_gradients(
    tester, formulation, token_alignment
):
    """`set_eager_formulation` changes how Eq. 6 is formed, never the function (float64, whole model)."""
    config = tester.get_config(attn_implementation="eager", truncation_tau=1.9)
    inputs = tester.prepare_inputs(config)
    inputs["pixel_values"] = inputs["pixel_values"].double()
    literal = NeuralInterpreterForImageClassification(config).double().train()
    model = copy.deepcopy(literal)
    set_eager_formulation(model, formulation, token_alignment)
    locs = [m for m in model.modules() if isinstance(m, LineOfCode)]
    assert {(m.fused_attention, m.bilinear_logits, m.columns_attention, m.token_alignment) for m in locs} == {
        (formulation == "fused", "bilinear" in formulation, "columns" in formulation, token_alignment)
    }
    expected, got = literal(**inputs), model(**inputs)
    torch.testing.assert_close(got.logits, expected.logits, rtol=1e-9, atol=1e-10)
    expected.loss.backward()
    got.loss.backward()
    for (name, p), q in zip(model.named_parameters(), literal.parameters(), strict=True):
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-8, atol=1e-10, msg=name)
    with pytest.raises(ValueError, match="expected one of"):
        set_eager_formulation(model, "flash")


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.bool])
def test_integer_pixels_are_refused_instead_of_cast(tester, dtype):
    """Raw uint8 images passed without the processor would run as pixel values 0-255: an error names it."""
    config = tester.get_config()
    model = NeuralInterpreterForImageClassification(config).eval()
    images = torch.randint(0, 2, (2, config.num_channels, config.image_size, config.image_size)).to(dtype)
    with pytest.raises(ValueError, match=f"`pixel_values` must be a floating-point tensor.*{dtype}"):
        model(pixel_values=images)
    with pytest.raises(ValueError, match="`inputs_embeds` must be a floating-point tensor"):
        model.neural_interpreter(inputs_embeds=torch.ones(2, 4, config.hidden_size, dtype=dtype))
    assert model(pixel_values=images.float()).logits.shape == (2, config.num_labels)
    with pytest.raises(ValueError, match="`pixel_values` must be a floating-point tensor.*complex64"):
        model(pixel_values=images.to(torch.complex64))


def test_integer_set_inputs_are_refused_instead_of_cast(tester):
    config = tester.get_config(use_relative_positional_bias=False)
    model = NeuralInterpreterForSetRegression(config).eval()
    with pytest.raises(ValueError, match="`inputs` must be a floating-point tensor.*torch.int64"):
        model(inputs=torch.ones(2, config.num_input_variables, dtype=torch.long))


def test_config_round_trips_through_dict(tester):
    config = tester.get_config(num_function_iterations=[3, 1])
    again = NeuralInterpreterConfig.from_dict(copy.deepcopy(config.to_dict()))
    assert again.iterations_per_script == [3, 1] and again.task_names == ["a", "b"]


# --- adaptation: new tasks, new functions --------------------------------------------------------------


def test_reset_tasks_gives_fresh_tokens_and_heads_and_reloads(tester, tmp_path):
    config = tester.get_config()
    model = NeuralInterpreterForImageClassification(config).eval()
    scripts_before = {k: v.clone() for k, v in model.state_dict().items() if "scripts" in k}
    model.reset_tasks(["x", "y", "z"], num_labels=4)
    assert model.neural_interpreter.task_tokens.shape == (3, config.hidden_size)
    out = model(
        pixel_values=torch.randn(2, config.num_patches, config.patch_dim), task_ids=torch.tensor([2, 0])
    )
    assert out.logits.shape == (2, 4)
    for k, v in scripts_before.items():
        torch.testing.assert_close(model.state_dict()[k], v)  # the functions are kept
    model.save_pretrained(tmp_path)
    again = NeuralInterpreterForImageClassification.from_pretrained(tmp_path).eval()
    assert again.config.task_names == ["x", "y", "z"] and again.config.num_labels == 4
    x = torch.randn(2, config.num_patches, config.patch_dim)
    torch.testing.assert_close(again(pixel_values=x).logits, model(pixel_values=x).logits)


def test_add_functions_extends_every_script_and_reloads(tester, tmp_path):
    config = tester.get_config(truncation_tau=1.99)
    model = NeuralInterpreterForImageClassification(config).eval()
    x = torch.randn(2, config.num_patches, config.patch_dim)
    new = model.neural_interpreter.add_functions(2)
    assert new == [3, 4] and model.config.num_functions == 5
    out = model(pixel_values=x, output_routing=True)
    assert out.compatibilities[0].shape[1] == 5 and (out.compatibilities[0][:, 3:] > 0).any()
    model.save_pretrained(tmp_path)
    again = NeuralInterpreterForImageClassification.from_pretrained(tmp_path).eval()
    assert again.config.num_functions == 5
    torch.testing.assert_close(again(pixel_values=x).logits, model(pixel_values=x).logits)


def test_add_task_tokens_keeps_the_old_tokens_in_the_set_and_reloads(tester, tmp_path):
    config = tester.get_config(
        task_names=["a", "b"], num_input_variables=5, use_relative_positional_bias=False
    )
    model = NeuralInterpreterForSetRegression(config).eval()
    old = model.neural_interpreter.task_tokens.detach().clone()
    new = model.neural_interpreter.add_task_tokens(["c", "d", "e"])
    assert new == [2, 3, 4] and model.config.task_names == ["a", "b", "c", "d", "e"]
    tokens = model.neural_interpreter.task_tokens
    torch.testing.assert_close(tokens[:2], old)
    assert tokens.shape == (5, config.hidden_size) and not torch.equal(tokens[2], tokens[3])
    x = torch.rand(3, 5)
    predictions = model(inputs=x).predictions
    assert predictions.shape == (3, 5)
    # The old tokens take part: replacing them changes the new tasks' predictions.
    with torch.no_grad():
        tokens[:2] = torch.randn(2, config.hidden_size)
    assert not torch.allclose(model(inputs=x).predictions[:, 2:], predictions[:, 2:])
    model.save_pretrained(tmp_path)
    again = NeuralInterpreterForSetRegression.from_pretrained(tmp_path).eval()
    assert again.config.task_names == ["a", "b", "c", "d", "e"]
    torch.testing.assert_close(again(inputs=x).predictions, model(inputs=x).predictions)
    for bad in ([], ["a"], ["f", "f"]):
        with pytest.raises(ValueError, match="new, distinct names|at least one task|must be distinct"):
            model.neural_interpreter.add_task_tokens(bad)


def test_a_collapsed_or_negative_sigma_gives_no_nan(tester):
    config = tester.get_config()
    model = NeuralInterpreterForImageClassification(config).eval()
    for script in model.neural_interpreter.scripts:
        script.sigma.data.fill_(-1e-3)  # unclamped, exp(d / 1e-3) overflows to inf and inf / inf = NaN
    out = model(**tester.prepare_inputs(config))
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)


@pytest.mark.parametrize(
    "overrides", [{}, {"hidden_size": 8, "attention_head_size": 8}], ids=["qk", "bilinear"]
)
def test_bf16_autocast_forward_and_backward_give_float32_gradients_close_to_float32(tester, overrides):
    """The custom autograd Functions re-enter the forward's autocast state in their backward."""
    config = tester.get_config(**overrides)
    torch.manual_seed(0)
    model = NeuralInterpreterForImageClassification(config).train()
    inputs = tester.prepare_inputs(config)
    reference = model(**inputs)
    reference.loss.backward()
    reference_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**inputs)
    out.loss.backward()
    assert out.logits.dtype == torch.bfloat16
    torch.testing.assert_close(out.loss.float(), reference.loss, atol=0.05, rtol=0.05)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads.keys() == reference_grads.keys()
    total_error = sum((grads[n] - g).norm() ** 2 for n, g in reference_grads.items()) ** 0.5
    total_norm = sum(g.norm() ** 2 for g in reference_grads.values()) ** 0.5
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads.values())
    assert total_error / total_norm < 0.1


def test_routing_density_counts_the_routed_pairs(tester):
    """`ni_hf.evaluation.routing_density`: 1 with tau near 2 (distances lie in [0, 2]), 0 with tau = 0, else the count."""
    from ni_hf.evaluation import routing_density

    inputs = tester.prepare_inputs(tester.get_config())["pixel_values"]
    batches = [{"pixel_values": inputs[:2]}, {"pixel_values": inputs[2:]}]  # unequal batches weigh by pairs
    for tau, expected in ((1.999, 1.0), (0.0, 0.0)):
        model = NeuralInterpreterModel(tester.get_config(truncation_tau=tau))
        density = routing_density(model, batches)
        assert density["per_iteration"] == [expected] * 3 and density["mean"] == expected
    model = NeuralInterpreterModel(tester.get_config(truncation_tau=1.0))
    with torch.no_grad():
        compat = model.eval()(pixel_values=inputs, output_routing=True).compatibilities
    density = routing_density(model, batches)
    expected = [(c > 0).float().mean().item() for c in compat]
    assert 0 < min(expected) and max(expected) < 1  # tau 1.0 routes some pairs, not all
    assert density["per_iteration"] == pytest.approx(expected)
    assert density["functions_per_token_mean"] == pytest.approx(3 * sum(expected) / len(expected))  # U x mean
    assert density["num_samples"] == tester.batch_size and density["num_functions"] == 3
    with pytest.raises(ValueError, match="at least one batch"):
        routing_density(model, [])


def test_routing_density_restores_the_callers_training_mode(tester):
    """`routing_density` counts in eval mode, then hands the model back in the mode it came in (even on error)."""
    from ni_hf.evaluation import routing_density

    inputs = tester.prepare_inputs(tester.get_config())["pixel_values"]
    model = NeuralInterpreterModel(tester.get_config())
    for training in (True, False):
        model.train(training)
        routing_density(model, [{"pixel_values": inputs}])
        assert model.training is training and all(m.training is training for m in model.modules())
    model.train()
    with pytest.raises(ValueError, match="at least one batch"):
        routing_density(model, [])
    assert model.training


# --- robustness of the public API (found by an audit as a transformers user) ------------------------------


def test_refused_reset_tasks_leaves_the_model_unchanged(tester):
    model = NeuralInterpreterForImageClassification(tester.get_config()).eval()
    inputs = tester.prepare_inputs(tester.get_config())
    before = model(**inputs).logits
    for names, num_labels in (([], 3), (["x", "x"], None), ("mnist", None), (["x"], 0)):
        with pytest.raises(ValueError, match="task_names|num_labels"):
            model.reset_tasks(names, num_labels=num_labels)
    assert model.config.task_names == ["a", "b"] and model.config.num_labels == 5
    torch.testing.assert_close(model(**inputs).logits, before)


def test_add_tasks_gives_each_new_task_a_token_and_a_head_and_survives_save_load(tester, tmp_path):
    config = tester.get_config(initializer_range=0.02)
    model = NeuralInterpreterForImageClassification(config).eval()
    inputs = tester.prepare_inputs(config)
    old_tokens = model.neural_interpreter.task_tokens.detach().clone()
    old_head = copy.deepcopy(model.classifier[1].state_dict())
    assert model.add_tasks(["c", "d"]) == [2, 3]
    assert model.config.task_names == ["a", "b", "c", "d"] and len(model.classifier) == 4
    # The old tokens and heads are kept (their outputs move: every sample's set now holds the new tokens too);
    # the new heads are initialised as the model's own (std 0.02, zero bias).
    torch.testing.assert_close(model.neural_interpreter.task_tokens[:2], old_tokens)
    for name, value in model.classifier[1].state_dict().items():
        torch.testing.assert_close(value, old_head[name])
    assert model.classifier[3].linear.weight.std() < 0.05 and not model.classifier[3].linear.bias.any()
    out = model(pixel_values=inputs["pixel_values"], task_ids=torch.tensor([3, 2, 0]))
    model.save_pretrained(tmp_path)
    reloaded = NeuralInterpreterForImageClassification.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(
        reloaded(pixel_values=inputs["pixel_values"], task_ids=torch.tensor([3, 2, 0])).logits, out.logits
    )


def test_tasks_changed_on_the_backbone_alone_give_a_clear_error(tester):
    model = NeuralInterpreterForImageClassification(tester.get_config()).eval()
    model.neural_interpreter.add_task_tokens(["c"])
    with pytest.raises(ValueError, match="add_tasks"):
        model(**tester.prepare_inputs(tester.get_config()))


def test_problem_type_follows_transformers_classifiers(tester):
    x = torch.randn(4, 16, 12)
    regression = NeuralInterpreterForImageClassification(tester.get_config(num_labels=1))
    targets = torch.tensor([0.3, 0.7, 0.5, 0.9])
    out = regression(pixel_values=x, labels=targets)
    assert regression.config.problem_type == "regression"
    torch.testing.assert_close(out.loss, F.mse_loss(out.logits.squeeze(-1), targets))
    out.loss.backward()
    assert regression.classifier[0].linear.weight.grad.abs().sum() > 0

    multi = NeuralInterpreterForImageClassification(tester.get_config())
    labels = (torch.rand(4, 5) > 0.5).float()
    out = multi(pixel_values=x, labels=labels)
    assert multi.config.problem_type == "multi_label_classification"
    torch.testing.assert_close(out.loss, F.binary_cross_entropy_with_logits(out.logits, labels))
    with pytest.raises(ValueError, match=r"\(batch, num_labels\)"):
        multi(pixel_values=x, labels=torch.tensor([1.0, 2.0, 0.0, 1.0]))

    single = NeuralInterpreterForImageClassification(tester.get_config())
    out = single(pixel_values=x, labels=torch.tensor([1, 2, 0, 4]))
    assert single.config.problem_type == "single_label_classification"
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, torch.tensor([1, 2, 0, 4])))
    with pytest.raises(ValueError, match="integer class indices"):
        single(pixel_values=x, labels=torch.tensor([1.7, 2.2, 0.0, 4.0]))


def test_float_task_ids_are_refused_not_truncated(tester):
    model = NeuralInterpreterForImageClassification(tester.get_config())
    with pytest.raises(ValueError, match="integer task indices"):
        model(pixel_values=torch.randn(2, 16, 12), task_ids=torch.tensor([0.9, 1.7]))


def test_set_regression_refuses_a_positional_bias_it_would_never_use(tester):
    with pytest.raises(ValueError, match="use_relative_positional_bias"):
        NeuralInterpreterForSetRegression(tester.get_config(use_relative_positional_bias=True))


def test_frozen_unused_patch_embedding_stays_frozen_after_loading(tester, tmp_path):
    model = NeuralInterpreterForSetRegression(tester.get_config(use_relative_positional_bias=False))
    model.save_pretrained(tmp_path)
    reloaded = NeuralInterpreterForSetRegression.from_pretrained(tmp_path)
    assert not reloaded.neural_interpreter.patch_embedding.weight.requires_grad
    assert reloaded.get_input_embeddings() is reloaded.input_projection
    assert reloaded.num_parameters(only_trainable=True) == model.num_parameters(only_trainable=True)
    assert model.num_parameters(only_trainable=True) < model.num_parameters()


def test_double_backward_works_with_eager_and_says_so_with_sdpa(tester):
    """Gradient penalties need create_graph=True: eager supports it, sdpa's hand-written backwards name eager."""
    config = tester.get_config()
    inputs = tester.prepare_inputs(config)
    torch.manual_seed(0)
    model = NeuralInterpreterForImageClassification(config)
    tokens = model.neural_interpreter.task_tokens
    model.set_attn_implementation("eager")
    (grad,) = torch.autograd.grad(model(**inputs).loss, tokens, create_graph=True)
    (second,) = torch.autograd.grad(grad.pow(2).sum(), tokens)
    assert torch.isfinite(second).all() and second.abs().sum() > 0
    model.set_attn_implementation("sdpa")
    with pytest.raises(RuntimeError, match="attn_implementation='eager'"):
        torch.autograd.grad(model(**inputs).loss, tokens, create_graph=True)


def test_empty_batch_gives_a_clear_error(tester):
    config = tester.get_config(use_relative_positional_bias=False)
    with pytest.raises(ValueError, match="empty batch"):
        NeuralInterpreterForImageClassification(config)(pixel_values=torch.randn(0, 16, 12))
    with pytest.raises(ValueError, match="empty batch"):
        NeuralInterpreterForSetRegression(config)(inputs=torch.rand(0, config.num_input_variables))


def test_forward_options_accept_tensors_and_name_bad_values(tester):
    model = NeuralInterpreterForImageClassification(tester.get_config()).eval()
    x = torch.randn(2, 16, 12)
    as_list = model(pixel_values=x, disabled_functions=[0, 2]).logits
    torch.testing.assert_close(model(pixel_values=x, disabled_functions=torch.tensor([0, 2])).logits, as_list)
    torch.testing.assert_close(
        model(pixel_values=x, num_function_iterations=torch.tensor(1)).logits,
        model(pixel_values=x, num_function_iterations=1).logits,
    )
    with pytest.raises(ValueError, match="script indices 0..1"):
        model(pixel_values=x, disabled_functions={2: [0]})
    with pytest.raises(ValueError, match="num_function_iterations"):
        model(pixel_values=x, num_function_iterations=[1.5, 1])
    with pytest.raises(ValueError, match="num_new"):
        model.neural_interpreter.add_functions(1.5)


def test_inputs_embeds_take_the_model_dtype(tester):
    model = NeuralInterpreterModel(tester.get_config()).eval()
    x = torch.randn(2, 7, 16)
    torch.testing.assert_close(
        model(inputs_embeds=x.double()).last_hidden_state, model(inputs_embeds=x).last_hidden_state
    )


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_inputs_and_labels_are_refused_by_name(tester, bad):
    config = tester.get_config()
    inputs = tester.prepare_inputs(config)
    poisoned = inputs["pixel_values"].clone()
    poisoned[1, 2, 3] = bad
    for model in (NeuralInterpreterModel(config), NeuralInterpreterForImageClassification(config)):
        with pytest.raises(ValueError, match=r"`pixel_values` contains NaN or infinite values"):
            model(pixel_values=poisoned)
    with pytest.raises(ValueError, match=r"`inputs_embeds` contains NaN"):
        NeuralInterpreterModel(config)(inputs_embeds=torch.full((2, 3, config.hidden_size), bad))
    regression = NeuralInterpreterForSetRegression(tester.get_config(use_relative_positional_bias=False))
    x = torch.rand(2, config.num_input_variables)
    y = torch.rand(2, config.num_tasks)
    with pytest.raises(ValueError, match=r"`inputs` contains NaN"):
        regression(inputs=torch.where(x > 0.5, bad, x), labels=y)
    y[0, 1] = bad
    with pytest.raises(ValueError, match=r"`labels` contains NaN"):
        regression(inputs=x, labels=y)


def test_an_overflowing_forward_pass_raises_instead_of_returning_nan(tester):
    config = tester.get_config()
    model = NeuralInterpreterForImageClassification(config).eval()
    x = tester.prepare_inputs(config)["pixel_values"]
    assert torch.isfinite(model(pixel_values=x * 1e15).logits).all()  # large but representable: no error
    with pytest.raises(
        FloatingPointError, match=r"NaN or infinite values in `logits`: the inputs .* overflow"
    ):
        model(pixel_values=x * 1e25)  # finite, but LayerNorm's variance overflows float32
    with pytest.raises(FloatingPointError, match=r"in `last_hidden_state`"):
        model.neural_interpreter.checks_finite = True
        model.neural_interpreter(pixel_values=x * 1e25)


def test_a_forward_pass_with_diverged_weights_names_the_broken_parameters(tester):
    model = NeuralInterpreterForImageClassification(tester.get_config()).eval()
    with torch.no_grad():
        model.neural_interpreter.task_tokens[0, 0] = float("nan")
    with pytest.raises(
        FloatingPointError, match=r"parameters \['neural_interpreter.task_tokens'\] are already NaN"
    ):
        model(**tester.prepare_inputs(model.config))


def test_checks_finite_false_turns_the_check_off(tester):
    config = tester.get_config()
    model = NeuralInterpreterForImageClassification(config).eval()
    x = tester.prepare_inputs(config)["pixel_values"]
    model.checks_finite = False
    assert torch.isnan(model(pixel_values=x * float("nan")).logits).all()


def test_a_meta_device_model_runs_a_shape_only_forward_and_backward(tester):
    config = tester.get_config()
    with torch.device("meta"):
        model = NeuralInterpreterForImageClassification(config).train()
        inputs = tester.prepare_inputs(config)
        out = model(**inputs)
    assert out.logits.shape == (tester.batch_size, config.num_labels) and out.logits.is_meta
    out.loss.backward()
