"""Tests of the Neural Interpreter models (transformers' ModelTester pattern plus behaviour tests)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ni_hf import (
    NeuralInterpreterConfig,
    NeuralInterpreterForImageClassification,
    NeuralInterpreterForSetRegression,
    NeuralInterpreterModel,
)
from ni_hf.models.neural_interpreter import modeling_checks, modeling_neural_interpreter
from ni_hf.models.neural_interpreter.modeling_neural_interpreter import RelativePositionalBias, patchify

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


def test_a_single_image_costs_the_digits_presets_forward_flops_of_an_image_in_a_batch():
    """Batch 1 (as under `pipeline`): at most 2.2 GFLOP per image (the authors' implementation: 3.55)."""
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


# --- memory-lean custom autograd Functions: exact gradients (float64 finite differences) -------------------


def test_sdpa_records_the_literal_eq6_when_compiled_on_an_accelerator(tester, monkeypatch):
    """Inductor miscompiled the value-column form of Eq. 6 on an accelerator (H200, torch 2.11); the literal one is
    recorded there instead, and only there."""
    import ni_hf.models.neural_interpreter.modeling_neural_interpreter as modeling

    loc = NeuralInterpreterModel(tester.get_config()).scripts[0].locs[0]
    used = []
    monkeypatch.setattr(loc, "forward", lambda *args, attention: used.append(attention) or (args[0], None))
    for compiling, device in ((False, "cuda"), (True, "cpu"), (True, "cuda")):
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda compiling=compiling: compiling)
        x = SimpleNamespace(device=torch.device(device))  # a stand-in: no accelerator here
        modeling.sdpa_line_of_code(loc, x, None, {}, None)
    assert used == [modeling.sdpa_attention, modeling.sdpa_attention, modeling.eager_attention]


def test_the_default_implementation_is_sdpa_and_an_unregistered_one_is_refused_by_name(tester):
    model = NeuralInterpreterForImageClassification(tester.get_config())
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(
        ValueError, match=r'`attn_implementation="flash"` is not supported .* expected one of'
    ):
        model.set_attn_implementation("flash")
    assert model.config._attn_implementation == "sdpa"


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


@pytest.mark.parametrize("impl", ["eager", "sdpa", "fast"])
def test_loc_leaves_a_stream_unchanged_where_compatibility_is_zero(tester, impl):
    config = tester.get_config()
    config._attn_implementation = impl
    loc = NeuralInterpreterModel(config).scripts[0].locs[0].eval()  # initialised weights
    u, b, n = config.num_functions, 2, config.num_task_tokens + config.num_patches
    x = torch.randn(u, b, n, config.hidden_size)
    c = torch.rand(u, b, n)
    c[1, 0, 3] = 0.0
    c[2] = 0.0
    codes = torch.randn(u, config.code_dim)
    y, _ = loc(x, c, loc.function_weights(codes), loc.position_bias(codes, config.num_task_tokens))
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


@pytest.mark.parametrize("impl", ["sdpa", "eager", "fast"])
def test_output_attentions_are_the_weights_the_forward_multiplies_the_values_with(tester, impl):
    """Asked for W, every LOC runs the literal Eq. 6 and returns the W it used: the same logits, and W is part of
    the graph, so gradients reach it (attention attribution)."""
    config = tester.get_config(truncation_tau=0.9, num_loc_layers=2)
    torch.manual_seed(0)
    model = NeuralInterpreterForImageClassification(config).eval()
    model.set_attn_implementation(impl)
    inputs = tester.prepare_inputs(config)
    plain = model(**inputs).logits
    out = _attentions_and_routing(model, config, inputs)
    torch.testing.assert_close(out.logits, plain, atol=1e-5, rtol=1e-5)
    b, n = tester.batch_size, tester.set_size(config)
    for w in out.attentions:
        assert w.shape == (b, config.num_functions, config.num_attention_heads, n, n)
        w.retain_grad()
    out.logits.square().sum().backward()
    assert all(w.grad is not None and w.grad.abs().sum() > 0 for w in out.attentions)


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
    eager = modeling_neural_interpreter.eager_attention
    monkeypatch.setattr(
        modeling_neural_interpreter, "eager_attention", lambda *a: calls.append(1) or eager(*a)
    )
    assert model(**inputs).attentions is None and not calls  # not asked: the "fast" path runs, no W is formed
    attentions = model(**inputs, output_attentions=True).attentions
    assert len(calls) == len(attentions)
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
        config = tester.get_config(truncation_tau=0.5, straight_through=straight_through)
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


