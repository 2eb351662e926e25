"""The fused model equals Eqs. 2-8 written out token by token in the authors' layout.

The authors' code (nasimrahaman/neural-interpreter, `core/nfc.py`, `core/modfc.py`, with the digits preset's
LOC options: `residual_mode: modulated_attn`, `use_fc_after_attention`, `scale_attention_weights`, no trailing
activation, no residuals around a function pod or a script) repeats every token for every function, (B, U, N, d),
modulates each token's weights with its function's code, and forms Eq. 6 with einsums. `reference_layout_forward`
below is that computation written independently of the package (plain tensors, no custom autograd, no folding
of the functions into GEMMs) for the set-regression model, whose input path is the reference's "entities" one:
`Linear(1, d)` of each scalar plus a learned position, CLS tokens first. The package's model must give the same
predictions and the same gradients on every execution path (the per-stream matmuls, the bilinear form of the
logits, eager), in eval and in training mode.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ni_hf import ALL_LINE_OF_CODE_FUNCTIONS, NeuralInterpreterConfig, NeuralInterpreterForSetRegression
from ni_hf.kernels.fast_line_of_code import bilinear_attention_pays


def _ln(p: dict[str, torch.Tensor], prefix: str, x: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), p[f"{prefix}.weight"], p[f"{prefix}.bias"], eps)


def _mod_lin(p: dict[str, torch.Tensor], prefix: str, x: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """Eq. 5 per token: W (x * LayerNorm(W_c c)) + b, with c the token's own copy of its function's code."""
    modulation = F.layer_norm(codes @ p[f"{prefix}.code_proj.weight"].t(), (x.shape[-1],))
    return F.linear(x * modulation, p[f"{prefix}.weight"], p.get(f"{prefix}.bias"))


def _loc(
    p: dict[str, torch.Tensor], prefix: str, x: torch.Tensor, codes: torch.Tensor, c: torch.Tensor, config
) -> torch.Tensor:
    """One LOC on (B, U, N, d) streams with compatibilities c (B, U, N): Eqs. 5-7."""
    b, u, n, d = x.shape
    heads = config.num_attention_heads
    codes = codes[None, :, None, :].expand(b, u, n, -1)
    h = _ln(p, f"{prefix}.attention_norm", x, config.layer_norm_eps)
    q = _mod_lin(p, f"{prefix}.query", h, codes).unflatten(-1, (heads, -1))
    k = _mod_lin(p, f"{prefix}.key", h, codes).unflatten(-1, (heads, -1))
    v = _mod_lin(p, f"{prefix}.value", h, codes).unflatten(-1, (heads, -1))
    a = torch.softmax(
        torch.einsum("burhc,bushc->bursh", q, k) / math.sqrt(config.attention_head_size), dim=-2
    )
    w = torch.einsum("bur,bus,bursh->bursh", c, c, a)  # Eq. 6: C_ui A_ij C_uj / (eps + sum_j ...)
    w = w / (w.sum(-2, keepdim=True) + config.attention_eps)
    attended = torch.einsum("bursh,bushc->burhc", w, v).flatten(-2)
    gate = c[..., None]
    a_out = x + gate * _mod_lin(p, f"{prefix}.output", attended, codes)
    hidden = F.gelu(
        _mod_lin(p, f"{prefix}.mlp.fc1", _ln(p, f"{prefix}.mlp_norm", a_out, config.layer_norm_eps), codes)
    )
    return a_out + gate * _mod_lin(p, f"{prefix}.mlp.fc2", hidden, codes)


def _function_iteration(
    p: dict[str, torch.Tensor], prefix: str, x: torch.Tensor, config, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """Eqs. 2-4 and 8 for x (B, N, d): types, truncated kernel, U streams of LOCs, combination by C.

    positions: the reference's layerwise positional encoding, written into the last rows of every LOC's input in
    place (its `PositionalEncoding.apply` on the (B, U, N, d) copy that einops 0.3's `repeat` returned).
    """
    t = _ln(p, f"{prefix}.type_inference.norm", x, config.layer_norm_eps)
    for i in range(config.type_inference_depth):
        t = F.linear(
            t if i == 0 else F.gelu(t),
            p[f"{prefix}.type_inference.layers.{i}.weight"],
            p[f"{prefix}.type_inference.layers.{i}.bias"],
        )
    distance = 1.0 - torch.einsum(
        "uc,bnc->bun", F.normalize(p[f"{prefix}.signatures"], dim=-1), F.normalize(t, dim=-1)
    )
    kernel = torch.exp(-distance / p[f"{prefix}.sigma"])
    kernel = torch.where(distance <= config.truncation_tau, kernel, torch.zeros_like(kernel))
    c = kernel / (kernel.sum(1, keepdim=True) + config.kernel_eps)  # (B, U, N)
    streams = x[:, None].expand(-1, c.shape[1], -1, -1)
    for layer in range(config.num_loc_layers):
        if positions is not None:
            streams = streams.clone()
            streams[..., -positions.shape[0] :, :] += positions
        streams = _loc(p, f"{prefix}.locs.{layer}", streams, p[f"{prefix}.codes"], c, config)
    y = torch.einsum("bun,bund->bnd", c, streams)
    return x + y if config.outer_residual else y


def reference_layout_forward(model: NeuralInterpreterForSetRegression, inputs: torch.Tensor) -> torch.Tensor:
    config = model.config
    p = dict(model.named_parameters())
    entities = F.linear(inputs[..., None], p["input_projection.weight"], p["input_projection.bias"])
    every_loc = config.input_position_embedding_placement == "every_loc"
    positions = p["input_position_embeddings"] if every_loc else None
    if not every_loc:  # the reference's pre_positional_encoding
        entities = entities + p["input_position_embeddings"]
    cls = p["neural_interpreter.task_tokens"][None].expand(inputs.shape[0], -1, -1)
    x = torch.cat([cls, entities], dim=1)
    for s, iterations in enumerate(config.iterations_per_script):
        for _ in range(iterations):
            x = _function_iteration(p, f"neural_interpreter.scripts.{s}", x, config, positions)
    y = _ln(p, "regressor.norm", x[:, : cls.shape[1]], config.layer_norm_eps)
    return F.linear(y, p["regressor.linear.weight"], p["regressor.linear.bias"]).squeeze(-1)


# The paper's fuzzy-Boolean preset (d 128, one head of 32: the per-stream matmuls) and a narrow two-head model
# with two LOCs per iteration whose first LOC takes the bilinear form of the logits on CPU; tau 1.2 and 1.3 (below the
# preset's 1.6) so that an untrained model already truncates some (function, token) pairs.
CONFIGS = {
    "fuzzy_boolean_preset": dict(
        num_input_variables=5, task_names=[f"f{i}" for i in range(6)], num_labels=1, truncation_tau=1.2
    ),
    "two_heads_two_locs_bilinear": dict(
        hidden_size=24,
        code_dim=16,
        num_scripts=2,
        num_function_iterations=[2, 1],
        num_loc_layers=2,
        num_functions=3,
        num_attention_heads=2,
        attention_head_size=32,
        type_inference_hidden_size=20,
        type_dim=8,
        truncation_tau=1.3,
        num_input_variables=7,
        task_names=["a", "b", "c"],
        num_labels=1,
        outer_residual=True,
        use_relative_positional_bias=False,
    ),
}
# The same two with the positions re-added inside every LOC (the reference's layerwise positional encoding).
CONFIGS |= {
    f"{name}_positions_every_loc": dict(kwargs, input_position_embedding_placement="every_loc")
    for name, kwargs in CONFIGS.items()
}


def _model(name: str, implementation: str) -> NeuralInterpreterForSetRegression:
    torch.manual_seed(1)
    if name.startswith("fuzzy_boolean_preset"):
        config = NeuralInterpreterConfig.from_paper("fuzzy_boolean", **CONFIGS[name])
    else:
        config = NeuralInterpreterConfig(**CONFIGS[name])
    config._attn_implementation = implementation
    model = NeuralInterpreterForSetRegression(config)
    with torch.no_grad():  # trained-looking routing: some pairs truncated, sigma away from its init
        for script in model.neural_interpreter.scripts:
            script.sigma.fill_(0.7)
    return model


@pytest.mark.parametrize("implementation", sorted(ALL_LINE_OF_CODE_FUNCTIONS))
@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_model_equals_reference_layout_in_value_and_gradient(
    name: str, implementation: str, training: bool
) -> None:
    model = _model(name, implementation).train(training)
    config = model.config
    generator = torch.Generator().manual_seed(1)
    inputs = torch.rand(16, config.num_input_variables, generator=generator)
    labels = torch.rand(16, len(config.task_names), generator=generator)

    out = model(inputs=inputs, labels=labels, output_routing=True)
    density = torch.cat([c.flatten() for c in out.compatibilities]).gt(0).float().mean().item()
    assert 0.0 < density < 1.0, f"the check needs truncated and kept pairs, got density {density}"
    # No token that every function truncates: such a token comes out as 0, and at init (zero biases) its next
    # type is exactly 0, where normalize's gradient is 1/1e-12 in both layouts: equal, but too large to compare.
    assert all(c.sum(1).gt(0).all() for c in out.compatibilities)
    expected = reference_layout_forward(model, inputs)
    torch.testing.assert_close(out.predictions, expected, rtol=1e-5, atol=1e-5)

    params = [p for p in model.parameters() if p.requires_grad]
    ours = torch.autograd.grad(out.loss, params, allow_unused=True)
    theirs = torch.autograd.grad(F.mse_loss(expected, labels), params, allow_unused=True)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    for name_, g, r in zip(names, ours, theirs, strict=True):
        if r is None:  # unused by the set model (the patch embedding)
            assert g is None or not g.any(), name_
            continue
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6, msg=lambda m, n=name_: f"{n}: {m}")


def test_the_second_config_takes_the_bilinear_form_on_cpu() -> None:
    """Guards the coverage claim above: the narrow config's first LOC uses the fast path's `BilinearAttention`."""
    c = CONFIGS["two_heads_two_locs_bilinear"]
    n = len(c["task_names"]) + c["num_input_variables"]
    assert bilinear_attention_pays(c["hidden_size"], c["attention_head_size"], n)
    preset = NeuralInterpreterConfig.from_paper("fuzzy_boolean")
    assert not bilinear_attention_pays(preset.hidden_size, preset.attention_head_size, 6 + 5)
