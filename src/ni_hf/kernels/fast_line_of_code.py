"""attn_implementation="fast": the reference LOC's function, computed on a CPU by custom autograd Functions.

Registered in `ALL_LINE_OF_CODE_FUNCTIONS` when `ni_hf` is imported; the modeling file never imports this module, so a
checkpoint's copied code runs without it. `fast_line_of_code` runs a whole LOC through Functions that keep only
their inputs for the backward and redo cheap work there instead of keeping it:

- Eq. 6 as A @ [C_uj v_j, C_uj] (see `sdpa_attention`), the N x N softmax redone in the backward:
  `BilinearAttention` for a LOC whose every function reads the same set h (the first LOC of an iteration) forms
  the logits q_i . k_j = h_i W_q,uh^T W_k,uh h_j^T as (h A_uh) . h with A_uh = W_q,uh^T W_k,uh (d x d), one GEMM
  for all functions and heads instead of the q and k projections, where that saves FLOPs
  (`bilinear_attention_pays`); `AttentionWithRecompute` elsewhere;
- `AttentionOutput`: x + C_ui ModLin(Eq. 6) from those columns, Eq. 6's normalisation redone in the backward;
- `NormModLin`: the MLP's first ModLin on LayerNorm(a), keeping a and its statistics;
- `GatedGeluModLin`: a + C_ui ModLin(GELU(hidden)), keeping hidden.

Their per-function products run one GEMM per function (`function_linear`). The Functions are CPU code of first
order: `fast_line_of_code` refuses, naming what to use instead, another device, torch.compile or tracing, autocast,
dropout in a training step, and gradients of gradients (attn_implementation="sdpa" computes the same function
everywhere); dropout without gradients (MC-dropout sampling) it hands over to "sdpa", which applies it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models.neural_interpreter.modeling_neural_interpreter import (
    FunctionWeights,
    LineOfCode,
    NeuralInterpreterLineOfCodeInterface,
    sdpa_line_of_code,
)

BILINEAR_SAVING_WEIGHT = 3
"""Weight of the bilinear form's per-sample FLOP saving against its per-batch cost (forming A_uh): the q.k^T
products it replaces are small batched matmuls that run at about a third of a GEMM's speed per FLOP on a CPU."""


def bilinear_attention_pays(
    hidden_size: int, head_size: int, num_tokens: int, batch_size: int | None = None
) -> bool:
    """Whether the bilinear form pays per (function, head): w B (2 N d d_h + N^2 d_h - N d^2 - N^2 d) > d^2 d_h.

    The left side is what it saves per sample in FLOPs, weighted by `BILINEAR_SAVING_WEIGHT`; the right, what
    forming A_uh costs whatever the batch. Without `batch_size` only the per-sample costs are compared.
    """
    n, d = num_tokens, hidden_size
    per_sample_saving = 2 * n * d * head_size + n * n * head_size - (n * d * d + n * n * d)
    if batch_size is None or per_sample_saving <= 0:
        return per_sample_saving > 0
    return BILINEAR_SAVING_WEIGHT * batch_size * per_sample_saving > d * d * head_size