def enable_activation_checkpointing(model: torch.nn.Module, reentrant: bool) -> None:
    """`activation_checkpointing_enable` (transformers >= 5.23), else its older name."""
    kwargs = {"use_reentrant": reentrant}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("bilinear", [False, True])
def test_gradient_checkpointing_gives_the_same_gradients(tester, bilinear, reentrant):
    config = tester.get_config(**({"hidden_size": 8, "attention_head_size": 8} if bilinear else {}))
    model = NeuralInterpreterForImageClassification(config).train()
    inputs = tester.prepare_inputs(config)
    model(**inputs).loss.backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    enable_activation_checkpointing(model, reentrant)
    model(**inputs).loss.backward()
    for n, g in reference.items():
        torch.testing.assert_close(dict(model.named_parameters())[n].grad, g, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("bilinear", [False, True])
def test_code_modulations_are_formed_once_per_forward_not_per_function_iteration(
    tester, monkeypatch, bilinear
):
    """W diag(LayerNorm(W_c c_u)) of every ModLin is the same in every function iteration: formed once per forward,
    however many iterations run ("fast" forms its A_uh from them once per call of a first LOC). The same model with
    every iteration forming its own gives the same loss and gradients."""
    import ni_hf.kernels.fast_line_of_code as fast
    import ni_hf.models.neural_interpreter.modeling_neural_interpreter as modeling

    overrides = {"hidden_size": 8, "attention_head_size": 8} if bilinear else {}
    config = tester.get_config(num_function_iterations=[3, 2], **overrides)
    torch.manual_seed(0)
    model = NeuralInterpreterForImageClassification(config).train()
    model.set_attn_implementation("fast")
    params = [p for p in model.parameters() if p.requires_grad]
    inputs = tester.prepare_inputs(config)
    modulations, formed = [], []
    function_weights, bilinear_weight = modeling.ModLin.function_weights, fast.bilinear_weight
    monkeypatch.setattr(
        modeling.ModLin, "function_weights", lambda m, c: modulations.append(id(m)) or function_weights(m, c)
    )
    monkeypatch.setattr(fast, "bilinear_weight", lambda *a: formed.append(1) or bilinear_weight(*a))
    loss = model(**inputs).loss
    modlins = [id(m) for m in model.modules() if isinstance(m, modeling.ModLin)]
    assert sorted(modulations) == sorted(modlins)  # each ModLin once
    iterations = sum(config.iterations_per_script)
    assert len(formed) == (iterations if bilinear else 0)
    grads = torch.autograd.grad(loss, params)

    # Every function iteration forms its own weights.
    enable_activation_checkpointing(model, reentrant=False)
    modulations.clear()
    formed.clear()
    reference = model(**inputs).loss
    assert len(modulations) == iterations * len(modlins) // config.num_scripts
    assert len(formed) == (iterations if bilinear else 0)
    torch.testing.assert_close(loss, reference, atol=1e-6, rtol=1e-6)
    for got, want in zip(grads, torch.autograd.grad(reference, params), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def _gradients(model) -> list[torch.Tensor]:
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return grads


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
    inputs = __import__("conftest").NeuralInterpreterModelTester(batch_size=8).prepare_inputs(config)
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
    """`ni_hf.training.evaluation.routing_density`: 1 with tau near 2 (distances lie in [0, 2]), 0 with tau = 0, else the count."""
    from ni_hf.training.evaluation import routing_density

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
    from ni_hf.training.evaluation import routing_density

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


# --- robustness of the public API ------------------------------------------------------------------------


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


def test_a_set_model_has_no_patch_embedding_and_reloads_with_the_same_trainable_parameters(tester, tmp_path):
    model = NeuralInterpreterForSetRegression(tester.get_config(use_relative_positional_bias=False))
    assert model.neural_interpreter.patch_embedding is None
    assert not any("patch_embedding" in name for name, _ in model.named_parameters())
    model.save_pretrained(tmp_path)
    reloaded = NeuralInterpreterForSetRegression.from_pretrained(tmp_path)
    assert reloaded.get_input_embeddings() is reloaded.input_projection
    assert reloaded.num_parameters(only_trainable=True) == model.num_parameters(only_trainable=True)
    with pytest.raises(ValueError, match="built without a patch embedding: pass `inputs_embeds`"):
        reloaded.neural_interpreter(pixel_values=torch.zeros(1, 4, 12))


def test_double_backward_works_with_eager_and_sdpa_and_fast_says_so(tester):
    """Gradient penalties need create_graph=True: eager and sdpa support it, the fast path's backwards name them."""
    config = tester.get_config()
    inputs = tester.prepare_inputs(config)
    torch.manual_seed(0)
    model = NeuralInterpreterForImageClassification(config)
    tokens = model.neural_interpreter.task_tokens
    for impl in ("eager", "sdpa"):
        model.set_attn_implementation(impl)
        (grad,) = torch.autograd.grad(model(**inputs).loss, tokens, create_graph=True)
        (second,) = torch.autograd.grad(grad.pow(2).sum(), tokens)
        assert torch.isfinite(second).all() and second.abs().sum() > 0
    model.set_attn_implementation("fast")
    with pytest.raises(RuntimeError, match="attn_implementation='eager' or 'sdpa'"):
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


# --- a refused or degenerate call: a clear error or warning, and nothing changed ---------------------------


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"pixel_values": [[0.0] * 12] * 16}, "must be a torch.Tensor"),
        ({"pixel_values": "np"}, "must be a torch.Tensor"),
        ({"task_ids": torch.zeros(2, 2, dtype=torch.long)}, "1-D tensor with one per sample"),
        ({"task_ids": torch.zeros(3, dtype=torch.long)}, "one per sample"),
        ({"labels": torch.tensor(1)}, "one entry per sample"),
    ],
    ids=["list-pixels", "numpy-pixels", "task-ids-2d", "task-ids-short", "scalar-label"],
)
def test_malformed_inputs_are_refused_by_name(tester, bad, match):
    import numpy as np

    config = tester.get_config()
    model = NeuralInterpreterForImageClassification(config).eval()
    inputs = {"pixel_values": torch.randn(4, config.num_patches, config.patch_dim)}
    if bad.get("pixel_values") == "np":
        bad = {"pixel_values": np.zeros((4, config.num_patches, config.patch_dim), dtype=np.float32)}
    with pytest.raises(ValueError, match=match):
        model(**{**inputs, **bad})


