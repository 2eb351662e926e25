"""The "fast" implementation of Eq. 6: the same function as `sdpa_attention`, faster on a CPU.

Registered with `NeuralInterpreterAttentionInterface` when `ni_hf` is imported; the modeling file never imports
this module, so a checkpoint's copied code runs without it (on "sdpa"). On a CPU, without attention dropout and
outside a compiler, it computes Eq. 6 as A @ [C_uj v_j, C_uj] (see `sdpa_attention`) with two custom autograd
Functions that keep only their inputs and redo the N x N softmax in the backward instead of keeping it:

- `BilinearAttention`, for a LOC whose every function reads the same set h (the first LOC of an iteration): the
  logits q_i . k_j = h_i W_q,uh^T W_k,uh h_j^T are formed as (h A_uh) . h with A_uh = W_q,uh^T W_k,uh (d x d),
  one GEMM for all functions and heads instead of the q and k projections and U * H small products, where that
  saves FLOPs (`bilinear_attention_pays`);
- `AttentionWithRecompute` elsewhere: softmax(q k^T) @ columns, the weights recomputed from q and k in the backward.

Everywhere else (accelerators, attention dropout, torch.compile, export) it is `sdpa_attention`. Both Functions are
first order: gradients of gradients need attn_implementation="eager" or "sdpa".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .modeling_neural_interpreter import (
    FunctionWeights,
    LineOfCode,
    NeuralInterpreterAttentionInterface,
    merge_heads,
    normalise_columns,
    sdpa_attention,
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
        grad_logits = grad_logits.permute(0, 3, 1, 2, 4).reshape(
            b, -1, n
        )  # back to the rows (i, u, h) of h A
        grad_mixed = (grad_logits @ hidden).view(b, n, -1)
        grad_hidden = grad_logits.transpose(1, 2) @ mixed.view(b, -1, d) + grad_mixed @ bilinear
        flat_hidden = hidden.reshape(b * n, d)
        grad_bilinear = grad_mixed.reshape(b * n, -1).t() @ flat_hidden
        grad_value, grad_c_key = _columns_backward(grad_columns, value, c_key)
        grad_value = grad_value.permute(0, 3, 1, 2, 4).reshape(b * n, -1)
        grad_hidden = grad_hidden + (grad_value @ value_weight).view(b, n, d)
        grad_value_weight = grad_value.t() @ flat_hidden
        grad_value_bias = None if value_bias is None else grad_value.sum(0)
        return grad_hidden, grad_bilinear, grad_value_weight, grad_value_bias, grad_c_key, grad_bias, None


def fast_attention(
    module: LineOfCode,
    hidden: torch.Tensor,
    weights: FunctionWeights,
    compatibilities: torch.Tensor,
    position_bias: torch.Tensor | None,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, None]:
    """Eq. 6 as `sdpa_attention` computes it, through `BilinearAttention` or `AttentionWithRecompute` on a CPU."""
    if hidden.device.type != "cpu" or dropout > 0 or torch.compiler.is_compiling():
        return sdpa_attention(module, hidden, weights, compatibilities, position_bias, dropout)
    scale = module.scaling
    c_key = compatibilities.transpose(0, 1)[:, :, None, :, None]  # (B, U, 1, N, 1)
    bias = None if position_bias is None else (position_bias * scale).to(hidden.dtype)
    head_size = module.config.attention_head_size
    if hidden.dim() == 3 and bilinear_attention_pays(
        hidden.shape[-1], head_size, hidden.shape[1], hidden.shape[0]
    ):
        if "bilinear" not in weights:  # formed once per forward, for every function iteration
            weights["bilinear"] = bilinear_weight(weights["query"] * scale, weights["key"], module.num_heads)
        value_weight = weights["value"].flatten(0, 1)
        value_bias = (
            None if module.value.bias is None else module.value.bias.repeat(weights["value"].shape[0])
        )
        out = BilinearAttention.apply(
            hidden, weights["bilinear"], value_weight, value_bias, c_key, bias, module.num_heads
        )
    else:
        query, key, value = (module.heads(hidden, weights, name) for name in ("query", "key", "value"))
        out = AttentionWithRecompute.apply(query, key, value, c_key, bias, scale)
    return merge_heads(normalise_columns(out, c_key, module.config.attention_eps)), None


NeuralInterpreterAttentionInterface.register("fast", fast_attention)
