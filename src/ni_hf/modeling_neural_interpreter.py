"""PyTorch Neural Interpreters ("Dynamic Inference with Neural Interpreters", Rahaman, Gondal et al., 2021).

Layout of the computation: every function u of a script runs on every token, so the U function streams
are folded into the leading (batch) dimension of one tensor, shape (U, B, N, d); per-function quantities
(code modulations, positional biases) are computed once per forward from the U code vectors, never per
token. Attention goes through one dispatch point: "sdpa" (torch's scaled_dot_product_attention with the
key compatibilities folded into the values; on CPU, where torch has no fused kernel for these head sizes, the
same computation with two batched matmuls) or "eager" (the literal formula of Eq. 6). Compiled on an accelerator,
"sdpa" runs the "eager" formulation (`attention_implementation`: a workaround for an inductor miscompile on CUDA).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.dynamic_module_utils import custom_object_save
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import ModelOutput

from .configuration_neural_interpreter import NeuralInterpreterConfig, validate_task_names

# ----------------------------------------------------------------------------------------------------------
# Outputs
# ----------------------------------------------------------------------------------------------------------


@dataclass
class NeuralInterpreterModelOutput(ModelOutput):
    """Output of the backbone.

    Args:
        last_hidden_state: (B, N, d) the set after the last function iteration (task tokens first).
        pooler_output: (B, T, d) the outputs of the T task (CLS) tokens.
        hidden_states: the set before the first and after every function iteration, each (B, N, d).
        attentions: Eq. 6's attention weights W of every (script, function iteration, LOC) in order, each
            (B, U, H, N, N): function u's weight of token j for token i at head h, before attention dropout.
        compatibilities: C of every (script, function iteration) in order, each (B, U, N).
        types: the types t of every (script, function iteration), each (B, N, d_type).
    """

    last_hidden_state: torch.FloatTensor | None = None
    pooler_output: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    compatibilities: tuple[torch.FloatTensor, ...] | None = None
    types: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class NeuralInterpreterImageClassifierOutput(ModelOutput):
    """Output of the multi-task image classifier.

    Args:
        loss: cross-entropy of `logits` against `labels`, when labels are given.
        logits: (B, num_labels) the logits of each sample's own task head.
        hidden_states / attentions / compatibilities / types: as in `NeuralInterpreterModelOutput`.
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    compatibilities: tuple[torch.FloatTensor, ...] | None = None
    types: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class NeuralInterpreterSetRegressionOutput(ModelOutput):
    """Output of the set-regression model (one scalar per task token).

    Args:
        loss: mean squared error of `predictions` against `labels`, when labels are given.
        predictions: (B, T) one regression output per task token.
        hidden_states / attentions / compatibilities / types: as in `NeuralInterpreterModelOutput`.
    """

    loss: torch.FloatTensor | None = None
    predictions: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    compatibilities: tuple[torch.FloatTensor, ...] | None = None
    types: tuple[torch.FloatTensor, ...] | None = None


# ----------------------------------------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------------------------------------


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, (H/p)(W/p), p*p*C), i.e. `b c (h p1) (w p2) -> b (h w) (p1 p2 c)`."""
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // patch_size, patch_size, w // patch_size, patch_size)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(
        b, (h // patch_size) * (w // patch_size), patch_size * patch_size * c
    )


class ModLin(nn.Module):
    """Code-modulated linear layer, Eq. 5: ModLin(x; c) = W (x * LayerNorm(W_c c)) + b."""

    def __init__(self, in_features: int, out_features: int, code_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.code_proj = nn.Linear(code_dim, in_features, bias=False)

    def function_weights(self, codes: torch.Tensor) -> torch.Tensor:
        """(U, out, in): W diag(LayerNorm(W_c c_u)) for every function; computed once per forward."""
        modulation = F.layer_norm(self.code_proj(codes), (self.in_features,))
        return self.weight.unsqueeze(0) * modulation.unsqueeze(1)

    def function_bias(self, num_functions: int) -> torch.Tensor | None:
        return None if self.bias is None else self.bias.expand(num_functions, -1)

    def forward(self, x: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """x (U, B, N, in) or (B, N, in) shared by all functions -> (U, B, N, out)."""
        return apply_function_weights(x, self.function_weights(codes), self.function_bias(codes.shape[0]))


# Smallest chunk of rows `_thread_split` cuts a function's matrix into: below it a GEMM is too small to pay.
MIN_SPLIT_ROWS = 128


def _thread_split(a: torch.Tensor) -> int:
    """Chunks to cut each function's rows of a (U, M, K) into so that every CPU thread gets as many matrices.

    torch's CPU bmm is MKL's sgemm_batch, which hands whole matrices to threads: U = 5 functions on 2 threads run as
    3 rounds, the last on one thread (161 against 193 GFLOP/s for the (5, 8576, 192) @ (5, 192, 192) products of the
    digits preset at batch 128; benchmarks/RESULTS.md). 1 where that cannot happen or splitting cannot help: on
    accelerators, while compiling, exporting or tracing (one graph for every thread count), with one thread, when a's
    function batches are not one stride of its rows (expanded or transposed views), or when the rows do not divide.
    """
    if a.device.type != "cpu" or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return 1
    threads = torch.get_num_threads()
    num_functions, rows = a.shape[0], a.shape[1]
    if threads <= 1 or num_functions % threads == 0:
        return 1
    split = threads // math.gcd(num_functions, threads)
    if rows % split or rows // split < MIN_SPLIT_ROWS or a.stride(0) != rows * a.stride(1):
        return 1
    return split


def _repeat_functions(t: torch.Tensor, split: int) -> torch.Tensor:
    """(U, ...) -> (U * split, ...): each function's entry repeated for its `split` chunks of rows."""
    return t.unsqueeze(1).expand(t.shape[0], split, *t.shape[1:]).reshape(-1, *t.shape[1:])