def bilinear_weight(query_weight: torch.Tensor, key_weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[A_uh^T] = [W_k,uh^T W_q,uh] (U * H * d, d), rows (u, h, e), so that (h_i A_uh) . h_j = q_i . k_j."""
    u, hd, d = query_weight.shape
    wq = query_weight.view(u, num_heads, hd // num_heads, d)
    wk = key_weight.view(u, num_heads, hd // num_heads, d)
    return (wk.transpose(-1, -2) @ wq).reshape(-1, d)


def _refuse_double_backward() -> None:
    if torch.is_grad_enabled():
        raise RuntimeError(
            "Gradients of gradients (create_graph=True) are not supported by attn_implementation='fast'; use "
            "attn_implementation='eager' or 'sdpa' (at load, or model.set_attn_implementation('eager')), which "
            "compute the same function with autograd's own ops."
        )


def _compatibility_columns(value: torch.Tensor, c_key: torch.Tensor) -> torch.Tensor:
    """[C_uj v_j, C_uj] (B, U, H, N, d_v + 1): values scaled by the key compatibilities, plus C_uj as a column."""
    b, u, h, n, _ = value.shape
    return torch.cat([value * c_key, c_key.expand(b, u, h, n, 1)], dim=-1)


def _softmax_backward(
    probs: torch.Tensor, grad_out: torch.Tensor, out: torch.Tensor, columns: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of out = P @ columns, P = softmax(logits): (dL/dcolumns, dL/dlogits), with rowsum(dO * O)."""
    grad_columns = probs.transpose(-1, -2) @ grad_out
    grad_logits = grad_out @ columns.transpose(-1, -2)
    grad_logits.sub_((grad_out * out).sum(-1, keepdim=True)).mul_(probs)
    return grad_columns, grad_logits


def _columns_backward(
    grad_columns: torch.Tensor, value: torch.Tensor, c_key: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of `_compatibility_columns`: (dL/dv, dL/dC_uj), the latter summed over the heads."""
    grad_scaled, grad_c_column = grad_columns.split([value.shape[-1], 1], dim=-1)
    grad_c_key = ((grad_scaled * value).sum(-1, keepdim=True) + grad_c_column).sum(2, keepdim=True)
    return grad_scaled * c_key, grad_c_key


def _attention_probs(
    query: torch.Tensor, key: torch.Tensor, position_bias: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """softmax_j(q_i . k_j * scale + bias_ij), the bias already scaled."""
    logits = (query @ key.transpose(-1, -2)).mul_(scale)
    if position_bias is not None:
        logits += position_bias
    return torch.softmax(logits, dim=-1)


class AttentionWithRecompute(torch.autograd.Function):
    """softmax(q k^T * scale + bias) @ [C_uj v_j, C_uj], keeping q, k, v and the output, not the N x N weights."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, query, key, value, c_key, position_bias, scale):
        query, key = query.contiguous(), key.contiguous()
        out = _attention_probs(query, key, position_bias, scale) @ _compatibility_columns(value, c_key)
        ctx.scale = scale
        ctx.save_for_backward(query, key, value, c_key, position_bias, out)
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad_out):
        _refuse_double_backward()
        query, key, value, c_key, position_bias, out = ctx.saved_tensors
        probs = _attention_probs(query, key, position_bias, ctx.scale)
        grad_out = grad_out.to(probs.dtype)
        grad_columns, grad_logits = _softmax_backward(
            probs, grad_out, out, _compatibility_columns(value, c_key)
        )
        del probs
        grad_bias = grad_logits.sum(0) if position_bias is not None and ctx.needs_input_grad[4] else None
        grad_logits.mul_(ctx.scale)
        grad_query = grad_logits @ key
        grad_key = grad_logits.transpose(-1, -2) @ query
        grad_value, grad_c_key = _columns_backward(grad_columns, value, c_key)
        return grad_query, grad_key, grad_value, grad_c_key, grad_bias, None


def _bilinear_probs(
    mixed: torch.Tensor, hidden: torch.Tensor, position_bias: torch.Tensor | None, u: int, h: int
) -> torch.Tensor:
    """softmax_j((h A_uh)_i . h_j + bias_uh,ij) (B, U, H, N, N), from h A (B, N, U * H * d) and h (B, N, d)."""
    b, n, d = hidden.shape
    # Formed key-major, h_j . (h A)_(i, u, h): N x (N U H) products keep the CPU's GEMM kernels fuller than
    # (N U H) x N ones, and the softmax over j then runs across rows.
    logits = (hidden @ mixed.reshape(b, -1, d).transpose(1, 2)).view(b, n, n, u, h)
    if position_bias is not None:  # (U, H, N_i, N_j) -> (N_j, N_i, U, H)
        logits += position_bias.permute(3, 2, 0, 1)
    return torch.softmax(logits, dim=1).permute(0, 3, 4, 2, 1)


class BilinearAttention(torch.autograd.Function):
    """softmax(h A_uh h^T + bias) @ [C_uj v_j, C_uj] with v = h W_v,u^T + b_v, for a set h (B, N, d) all functions read.

    Keeps h, h A, v, the softmax and the output; `bilinear` is [A_uh^T] (U * H * d, d), `value_weight`
    (U * H * d_v, d), `value_bias` (U * H * d_v,) or None.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, hidden, bilinear, value_weight, value_bias, c_key, position_bias, num_heads):
        hidden = hidden.contiguous()
        b, n, _ = hidden.shape
        u = c_key.shape[1]
        mixed = F.linear(hidden, bilinear)  # (B, N, U * H * d), rows (i, u, h)
        probs = _bilinear_probs(mixed, hidden, position_bias, u, num_heads).contiguous()  # (B, U, H, N, N)
        value = F.linear(hidden, value_weight, value_bias).view(b, n, u, num_heads, -1).permute(0, 2, 3, 1, 4)
        out = probs @ _compatibility_columns(value, c_key)
        ctx.num_heads = num_heads
        ctx.save_for_backward(
            hidden, bilinear, value_weight, value_bias, c_key, position_bias, out, probs, mixed, value
        )
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad_out):
        _refuse_double_backward()
        hidden, bilinear, value_weight, value_bias, c_key, position_bias, out, probs, mixed, value = (
            ctx.saved_tensors
        )
        b, n, d = hidden.shape
        grad_out = grad_out.to(probs.dtype)
        grad_columns, grad_logits = _softmax_backward(
            probs, grad_out, out, _compatibility_columns(value, c_key)
        )
        del probs
        grad_bias = grad_logits.sum(0) if position_bias is not None and ctx.needs_input_grad[5] else None
        grad_logits = grad_logits.permute(0, 3, 1, 2, 4).flatten(1, 3)  # back to the rows (i, u, h) of h A
        grad_mixed = torch.bmm(grad_logits, hidden).view(b * n, -1)
        grad_hidden = torch.bmm(grad_logits.transpose(1, 2), mixed.view(b, -1, d))
        grad_hidden.view(b * n, d).addmm_(grad_mixed, bilinear)
        flat_hidden = hidden.reshape(b * n, d)
        grad_bilinear = grad_mixed.t() @ flat_hidden
        grad_value, grad_c_key = _columns_backward(grad_columns, value, c_key)
        grad_value = grad_value.permute(0, 3, 1, 2, 4).reshape(b * n, -1)
        grad_hidden = grad_hidden + (grad_value @ value_weight).view(b, n, d)
        grad_value_weight = grad_value.t() @ flat_hidden
        grad_value_bias = None if value_bias is None else grad_value.sum(0)
        return grad_hidden, grad_bilinear, grad_value_weight, grad_value_bias, grad_c_key, grad_bias, None


def _attention_columns(
    module: LineOfCode,
    hidden: torch.Tensor,
    function_weights: FunctionWeights,
    compatibilities: torch.Tensor,
    attention_bias: torch.Tensor | None,
    bilinear: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A @ [C_uj v_j, C_uj] (B, U, H, N, d_v + 1) and C_uj (B, U, 1, N, 1): `BilinearAttention` when `bilinear`
    ([A_uh^T], for a set h that every function reads) is given, else `AttentionWithRecompute`."""
    scale = module.scaling
    c_key = compatibilities.transpose(0, 1)[:, :, None, :, None]
    bias = None if attention_bias is None else (attention_bias * scale).to(hidden.dtype)
    if bilinear is not None:
        value_weight = function_weights["value"].flatten(0, 1)
        value_bias = (
            None
            if module.value.bias is None
            else module.value.bias.repeat(function_weights["value"].shape[0])
        )
        out = BilinearAttention.apply(
            hidden, bilinear, value_weight, value_bias, c_key, bias, module.num_heads
        )
    else:
        query, key, value = (
            module.project_heads(hidden, function_weights, name) for name in ("query", "key", "value")
        )
        out = AttentionWithRecompute.apply(query, key, value, c_key, bias, scale)
    return out, c_key


# ----------------------------------------------------------------------------------------------------------
# The rest of the LOC: gated ModLins that keep only their inputs
# ----------------------------------------------------------------------------------------------------------


def function_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x_u W_u^T + b (U, M, out) from x (U, M, in), W (U, out, in), one GEMM per function.

    A CPU's batched GEMM gives each thread whole matrices (5 functions on 2 threads: 3 rounds, the last on one
    thread); one GEMM per function keeps every thread on each.
    """
    out = x.new_empty(x.shape[0], x.shape[1], weight.shape[1])
    for u in range(x.shape[0]):
        if bias is None:
            torch.mm(x[u], weight[u].t(), out=out[u])
        else:
            torch.addmm(bias, x[u], weight[u].t(), out=out[u])
    return out


def function_matmul(grad: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """g_u W_u (U, M, in) from g (U, M, out) and W (U, out, in), one GEMM per function."""
    out = grad.new_empty(grad.shape[0], grad.shape[1], weight.shape[2])
    for u in range(grad.shape[0]):
        torch.mm(grad[u], weight[u], out=out[u])
    return out


def _gated_linear_backward(
    grad: torch.Tensor,
    inputs: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    gate: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Backward of r + gate * (x W_u^T + b) for x, W, b and the gate, without the product x W_u^T + b.

    dL/dgate = g . (x W_u^T + b) = (g W_u) . x + g . b reuses g W_u, which dL/dx needs anyway.
    """
    u, rows = gate.shape[0], gate[0].numel()
    grad = grad.reshape(u, rows, -1)
    flat_inputs = inputs.reshape(u, rows, -1)
    flat_gate = gate.reshape(u, rows, 1)
    grad_times_weight = function_matmul(grad, weight)
    grad_gate = (grad_times_weight * flat_inputs).sum(-1, keepdim=True)
    if bias is not None:
        grad_gate += grad @ bias.unsqueeze(-1)
    gated = grad * flat_gate
    grad_weight = torch.bmm(gated.transpose(1, 2), flat_inputs)
    grad_bias = None if bias is None else gated.sum((0, 1))
    grad_inputs = grad_times_weight.mul_(flat_gate).view_as(inputs)
    return grad_inputs, grad_weight, grad_bias, grad_gate.view_as(gate)