@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8, torch.bool])
def test_a_refused_forward_leaves_the_problem_type_unchanged(tester, tmp_path, dtype):
    """Labels refused for their dtype must not set `config.problem_type`: the next valid call works, also reloaded."""
    config = tester.get_config()
    model = NeuralInterpreterForImageClassification(config).eval()
    pixels = torch.randn(4, config.num_patches, config.patch_dim)
    with pytest.raises(ValueError, match="labels"):
        model(pixel_values=pixels, labels=torch.tensor([1, 0, 1, 0]).to(dtype))
    assert model.config.problem_type is None
    model.save_pretrained(tmp_path)
    for m in (model, NeuralInterpreterForImageClassification.from_pretrained(tmp_path)):
        assert m.config.problem_type is None
        assert torch.isfinite(m(pixel_values=pixels, labels=torch.tensor([1, 0, 2, 3])).loss)
        assert m.config.problem_type == "single_label_classification"


def test_ignored_labels_are_left_out_of_the_mean_and_all_ignored_give_zero_loss(tester):
    config = tester.get_config()
    model = NeuralInterpreterForImageClassification(config).eval()
    pixels = torch.randn(4, config.num_patches, config.patch_dim)
    labels = torch.tensor([1, -100, 3, -100])
    out = model(pixel_values=pixels, labels=labels)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels, ignore_index=-100))
    out = model(pixel_values=pixels, labels=torch.full((4,), -100))
    assert out.loss.item() == 0.0
    out.loss.backward()  # no NaN gradient either
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_input_embeddings_can_be_replaced(tester):
    config = tester.get_config()
    model = NeuralInterpreterForImageClassification(config).eval()
    pixels = torch.randn(2, config.num_patches, config.patch_dim)
    replacement = nn.Linear(config.patch_dim, config.hidden_size)
    model.set_input_embeddings(replacement)
    assert model.get_input_embeddings() is replacement
    assert model.neural_interpreter.get_input_embeddings() is replacement
    with torch.no_grad():
        replacement.weight.zero_()
        replacement.bias.zero_()
    zeroed = model(pixel_values=pixels).logits
    torch.testing.assert_close(
        model(pixel_values=torch.randn_like(pixels)).logits, zeroed
    )  # input ignored now