def function_bmm(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """bias + a @ b per function: a (U, M, K), b (U, K, N), bias (U, 1, N) or None -> (U, M, N), thread-balanced.

    out: a contiguous (U, M, N) tensor to write the product into (a `_Workspace` buffer), or None.
    """
    split = _thread_split(a)
    if split > 1:
        num_functions, rows, _ = a.shape
        a = a.reshape(num_functions * split, rows // split, -1)
        b = _repeat_functions(b, split)
        bias = None if bias is None else _repeat_functions(bias, split)
    if out is not None:
        out = out.view(a.shape[0], a.shape[1], b.shape[2])
    y = torch.bmm(a, b, out=out) if bias is None else torch.baddbmm(bias, a, b, out=out)
    return y if split == 1 else y.view(-1, split * y.shape[1], y.shape[2])


def function_weight_grad(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a^T @ c per function, summed over the rows: a (U, M, K1), c (U, M, K2) -> (U, K1, K2), thread-balanced."""
    split = _thread_split(a)
    if split == 1 or _thread_split(c) != split:
        return torch.bmm(a.transpose(1, 2), c)
    num_functions, rows = a.shape[:2]
    chunks = torch.bmm(
        a.reshape(num_functions * split, rows // split, -1).transpose(1, 2),
        c.reshape(num_functions * split, rows // split, -1),
    )
    return chunks.view(num_functions, split, *chunks.shape[1:]).sum(1)


def apply_function_weights(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    function_first: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Apply per-function weights (U, out, in) to x (U, B, N, in), or to x (B, N, in) shared by all functions.

    Returns (U, B, N, out); with `function_first=False` and a shared x, the cheaper (B, N, U, out) view.
    out: for x (U, B, N, in), a contiguous tensor of U * B * N * out numbers to write the result into, or None.
    """
    num_functions, out_features, in_features = weight.shape
    if x.dim() == 3:
        # One matmul for all functions: the input is the same for every stream.
        flat_bias = None if bias is None else bias.reshape(-1)
        y = F.linear(x, weight.reshape(num_functions * out_features, in_features), flat_bias)
        y = y.unflatten(-1, (num_functions, out_features))
        return y.permute(2, 0, 1, 3) if function_first else y
    u, b, n, _ = x.shape
    flat = x.reshape(u, b * n, in_features)
    y = function_bmm(flat, weight.transpose(1, 2), None if bias is None else bias.unsqueeze(1), out=out)
    y = y.view(u, b, n, out_features)
    return y if function_first else y.permute(1, 2, 0, 3)


class _AutocastState:
    """The autocast state of a custom Function's forward, re-entered by its backward (as torch.amp.custom_bwd)."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        # Autocast knows no "meta" device (shape-only forwards, e.g. under accelerate's init_empty_weights).
        self.supported = device_type != "meta"
        self.enabled = self.supported and torch.is_autocast_enabled(device_type)
        self.dtype = torch.get_autocast_dtype(device_type) if self.enabled else None

    def __call__(self) -> torch.autocast | contextlib.nullcontext:
        if not self.supported:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled)


class _GatedModLin(torch.autograd.Function):
    """gate * ModLin(act(x); c_u) for the U functions (a gated LOC output, Eq. 7), keeping x but not the product.

    dL/dgate = sum_o g_o (x W_u^T + b)_o = (g W_u) . x + g . b reuses the matmul g W_u that dL/dx needs, so the
    (U, B, N, out) output of the layer is not kept for the backward; with `gelu=True` the GELU of the MLP's
    hidden layer is applied here and recomputed in the backward, so only its input is kept.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, gate, gelu):
        ctx.autocast = _AutocastState(x.device.type)
        ctx.gelu = gelu
        num_functions = weight.shape[0]
        inputs = F.gelu(x) if gelu else x
        y = apply_function_weights(inputs, weight, None if bias is None else bias.expand(num_functions, -1))
        ctx.save_for_backward(x, weight, bias, gate)
        # Not in place while compiling: torch 2.11's tracing of a custom Function mishandles an output written
        # in place (wrong gradients, see `_AttentionOutput`); the compiler fuses the product anyway.
        return y * gate if torch.compiler.is_compiling() else y.mul_(gate)

    @staticmethod
    def backward(ctx, grad):
        x, weight, bias, gate = ctx.saved_tensors
        with ctx.autocast():
            grads = _gated_mod_lin_backward(grad, x, weight, bias, gate, ctx.gelu, ctx.needs_input_grad[0])
        grad_x, grad_weight, grad_bias, grad_gate = grads
        return grad_x, grad_weight, grad_bias, grad_gate if ctx.needs_input_grad[3] else None, None


def _gated_mod_lin_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    gate: torch.Tensor,
    gelu: bool,
    needs_grad_x: bool = True,
    grad_x_name: str | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Backward of gate * ModLin(act(x); c_u): (dL/dx, dL/dW_u, dL/db, dL/dgate), without the layer's output.

    grad_x_name: dL/dx dies in the caller's backward (without `gelu`): a `_Workspace` buffer of that name may hold it.
    """
    u, b, n, in_features = x.shape
    # Float32 on CPU, the (U, B*N, .) temporaries below go to `_Workspace` buffers (see `_transient_stream`).
    transient = _reuses_workspace(grad, x, weight, gate)
    # One dL/dy expanded over the functions (`_GatedModLinSum`): into a reused buffer for the out= products below;
    # elsewhere the reshape keeps the expanded view (a copy moved 0.41 GB more per compiled step of the digits preset).
    if transient and not grad.is_contiguous():
        grad = _transient_copy("dL/dy", grad)
    grad = grad.reshape(u, b * n, -1)
    inputs = _transient_gelu("recomputed input", x) if gelu else x
    flat_x = inputs.reshape(u, b * n, in_features)
    flat_gate = gate.reshape(u, b * n, 1)
    grad_w = function_bmm(grad, weight, out=_transient_stream("g W", (u, b * n, in_features), grad, weight))
    grad_gate = _transient_mul("product", grad_w, flat_x).sum(-1, keepdim=True, dtype=torch.float32)
    if bias is not None:
        if transient:  # one pass on both threads; MKL's sgemv for this (U B N, out) @ (out,) ran on one
            grad_gate = grad_gate + _transient_mul("product", grad, bias).sum(-1, keepdim=True)
        else:
            grad_gate = grad_gate + (grad.float() @ bias.float()).unsqueeze(-1)
    grad_gate = grad_gate.view_as(gate).to(gate.dtype)
    grad_x = None
    if needs_grad_x:
        if gelu:  # g W_u * gate dies in gelu_backward: in place on the transient g W_u
            grad_x = grad_w.mul_(flat_gate) if transient else grad_w * flat_gate
            grad_x = torch.ops.aten.gelu_backward(grad_x.view_as(x), x.to(grad_x.dtype))
        elif grad_x_name is not None:
            grad_x = _transient_mul(grad_x_name, grad_w, flat_gate)
        else:
            grad_x = grad_w * flat_gate
        grad_x = grad_x.view_as(x).to(x.dtype)
    gated_grad = _transient_mul("product", grad, flat_gate)
    grad_weight = function_weight_grad(gated_grad, flat_x).to(weight.dtype)
    grad_bias = None if bias is None else gated_grad.sum((0, 1), dtype=torch.float32).to(bias.dtype)
    return grad_x, grad_weight, grad_bias, grad_gate


def gated_mod_lin(
    projection: ModLin, x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor, gelu: bool = False
) -> torch.Tensor:
    """gate (U, B, N, 1) * ModLin(GELU(x) if gelu else x; c_u) -> (U, B, N, out), through `_GatedModLin`.

    weight: the layer's `function_weights` (U, out, in), computed once per forward.
    """
    return _GatedModLin.apply(x, weight, projection.bias, gate, gelu)


def _merge_heads(attended: torch.Tensor) -> torch.Tensor:
    """(B, U, H, N, dv) -> (U, B, N, H * dv): the heads side by side, as the LOC's output ModLin reads them."""
    b, u, h, n, dv = attended.shape
    return attended.permute(1, 0, 3, 2, 4).reshape(u, b, n, h * dv)


def _refuse_double_backward() -> None:
    """The sdpa path's hand-written backwards are first order: they write into reused buffers in place."""
    if torch.is_grad_enabled():  # the engine runs a backward with grad mode on only under create_graph=True
        raise RuntimeError(
            "Gradients of gradients (backward with create_graph=True, e.g. a gradient penalty or MAML) are not "
            "supported by attn_implementation='sdpa'; use attn_implementation='eager' (at load, or "
            "model.set_attn_implementation('eager')), which computes the same function with autograd's own ops."
        )


class _AttentionOutput(torch.autograd.Function):
    """x + gate * ModLin(heads of Eq. 6; c_u) from A @ [C_uj v_j, C_uj], keeping those columns, not Eq. 6's output.

    Eq. 6's normalisation is written straight into the merged-heads layout the output ModLin reads (one pass, no
    copy), and the residual x and the bias join in one pass after the matmul. The backward redoes the
    normalisation from the attention's columns (which the attention keeps anyway) instead of keeping its
    (U, B, N, d) result, as `_GatedModLin` would. x is (B, N, d) shared by all functions, or (U, B, N, d).
    """

    @staticmethod
    def forward(ctx, x, columns, c_key, eps, weight, bias, gate, output):
        ctx.autocast = _AutocastState(columns.device.type)
        ctx.eps = eps
        ctx.shared_input = x.dim() == 3
        attended = _merged_normalised_columns(columns, c_key, eps)
        u, b, n, _ = attended.shape
        y = apply_function_weights(
            attended, weight, None, out=_function_output(output, (u, b, n, weight.shape[1]), columns)
        )
        del attended
        if bias is not None:
            y.add_(bias.to(y.dtype))
        ctx.save_for_backward(columns, c_key, weight, bias, gate)
        # x + gate * y in place; under autocast the residual stream keeps x's dtype. Not while compiling: torch
        # 2.11's tracing of a custom Function whose output was written with out= gives wrong gradients upstream
        # (tests/test_compile.py); the compiler fuses the product and the sum itself.
        if y.dtype != x.dtype or torch.compiler.is_compiling():
            return torch.addcmul(x, y.to(x.dtype), gate)
        return torch.addcmul(x, y, gate, out=y)

    @staticmethod
    def backward(ctx, grad):
        _refuse_double_backward()
        columns, c_key, weight, bias, gate = ctx.saved_tensors
        with ctx.autocast():
            attended = _merged_normalised_columns(columns, c_key, ctx.eps)
            grad_x, grad_weight, grad_bias, grad_gate = _gated_mod_lin_backward(
                grad, attended, weight, bias, gate, gelu=False, grad_x_name="dL/dx"
            )
            del attended
            b, u, h, n = columns.shape[:4]
            grad_attended = grad_x.view(u, b, n, h, -1).permute(1, 0, 3, 2, 4)
            grad_columns, grad_c_key = _normalise_columns_backward(grad_attended, columns, c_key, ctx.eps)
        grad_residual = grad.sum(0) if ctx.shared_input else grad
        return grad_residual, grad_columns, grad_c_key, None, grad_weight, grad_bias, grad_gate, None


def _merged_normalised_columns(columns: torch.Tensor, c_key: torch.Tensor, eps: float) -> torch.Tensor:
    """`_merge_heads(_normalise_columns(columns, c_key, eps))` (U, B, N, H * dv), written in one pass."""
    b, u, h, n, _ = columns.shape
    if torch.compiler.is_compiling():  # no strided out= there; the compiler fuses the product and the copy
        return _merge_heads(_normalise_columns(columns, c_key, eps))
    numerator, total = columns.split([columns.shape[-1] - 1, 1], dim=-1)
    ratio = _normalise_ratio(total, c_key, eps)
    shape = (u, b, n, h * numerator.shape[-1])
    dtype = torch.promote_types(numerator.dtype, ratio.dtype)
    if _reuses_workspace(columns, c_key):  # float32 on CPU: the promoted dtype is float32 too
        merged = _WORKSPACE.get("attended", shape, columns)
    else:
        merged = torch.empty(shape, dtype=dtype, device=columns.device)
    torch.mul(numerator, ratio, out=merged.view(u, b, n, h, -1).permute(1, 0, 3, 2, 4))
    return merged


def _normalise_columns_backward(
    grad: torch.Tensor, columns: torch.Tensor, c_key: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of `_normalise_columns`: (dL/d columns, dL/dC_ui summed over the heads).

    With r = C / (eps + C T) (0 where that denominator is 0): dr/dC = eps / (eps + C T)^2, dr/dT = -C^2 / (...)^2.
    """
    numerator, total = columns.split([columns.shape[-1] - 1, 1], dim=-1)
    denominator = eps + c_key * total
    nonzero = denominator > 0
    inverse = torch.where(nonzero, 1.0 / torch.where(nonzero, denominator, 1.0), 0.0)
    ratio = c_key * inverse
    grad_ratio = _transient_mul("product", grad, numerator).sum(-1, keepdim=True) * inverse * inverse
    grad_total = -grad_ratio * c_key * c_key
    grad_c_key = (grad_ratio * eps).sum(2, keepdim=True)
    if torch.compiler.is_compiling():  # no strided out= there
        grad_columns = torch.cat([grad * ratio, grad_total], dim=-1)
    else:  # both parts straight into their slots: no (B, U, H, N, dv) temporary to copy over
        dtype = torch.promote_types(torch.promote_types(grad.dtype, ratio.dtype), grad_total.dtype)
        grad_columns = torch.empty(columns.shape, dtype=dtype, device=columns.device)
        torch.mul(grad, ratio, out=grad_columns[..., :-1])
        grad_columns[..., -1:] = grad_total
    return grad_columns.to(columns.dtype), grad_c_key.to(c_key.dtype)


def attention_output(
    projection: ModLin,
    x: torch.Tensor,
    columns: torch.Tensor,
    compatibilities: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    gate: torch.Tensor,
    output: str | None = None,
) -> torch.Tensor:
    """x + gate * ModLin(Eq. 6; c_u) (U, B, N, out) from the attention's columns A @ [C_uj v_j, C_uj] (B, U, H, N, dv + 1).

    weight: the ModLin's `function_weights` (U, out, in). output: for a caller that uses the result only until its
    next call, a buffer name (see `_output_buffer`).
    """
    c_key = compatibilities.transpose(0, 1)[:, :, None, :, None]  # (B, U, 1, N, 1)
    output = _output_buffer(output, x, columns, weight)
    return _AttentionOutput.apply(x, columns, c_key, eps, weight, projection.bias, gate, output)


class _GatedModLinSum(torch.autograd.Function):
    """sum_u C_u (a_u + C_u ModLin(GELU(x_u); c_u)): the last LOC's gated MLP and the sum of Eq. 8, in one step.

    Keeps a and x (which the LOC keeps anyway), not the (U, B, N, d) streams that the sum over functions would
    keep for dL/dC.
    """

    @staticmethod
    def forward(ctx, a, x, weight, bias, gate):
        ctx.autocast = _AutocastState(x.device.type)
        u, b, n, _ = x.shape
        # GELU(x) and the MLP's output die here (float32 on CPU: `_Workspace` buffers).
        y = apply_function_weights(
            _transient_gelu("recomputed input", x),
            weight,
            None if bias is None else bias.expand(u, -1),
            out=_transient_stream("y", (u, b * n, weight.shape[1]), x, weight),
        )
        ctx.save_for_backward(a, x, weight, bias, gate)
        # As a + gate * y, then sum_u gate * (...); under autocast the residual stream stays in a's dtype.
        return y.to(a.dtype).mul_(gate).add_(a).mul_(gate).sum(0)

    @staticmethod
    def backward(ctx, grad):
        a, x, weight, bias, gate = ctx.saved_tensors
        with ctx.autocast():
            # The sum is sum_u C_u a_u + sum_u C_u^2 m_u: the gated layer's backward with gate C^2 gives dL/dx,
            # dL/dW_u, dL/db and g . m_u; then dL/dC_u = g . a_u + 2 C_u g . m_u.
            per_function = grad.unsqueeze(0).expand_as(a)
            grad_x, grad_weight, grad_bias, g_dot_m = _gated_mod_lin_backward(
                per_function, x, weight, bias, gate * gate, gelu=True
            )
            g_dot_a = _transient_mul("product", a, per_function).sum(-1, keepdim=True, dtype=torch.float32)
            grad_gate = g_dot_a + 2 * gate.float() * g_dot_m.float()
            grad_a = per_function * gate
        return grad_a.to(a.dtype), grad_x, grad_weight, grad_bias, grad_gate.to(gate.dtype)


def gated_mod_lin_sum(
    projection: ModLin, a: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor
) -> torch.Tensor:
    """sum_u gate_u * (a_u + gate_u * ModLin(GELU(x_u); c_u)) -> (B, N, out), through `_GatedModLinSum`.

    weight: the layer's `function_weights` (U, out, in).
    """
    return _GatedModLinSum.apply(a, x, weight, projection.bias, gate)


def _layer_norm_input(x: torch.Tensor, norm_weight: torch.Tensor | None) -> torch.Tensor:
    """x in the LayerNorm weight's dtype, as autocast runs layer_norm (CUDA's kernels take no mixed dtypes)."""
    return x if norm_weight is None or x.dtype == norm_weight.dtype else x.to(norm_weight.dtype)


class _NormModLin(torch.autograd.Function):
    """ModLin(LayerNorm(x); c_u) for the U functions, keeping x and its statistics, not the normalised x."""

    @staticmethod
    def forward(ctx, x, norm_weight, norm_bias, eps, weight, bias, output):
        ctx.autocast = _AutocastState(x.device.type)
        ctx.eps = eps
        normed, mean, rstd = torch.native_layer_norm(
            _layer_norm_input(x, norm_weight), x.shape[-1:], norm_weight, norm_bias, eps
        )
        u, b, n, _ = x.shape
        out = _function_output(output, (u, b, n, weight.shape[1]), normed)
        y = apply_function_weights(normed, weight, None if bias is None else bias.expand(u, -1), out=out)
        ctx.save_for_backward(x, mean, rstd, norm_weight, norm_bias, weight, bias)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, mean, rstd, norm_weight, norm_bias, weight, bias = ctx.saved_tensors
        u, b, n, in_features = x.shape
        with ctx.autocast():
            normed = _transient_stream("recomputed input", x.shape, x, mean, rstd)
            if normed is None:
                normed = (x - mean) * rstd
                if norm_weight is not None:
                    normed = normed * norm_weight + norm_bias
            else:  # float32 on CPU: the same arithmetic in place on one buffer
                torch.sub(x, mean, out=normed).mul_(rstd)
                if norm_weight is not None:
                    normed.mul_(norm_weight).add_(norm_bias)
            grad = grad.reshape(u, b * n, -1)
            grad_weight = function_weight_grad(grad, normed.reshape(u, b * n, in_features).to(grad.dtype))
            del normed
            grad_bias = None if bias is None else grad.sum((0, 1), dtype=torch.float32).to(bias.dtype)
            grad_normed = function_bmm(
                grad,
                weight.to(grad.dtype),
                out=_transient_stream("g W", (u, b * n, in_features), grad, weight),
            ).view_as(x)
        x_norm = _layer_norm_input(x, norm_weight)
        grad_x, grad_norm_weight, grad_norm_bias = torch.ops.aten.native_layer_norm_backward(
            grad_normed.to(x_norm.dtype),
            x_norm,
            x.shape[-1:],
            mean,
            rstd,
            norm_weight,
            norm_bias,
            list(ctx.needs_input_grad[:3]),
        )
        if grad_x is not None:
            grad_x = grad_x.to(x.dtype)
        return grad_x, grad_norm_weight, grad_norm_bias, None, grad_weight.to(weight.dtype), grad_bias, None


def norm_mod_lin(
    norm: nn.LayerNorm,
    projection: ModLin,
    x: torch.Tensor,
    weight: torch.Tensor,
    output: str | None = None,
) -> torch.Tensor:
    """ModLin(LayerNorm(x (U, B, N, in)); c_u) -> (U, B, N, out), through `_NormModLin`.

    weight: the ModLin's `function_weights` (U, out, in). output: for a caller that uses the result only until its
    next call, a buffer name (see `_output_buffer`).
    """
    output = _output_buffer(output, x, weight)
    return _NormModLin.apply(x, norm.weight, norm.bias, norm.eps, weight, projection.bias, output)


class ModMLP(nn.Module):
    """ModMLP(x; c) = ModLin(GELU(ModLin(x; c)); c), hidden width d (Eq. 5)."""

    def __init__(self, config: NeuralInterpreterConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.fc1 = ModLin(d, d, config.code_dim)
        self.fc2 = ModLin(d, d, config.code_dim)

    def forward(self, x: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x, codes)), codes)


class RelativePositionalBias(nn.Module):
    """Per-function relative positional bias between patch tokens (reference "sep_sum" mode, SPEC.md)."""

    def __init__(self, config: NeuralInterpreterConfig) -> None:
        super().__init__()
        g, heads, hd = config.grid_size, config.num_attention_heads, config.attention_head_size
        self.grid_size = g
        self.row_offset_embeddings = nn.Parameter(torch.empty(2 * g - 1, hd))
        self.col_offset_embeddings = nn.Parameter(torch.empty(2 * g - 1, hd))
        self.row_head_keys = nn.Linear(hd, heads, bias=False)
        self.col_head_keys = nn.Linear(hd, heads, bias=False)
        self.row_function_keys = nn.Linear(config.code_dim, heads, bias=False)
        self.col_function_keys = nn.Linear(config.code_dim, heads, bias=False)

    def forward(self, codes: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
        """(U, H, N, N) bias; zero for any pair that involves a task (CLS) token."""
        g = self.grid_size
        # Offsets key - query along one axis as table indices (G, G). Built here rather than kept as a buffer,
        # which transformers' meta-device loading would leave uninitialised.
        grid = torch.arange(g, device=codes.device)
        offsets = grid[None, :] - grid[:, None] + g - 1
        row_table = self.row_head_keys(self.row_offset_embeddings)  # (2G-1, H)
        col_table = self.col_head_keys(self.col_offset_embeddings)
        # Gather G x G entries per axis and broadcast them over the other axis, rather than gather P x P = G^4: the
        # gather's backward scatters into the 2G-1 table rows, which on a GPU is G^2 times fewer colliding atomic adds.
        row_bias, col_bias = row_table[offsets], col_table[offsets]  # (G query, G key, H)
        # (G, G, G, G, H) indexed by query row, query column, key row, key column
        patch_bias = row_bias[:, None, :, None] + col_bias[None, :, None, :]
        patch_bias = patch_bias.reshape(g * g, g * g, -1).permute(2, 0, 1)  # (H, P, P), row-major patches
        function_bias = self.row_function_keys(codes) + self.col_function_keys(codes)  # (U, H)
        bias = patch_bias.unsqueeze(0) + function_bias[:, :, None, None]
        return F.pad(bias, (num_prefix_tokens, 0, num_prefix_tokens, 0))


def _normalise_ratio(total: torch.Tensor, c_query: torch.Tensor, eps: float) -> torch.Tensor:
    """C_ui / (eps + C_ui * total), and 0 where that denominator is 0 (eps = 0 and C_ui = 0)."""
    denominator = eps + c_query * total
    nonzero = denominator > 0
    return torch.where(nonzero, c_query / torch.where(nonzero, denominator, 1.0), 0.0)


def _gated_normalise(
    numerator: torch.Tensor, total: torch.Tensor, c_query: torch.Tensor, eps: float
) -> torch.Tensor:
    """C_ui * numerator / (eps + C_ui * total), and 0 where that denominator is 0 (eps = 0 and C_ui = 0)."""
    return numerator * _normalise_ratio(total, c_query, eps)


def _normalise_columns(out: torch.Tensor, c_key: torch.Tensor, eps: float) -> torch.Tensor:
    """Eq. 6 from A @ [C_uj v_j, C_uj] (B, U, H, N, dv + 1): the value columns over the normaliser column."""
    # split, not two slices: its backward is one cat, where slicing backward zero-fills a full tensor twice.
    numerator, total = out.split([out.shape[-1] - 1, 1], dim=-1)
    return _gated_normalise(numerator, total, c_key, eps)


def modulated_attention_eager(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    compatibilities: torch.Tensor,
    position_bias: torch.Tensor | None,
    scale: float,
    eps: float,
    dropout: float,
) -> torch.Tensor:
    """Eq. 6 literally: W = A~ / (eps + sum_j A~), A~_ij = C_ui C_uj softmax_j((q.k + bias) * scale).

    query/key/value are (B, U, H, N, .), compatibilities (U, B, N), position_bias (U, H, N, N).
    """
    logits = query @ key.transpose(-1, -2)  # (B, U, H, N, N)
    return _modulated_attention_from_logits(
        logits, value, compatibilities, position_bias, scale, eps, dropout
    )


def _modulated_attention_from_logits(
    logits: torch.Tensor,
    value: torch.Tensor,
    compatibilities: torch.Tensor,
    position_bias: torch.Tensor | None,
    scale: float,
    eps: float,
    dropout: float,
) -> torch.Tensor:
    """The rest of `modulated_attention_eager` from its logits q.k (B, U, H, N, N)."""
    weights = modulated_attention_weights(logits, compatibilities, position_bias, scale, eps)
    weights = F.dropout(weights, p=dropout, training=dropout > 0)
    return weights @ value


def modulated_attention_weights(
    logits: torch.Tensor,
    compatibilities: torch.Tensor,
    position_bias: torch.Tensor | None,
    scale: float,
    eps: float,
) -> torch.Tensor:
    """Eq. 6's W (B, U, H, N, N) from the logits q.k: A~ / (eps + sum_j A~), A~_ij = C_ui C_uj softmax_j(...)."""
    if position_bias is not None:
        logits = logits + position_bias
    probs = torch.softmax(logits * scale, dim=-1)
    c = compatibilities.transpose(0, 1).unsqueeze(2)  # (B, U, 1, N)
    modulated = c.unsqueeze(-1) * c.unsqueeze(-2) * probs
    total = modulated.sum(dim=-1, keepdim=True)
    nonzero = eps + total > 0
    return torch.where(nonzero, modulated / torch.where(nonzero, eps + total, 1.0), 0.0)


def modulated_attention_columns(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    compatibilities: torch.Tensor,
    position_bias: torch.Tensor | None,
    scale: float,
    eps: float,
    dropout: float,
    column_alignment: int = 1,
) -> torch.Tensor:
    """Eq. 6 as softmax(q k^T + bias) @ [C_uj v_j, C_uj] over its last column, in plain autograd ops.

    The experiment of `LineOfCode.columns_attention`: the "sdpa" path's arithmetic without SDPA or custom Functions,
    so no N x N modulated weights, their sum or their quotient, forward or backward (less memory traffic in a
    compiled step, benchmarks/RESULTS.md). Not the default for compiled GPU runs: inductor compiled the model around
    that structure wrongly on CUDA (2026-11-27), which only a GPU can check again. No attention dropout.
    column_alignment: pad the dv + 1 columns with zeros to a multiple of this (aligned GEMM rows on a GPU).
    """
    logits = query @ key.transpose(-1, -2)
    return _modulated_attention_columns_from_logits(
        logits, value, compatibilities, position_bias, scale, eps, dropout, column_alignment
    )


def _modulated_attention_columns_from_logits(
    logits: torch.Tensor,
    value: torch.Tensor,
    compatibilities: torch.Tensor,
    position_bias: torch.Tensor | None,
    scale: float,
    eps: float,
    dropout: float,
    column_alignment: int = 1,
) -> torch.Tensor:
    """The rest of `modulated_attention_columns` from its logits q.k (B, U, H, N, N)."""
    if dropout > 0:
        raise ValueError(
            "the columns formulation of Eq. 6 has no attention dropout (it would act on A, not W)"
        )
    c_key = compatibilities.transpose(0, 1)[:, :, None, :, None]  # (B, U, 1, N, 1)
    if position_bias is not None:
        logits = logits + position_bias.to(logits.dtype)
    probs = torch.softmax(logits * scale, dim=-1)
    columns = _compatibility_columns(value, c_key)
    width = columns.shape[-1]
    pad = -width % column_alignment
    if pad == 0:  # F.pad copies even when it pads nothing
        return _normalise_columns(probs @ columns, c_key, eps)
    return _normalise_columns((probs @ F.pad(columns, (0, pad)))[..., :width], c_key, eps)


def bilinear_weight(query_weight: torch.Tensor, key_weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[A_uh^T] = [W_k,uh^T W_q,uh] (U * H * d, d), rows (u, h, e): (h A_uh)_e = sum_k W_k,uh[k, e] q_k, so
    (h_i A_uh) . h_j = q_i . k_j. query_weight, key_weight: (U, H * d_h, d) modulated weights."""
    u, hd, d = query_weight.shape
    wq = query_weight.view(u, num_heads, hd // num_heads, d)
    wk = key_weight.view(u, num_heads, hd // num_heads, d)
    return (wk.transpose(-1, -2) @ wq).reshape(-1, d)


def modulated_attention_eager_bilinear(
    hidden: torch.Tensor,
    query_weight: torch.Tensor,
    key_weight: torch.Tensor,
    value: torch.Tensor,
    compatibilities: torch.Tensor,
    position_bias: torch.Tensor | None,
    scale: float,
    eps: float,
    dropout: float,
    columns: bool = False,
    column_alignment: int = 1,
    bilinear: torch.Tensor | None = None,
) -> torch.Tensor:
    """`modulated_attention_eager` with the logits of Eq. 6 in the bilinear form q_i.k_j = (h_i A_uh) . h_j.

    The experiment of `LineOfCode.bilinear_logits`, in plain ops for compilers (the CPU's `_BilinearAttention` keeps
    workspace buffers of its own): every function reads the same h (B, N, d), so the (U, H, d_h, d) query and key
    weights fold into A_uh = W_q,uh^T W_k,uh, one GEMM h @ [A_uh] (B, N, U * H * d) and one batched product per
    sample against h^T, in place of the q and k projections and B * U * H products of 128-wide heads. It costs fewer
    FLOPs where `bilinear_attention_pays`. value (B, U, H, N, dv), compatibilities (U, B, N), position_bias
    (U, H, N, N) or None; columns: the rest of Eq. 6 as `modulated_attention_columns` computes it (with
    ``column_alignment``). hidden and value may hold more tokens than the compatibilities, padded
    (`LineOfCode.token_alignment`): those get C = 0 and a logit of -inf as keys, and their output rows are dropped, as
    in `modulated_attention_aligned`. bilinear: `bilinear_weight(query_weight, key_weight, H)` if already formed
    (once per forward, `LineOfCode.function_weights`).
    """
    b, u, h, n, _ = value.shape
    d = hidden.shape[-1]
    tokens = compatibilities.shape[-1]
    if bilinear is None:
        bilinear = bilinear_weight(query_weight, key_weight, h)
    mixed = F.linear(hidden, bilinear)  # (B, N, U * H * d)
    logits = mixed.view(b, -1, d) @ hidden.to(mixed.dtype).transpose(1, 2)  # (B, N * U * H, N)
    logits = logits.view(b, n, u, h, n).permute(0, 2, 3, 1, 4)
    if n > tokens:
        compatibilities, position_bias = _padded_keys(compatibilities, position_bias, n, logits.dtype)
    if columns:
        out = _modulated_attention_columns_from_logits(
            logits, value, compatibilities, position_bias, scale, eps, dropout, column_alignment
        )
    else:
        out = _modulated_attention_from_logits(
            logits, value, compatibilities, position_bias, scale, eps, dropout
        )
    return out[..., :tokens, :] if n > tokens else out


def modulated_attention_aligned(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    compatibilities: torch.Tensor,
    position_bias: torch.Tensor | None,
    scale: float,
    eps: float,
    dropout: float,
    alignment: int = 8,
    columns: bool = False,
) -> torch.Tensor:
    """`modulated_attention_eager` with the N tokens padded to a multiple of ``alignment`` (Eq. 6 unchanged).

    A padded token has C = 0 and a logit of -inf as a key, so it gets no attention and, as a query, attends to nothing
    (its output row is dropped). The point is the layout: with 67 tokens every N x N product has a row length of
    134 bf16 bytes, which GPU GEMM kernels that need 16-byte aligned rows cannot take (benchmarks/RESULTS.md).
    N is that of the compatibilities; query, key and value may come padded already (projected from padded tokens,
    as the LOC does: padding its input costs less than padding the three projections). columns: compute Eq. 6 as
    `modulated_attention_columns` does, its dv + 1 columns padded to a multiple of ``alignment`` too.
    """
    kwargs = {"column_alignment": alignment} if columns else {}
    attention = modulated_attention_columns if columns else modulated_attention_eager
    n = compatibilities.shape[-1]
    pad = -n % alignment
    if pad == 0:
        return attention(query, key, value, compatibilities, position_bias, scale, eps, dropout, **kwargs)
    if key.shape[-2] == n:
        query, key, value = (F.pad(t, (0, 0, 0, pad)) for t in (query, key, value))
    compatibilities, bias = _padded_keys(compatibilities, position_bias, n + pad, query.dtype)
    out = attention(query, key, value, compatibilities, bias, scale, eps, dropout, **kwargs)
    return out[..., :n, :]


def _padded_keys(
    compatibilities: torch.Tensor, position_bias: torch.Tensor | None, padded: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Compatibilities (U, B, N) with C = 0 for the tokens padded up to ``padded``, and the position bias (or none)
    with a logit of -inf for them as keys, so that they take no part in Eq. 6."""
    n = compatibilities.shape[-1]
    compatibilities = F.pad(compatibilities, (0, padded - n))
    mask = torch.zeros(padded, padded, dtype=dtype, device=compatibilities.device)
    mask[:, n:] = float("-inf")
    if position_bias is None:
        return compatibilities, mask
    return compatibilities, F.pad(position_bias, (0, padded - n, 0, padded - n)) + mask


def modulated_attention_fused(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    compatibilities: torch.Tensor,
    position_bias: torch.Tensor | None,
    scale: float,
    eps: float,
    dropout: float,
    alignment: int = 8,
) -> torch.Tensor:
    """Eq. 6 as SDPA(q, k, [C_uj v_j, C_uj]) over its last column, with keys and columns padded for fused GPU kernels.

    The experiment of `LineOfCode.fused_attention`: CUDA's memory-efficient SDPA kernel keeps the N x N weights on
    chip (the largest share of a compiled step's memory traffic otherwise, benchmarks/RESULTS.md) but takes key
    counts and head sizes in multiples of 8 only, and the model's are 67 keys and 48 + 1 columns. Padded keys get
    C = 0 and a logit of -inf; padded columns are zeros and are cut from the output. The division is plain ops
    (the "sdpa" path's custom Function around it is what inductor compiled wrongly on CUDA). Without dropout the
    same function as `modulated_attention_eager` (dropout acts on A, as in "sdpa"); query/key/value are
    (B, U, H, N, .), compatibilities (U, B, N).
    """
    b, u, h, n, dv = value.shape
    c_key = compatibilities.transpose(0, 1)[:, :, None, :, None]  # (B, U, 1, N, 1)
    pad_keys, pad_columns = -n % alignment, -(dv + 1) % alignment
    columns = F.pad(_compatibility_columns(value, c_key), (0, pad_columns, 0, pad_keys))
    key = F.pad(key, (0, 0, 0, pad_keys))
    mask = None
    if position_bias is not None:
        mask = (position_bias * scale).to(query.dtype).flatten(0, 1)  # (U * H, N, N), broadcast over B
    if pad_keys:
        if mask is None:
            mask = query.new_zeros(1, n, n)
        mask = F.pad(mask, (0, pad_keys), value=float("-inf"))
    out = F.scaled_dot_product_attention(
        query.flatten(1, 2),
        key.flatten(1, 2),
        columns.flatten(1, 2),
        attn_mask=mask,
        dropout_p=dropout,
        scale=scale,
    ).unflatten(1, (u, h))
    return _normalise_columns(out[..., : dv + 1], c_key, eps)


def _compatibility_columns(value: torch.Tensor, c_key: torch.Tensor, transient: bool = False) -> torch.Tensor:
    """[C_uj v_j, C_uj] (B, U, H, N, dv + 1): values scaled by the key compatibilities, plus C_uj as a column.

    transient: the result dies inside the calling autograd Function (see `_Workspace`).
    """
    b, u, h, n, dv = value.shape
    # out= has no autograd, and torch.compile takes no strided out= (and fuses the two itself).
    if torch.compiler.is_compiling() or (
        torch.is_grad_enabled() and (value.requires_grad or c_key.requires_grad)
    ):
        return torch.cat([value * c_key, c_key.expand(b, u, h, n, 1)], dim=-1)
    shape = (b, u, h, n, dv + 1)
    if transient and _reuses_workspace(value, c_key):
        columns = _WORKSPACE.get("columns", shape, value)
    else:
        columns = torch.empty(shape, dtype=torch.promote_types(value.dtype, c_key.dtype), device=value.device)
    # The scaled values go straight into their slots: no (B, U, H, N, dv) temporary to copy over.
    torch.mul(value, c_key, out=columns[..., :dv])
    columns[..., dv:] = c_key
    return columns


def _attention_weights_backward(
    probs: torch.Tensor, grad_out: torch.Tensor, out: torch.Tensor, value: torch.Tensor, c_key: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of out = P @ [C_uj v_j, C_uj] with P = softmax(logits): (dL/d columns, dL/d logits)."""
    columns = _compatibility_columns(value, c_key, transient=True)
    grad_out = grad_out.to(probs.dtype)
    grad_columns = _transient_matmul("dL/dcolumns", probs.transpose(-1, -2), grad_out)
    # dL/dlogits = P * (dL/dP - rowsum(dO * O)), in place on the one N x N buffer.
    grad_logits = _transient_matmul("dL/dlogits", grad_out, columns.transpose(-1, -2))
    grad_logits.sub_(_transient_mul("product", grad_out, out.to(grad_out.dtype)).sum(-1, keepdim=True)).mul_(
        probs
    )
    return grad_columns, grad_logits


def _compatibility_columns_backward(
    grad_columns: torch.Tensor, value: torch.Tensor, c_key: torch.Tensor, out: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of `_compatibility_columns`: (dL/dv, dL/dC_uj), the latter summed over the heads.

    out: a (B, U, H, N, dv) tensor (a view in any layout) to write dL/dv into, or None.
    """
    grad_scaled_values, grad_c_column = grad_columns.split([value.shape[-1], 1], dim=-1)
    grad_value = grad_scaled_values * c_key if out is None else torch.mul(grad_scaled_values, c_key, out=out)
    grad_c_key = _transient_mul("product", grad_scaled_values, value).sum(-1, keepdim=True)
    grad_c_key = (grad_c_key + grad_c_column).sum(2, keepdim=True)
    return grad_value, grad_c_key


class _AttentionWithRecompute(torch.autograd.Function):
    """softmax(q k^T * scale + bias) @ [C_uj v_j, C_uj], keeping q, k, v and the output, not the N x N weights.

    The backward recomputes the attention weights from q and k (one batched matmul and a softmax), as
    FlashAttention does, and uses rowsum(dO * O) for the softmax gradient; the (B, U, H, N, N) tensors are
    transient in both passes.
    """

    @staticmethod
    def forward(ctx, query, key, value, c_key, position_bias, scale):
        ctx.autocast = _AutocastState(query.device.type)
        query, key = query.contiguous(), key.contiguous()
        probs = _attention_probs(query, key, position_bias, scale)
        out = probs @ _compatibility_columns(value, c_key, transient=True)
        ctx.scale = scale
        ctx.save_for_backward(query, key, value, c_key, position_bias, out)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        _refuse_double_backward()
        query, key, value, c_key, position_bias, out = ctx.saved_tensors
        with ctx.autocast():
            probs = _attention_probs(query, key, position_bias, ctx.scale)
            grad_columns, grad_logits = _attention_weights_backward(probs, grad_out, out, value, c_key)
            del probs
            grad_bias = None
            if position_bias is not None and ctx.needs_input_grad[4]:
                grad_bias = grad_logits.sum(0).to(position_bias.dtype)
            if ctx.scale != 1.0:
                grad_logits.mul_(ctx.scale)
            grad_query = grad_logits @ key.to(grad_logits.dtype)
            grad_key = grad_logits.transpose(-1, -2) @ query.to(grad_logits.dtype)
            grad_value, grad_c_key = _compatibility_columns_backward(grad_columns, value, c_key)
        return (
            grad_query.to(query.dtype),
            grad_key.to(key.dtype),
            grad_value.to(value.dtype),
            grad_c_key.to(c_key.dtype),
            grad_bias,
            None,
        )


class _Workspace(threading.local):
    """Reused CPU buffers for the transients of the custom Functions: the bilinear form's h A, its gradient and the
    logits, and the (U, B, N, d) temporaries of the gated ModLins' backwards (g W_u, recomputed GELU or LayerNorm
    inputs, elementwise products summed at once).

    glibc maps every allocation above 32 MiB afresh (h A is 126 MiB at batch 128 for the digits preset), and
    faulting those pages in takes about half as long as the GEMM that fills them. Below that (a (U, B, N, d) stream
    is 31.4 MiB) its heap serves them, and a step's hundreds of such blocks, mixed with smaller ones, left 300-750
    MiB of freed memory resident at the training peak (benchmarks/RESULTS.md, 2026-11-28). Each buffer is reused by
    every function iteration, forward and backward, and grows to the largest size seen. One set per thread; a name
    is one role, and a buffer never outlives the Function call that wrote it.
    """

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
        numel = math.prod(shape)
        buffer = self.buffers.get(name)
        if (
            buffer is None
            or buffer.numel() < numel
            or buffer.dtype != like.dtype
            # made under torch.inference_mode(): such a tensor takes no in-place writes outside it
            or (buffer.is_inference() and not torch.is_inference_mode_enabled())
        ):
            buffer = self.buffers[name] = torch.empty(numel, dtype=like.dtype, device=like.device)
        return buffer[:numel].view(shape)


_WORKSPACE = _Workspace()


class _KeptBuffers:
    """Reused CPU buffers for large tensors that a custom Function keeps for its backward (h A, the attention weights).

    Kept tensors die when autograd releases what the Function saved (after its backward, or with the graph), and a
    fresh one would cost page faults at every step as the workspace's transients would (see `_Workspace`). Here a
    buffer returns to the pool only when every tensor handed out on it has died (a `weakref.finalize` on each;
    autograd holds those very tensors), so it is never handed out twice while a graph may still read it:
    `retain_graph`, several graphs alive at once and activation checkpointing stay exact. A Function that returns
    such a tensor and also saves it saves an `alias` (autograd keeps a saved output as a tensor of its own, which
    the pool could not see). Shared by all threads.
    """

    @dataclass
    class Lease:
        """A pooled buffer while it is handed out: its pool key (dtype, device, numel) and the tensors alive on it."""

        key: tuple[torch.dtype, torch.device, int]
        storage: torch.UntypedStorage
        alive: int = 0

    def __init__(self) -> None:
        self.free: dict[tuple[torch.dtype, torch.device, int], list[torch.UntypedStorage]] = {}
        self.lock = threading.Lock()

    def take(self, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
        """An uninitialised contiguous tensor of `shape` (not a view); hold it, or an `alias`, while it is in use."""
        key = (like.dtype, like.device, math.prod(shape))
        with self.lock:
            spare = self.free.get(key)
            storage = spare.pop() if spare else None
        if storage is None:
            storage = torch.empty(key[2], dtype=like.dtype, device=like.device).untyped_storage()
        return self._hand_out(self.Lease(key, storage), shape)

    def alias(self, tensor: torch.Tensor) -> torch.Tensor:
        """Another tensor on the buffer of `tensor` (from `take`); the buffer stays out until both have died."""
        return self._hand_out(tensor._kept_lease, tensor.shape)

    def _hand_out(self, lease: _KeptBuffers.Lease, shape: Sequence[int]) -> torch.Tensor:
        """A tensor on the lease's buffer (not a view: `set_`), given back when it dies."""
        dtype, device, _ = lease.key
        tensor = torch.empty(0, dtype=dtype, device=device).set_(lease.storage, 0, tuple(shape))
        with self.lock:
            lease.alive += 1
        tensor._kept_lease = lease
        weakref.finalize(tensor, self._release, lease)
        return tensor

    def _release(self, lease: _KeptBuffers.Lease) -> None:
        with self.lock:
            lease.alive -= 1
            if lease.alive == 0:
                self.free.setdefault(lease.key, []).append(lease.storage)

    def clear(self) -> None:
        with self.lock:
            self.free.clear()


_KEPT = _KeptBuffers()


def enable_activation_checkpointing(model: PreTrainedModel, checkpoint_kwargs: dict | None = None) -> None:
    """Turn on transformers' activation checkpointing under either name of its method.

    `activation_checkpointing_enable` since transformers 5.23 (where `gradient_checkpointing_enable` warns that it is
    deprecated); the older releases that `pyproject.toml` accepts have only `gradient_checkpointing_enable`.
    checkpoint_kwargs: passed on to `torch.utils.checkpoint.checkpoint` (e.g. ``{"use_reentrant": True}``).
    """
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=checkpoint_kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs)


def set_token_alignment(model: nn.Module, alignment: int) -> None:
    """Pad the tokens of every LOC's "eager" attention to a multiple of ``alignment`` (1: none); same function."""
    if alignment < 1:
        raise ValueError(f"`alignment` must be a positive number of tokens, got {alignment}.")
    for module in model.modules():
        if isinstance(module, LineOfCode):
            module.token_alignment = alignment


def set_fused_attention(model: nn.Module, enabled: bool = True) -> None:
    """Run every LOC's "eager" attention through `modulated_attention_fused` (SDPA's fused kernels); same function.

    Takes precedence over `set_token_alignment`, which pads the tokens for the unfused formulation.
    """
    for module in model.modules():
        if isinstance(module, LineOfCode):
            module.fused_attention = enabled


def set_bilinear_logits(model: nn.Module, enabled: bool = True) -> None:
    """Turn `LineOfCode.bilinear_logits` on or off in every LOC of ``model`` (an experiment for compiled GPU runs)."""
    for module in model.modules():
        if isinstance(module, LineOfCode):
            module.bilinear_logits = enabled


def set_columns_attention(model: nn.Module, enabled: bool = True) -> None:
    """Turn `LineOfCode.columns_attention` on or off in every LOC of ``model`` (an experiment for compiled GPU runs)."""
    for module in model.modules():
        if isinstance(module, LineOfCode):
            module.columns_attention = enabled


# How the "eager" path forms Eq. 6 (`set_eager_formulation`); every one computes the same function.
EAGER_FORMULATIONS = ("literal", "fused", "bilinear", "columns", "bilinear-columns")


def set_eager_formulation(model: nn.Module, formulation: str = "literal", token_alignment: int = 1) -> None:
    """Choose how every LOC's "eager" path, which "sdpa" also runs when compiled on a GPU, forms Eq. 6; same function.

    "literal" (the default): the written-out formula. "fused": SDPA's fused kernels on the keys and the [C v, C]
    value columns padded to multiples of 8 (`set_fused_attention`). "bilinear": the logits as (h A_uh) . h where
    every function reads the same set (`set_bilinear_logits`). "columns": softmax(q k^T + bias) @ [C v, C], then
    the division (`set_columns_attention`; the literal formula while attention dropout is on). "bilinear-columns":
    both. token_alignment: pad the tokens to a multiple of it (`set_token_alignment`; the fused formulation pads
    its own). GPU experiments: fewer bytes per compiled training step by inductor's count (benchmarks/SPEED.md);
    the fused, bilinear and bilinear-columns ones compiled exactly on an H200 (2026-11-28), none has been timed
    on a GPU yet.
    """
    if formulation not in EAGER_FORMULATIONS:
        raise ValueError(f"Unknown eager formulation {formulation!r}; expected one of {EAGER_FORMULATIONS}.")
    set_token_alignment(model, token_alignment)
    set_fused_attention(model, formulation == "fused")
    set_bilinear_logits(model, formulation in ("bilinear", "bilinear-columns"))
    set_columns_attention(model, formulation in ("columns", "bilinear-columns"))


def release_workspace() -> None:
    """Free the reused CPU buffers (this thread's `_Workspace`, and the idle ones of `_KeptBuffers`).

    Training on CPU leaves them with the process for the next step (about 2.35 GiB for the digits preset at batch
    128: 0.53 GiB of workspace, 1.82 GiB of kept buffers); call this when training is over. The next forward
    allocates what it needs again.
    """
    _WORKSPACE.buffers.clear()
    _KEPT.clear()


def _reuses_workspace(*tensors: torch.Tensor) -> bool:
    """Whether a product of these can be written into a `_Workspace` buffer: float32 on CPU, outside autocast.

    Never while torch.compile traces: the compiler plans its own buffers, and a mutated module-level buffer is a
    side effect that breaks the graph (torch < 2.13) inside the custom Functions.
    """
    # Grad mode is off inside a custom Function's forward and backward, except in a backward that builds a graph
    # (create_graph=True), which may save what it reads: out= records no autograd, and a buffer is rewritten.
    return _cpu_float32(*tensors) and not torch.is_grad_enabled()


def _cpu_float32(*tensors: torch.Tensor) -> bool:
    """Float32 CPU tensors, outside autocast and outside torch.compile's tracing: where the reused buffers apply."""
    return (
        all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
    )


def _output_buffer(name: str | None, *inputs: torch.Tensor) -> str | None:
    """`name` where a custom Function may write the (U, B, N, d) result it returns into this thread's `_Workspace`
    buffer of that name, else None (a fresh tensor). For a caller done with the result before its next call with
    `name` (a LOC's streams a and its MLP's hidden layer), and only where grad mode is off: with it on, a graph
    recorded later could save the result. On float32 CPU tensors, as `_reuses_workspace`.
    """
    return name if name is not None and _cpu_float32(*inputs) and not torch.is_grad_enabled() else None


def _function_output(output: str | None, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor | None:
    """The `_Workspace` buffer `_output_buffer` named (for `shape`, and the dtype and device of `like`), or None."""
    return None if output is None else _WORKSPACE.get(output, shape, like)


def _transient_bmm(name: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b (batched, 3-D) for a result that dies before the next call with the same name."""
    if not _reuses_workspace(a, b):
        return torch.bmm(a, b)
    return torch.bmm(a, b, out=_WORKSPACE.get(name, (a.shape[0], a.shape[1], b.shape[2]), a))


def _transient_matmul(name: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b (same batch dimensions), for a result that dies before the next call with the same name."""
    if not _reuses_workspace(a, b):
        return a @ b
    return torch.matmul(a, b, out=_WORKSPACE.get(name, (*a.shape[:-1], b.shape[-1]), a))


def _transient_copy(name: str, x: torch.Tensor) -> torch.Tensor:
    """x.contiguous(), for a result that dies before the next call with the same name."""
    if not _reuses_workspace(x):
        return x.contiguous()
    return _WORKSPACE.get(name, x.shape, x).copy_(x)


def _kept_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), for a result a custom Function keeps for its backward (`_KeptBuffers`)."""
    if not _reuses_workspace(x, weight):
        return F.linear(x, weight, bias)
    out = _KEPT.take((*x.shape[:-1], weight.shape[0]), x)
    _linear_into(x.reshape(-1, x.shape[-1]), weight, bias, out.view(-1, weight.shape[0]))
    return out


def _linear_into(
    flat_x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor
) -> torch.Tensor:
    """flat_x (M, in) @ weight^T (+ bias) written into the contiguous (M, out) tensor `out`."""
    if bias is None:
        return torch.mm(flat_x, weight.t(), out=out)
    return torch.addmm(bias, flat_x, weight.t(), out=out)


def _kept_copy(x: torch.Tensor) -> torch.Tensor:
    """x.contiguous(), for a result a custom Function keeps for its backward (`_KeptBuffers`)."""
    if not _reuses_workspace(x):
        return x.contiguous()
    return _KEPT.take(x.shape, x).copy_(x)


def _transient_stream(name: str, shape: Sequence[int], *like: torch.Tensor) -> torch.Tensor | None:
    """A buffer of `shape` for a result (written with out=) that dies before the next use of `name`, or None.

    None where `_reuses_workspace` says no: the caller then lets the op allocate its result.
    """
    return _WORKSPACE.get(name, shape, like[0]) if _reuses_workspace(*like) else None


def _transient_mul(name: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a * b (b broadcast to a's shape), for a result that dies before the next call with the same name."""
    if not _reuses_workspace(a, b) or torch.broadcast_shapes(a.shape, b.shape) != a.shape:
        return a * b
    return torch.mul(a, b, out=_WORKSPACE.get(name, a.shape, a))


def _transient_gelu(name: str, x: torch.Tensor) -> torch.Tensor:
    """GELU(x), for a result that dies before the next call with the same name."""
    if not _reuses_workspace(x):
        return F.gelu(x)
    return torch.ops.aten.gelu.out(x, out=_WORKSPACE.get(name, x.shape, x))


def _transient_linear(
    name: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """F.linear(x, weight, bias), for a result that dies before the next call with the same name."""
    if not _reuses_workspace(x, weight):
        return F.linear(x, weight, bias)
    flat = x.reshape(-1, x.shape[-1])
    out = _linear_into(flat, weight, bias, _WORKSPACE.get(name, (flat.shape[0], weight.shape[0]), x))
    return out.view(*x.shape[:-1], weight.shape[0])


class _BilinearAttention(torch.autograd.Function):
    """softmax(h A_uh h^T + bias) @ [C_uj v_j, C_uj], v = h W_v,u^T + b_v, for a set h (B, N, d) every function reads.

    q_i . k_j = h_i W_q,uh^T W_k,uh h_j^T (ModLins without bias), so with A_uh = W_q,uh^T W_k,uh (d x d, the
    codes and the softmax scale folded in) the logits are (h A_uh) h^T: one GEMM for all functions and heads
    (`bilinear` is [A_uh^T], a (U * H * d, d) Linear weight), then one batched matmul per sample against the
    shared h. That replaces the q and k projections and U * H small (N x d_h) @ (d_h x N) products, and costs
    fewer FLOPs when d is below about 2 d_h (the digits preset: 192 < 256; `bilinear_attention_pays` decides).
    Keeps h, h A, the values v = h W_v^T + b_v (`value_weight` (U * H * dv, d), `value_bias` (U * H * dv,) or
    None), the N x N weights (softmax) and the output. Redoing h A was a tenth of the arithmetic of a training
    step of the digits preset (0.79 of 6.94 GFLOP per image; benchmarks/RESULTS.md, 2026-11-25), redoing v 2% of
    its time (2026-11-28). On CPU they live in pooled buffers (`_KeptBuffers`) that the next step reuses.
    """

    @staticmethod
    def forward(
        ctx, hidden, bilinear, value_weight, value_bias, c_key, position_bias, num_heads, keep, output
    ):
        ctx.autocast = _AutocastState(hidden.device.type)
        ctx.num_heads = num_heads
        hidden = hidden.contiguous()
        num_functions = c_key.shape[1]
        # (B, N, U * H * d), rows (i, u, h); `keep`: autograd records this call, so there may be a backward.
        if keep:
            mixed = _kept_linear(hidden, bilinear)
        else:
            mixed = _transient_linear("h A", hidden, bilinear)
        probs = _bilinear_probs(mixed, hidden, position_bias, num_functions, num_heads)  # (B, N, U, H, N)
        probs = probs.permute(0, 2, 3, 1, 4)  # (B, U, H, N, N)
        probs = _kept_copy(probs) if keep else _transient_copy("probs", probs)
        value = _bilinear_values(hidden, value_weight, value_bias, num_functions, num_heads, keep)
        columns = _compatibility_columns(value, c_key, transient=True)
        if keep and _reuses_workspace(probs, columns):
            # The output is kept too (here and by `_AttentionOutput`): a pooled buffer, saved as an alias.
            out = _KEPT.take((*probs.shape[:-1], columns.shape[-1]), probs)
            torch.bmm(probs.flatten(0, 2), columns.flatten(0, 2), out=out.view(-1, *out.shape[-2:]))
            saved_out = _KEPT.alias(out)
        elif output is not None and _reuses_workspace(probs, columns):  # see `modulated_attention_bilinear`
            out = saved_out = _transient_matmul(output, probs, columns)
        else:
            out = saved_out = probs @ columns
        ctx.save_for_backward(
            hidden, bilinear, value_weight, value_bias, c_key, position_bias, saved_out, probs, mixed, value
        )
        return out

    @staticmethod
    def backward(ctx, grad_out):
        _refuse_double_backward()
        hidden, bilinear, value_weight, value_bias, c_key, position_bias, out, probs, mixed, value = (
            ctx.saved_tensors
        )
        b, n, d = hidden.shape
        u, h = c_key.shape[1], ctx.num_heads
        with ctx.autocast():
            grad_columns, grad_logits = _attention_weights_backward(probs, grad_out, out, value, c_key)
            del probs
            grad_bias = None
            if position_bias is not None and ctx.needs_input_grad[5]:
                grad_bias = grad_logits.sum(0).to(position_bias.dtype)
            # Back to the rows (i, u, h) of h A: one copy of the N x N gradient.
            grad_logits = _transient_copy("dL/dlogits rows", grad_logits.permute(0, 3, 1, 2, 4)).view(
                b, -1, n
            )
            mixed = mixed.to(grad_logits.dtype).view(b, -1, d)
            grad_mixed = _transient_bmm("dL/dh A", grad_logits, hidden.to(grad_logits.dtype)).view(b, n, -1)
            grad_hidden = torch.bmm(grad_logits.transpose(1, 2), mixed)
            grad_hidden = grad_hidden.add_(grad_mixed @ bilinear.to(grad_mixed.dtype))
            flat_hidden = hidden.reshape(b * n, d)
            grad_bilinear = grad_mixed.reshape(b * n, -1).t() @ flat_hidden.to(grad_mixed.dtype)
            # v = h W_v^T + b_v in the (B, N, U, H, dv) layout of the GEMM that made it (dL/dv written into it).
            layout = _transient_stream("dL/dx", (b, n, u, h, value.shape[-1]), grad_columns, c_key)
            grad_value, grad_c_key = _compatibility_columns_backward(
                grad_columns, value, c_key, out=None if layout is None else layout.permute(0, 2, 3, 1, 4)
            )
            grad_value = grad_value.permute(0, 3, 1, 2, 4).reshape(b * n, -1)
            grad_hidden = grad_hidden.add_((grad_value @ value_weight.to(grad_value.dtype)).view(b, n, d))
            grad_value_weight = (grad_value.t() @ flat_hidden.to(grad_value.dtype)).to(value_weight.dtype)
            grad_value_bias = None
            if value_bias is not None:
                grad_value_bias = grad_value.sum(0, dtype=torch.float32).to(value_bias.dtype)
        return (
            grad_hidden.to(hidden.dtype),
            grad_bilinear.to(bilinear.dtype),
            grad_value_weight,
            grad_value_bias,
            grad_c_key.to(c_key.dtype),
            grad_bias,
            None,
            None,
            None,
        )


def _bilinear_values(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, u: int, h: int, keep: bool = False
) -> torch.Tensor:
    """v = h W_v,u^T + b_v,u (B, U, H, N, dv) for all functions in one GEMM: a view of (B, N, U, H, dv).

    keep: `_BilinearAttention` keeps v for its backward (`_KeptBuffers`); else v dies inside the call (`_Workspace`).
    """
    b, n, _ = hidden.shape
    value = _kept_linear(hidden, weight, bias) if keep else _transient_linear("y", hidden, weight, bias)
    return value.view(b, n, u, h, -1).permute(0, 2, 3, 1, 4)


def _bilinear_probs(
    mixed: torch.Tensor, hidden: torch.Tensor, position_bias: torch.Tensor | None, u: int, h: int
) -> torch.Tensor:
    """softmax_j((h A_uh)_i . h_j + bias_uh,ij) as (B, N, U, H, N), from h A (B, N, U * H * d) and h (B, N, d)."""
    b, n, d = hidden.shape
    if hidden.device.type == "cpu" and not torch.compiler.is_compiling():
        # On CPU the logits are formed key-major, h_j . (h A)_(i, u, h): N x (N U H) products keep MKL's kernels
        # fuller than (N U H) x N ones (67 columns), and the softmax over j then runs across rows. The bmm, bias and
        # softmax took 77 ms against 89 (float32, digits preset, batch 128, one Zen 5 core, 2026-11-28; the caller's
        # copy to (B, U, H, N, N) transposes them: 10.5 ms against 4.4, counted in; bf16 63 against 64). The same
        # (B, N, U, H, N) view is returned.
        logits = _transient_bmm("logits", hidden.to(mixed.dtype), mixed.reshape(b, -1, d).transpose(1, 2))
        logits = logits.view(b, n, n, u, h)
        if position_bias is not None:  # (U, H, N_i, N_j) -> (N_j, N_i, U, H), contiguous: a small tensor
            logits += position_bias.permute(3, 2, 0, 1).to(logits.dtype).contiguous()
        if _reuses_workspace(logits):
            logits = torch.ops.aten._softmax.out(logits, 1, False, out=logits)
        else:
            logits = torch.softmax(logits, dim=1)
        return logits.permute(0, 2, 3, 4, 1)
    logits = _transient_bmm("logits", mixed.reshape(b, -1, d), hidden.to(mixed.dtype).transpose(1, 2))
    logits = logits.view(b, n, u, h, n)
    if position_bias is not None:  # off CPU or while compiling: no workspace buffers here
        logits += position_bias.permute(2, 0, 1, 3).to(logits.dtype)
    return torch.softmax(logits, dim=-1)


def modulated_attention_bilinear(
    hidden: torch.Tensor,
    query_weight: torch.Tensor,
    key_weight: torch.Tensor,
    value_weight: torch.Tensor,
    value_bias: torch.Tensor | None,
    compatibilities: torch.Tensor,
    position_bias: torch.Tensor | None,
    num_heads: int,
    eps: float,
    normalise: bool = True,
    output: str | None = None,
    bilinear: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eq. 6 exactly, as `modulated_attention_matmul` with q, k, v = h W_{q,k,v},u^T (+ b_v), in the bilinear form.

    hidden (B, N, d) is read by every function; query_weight / key_weight (U, H * d_h, d) and value_weight
    (U, H * dv, d) are the functions' modulated weights (the softmax scale folded into the query's), value_bias
    (U, H * dv) or None; compatibilities (U, B, N); position_bias (U, H, N, N) already scaled, or None. No
    dropout: see `_BilinearAttention`. output: for a caller done with the result before its next call with this
    name, a `_Workspace` buffer name for the columns without `normalise` (used where grad mode is off). bilinear:
    `bilinear_weight(query_weight, key_weight, num_heads)` if already formed (once per forward).
    """
    d = query_weight.shape[-1]
    # [A_uh^T] = [W_k,uh^T W_q,uh] as one (U * H * d, d) Linear weight: that layout runs the h A GEMM fastest.
    if bilinear is None:
        bilinear = bilinear_weight(query_weight, key_weight, num_heads)
    c_key = compatibilities.transpose(0, 1)[:, :, None, :, None]  # (B, U, 1, N, 1)
    value_weight = value_weight.reshape(-1, d)
    value_bias = None if value_bias is None else value_bias.reshape(-1)
    inputs = (hidden, bilinear, value_weight, value_bias, c_key, position_bias)
    keep = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)
    output = None if normalise or torch.is_grad_enabled() else output
    out = _BilinearAttention.apply(*inputs, num_heads, keep, output)
    return _normalise_columns(out, c_key, eps) if normalise else out


BILINEAR_SAVING_WEIGHT = 3
"""Weight of the bilinear form's per-sample FLOP saving against its per-batch cost (forming A_uh) in
`bilinear_attention_pays`: the q.k^T products it replaces are U * H small (N x d_h) @ (d_h x N) matmuls per
sample, which ran at about a third of the speed of the GEMMs per FLOP (the digits preset in eval mode on 2 AMD
EPYC cores, 2026-11-28: the bilinear form was slower at batch 1 and 2 and faster from 3 or 4 on, with one or two
threads; benchmarks/RESULTS.md)."""


def _static_size(size: int | torch.SymInt) -> int | None:
    """`size` where it is a plain int; None where it is symbolic (a dynamic batch under torch.export or
    torch.compile), so that no choice of execution path depends on it: a guard on it would narrow the range of
    batch sizes the exported or compiled graph accepts."""
    return size if isinstance(size, int) else None


def bilinear_attention_pays(
    hidden_size: int, head_size: int, num_tokens: int, batch_size: int | None = None
) -> bool:
    """Whether the bilinear form pays per (function, head): w B (2 N d d_h + N^2 d_h - N d^2 - N^2 d) > d^2 d_h.

    The left side is what it saves per sample in FLOPs (weighted by `BILINEAR_SAVING_WEIGHT`), the right what
    forming A_uh costs whatever the batch: at the digits preset's sizes that outweighed the saving at batch 1 and 2
    when A_uh was formed in every function iteration (batch 1, as under `pipeline`, ran 3.5 GFLOP per image
    instead of 2.2). It is formed once per forward now (`LineOfCode.function_weights`), and the rule still weighs
    one iteration's saving against one forming: for the digits preset in eval mode (2 Zen 5 cores, 2026-11-29) it
    still picks q and k rightly at batch 1 (33.2 against 34.7 ms with one thread, 20.1 against 20.8 with two), but
    also at batch 2, where the bilinear form is now 4-7% faster (55.7 against 59.7 ms, 35.0 against 36.3); from
    batch 3 on it picks the bilinear form. Without `batch_size` only the per-sample costs are compared.
    """
    n, d = num_tokens, hidden_size
    per_sample_saving = 2 * n * d * head_size + n * n * head_size - (n * d * d + n * n * d)
    if batch_size is None or per_sample_saving <= 0:
        return per_sample_saving > 0
    return BILINEAR_SAVING_WEIGHT * batch_size * per_sample_saving > d * d * head_size


def _attention_probs(
    query: torch.Tensor, key: torch.Tensor, position_bias: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """softmax_j(q_i . k_j * scale + bias_ij) for contiguous q, k; k is read transposed, without a copy."""
    logits = torch.matmul(query, key.transpose(-1, -2))
    if scale != 1.0:
        logits = logits * scale
    if position_bias is not None:
        logits = logits + position_bias.to(logits.dtype)
    return torch.softmax(logits, dim=-1)


def modulated_attention_matmul(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    compatibilities: torch.Tensor,
    position_bias: torch.Tensor | None,
    scale: float,
    eps: float,
    dropout: float,
    normalise: bool = True,
) -> torch.Tensor:
    """Eq. 6 exactly, as `modulated_attention_sdpa` computes it, with two batched matmuls and a softmax.

    The path "sdpa" takes on CPU: PyTorch has no fused CPU kernel for a value head size (dv + 1) that differs
    from the query/key head size, and its math fallback rescales q and k by sqrt(scale) (two extra passes over
    the largest tensors of the layer, forward and backward) and keeps the N x N weights for the backward. Here
    `scale` multiplies the logits only when it is not 1 (the LOC folds it into the query weights), and without
    dropout the weights are recomputed in the backward (`_AttentionWithRecompute`).
    """
    c_key = compatibilities.transpose(0, 1)[:, :, None, :, None]  # (B, U, 1, N, 1)
    bias = None if position_bias is None else position_bias * scale
    if dropout > 0:
        probs = F.dropout(_attention_probs(query.contiguous(), key.contiguous(), bias, scale), p=dropout)
        out = probs @ _compatibility_columns(value, c_key)
    else:
        out = _AttentionWithRecompute.apply(query, key, value, c_key, bias, scale)
    return _normalise_columns(out, c_key, eps) if normalise else out


def modulated_attention_sdpa_kernel(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    compatibilities: torch.Tensor,
    position_bias: torch.Tensor | None,
    scale: float,
    eps: float,
    dropout: float,
    normalise: bool = True,
) -> torch.Tensor:
    """Eq. 6 through SDPA, exactly: W v = C_ui (A (C_u v)) / (eps + C_ui (A C_u)), A = softmax_j(logits).

    The key compatibilities C_uj scale the values and ride along as one extra value column, so the
    normaliser of Eq. 6 comes out of the same kernel call: no log-compatibility mask, no -inf rows
    (a function that accepts no token gives 0, not NaN), and the only mask is the positional bias.
    Functions are folded into the heads, (B, U * H, N, .), so that bias (U * H, N, N) broadcasts over
    the batch and is never materialised per sample. Dropout, if any, acts on A.
    """
    b, u, h, n, _ = query.shape
    c_key = compatibilities.transpose(0, 1)[:, :, None, :, None]  # (B, U, 1, N, 1)
    value = _compatibility_columns(value, c_key)
    mask = None if position_bias is None else (position_bias * scale).to(query.dtype).flatten(0, 1)
    out = F.scaled_dot_product_attention(
        query.flatten(1, 2),
        key.flatten(1, 2),
        value.flatten(1, 2),
        attn_mask=mask,
        dropout_p=dropout,
        scale=scale,
    ).unflatten(1, (u, h))
    return _normalise_columns(out, c_key, eps) if normalise else out


def modulated_attention_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    compatibilities: torch.Tensor,
    position_bias: torch.Tensor | None,
    scale: float,
    eps: float,
    dropout: float,
    normalise: bool = True,
) -> torch.Tensor:
    """The "sdpa" implementation: `modulated_attention_sdpa_kernel`, or on CPU `modulated_attention_matmul`.

    PyTorch has no fused CPU kernel for these head sizes, and its CPU math fallback is slower than the
    explicit matmuls, which compute the same formula. With `normalise=False` every path of "sdpa" returns the
    columns A @ [C_uj v_j, C_uj] (B, U, H, N, dv + 1) before Eq. 6's division, for `attention_output`.
    """
    fn = modulated_attention_matmul if query.device.type == "cpu" else modulated_attention_sdpa_kernel
    return fn(query, key, value, compatibilities, position_bias, scale, eps, dropout, normalise)


ATTENTION_FUNCTIONS = {"eager": modulated_attention_eager, "sdpa": modulated_attention_sdpa}

# Whether a LOC without hidden dropout forms its gated products, Eq. 6's division and the MLP's LayerNorm and GELU
# inside the memory-lean custom Functions (the default) or with plain autograd ops (as with hidden dropout). Both
# compute the same function; the switch lets benchmarks/diagnose_compile.py tell a compiler's handling of the
# custom Functions apart from the rest of the model.
LEAN_CUSTOM_FUNCTIONS = True

# Whether "sdpa" runs Eq. 6 in the "eager" formulation while torch.compile traces a model on an accelerator. On
# CUDA (an H200, torch 2.11, benchmarks/RESULTS.md of 2026-11-27) inductor compiled the LOCs of the "sdpa" path,
# A @ [C_uj v_j, C_uj] then Eq. 6's division, to another function (logits off by O(1), in float32 too; right with
# inductor's pattern matcher off, and with the "eager" formulation); never seen on the CPU. The switch lets
# benchmarks/diagnose_compile.py and benchmarks/diagnose_sdpa.py compile the "sdpa" path as built.
EAGER_ATTENTION_WHEN_COMPILED_ON_ACCELERATOR = True


def attention_implementation(requested: str | None, device: torch.device, compiling: bool) -> str:
    """The attention path a LOC runs: the config's, but "eager" for "sdpa" compiled on an accelerator (see above).

    Both compute Eq. 6; at these sizes "eager" was also the faster of the two on an H100 without compile
    (benchmarks/RESULTS.md, 2026-11-23).
    """
    implementation = requested or "sdpa"
    if (
        implementation == "sdpa"
        and compiling
        and device.type not in ("cpu", "meta")
        and EAGER_ATTENTION_WHEN_COMPILED_ON_ACCELERATOR
    ):
        return "eager"
    return implementation


class LineOfCode(nn.Module):
    """One LOC (Eqs. 5-7): modulated attention then ModMLP, both gated by C_ui, in U parallel streams."""

    def __init__(self, config: NeuralInterpreterConfig) -> None:
        super().__init__()
        d, cd = config.hidden_size, config.code_dim
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_size = config.attention_head_size
        self.qk_size = self.num_heads * self.head_size
        self.attention_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.query = ModLin(d, self.qk_size, cd, bias=False)
        self.key = ModLin(d, self.qk_size, cd, bias=False)
        self.value = ModLin(d, d, cd, bias=True)
        self.output = ModLin(d, d, cd, bias=True)
        self.mlp_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.mlp = ModMLP(config)
        self.position_bias = RelativePositionalBias(config) if config.use_relative_positional_bias else None
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        # Pad the tokens of the "eager" formulation to a multiple of this (1: no padding); an experiment for GPU
        # GEMM alignment that benchmarks/benchmark.py's "ni-eager-aligned" model turns on, not a config field.
        self.token_alignment = 1
        # Run the "eager" formulation's Eq. 6 through `modulated_attention_fused` (SDPA's fused GPU kernels) instead;
        # an experiment for compiled GPU training that benchmarks/benchmark.py's "ni-fused" model turns on.
        self.fused_attention = False
        # Form the "eager" formulation's logits in the bilinear form (`modulated_attention_eager_bilinear`) where
        # every function reads the same h; an experiment for compiled GPU training ("ni-bilinear" in the benchmarks).
        self.bilinear_logits = False
        # Compute the "eager" formulation's Eq. 6 as `modulated_attention_columns` (no N x N modulated weights), where
        # neither fused attention nor attention dropout is on; an experiment for compiled GPU training.
        self.columns_attention = False

    def _implementation(self, device: torch.device) -> str:
        """The attention path this LOC runs (see `attention_implementation`)."""
        # torch.jit.trace cannot record custom autograd Functions: it gets the plain autograd ops of "eager".
        if torch.jit.is_tracing():
            return "eager"
        return attention_implementation(
            self.config._attn_implementation, device, torch.compiler.is_compiling()
        )

    def _bilinear_form(self, x: torch.Tensor, implementation: str | None = None) -> str | None:
        """Where every function reads the same x (B, N, d), the formulation that forms the logits as (h A_uh) . h:
        "sdpa" (`modulated_attention_bilinear`, CPU) or "eager" (`modulated_attention_eager_bilinear`, the
        `bilinear_logits` experiment); None where the logits are q . k. implementation: `_implementation`'s."""
        if x.dim() != 3:
            return None
        implementation = implementation or self._implementation(x.device)
        if implementation == "eager":
            return "eager" if self.bilinear_logits and not self.fused_attention else None
        if (
            implementation == "sdpa"
            and x.device.type == "cpu"
            and not (self.training and self.config.attention_probs_dropout_prob > 0)
            and bilinear_attention_pays(x.shape[-1], self.head_size, x.shape[-2], _static_size(x.shape[0]))
        ):
            return "sdpa"
        return None

    def function_weights(
        self, codes: torch.Tensor, shared_input: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """The per-function weights of this LOC's ModLins, W diag(LayerNorm(W_c c_u)) (U, out, in) each (Eq. 5):
        "query" (the softmax scale folded in), "key", "value", "output", "fc1", "fc2". The same in every function
        iteration, so computed once per forward (`NeuralInterpreterScript.function_weights`). With `shared_input`, the
        (B, N, d) set this LOC reads with every function, also "bilinear" ([A_uh^T], `bilinear_weight`) where the
        LOC forms its logits in the bilinear form on it (0.19 GFLOP per forming in the digits preset)."""
        weights = {
            "query": self.query.function_weights(codes) * (1.0 / math.sqrt(self.head_size)),
            "key": self.key.function_weights(codes),
            "value": self.value.function_weights(codes),
            "output": self.output.function_weights(codes),
            "fc1": self.mlp.fc1.function_weights(codes),
            "fc2": self.mlp.fc2.function_weights(codes),
        }
        if shared_input is not None and self._bilinear_form(shared_input) is not None:
            weights["bilinear"] = bilinear_weight(weights["query"], weights["key"], self.num_heads)
        return weights

    def forward(
        self,
        x: torch.Tensor,
        compatibilities: torch.Tensor,
        codes: torch.Tensor,
        position_bias: torch.Tensor | None,
        combine: bool = False,
        weights: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """x (B, N, d) shared by all streams or (U, B, N, d); compatibilities (U, B, N) -> (U, B, N, d).

        position_bias: this LOC's (U, H, N, N) relative positional bias (see `NeuralInterpreterScript`), or None.
        combine: return sum_u C_ui LOC_u(x)_i (B, N, d), Eq. 8's combination of the streams, instead of them.
        weights: `function_weights(codes, x)` if already computed for this forward, else computed here.
        """
        u = codes.shape[0]
        if weights is None:
            weights = self.function_weights(codes, x if x.dim() == 3 else None)
        h = self.attention_norm(x)
        n = h.shape[-2]
        scale = 1.0 / math.sqrt(self.head_size)
        tracing = torch.jit.is_tracing()
        implementation = self._implementation(h.device)
        bilinear_form = self._bilinear_form(x, implementation)
        # The GPU experiments of the benchmark's models, switches of the "eager" formulation (see __init__).
        fused = implementation == "eager" and self.fused_attention
        aligned = implementation == "eager" and self.token_alignment > 1 and not fused
        if aligned:  # project padded tokens (zeros; see modulated_attention_aligned)
            h = F.pad(h, (0, 0, 0, -n % self.token_alignment))
        # The eager formulation's batched products take (B, U, H, N, .) views of a token-major (N, B, U, H, .)
        # projection as they are (the batch dimensions B, U, H merge into one stride); a batch-major projection
        # would be copied into head-major order first, q and k (128-wide heads) and v at every function iteration.
        token_major = implementation == "eager" and h.dim() == 3

        def heads(name: str, projection: ModLin) -> torch.Tensor:
            """(B, U, H, N, .) for the U functions, from their (U, out, in) weights `weights[name]`."""
            weight = weights[name]
            if token_major:
                y = apply_function_weights(h.transpose(0, 1), weight, projection.function_bias(u), False)
                return y.unflatten(-1, (self.num_heads, -1)).permute(1, 2, 3, 0, 4)
            y = apply_function_weights(h, weight, projection.function_bias(u), False)
            return y.unflatten(-1, (self.num_heads, -1)).permute(0, 2, 3, 1, 4)

        dropout = self.config.attention_probs_dropout_prob if self.training else 0.0
        columns_experiment = (
            implementation == "eager" and self.columns_attention and not fused and dropout == 0.0
        )
        bias = None if position_bias is None else position_bias * scale
        gate = compatibilities.unsqueeze(-1)
        eps = self.config.attention_eps
        # Without hidden dropout, the gated products, Eq. 6's division, the MLP's LayerNorm and its GELU are formed
        # inside custom Functions that keep only their inputs for the backward (cheap elementwise work is redone).
        lean = (
            LEAN_CUSTOM_FUNCTIONS
            and not tracing
            and not (self.training and self.config.hidden_dropout_prob > 0)
        )
        columns = lean and implementation != "eager"  # the attention hands over A @ [C v, C], not Eq. 6
        if bilinear_form == "sdpa":
            # Every function reads the same h (the first LOC of an iteration): q.k^T = h A_uh h^T.
            attended = modulated_attention_bilinear(
                h,
                weights["query"],
                weights["key"],
                weights["value"],
                self.value.function_bias(u),
                compatibilities,
                bias,
                self.num_heads,
                eps=eps,
                normalise=not columns,
                output="LOC attention",
                bilinear=weights.get("bilinear"),
            )
        elif bilinear_form == "eager":
            attended = modulated_attention_eager_bilinear(
                h,
                weights["query"],
                weights["key"],
                heads("value", self.value),
                compatibilities,
                bias,
                scale=1.0,
                eps=eps,
                dropout=dropout,
                columns=columns_experiment,
                column_alignment=self.token_alignment if aligned else 1,
                bilinear=weights.get("bilinear"),
            )
        else:
            # The softmax scale is folded into the query weights (U x out x in numbers, not B x U x N x out).
            q, k, v = heads("query", self.query), heads("key", self.key), heads("value", self.value)
            attention = ATTENTION_FUNCTIONS.get(implementation, modulated_attention_sdpa)
            kwargs = {"normalise": False} if columns else {}
            if columns_experiment:
                attention = modulated_attention_columns
            if aligned:
                attention = modulated_attention_aligned
                kwargs = {"alignment": self.token_alignment, "columns": columns_experiment}
            elif fused:
                attention = modulated_attention_fused
            attended = attention(
                q, k, v, compatibilities, bias, scale=1.0, eps=eps, dropout=dropout, **kwargs
            )
        if not lean:
            attended = _merge_heads(attended)
            y = apply_function_weights(attended, weights["output"], self.output.function_bias(u))
            a = torch.addcmul(x, gate, self.dropout(y))
            y = apply_function_weights(self.mlp_norm(a), weights["fc1"], self.mlp.fc1.function_bias(u))
            y = apply_function_weights(F.gelu(y), weights["fc2"], self.mlp.fc2.function_bias(u))
            streams = torch.addcmul(a, gate, self.dropout(y))
            return (gate * streams).sum(0) if combine else streams
        # a and the hidden layer stay inside this LOC: in inference on float32 CPU they go into reused buffers
        # (`_output_buffer`).
        if columns:
            a = attention_output(
                self.output, x, attended, compatibilities, eps, weights["output"], gate, output="LOC a"
            )
        else:
            a = x + gated_mod_lin(self.output, _merge_heads(attended), weights["output"], gate)
        hidden = norm_mod_lin(self.mlp_norm, self.mlp.fc1, a, weights["fc1"], output="LOC hidden")
        if combine:
            return gated_mod_lin_sum(self.mlp.fc2, a, hidden, weights["fc2"], gate)
        return a + gated_mod_lin(self.mlp.fc2, hidden, weights["fc2"], gate, gelu=True)

    def attention_weights(
        self,
        x: torch.Tensor,
        compatibilities: torch.Tensor,
        codes: torch.Tensor,
        position_bias: torch.Tensor | None,
        weights: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Eq. 6's attention weights W (B, U, H, N, N) of this LOC on `forward`'s inputs, before attention dropout.

        Computed apart from `forward` in the literal form (the fast paths never form W): for `output_attentions`.
        weights: `function_weights(codes)` if already computed for this forward.
        """
        if weights is None:
            weights = self.function_weights(codes)
        h = self.attention_norm(x)
        scale = 1.0 / math.sqrt(self.head_size)

        def heads(weight: torch.Tensor) -> torch.Tensor:
            """(B, U, H, N, dh) from the (U, B, N, H dh) projection of h."""
            y = apply_function_weights(h, weight, None)
            return y.unflatten(-1, (self.num_heads, -1)).permute(1, 0, 3, 2, 4)

        logits = heads(weights["query"]) @ heads(weights["key"]).transpose(-1, -2)
        bias = None if position_bias is None else position_bias * scale
        return modulated_attention_weights(logits, compatibilities, bias, 1.0, self.config.attention_eps)


class TypeInference(nn.Module):
    """Type inference, Eq. 2: t_i = normalize(MLP(LayerNorm(x_i)))."""

    def __init__(self, config: NeuralInterpreterConfig) -> None:
        super().__init__()
        widths = [config.hidden_size] + [config.type_inference_hidden_size] * (
            config.type_inference_depth - 1
        )
        widths.append(config.type_dim)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(nn.Linear(i, o) for i, o in zip(widths[:-1], widths[1:], strict=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == 0 else layer(F.gelu(x))
        return F.normalize(x, dim=-1)


class NeuralInterpreterScript(GradientCheckpointingLayer):
    """A script: U functions (signature s_u, code c_u) sharing one interpreter; `forward` is one function iteration."""

    def __init__(self, config: NeuralInterpreterConfig) -> None:
        super().__init__()
        self.config = config
        self.type_inference = TypeInference(config)
        self.signatures = nn.Parameter(torch.empty(config.num_functions, config.type_dim))
        self.codes = nn.Parameter(torch.empty(config.num_functions, config.code_dim))
        self.sigma = nn.Parameter(torch.tensor(float(config.sigma_init)))
        self.locs = nn.ModuleList(LineOfCode(config) for _ in range(config.num_loc_layers))

    def compatibilities(self, types: torch.Tensor, function_mask: torch.Tensor | None) -> torch.Tensor:
        """Eqs. 3-4: C_ui = C~_ui / (eps + sum_u C~_ui), C~_ui = exp(-d_ui / sigma) if d_ui <= tau else 0."""
        signatures = F.normalize(self.signatures, dim=-1)
        distance = 1.0 - torch.einsum("bnt,ut->ubn", types, signatures)  # (U, B, N)
        # sigma is learned freely; a floor keeps a sigma driven to 0 (or below) from turning d / sigma into NaN.
        kernel = torch.exp(-distance / self.sigma.clamp_min(1e-4))
        truncated = torch.where(distance <= self.config.truncation_tau, kernel, 0.0)
        if self.config.straight_through:
            truncated = kernel + (truncated - kernel).detach()
        if function_mask is not None:
            truncated = truncated * function_mask[:, None, None].to(truncated.dtype)
        return truncated / (self.config.kernel_eps + truncated.sum(dim=0, keepdim=True))

    def function_weights(self, hidden_states: torch.Tensor) -> tuple[dict[str, torch.Tensor], ...]:
        """Every LOC's `LineOfCode.function_weights`: the same in every function iteration, so computed once per
        forward, not per iteration. hidden_states (B, N, d): the set the first LOC reads with every function."""
        return tuple(
            loc.function_weights(self.codes, hidden_states if i == 0 else None)
            for i, loc in enumerate(self.locs)
        )

    def position_biases(self, num_prefix_tokens: int) -> torch.Tensor | None:
        """(L, U, H, N, N): every LOC's positional bias, computed once per forward, not per iteration or sample."""
        if not self.config.use_relative_positional_bias:
            return None
        return torch.stack([loc.position_bias(self.codes, num_prefix_tokens) for loc in self.locs])

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_biases: torch.Tensor | None = None,
        function_mask: torch.Tensor | None = None,
        loc_positions: torch.Tensor | None = None,
        output_attentions: bool = False,
        function_weights: tuple[dict[str, torch.Tensor], ...] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """One function iteration (Eq. 8): y_i = sum_u C_ui LOC_stack_u(x)_i. Returns (y, C (U,B,N), types, W).

        position_biases: from `position_biases` (patch inputs), or None (a set without positions).
        loc_positions: (N, d) absolute positions added to the stream before every LOC (zero rows for the task
            tokens), or None; type inference and the outer residual see x without them, as in the reference.
        output_attentions: W is then every LOC's Eq. 6 weights (`LineOfCode.attention_weights`), else None.
        function_weights: from `function_weights` (computed once per forward), or None to compute them here.
        """
        if function_weights is None:
            function_weights = self.function_weights(hidden_states)
        types = self.type_inference(hidden_states)
        compatibilities = self.compatibilities(types, function_mask)
        streams = hidden_states  # every stream starts from the same x: kept unexpanded for the first LOC
        attentions = () if output_attentions else None
        for i, loc in enumerate(self.locs):
            bias = None if position_biases is None else position_biases[i]
            if loc_positions is not None:
                streams = streams + loc_positions
            weights = function_weights[i]
            if output_attentions:
                attentions += (loc.attention_weights(streams, compatibilities, self.codes, bias, weights),)
            # The last LOC forms sum_u C_ui LOC_u(x)_i itself, which spares keeping the streams for dL/dC.
            streams = loc(streams, compatibilities, self.codes, bias, i == len(self.locs) - 1, weights)
        output = streams
        if self.config.outer_residual:
            output = hidden_states + output
        return output, compatibilities, types, attentions


# ----------------------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------------------


class NeuralInterpreterPreTrainedModel(PreTrainedModel):
    config_class = NeuralInterpreterConfig
    config: NeuralInterpreterConfig
    base_model_prefix = "neural_interpreter"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _no_split_modules = ["NeuralInterpreterScript"]
    # Trainer must not assume the model averages the loss over processes itself (see HF-NOTES.md).
    accepts_loss_kwargs = False

    def __init__(self, config: NeuralInterpreterConfig, *inputs: Any, **kwargs: Any) -> None:
        # A config changed in place after construction (`config.num_functions = 0`) is checked here, not later.
        if isinstance(config, NeuralInterpreterConfig):
            config.validate_neural_interpreter()
        super().__init__(config, *inputs, **kwargs)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """Load as transformers does, then re-freeze what the config freezes (loading makes every tensor trainable)."""
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        for module in model.modules():
            if isinstance(module, NeuralInterpreterModel):
                module.apply_freezing()
        return loaded

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Save as transformers does; a checkpoint with copied code also names the backbone for `AutoModel`.

        A head with no Auto class of its own (set regression) copies the code through its backbone, so the
        checkpoint loads without `ni_hf` too: `AutoModel` gives the backbone, and the head class named in
        `config.architectures` comes from `transformers.dynamic_module_utils.get_class_from_dynamic_module`.
        """
        backbone = getattr(self, self.base_model_prefix, None)
        is_main_process = kwargs.get("is_main_process", args[0] if args else True)
        if self._auto_class is not None:
            auto_map = dict(getattr(self.config, "auto_map", None) or {})
            auto_map.setdefault("AutoModel", "modeling_neural_interpreter.NeuralInterpreterModel")
            self.config.auto_map = auto_map
        elif isinstance(backbone, NeuralInterpreterModel) and backbone.is_remote_code() and is_main_process:
            os.makedirs(save_directory, exist_ok=True)
            custom_object_save(backbone, save_directory, config=self.config)
        return super().save_pretrained(save_directory, *args, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Signatures, codes, task tokens ~ N(0, 1); Linear weights: PyTorch's default or truncated normal."""
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, ModLin)):
            if std is None:
                init.kaiming_uniform_(module.weight, a=math.sqrt(5))
            else:
                init.trunc_normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, NeuralInterpreterScript):
            init.normal_(module.signatures)
            init.normal_(module.codes)
            init.constant_(module.sigma, float(self.config.sigma_init))
        elif isinstance(module, RelativePositionalBias):
            init.normal_(module.row_offset_embeddings)
            init.normal_(module.col_offset_embeddings)
        elif isinstance(module, NeuralInterpreterModel):
            init.normal_(module.task_tokens)


class NeuralInterpreterModel(NeuralInterpreterPreTrainedModel):
    """The backbone: patch embedding, task (CLS) tokens, and scripts of function iterations."""

    def __init__(self, config: NeuralInterpreterConfig) -> None:
        super().__init__(config)
        self.config = config
        self.patch_embedding = nn.Linear(config.patch_dim, config.hidden_size)
        num_token_params = 1 if config.share_task_tokens else config.num_task_tokens
        self.task_tokens = nn.Parameter(torch.empty(num_token_params, config.hidden_size))
        self.scripts = nn.ModuleList(NeuralInterpreterScript(config) for _ in range(config.num_scripts))
        # False under a head that feeds sets (`inputs_embeds`): the patch embedding is then never used.
        self.reads_patches = True
        # Whether forward checks for NaN and inf (one host sync); False under a head, which checks its own tensors.
        self.checks_finite = True
        self.post_init()
        self.apply_freezing()

    def apply_freezing(self) -> None:
        """Make the tensors the config freezes, and unused ones, non-trainable (so optimizers and DDP never see them)."""
        for script in self.scripts:
            script.signatures.requires_grad_(not self.config.freeze_signatures)
            script.codes.requires_grad_(not self.config.freeze_codes)
        self.patch_embedding.requires_grad_(self.reads_patches and not self.config.freeze_patch_embedding)

    def get_input_embeddings(self) -> nn.Module:
        return self.patch_embedding

    def reset_task_tokens(self, task_names: Sequence[str]) -> None:
        """Replace the task (CLS) tokens by fresh, trainable N(0, 1) ones, one per new task (adaptation)."""
        # Validate before any change: a refused call leaves the model as it was.
        names = validate_task_names(task_names)
        self.config.task_names = names
        self.config.default_task = 0
        num = 1 if self.config.share_task_tokens else len(names)
        ref = self.task_tokens
        self.task_tokens = nn.Parameter(torch.randn(num, ref.shape[1], device=ref.device, dtype=ref.dtype))

    def add_task_tokens(self, task_names: Sequence[str]) -> list[int]:
        """Append fresh N(0, 1) task (CLS) tokens for new tasks; the existing ones stay in the set, unchanged.

        Returns the indices of the new tasks. This is the reference implementation's ``finetune``: the tokens of
        the tasks seen so far remain part of every sample's set. Shared task tokens only gain the names. The
        set-regression model's shared head reads every token; an image classifier needs a head per new task too.
        """
        names = validate_task_names(task_names)
        if set(names) & set(self.config.task_names):
            raise ValueError(
                f"`task_names` must be new, distinct names (existing: {self.config.task_names}); got {names}."
            )
        old = self.config.num_tasks
        self.config.task_names = [*self.config.task_names, *names]
        if not self.config.share_task_tokens:
            ref = self.task_tokens
            fresh = torch.randn(len(names), ref.shape[1], device=ref.device, dtype=ref.dtype)
            self.task_tokens = nn.Parameter(torch.cat([ref.data, fresh]), requires_grad=ref.requires_grad)
        return list(range(old, old + len(names)))

    def add_functions(self, num_new: int) -> list[int]:
        """Capacity extension: append `num_new` functions (fresh N(0, 1) signature and code) to every script."""
        if not isinstance(num_new, int) or isinstance(num_new, bool) or num_new < 1:
            raise ValueError(f"`num_new` must be a positive integer, got {num_new!r}.")
        old = self.config.num_functions
        for script in self.scripts:
            for name in ("signatures", "codes"):
                param = getattr(script, name)
                fresh = torch.randn(num_new, param.shape[1], device=param.device, dtype=param.dtype)
                new = nn.Parameter(torch.cat([param.data, fresh]), requires_grad=param.requires_grad)
                setattr(script, name, new)
        self.config.num_functions = old + num_new
        return list(range(old, old + num_new))

    def embed_task_tokens(self, batch_size: int) -> torch.Tensor:
        """(B, T, d): every task's CLS token, for every sample (one copy per task when they are shared)."""
        tokens = self.task_tokens.expand(self.config.num_task_tokens, -1)
        return tokens.unsqueeze(0).expand(batch_size, -1, -1)

    def _embed_inputs(
        self, pixel_values: torch.Tensor | None, inputs_embeds: torch.Tensor | None
    ) -> tuple[torch.Tensor, bool]:
        """(B, N_in, d) input set, and whether it is a grid of patches (for the positional bias)."""
        if (pixel_values is None) == (inputs_embeds is None):
            raise ValueError(
                "Pass exactly one of `pixel_values` (images or patches) and `inputs_embeds` (a set)."
            )
        c = self.config
        if inputs_embeds is not None:
            if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != c.hidden_size:
                raise ValueError(
                    f"`inputs_embeds` must have shape (batch, set_size, {c.hidden_size}), got {tuple(inputs_embeds.shape)}."
                )
            _check_not_empty(inputs_embeds.shape[0])
            _check_floating("inputs_embeds", inputs_embeds, "a set of embedding vectors")
            return inputs_embeds.to(self.task_tokens.dtype), False
        _check_floating(
            "pixel_values",
            pixel_values,
            "pixels normalized to about [-1, 1], as NeuralInterpreterImageProcessor gives them; raw 0-255 images go "
            "through the processor first",
        )
        if pixel_values.dim() == 4:
            if pixel_values.shape[1:] != (c.num_channels, c.image_size, c.image_size):
                raise ValueError(
                    f"Images must have shape (batch, {c.num_channels}, {c.image_size}, {c.image_size}), got "
                    f"{tuple(pixel_values.shape)}; resize them with NeuralInterpreterImageProcessor."
                )
            pixel_values = patchify(pixel_values, c.patch_size)
        elif pixel_values.dim() != 3 or pixel_values.shape[1:] != (c.num_patches, c.patch_dim):
            raise ValueError(
                f"`pixel_values` must be images (batch, {c.num_channels}, {c.image_size}, {c.image_size}) or patches "
                f"(batch, {c.num_patches}, {c.patch_dim}), got {tuple(pixel_values.shape)}."
            )
        _check_not_empty(pixel_values.shape[0])
        pixel_values = pixel_values.to(self.patch_embedding.weight.dtype)
        return self.patch_embedding(pixel_values), True

    def _function_masks(self, disabled_functions: Sequence[int] | dict[int, Sequence[int]] | None, device):
        """One (U,) 0/1 mask per script, or None; `disabled_functions` lists functions (per script if a dict)."""
        if disabled_functions is None:
            return [None] * self.config.num_scripts
        num_scripts = self.config.num_scripts
        per_script = (
            disabled_functions
            if isinstance(disabled_functions, dict)
            else dict.fromkeys(range(num_scripts), disabled_functions)
        )
        unknown = [key for key in per_script if key not in range(num_scripts)]
        if unknown:
            raise ValueError(
                f"`disabled_functions` keys must be script indices 0..{num_scripts - 1}, got {unknown}."
            )
        masks = []
        for s in range(num_scripts):
            disabled = _index_list(per_script.get(s, []), "disabled_functions")
            if any(not 0 <= u < self.config.num_functions for u in disabled):
                raise ValueError(
                    f"`disabled_functions` must index functions 0..{self.config.num_functions - 1}, got {disabled}."
                )
            mask = torch.ones(self.config.num_functions, device=device)
            mask[disabled] = 0.0
            masks.append(mask if disabled else None)
        return masks

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_routing: bool = False,
        num_function_iterations: int | Sequence[int] | None = None,
        disabled_functions: Sequence[int] | dict[int, Sequence[int]] | None = None,
        return_dict: bool | None = None,
        loc_position_embeddings: torch.Tensor | None = None,
        output_attentions: bool | None = None,
    ) -> NeuralInterpreterModelOutput | tuple:
        r"""Run the scripts on the input set with the task tokens prepended.

        Args:
            pixel_values: images (B, C, H, W) or patches (B, num_patches, patch_dim) from the image processor.
            inputs_embeds: a set of vectors (B, N_in, d), used as is (no patch embedding, no positions).
            loc_position_embeddings: (N_in, d) positions of the input elements, added to the stream inside every
                LOC (`input_position_embedding_placement="every_loc"`); the task tokens get none.
            output_hidden_states: return the set after every function iteration.
            output_attentions: return Eq. 6's attention weights (B, U, H, N, N) of every LOC of every function
                iteration (computed apart, in the literal form, whatever the attention implementation).
            output_routing: return the compatibilities C (B, U, N) and types of every function iteration.
            num_function_iterations: run this many iterations per script (int or one per script) instead of the
                config's: anytime inference.
            disabled_functions: functions whose C_ui is forced to 0 before normalisation (indices for all scripts,
                or a dict script -> indices).
        """
        c = self.config
        output_hidden_states = (
            c.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        output_attentions = c.output_attentions if output_attentions is None else output_attentions
        return_dict = c.return_dict if return_dict is None else return_dict
        embeddings, is_patch_grid = self._embed_inputs(pixel_values, inputs_embeds)
        batch_size = embeddings.shape[0]
        num_prefix = c.num_task_tokens
        hidden = torch.cat([self.embed_task_tokens(batch_size).to(embeddings.dtype), embeddings], dim=1)

        iterations = c.iterations_per_script if num_function_iterations is None else num_function_iterations
        if isinstance(iterations, torch.Tensor) and iterations.dim() == 0:
            iterations = iterations.item()
        if isinstance(iterations, int) and not isinstance(iterations, bool):
            iterations = [iterations] * c.num_scripts
        iterations = _index_list(iterations, "num_function_iterations")
        if len(iterations) != c.num_scripts or any(k < 0 for k in iterations):
            raise ValueError(
                f"`num_function_iterations` must be a non-negative int or one per script ({c.num_scripts}), got {iterations}."
            )
        function_masks = self._function_masks(disabled_functions, hidden.device)
        loc_positions = None
        if loc_position_embeddings is not None:
            if loc_position_embeddings.shape != embeddings.shape[1:]:
                raise ValueError(
                    f"`loc_position_embeddings` must have shape {tuple(embeddings.shape[1:])} (one row per input "
                    f"element), got {tuple(loc_position_embeddings.shape)}."
                )
            loc_positions = F.pad(loc_position_embeddings.to(hidden.dtype), (0, 0, num_prefix, 0))

        all_hidden = (hidden,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        all_compat = () if output_routing else None
        all_types = () if output_routing else None
        for script, n_iter, mask in zip(self.scripts, iterations, function_masks, strict=True):
            biases = script.position_biases(num_prefix) if is_patch_grid and n_iter > 0 else None
            # Formed once for all iterations; but a checkpointed iteration forms its own inside the checkpoint: shared
            # tensors made outside it would be backpropagated by each reentrant checkpoint's inner backward.
            checkpointed = script.gradient_checkpointing and script.training and torch.is_grad_enabled()
            weights = script.function_weights(hidden) if n_iter > 0 and not checkpointed else None
            for _ in range(n_iter):
                hidden, compat, types, attentions = script(
                    hidden,
                    biases,
                    mask,
                    loc_positions,
                    output_attentions=output_attentions,
                    function_weights=weights,
                )
                if output_hidden_states:
                    all_hidden += (hidden,)
                if output_attentions:
                    all_attentions += attentions
                if output_routing:
                    all_compat += (compat.transpose(0, 1),)
                    all_types += (types,)

        if self.checks_finite:
            _check_finite(
                self,
                {
                    "pixel_values": pixel_values,
                    "inputs_embeds": inputs_embeds,
                    "loc_position_embeddings": loc_position_embeddings,
                },
                {"last_hidden_state": hidden},
            )
        pooled = hidden[:, :num_prefix]
        if not return_dict:
            outputs = (hidden, pooled, all_hidden, all_attentions, all_compat, all_types)
            return tuple(v for v in outputs if v is not None)
        return NeuralInterpreterModelOutput(
            last_hidden_state=hidden,
            pooler_output=pooled,
            hidden_states=all_hidden,
            attentions=all_attentions,
            compatibilities=all_compat,
            types=all_types,
        )


def _check_not_empty(batch_size: int) -> None:
    if batch_size == 0:
        raise ValueError("Got an empty batch (0 samples); pass at least one image or set.")


def _check_floating(name: str, values: torch.Tensor, expected: str) -> None:
    """Refuse integer, bool or complex inputs: a cast would run raw uint8 pixels as garbage, or drop imaginary parts."""
    if not values.is_floating_point():
        raise ValueError(f"`{name}` must be a floating-point tensor ({expected}), got dtype {values.dtype}.")


def _check_finite(
    module: nn.Module, inputs: dict[str, torch.Tensor | None], outputs: dict[str, torch.Tensor]
) -> None:
    """Raise, naming the tensor, if an input or an output holds NaN or inf (one host sync; skipped when compiling)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return
    checked = {
        name: t
        for name, t in {**inputs, **outputs}.items()
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    }
    device = next(iter(outputs.values())).device
    if device.type == "meta":  # shapes only (e.g. under accelerate's init_empty_weights): no values to check
        return
    if bool(torch.stack([torch.isfinite(t).all().to(device) for t in checked.values()]).all()):
        return
    for name in inputs:
        if name in checked and not bool(torch.isfinite(checked[name]).all()):
            raise ValueError(f"`{name}` contains NaN or infinite values: expected finite numbers.")
    name = next(n for n in outputs if not bool(torch.isfinite(checked[n]).all()))
    broken = [n for n, p in module.named_parameters() if not bool(torch.isfinite(p).all())]
    if broken:
        cause = (
            f"the parameters {broken[:3]}{' ...' if len(broken) > 3 else ''} are already NaN or inf (a diverged "
            "training run: lower the learning rate, or reload a checkpoint)"
        )
    else:
        magnitudes = [float(t.abs().max()) for n, t in checked.items() if n in inputs and t.numel()]
        largest = f" (largest magnitude {max(magnitudes):.3g})" if magnitudes else ""
        cause = (
            f"the inputs{largest} overflow {next(module.parameters()).dtype} inside the network: normalize them "
            "(NeuralInterpreterImageProcessor does) or use a wider dtype"
        )
    raise FloatingPointError(f"The forward pass produced NaN or infinite values in `{name}`: {cause}.")


def _index_list(values, name: str) -> list[int]:
    """Integers from a list, tuple, array or tensor of them; a ValueError naming `name` for anything else."""
    if isinstance(values, torch.Tensor) or hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, int) and not isinstance(values, bool):
        return [values]
    if not isinstance(values, (list, tuple)) or any(
        not isinstance(v, numbers.Integral) or isinstance(v, bool) for v in values
    ):
        raise ValueError(
            f"`{name}` must be integers (a list, tuple, array or tensor of them), got {values!r}."
        )
    return [int(v) for v in values]


def classification_loss(logits: torch.Tensor, labels: torch.Tensor, config) -> torch.Tensor:
    """Loss of transformers' image classifiers for `config.problem_type`, inferred as they do when unset.

    One label (num_labels=1): regression (MSE). Integer labels (B,): single-label cross-entropy. Float labels
    (B, num_labels): multi-label (BCE with logits).
    """
    batch_size, num_labels = logits.shape
    labels = labels.to(logits.device)
    if labels.shape[0] != batch_size:
        raise ValueError(f"`labels` must have one entry per sample ({batch_size}), got {labels.shape[0]}.")
    problem_type = config.problem_type
    if problem_type is None:
        if num_labels == 1:
            problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            problem_type = "single_label_classification"
        else:
            problem_type = "multi_label_classification"
        # Written into the config as transformers does, but not while compiling: the compiled graph guards on
        # `problem_type is None`, and changing it would recompile the model at its second call.
        if not torch.compiler.is_compiling():
            config.problem_type = problem_type
    logits = logits.float()
    if problem_type == "regression":
        if labels.numel() != batch_size * num_labels:
            raise ValueError(
                f"Regression `labels` must have shape (batch, {num_labels}), got {tuple(labels.shape)}."
            )
        return F.mse_loss(logits, labels.float().reshape(logits.shape))
    if problem_type == "single_label_classification":
        if labels.is_floating_point() or labels.dtype == torch.bool or labels.numel() != batch_size:
            raise ValueError(
                f"Single-label classification needs integer class indices of shape (batch,), got {labels.dtype} "
                f"labels of shape {tuple(labels.shape)}."
            )
        return F.cross_entropy(logits, labels.long().reshape(-1))
    if labels.shape != logits.shape:
        raise ValueError(
            f"Multi-label `labels` must have shape (batch, num_labels) = {tuple(logits.shape)}, got "
            f"{tuple(labels.shape)} (integer class indices of shape (batch,) need problem_type "
            "'single_label_classification')."
        )
    return F.binary_cross_entropy_with_logits(logits, labels.float())


class TaskHead(nn.Module):
    """LayerNorm + Linear on one task token's output."""

    def __init__(self, hidden_size: int, num_outputs: int, eps: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size, eps=eps)
        self.linear = nn.Linear(hidden_size, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(x))


def _resolve_task_ids(
    task_ids: torch.Tensor | None, config: NeuralInterpreterConfig, batch_size: int, device
):
    """(B,) long task ids; `config.default_task` when not given (e.g. under `pipeline`)."""
    if task_ids is None:
        return torch.full((batch_size,), config.default_task, dtype=torch.long, device=device)
    task_ids = torch.as_tensor(task_ids, device=device)
    if task_ids.is_floating_point() or task_ids.is_complex() or task_ids.dtype == torch.bool:
        raise ValueError(f"`task_ids` must be integer task indices, got {task_ids.dtype} values.")
    task_ids = task_ids.long().reshape(-1)
    if task_ids.numel() == 1 and batch_size > 1:
        task_ids = task_ids.expand(batch_size)
    if task_ids.shape[0] != batch_size:
        raise ValueError(
            f"`task_ids` must have one entry per sample ({batch_size}), got {task_ids.shape[0]}."
        )
    # One host sync in eager execution; none when compiling (a data-dependent branch would break the graph there,
    # in the multi-task training forward that run_digits.py compiles).
    if (
        task_ids.numel()
        and not task_ids.is_meta
        and not torch.compiler.is_compiling()
        and bool(((task_ids < 0) | (task_ids >= config.num_tasks)).any())
    ):
        raise ValueError(
            f"`task_ids` must lie in 0..{config.num_tasks - 1} (tasks {config.task_names}), got {task_ids.tolist()}."
        )
    return task_ids


class NeuralInterpreterForImageClassification(NeuralInterpreterPreTrainedModel):
    """Multi-task image classifier: each sample's task id picks its CLS token output and its head."""

    def __init__(self, config: NeuralInterpreterConfig) -> None:
        if config.input_position_embedding_placement != "input":
            # Patches carry no absolute positions to re-add: an image model places them through the relative
            # positional bias, so "every_loc" would silently change nothing.
            raise ValueError(
                "`input_position_embedding_placement` must be 'input' for image classification, got "
                f"{config.input_position_embedding_placement!r}: 'every_loc' re-adds the learned positions of set "
                "inputs (NeuralInterpreterForSetRegression); patch positions come from `use_relative_positional_bias`."
            )
        super().__init__(config)
        self.num_labels = config.num_labels
        self.neural_interpreter = NeuralInterpreterModel(config)
        self.neural_interpreter.checks_finite = False  # the head checks its own inputs and outputs
        self.checks_finite = True
        num_heads = 1 if config.share_task_tokens else config.num_tasks
        self.classifier = nn.ModuleList(
            TaskHead(config.hidden_size, config.num_labels, config.layer_norm_eps) for _ in range(num_heads)
        )
        self.post_init()

    def _fresh_heads(self, count: int) -> list[TaskHead]:
        """`count` task heads initialised as the model's own, on its device and in its dtype."""
        ref = self.neural_interpreter.task_tokens
        heads = [
            TaskHead(self.config.hidden_size, self.config.num_labels, self.config.layer_norm_eps)
            for _ in range(count)
        ]
        for head in heads:
            head.apply(self._init_weights)
        return [head.to(device=ref.device, dtype=ref.dtype) for head in heads]

    def reset_tasks(self, task_names: Sequence[str], num_labels: int | None = None) -> None:
        """New tasks: fresh CLS tokens and freshly initialised heads (e.g. few-shot adaptation to K-MNIST)."""
        # Validate before any change: a refused call leaves the model as it was.
        names = validate_task_names(task_names)
        if num_labels is not None and (
            not isinstance(num_labels, int) or isinstance(num_labels, bool) or num_labels < 1
        ):
            raise ValueError(f"`num_labels` must be a positive integer, got {num_labels!r}.")
        if num_labels is not None:
            self.config.num_labels = self.num_labels = num_labels
        self.neural_interpreter.reset_task_tokens(names)
        self.classifier = nn.ModuleList(self._fresh_heads(1 if self.config.share_task_tokens else len(names)))

    def add_tasks(self, task_names: Sequence[str]) -> list[int]:
        """Append tasks (a fresh CLS token and head each); the existing ones stay as they are. Returns their ids."""
        new_ids = self.neural_interpreter.add_task_tokens(task_names)
        if not self.config.share_task_tokens:
            self.classifier.extend(self._fresh_heads(len(new_ids)))
        return new_ids

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        task_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_routing: bool = False,
        num_function_iterations: int | Sequence[int] | None = None,
        disabled_functions: Sequence[int] | dict[int, Sequence[int]] | None = None,
        return_dict: bool | None = None,
        output_attentions: bool | None = None,
    ) -> NeuralInterpreterImageClassifierOutput | tuple:
        r"""Logits of each sample's task head; the loss of `config.problem_type` when `labels` are given.

        Args:
            task_ids: (B,) index of each sample's task in `config.task_names` (default `config.default_task`).
            labels: (B,) class indices (cross-entropy); (B, num_labels) floats for multi-label classification or
                regression, as in transformers' classifiers (`classification_loss`).
            Other arguments as in `NeuralInterpreterModel.forward`.
        """
        return_dict = self.config.return_dict if return_dict is None else return_dict
        outputs = self.neural_interpreter(
            pixel_values=pixel_values,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            output_routing=output_routing,
            num_function_iterations=num_function_iterations,
            disabled_functions=disabled_functions,
            return_dict=True,
        )
        pooled = outputs.pooler_output  # (B, T, d)
        num_heads = 1 if self.config.share_task_tokens else self.config.num_tasks
        if len(self.classifier) != num_heads:
            raise ValueError(
                f"The classifier has {len(self.classifier)} heads for {self.config.num_tasks} tasks: change tasks "
                "with the classifier's `reset_tasks` / `add_tasks`, which give each task its head, not with "
                "the backbone's `reset_task_tokens` / `add_task_tokens`."
            )
        task_ids = _resolve_task_ids(task_ids, self.config, pooled.shape[0], pooled.device)
        own_token = pooled[torch.arange(pooled.shape[0], device=pooled.device), task_ids]  # (B, d)
        if len(self.classifier) == 1:
            logits = self.classifier[0](own_token)
        else:
            all_logits = torch.stack([head(own_token) for head in self.classifier], dim=1)  # (B, T, L)
            logits = all_logits[torch.arange(pooled.shape[0], device=pooled.device), task_ids]
        labels = None if labels is None else torch.as_tensor(labels)
        if self.checks_finite:
            _check_finite(self, {"pixel_values": pixel_values, "labels": labels}, {"logits": logits})
        loss = None if labels is None else classification_loss(logits, labels, self.config)
        if not return_dict:
            extra = (outputs.hidden_states, outputs.attentions, outputs.compatibilities, outputs.types)
            return tuple(v for v in (loss, logits, *extra) if v is not None)
        return NeuralInterpreterImageClassifierOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            compatibilities=outputs.compatibilities,
            types=outputs.types,
        )


class NeuralInterpreterForSetRegression(NeuralInterpreterPreTrainedModel):
    """Set regression (the fuzzy-Boolean experiment): N scalars + one CLS token per task -> one scalar per task."""

    main_input_name = "inputs"
    input_modalities = ("text",)

    def __init__(self, config: NeuralInterpreterConfig) -> None:
        if config.use_relative_positional_bias:
            # A set has no grid: the bias would be built, saved and trained by nobody (and break DDP).
            raise ValueError(
                "`use_relative_positional_bias` must be False for set regression (the fuzzy_boolean preset's "
                "value): the bias is between patches of an image grid; set elements get learned positions instead."
            )
        super().__init__(config)
        d = config.hidden_size
        self.input_projection = nn.Linear(1, d)
        self.input_position_embeddings = nn.Parameter(torch.empty(config.num_input_variables, d))
        self.neural_interpreter = NeuralInterpreterModel(config)
        self.neural_interpreter.checks_finite = False  # the head checks its own inputs and outputs
        self.checks_finite = True
        # The backbone's patch embedding is never read by sets; frozen, it stays out of optimizers and DDP.
        self.neural_interpreter.reads_patches = False
        self.neural_interpreter.apply_freezing()
        self.regressor = TaskHead(d, 1, config.layer_norm_eps)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.input_projection

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, NeuralInterpreterForSetRegression):
            # Learned positional embeddings: N(0, std), std 1.0 by default as the reference's (GPT-2's is 0.02).
            init.normal_(module.input_position_embeddings, std=self.config.input_position_embedding_std)

    def forward(
        self,
        inputs: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_routing: bool = False,
        num_function_iterations: int | Sequence[int] | None = None,
        disabled_functions: Sequence[int] | dict[int, Sequence[int]] | None = None,
        return_dict: bool | None = None,
        output_attentions: bool | None = None,
    ) -> NeuralInterpreterSetRegressionOutput | tuple:
        r"""Predictions (B, T) from inputs (B, num_input_variables); MSE loss against labels (B, T)."""
        c = self.config
        return_dict = c.return_dict if return_dict is None else return_dict
        if inputs is None or inputs.dim() != 2 or inputs.shape[1] != c.num_input_variables:
            shape = None if inputs is None else tuple(inputs.shape)
            raise ValueError(f"`inputs` must have shape (batch, {c.num_input_variables}), got {shape}.")
        _check_floating("inputs", inputs, "the input variables' values")
        dtype = self.input_projection.weight.dtype
        embeds = self.input_projection(inputs.to(dtype).unsqueeze(-1))
        every_loc = c.input_position_embedding_placement == "every_loc"
        if not every_loc:
            embeds = embeds + self.input_position_embeddings
        outputs = self.neural_interpreter(
            inputs_embeds=embeds,
            loc_position_embeddings=self.input_position_embeddings if every_loc else None,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            output_routing=output_routing,
            num_function_iterations=num_function_iterations,
            disabled_functions=disabled_functions,
            return_dict=True,
        )
        predictions = self.regressor(outputs.pooler_output).squeeze(-1)  # (B, T)
        if self.checks_finite:
            _check_finite(self, {"inputs": inputs, "labels": labels}, {"predictions": predictions})
        loss = None
        if labels is not None:
            if labels.shape != predictions.shape:
                raise ValueError(
                    f"`labels` must have shape (batch, num_tasks) = {tuple(predictions.shape)}, got {tuple(labels.shape)}."
                )
            loss = F.mse_loss(predictions.float(), labels.to(predictions.device).float())
        if not return_dict:
            extra = (outputs.hidden_states, outputs.attentions, outputs.compatibilities, outputs.types)
            return tuple(v for v in (loss, predictions, *extra) if v is not None)
        return NeuralInterpreterSetRegressionOutput(
            loss=loss,
            predictions=predictions,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            compatibilities=outputs.compatibilities,
            types=outputs.types,
        )


__all__ = [
    "NeuralInterpreterPreTrainedModel",
    "NeuralInterpreterModel",
    "NeuralInterpreterForImageClassification",
    "NeuralInterpreterForSetRegression",
    "NeuralInterpreterModelOutput",
    "NeuralInterpreterImageClassifierOutput",
    "NeuralInterpreterSetRegressionOutput",
    "ModLin",
    "ModMLP",
    "LineOfCode",
    "NeuralInterpreterScript",
    "patchify",
    "release_workspace",
    "set_eager_formulation",
]
