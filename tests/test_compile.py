"""torch.compile: the digits preset's forward and backward trace as one graph; on a GPU, bf16 compile == eager."""

from __future__ import annotations

import pytest
import torch

from ni_hf import NeuralInterpreterConfig, NeuralInterpreterForImageClassification


def _digits_model(**overrides) -> NeuralInterpreterForImageClassification:
    torch.manual_seed(0)
    # The paper's digits preset, with two function iterations instead of eight: same code path, less tracing.
    config = NeuralInterpreterConfig.from_paper("digits", num_function_iterations=2, **overrides)
    return NeuralInterpreterForImageClassification(config)


def test_digits_preset_forward_has_no_graph_breaks():
    import torch._dynamo as dynamo

    model = _digits_model().train()  # training mode: the custom autograd Functions are on the path
    explanation = dynamo.explain(model)(pixel_values=torch.randn(2, 3, 32, 32))
    assert explanation.graph_break_count == 0, [b.reason for b in explanation.break_reasons]
    assert explanation.graph_count == 1


def test_fullgraph_compile_matches_eager_in_outputs_and_gradients():
    """aot_eager traces forward and backward (the custom Functions included) without needing a C++ compiler."""
    model = _digits_model().train()
    inputs = {"pixel_values": torch.randn(2, 3, 32, 32), "labels": torch.tensor([3, 7])}
    results = []
    for fn in (model, torch.compile(model, backend="aot_eager", fullgraph=True)):
        model.zero_grad()
        out = fn(**inputs)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((out.logits.detach(), grads))
    (eager_logits, eager_grads), (compiled_logits, compiled_grads) = results
    torch.testing.assert_close(compiled_logits, eager_logits)
    assert compiled_grads.keys() == eager_grads.keys()
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (inductor + bf16 autocast)")
def test_compiled_bf16_logits_match_eager_on_gpu():
    model = _digits_model().cuda().eval()
    pixel_values = torch.randn(8, 3, 32, 32, device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        eager = model(pixel_values=pixel_values).logits.float()
        compiled = torch.compile(model, fullgraph=True)(pixel_values=pixel_values).logits.float()
    torch.testing.assert_close(compiled, eager, atol=5e-2, rtol=5e-2)