def test_a_routing_that_accepts_no_token_warns_once_and_gives_no_nan(tester, monkeypatch):
    warnings = []
    monkeypatch.setattr(modeling_checks.logger, "warning_once", warnings.append)
    config = tester.get_config()
    model = NeuralInterpreterForImageClassification(config).eval()
    pixels = torch.randn(2, config.num_patches, config.patch_dim)
    model(pixel_values=pixels)
    assert warnings == []  # a normal routing says nothing
    every_function = list(range(config.num_functions))
    out = model(pixel_values=pixels, disabled_functions=every_function)
    assert torch.isfinite(out.logits).all()
    assert len(warnings) == 1 and "No function accepted any token" in warnings[0]
    backbone = NeuralInterpreterModel(config)  # a backbone alone warns too
    backbone(pixel_values=pixels, disabled_functions=every_function)
    assert len(warnings) == 2


def test_a_script_s_forward_is_one_function_iteration_and_returns_it(tester):
    """`NeuralInterpreterScript.forward` returns its `FunctionIteration`, C laid out (B, U, N) as in the outputs."""
    config = tester.get_config()
    model = NeuralInterpreterModel(config).eval()
    pixel_values = tester.prepare_inputs(config)["pixel_values"]
    with torch.no_grad():
        out = model(pixel_values=pixel_values, output_routing=True, output_hidden_states=True)
        script = model.scripts[0]
        iteration = script(out.hidden_states[0], script.attention_biases(config.num_task_tokens), None, None)
    assert isinstance(iteration, modeling_neural_interpreter.FunctionIteration)
    assert iteration.compatibilities.shape == (
        tester.batch_size,
        config.num_functions,
        tester.set_size(config),
    )
    torch.testing.assert_close(iteration.compatibilities, out.compatibilities[0])
    torch.testing.assert_close(iteration.types, out.types[0])
    torch.testing.assert_close(iteration.hidden_state, out.hidden_states[1])


def test_every_head_takes_the_routing_options_as_one_group(tester):
    """The heads hand `RoutingKwargs` to the backbone as they are: explicit keywords work, a misspelt one is refused."""
    import inspect
    import typing

    from ni_hf import NeuralInterpreterForMultipleChoice, NeuralInterpreterForSetRegression, RoutingKwargs

    options = set(typing.get_type_hints(RoutingKwargs))
    assert options == {
        "output_hidden_states",
        "output_attentions",
        "output_routing",
        "num_function_iterations",
        "disabled_functions",
    }
    backbone = set(inspect.signature(NeuralInterpreterModel.forward).parameters)
    assert options <= backbone
    for head in (
        NeuralInterpreterForImageClassification,
        NeuralInterpreterForSetRegression,
        NeuralInterpreterForMultipleChoice,
    ):
        parameters = inspect.signature(head.forward).parameters
        assert not options & set(parameters) and parameters["routing"].kind is inspect.Parameter.VAR_KEYWORD
    config = tester.get_config()
    model = NeuralInterpreterForImageClassification(config).eval()
    inputs = tester.prepare_inputs(config)
    out = model(**inputs, output_routing=True, num_function_iterations=1, disabled_functions=[0])
    assert len(out.compatibilities) == config.num_scripts and (out.compatibilities[0][:, 0] == 0).all()
    with pytest.raises(TypeError, match="output_routng"):
        model(**inputs, output_routng=True)


def test_the_output_classes_share_one_declaration_of_the_routing_fields():
    from dataclasses import fields

    from ni_hf import (
        NeuralInterpreterImageClassifierOutput,
        NeuralInterpreterModelOutput,
        NeuralInterpreterMultipleChoiceOutput,
        NeuralInterpreterSetRegressionOutput,
        RoutingOutput,
    )

    for output in (
        NeuralInterpreterModelOutput,
        NeuralInterpreterImageClassifierOutput,
        NeuralInterpreterMultipleChoiceOutput,
        NeuralInterpreterSetRegressionOutput,
    ):
        assert issubclass(output, RoutingOutput)
        assert {"compatibilities", "types"} <= {field.name for field in fields(output)}
        assert "compatibilities" not in vars(output).get("__annotations__", {}), output
    # transformers' order first: a tuple output starts with the loss or the last hidden state, as transformers' own
    assert [f.name for f in fields(NeuralInterpreterSetRegressionOutput)][:2] == ["loss", "predictions"]
    assert [f.name for f in fields(NeuralInterpreterImageClassifierOutput)][:2] == ["loss", "logits"]