def _normalised_merged(columns: torch.Tensor, c_query: torch.Tensor, eps: float) -> torch.Tensor:
    """`merge_heads(normalise_columns(columns, c_query, eps))` (U, B, N, H * d_v), written in one pass."""
    b, u, h, n, _ = columns.shape
    numerator, total = columns.split([columns.shape[-1] - 1, 1], dim=-1)
    ratio = c_query / (eps + c_query * total).clamp_min(1e-30)
    merged = columns.new_empty(u, b, n, h * numerator.shape[-1])
    torch.mul(numerator, ratio, out=merged.view(u, b, n, h, -1).permute(1, 0, 3, 2, 4))
    return merged


def _normalise_columns_backward(
    grad: torch.Tensor, columns: torch.Tensor, c_query: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward of `normalise_columns`: (dL/dcolumns, dL/dC_ui summed over the heads).

    With D = max(eps + C T, 1e-30) and r = C / D: d(num r)/dnum = r, d/dT = -num C^2 / D^2, d/dC = num eps / D^2
    (0 where the clamp acts).
    """
    numerator, total = columns.split([columns.shape[-1] - 1, 1], dim=-1)
    denominator = eps + c_query * total
    unclamped = denominator >= 1e-30
    inverse = 1.0 / denominator.clamp_min(1e-30)
    grad_numerator = grad * (c_query * inverse)
    along = (grad * numerator).sum(-1, keepdim=True) * inverse * inverse * unclamped
    grad_total = -along * c_query * c_query
    grad_c_query = (along * eps).sum(2, keepdim=True)
    return torch.cat([grad_numerator, grad_total], dim=-1), grad_c_query


class AttentionOutput(torch.autograd.Function):
    """x + gate * ModLin(Eq. 6; c_u) from the attention's A @ [C_uj v_j, C_uj], keeping those columns only."""

    @staticmethod
    def forward(ctx, x, columns, c_query, eps, weight, bias, gate):
        attended = _normalised_merged(columns, c_query, eps)
        u, b, n, d = attended.shape
        y = function_linear(attended.view(u, -1, d), weight, bias).view(u, b, n, -1)
        del attended
        ctx.eps = eps
        ctx.shared_input = x.dim() == 3
        ctx.save_for_backward(columns, c_query, weight, bias, gate)
        return torch.addcmul(x, y, gate, out=y)

    @staticmethod
    def backward(ctx, grad):
        _refuse_double_backward()
        columns, c_query, weight, bias, gate = ctx.saved_tensors
        attended = _normalised_merged(columns, c_query, ctx.eps)
        grad_attended, grad_weight, grad_bias, grad_gate = _gated_linear_backward(
            grad, attended, weight, bias, gate
        )
        del attended
        b, u, h, n, _ = columns.shape
        grad_attended = grad_attended.view(u, b, n, h, -1).permute(1, 0, 3, 2, 4)
        grad_columns, grad_c_query = _normalise_columns_backward(grad_attended, columns, c_query, ctx.eps)
        grad_x = grad.sum(0) if ctx.shared_input else grad
        return grad_x, grad_columns, grad_c_query, None, grad_weight, grad_bias, grad_gate


class NormModLin(torch.autograd.Function):
    """ModLin(LayerNorm(a); c_u) for every function, keeping a and its statistics, not LayerNorm(a)."""

    @staticmethod
    def forward(ctx, a, norm_weight, norm_bias, norm_eps, weight, bias):
        normed, mean, rstd = torch.native_layer_norm(a, a.shape[-1:], norm_weight, norm_bias, norm_eps)
        u, b, n, d = a.shape
        y = function_linear(normed.view(u, -1, d), weight, bias).view(u, b, n, -1)
        ctx.save_for_backward(a, mean, rstd, norm_weight, norm_bias, weight, bias)
        return y

    @staticmethod
    def backward(ctx, grad):
        _refuse_double_backward()
        a, mean, rstd, norm_weight, norm_bias, weight, bias = ctx.saved_tensors
        u = a.shape[0]
        normed = (a - mean).mul_(rstd)
        if norm_weight is not None:
            normed.mul_(norm_weight)
        if norm_bias is not None:
            normed.add_(norm_bias)
        grad = grad.reshape(u, -1, grad.shape[-1])
        grad_weight = torch.bmm(grad.transpose(1, 2), normed.view(u, -1, a.shape[-1]))
        del normed
        grad_bias = None if bias is None else grad.sum((0, 1))
        grad_normed = function_matmul(grad, weight).view_as(a)
        grad_a, grad_norm_weight, grad_norm_bias = torch.ops.aten.native_layer_norm_backward(
            grad_normed, a, a.shape[-1:], mean, rstd, norm_weight, norm_bias, list(ctx.needs_input_grad[:3])
        )
        return grad_a, grad_norm_weight, grad_norm_bias, None, grad_weight, grad_bias


class GatedGeluModLin(torch.autograd.Function):
    """a + gate * ModLin(GELU(hidden); c_u): the MLP's second layer, keeping hidden, not GELU(hidden) or the product."""

    @staticmethod
    def forward(ctx, a, hidden, weight, bias, gate):
        u, b, n, d = hidden.shape
        y = function_linear(F.gelu(hidden).view(u, -1, d), weight, bias).view(u, b, n, -1)
        ctx.save_for_backward(hidden, weight, bias, gate)
        return torch.addcmul(a, y, gate, out=y)

    @staticmethod
    def backward(ctx, grad):
        _refuse_double_backward()
        hidden, weight, bias, gate = ctx.saved_tensors
        grad_gelu, grad_weight, grad_bias, grad_gate = _gated_linear_backward(
            grad, F.gelu(hidden), weight, bias, gate
        )
        grad_hidden = torch.ops.aten.gelu_backward(grad_gelu, hidden)
        return grad, grad_hidden, grad_weight, grad_bias, grad_gate


def _drops_out(module: LineOfCode) -> bool:
    """Whether the LOC applies dropout now: in training mode, with the config's hidden or attention dropout."""
    return module.training and (
        module.config.hidden_dropout_prob > 0 or module.config.attention_probs_dropout_prob > 0
    )


def _check_applies(module: LineOfCode, x: torch.Tensor) -> None:
    """Refuse, naming the alternative, what these CPU Functions do not compute."""
    problem = None
    if x.device.type != "cpu":
        problem = f"runs on a CPU only, and the model is on {x.device.type}"
    elif torch.compiler.is_compiling() or torch.jit.is_tracing():
        problem = "is not traced by torch.compile, torch.export or torch.jit (custom autograd Functions)"
    elif torch.is_autocast_enabled("cpu"):
        problem = "computes in the parameters' dtype and does not run under autocast"
    elif _drops_out(module) and torch.is_grad_enabled():
        problem = "has no dropout, and the config's hidden or attention dropout is above 0"
    if problem is not None:
        raise RuntimeError(
            f'attn_implementation="fast" {problem}: use attn_implementation="sdpa", which computes the same '
            'function (at load, or model.set_attn_implementation("sdpa")).'
        )


CHUNK_NUMBERS = 1 << 23
"""`fast_line_of_code` runs a batch in chunks whose largest tensor has at most this many numbers (32 MiB in float32),
so that its tensors come from the allocator's heap (glibc maps anything larger afresh, page by page, at every
allocation) and more of them stay in the CPU's caches."""


def _batch_chunks(x: torch.Tensor, compatibilities: torch.Tensor, module: LineOfCode) -> list[slice]:
    """Slices of the batch: chunks of at most `CHUNK_NUMBERS` numbers in h A, the N x N softmax and the streams."""
    u, b, n = compatibilities.shape
    per_sample = n * u * max(module.num_heads * x.shape[-1], module.num_heads * n, x.shape[-1])
    size = max(1, CHUNK_NUMBERS // per_sample)
    return [slice(start, start + size) for start in range(0, b, size)]


def fast_line_of_code(
    module: LineOfCode,
    x: torch.Tensor,
    compatibilities: torch.Tensor,
    function_weights: FunctionWeights,
    attention_bias: torch.Tensor | None,
) -> tuple[torch.Tensor, None]:
    """`LineOfCode.forward`'s streams (U, B, N, d), through Functions that keep only their inputs.

    Every sample is independent in a LOC, so the batch runs in chunks (`CHUNK_NUMBERS`); the gradients of the
    weights add up over the chunks. A_uh, when the bilinear form pays, is formed once for all chunks. A LOC that
    applies dropout without gradients (MC-dropout sampling: training mode under no_grad) runs `sdpa_line_of_code`,
    which applies it; with gradients, dropout is refused (these Functions have none).
    """
    _check_applies(module, x)
    if _drops_out(module):
        return sdpa_line_of_code(module, x, compatibilities, function_weights, attention_bias)
    bilinear = None
    if x.dim() == 3 and bilinear_attention_pays(
        x.shape[-1], module.config.attention_head_size, x.shape[1], x.shape[0]
    ):
        scaled_query = function_weights["query"] * module.scaling
        bilinear = bilinear_weight(scaled_query, function_weights["key"], module.num_heads)
    chunks = _batch_chunks(x, compatibilities, module)
    streams = [
        _lean_line_of_code(
            module, x[..., s, :, :], compatibilities[:, s], function_weights, attention_bias, bilinear
        )
        for s in chunks
    ]
    return (streams[0] if len(streams) == 1 else torch.cat(streams, dim=1)), None


def _lean_line_of_code(
    module: LineOfCode,
    x: torch.Tensor,
    compatibilities: torch.Tensor,
    function_weights: FunctionWeights,
    attention_bias: torch.Tensor | None,
    bilinear: torch.Tensor | None,
) -> torch.Tensor:
    """One chunk of `fast_line_of_code`."""
    columns, c_key = _attention_columns(
        module, module.attention_norm(x), function_weights, compatibilities, attention_bias, bilinear
    )
    gate = compatibilities.unsqueeze(-1)
    eps = module.config.attention_eps
    a = AttentionOutput.apply(x, columns, c_key, eps, function_weights["output"], module.output.bias, gate)
    norm = module.mlp_norm
    hidden = NormModLin.apply(
        a, norm.weight, norm.bias, norm.eps, function_weights["fc1"], module.mlp.fc1.bias
    )
    return GatedGeluModLin.apply(a, hidden, function_weights["fc2"], module.mlp.fc2.bias, gate)


NeuralInterpreterLineOfCodeInterface.register("fast", fast_line_of_code)
