"""torch.compile: the digits preset's forward and backward trace as one graph; on a GPU, bf16 compile == eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ni_hf import NeuralInterpreterConfig, NeuralInterpreterForImageClassification


@pytest.fixture(autouse=True)
def _fresh_dynamo_cache():
    """Each test compiles from scratch: dynamo keeps at most 8 compiled versions of a code object (recompile_limit),
    and this file's tests together compile the model's forward more often than that, which under fullgraph is an
    error ("recompile limit exceeded")."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _digits_model(**overrides) -> NeuralInterpreterForImageClassification:
    torch.manual_seed(0)
    # The paper's digits preset, with two function iterations instead of eight: same code path, less tracing.
    config = NeuralInterpreterConfig.from_paper("digits", num_function_iterations=2, **overrides)
    return NeuralInterpreterForImageClassification(config)


def _untruncated_digits_model(**overrides) -> NeuralInterpreterForImageClassification:
    """For comparing two executions numerically: the kernel's truncation (Eq. 3) jumps from exp(-tau/sigma) to 0,
    so a pair whose distance sits within rounding of tau flips between executions that round differently and
    changes everything downstream of it (bf16 on a GPU is enough). tau = 1.99 keeps the same code path but leaves
    no pair near the threshold."""
    return _digits_model(truncation_tau=1.99, **overrides)


def test_digits_preset_forward_has_no_graph_breaks():
    import torch._dynamo as dynamo

    model = _digits_model().train()  # the forward that a compiled training step traces
    explanation = dynamo.explain(model)(pixel_values=torch.randn(2, 3, 32, 32))
    assert explanation.graph_break_count == 0, [b.reason for b in explanation.break_reasons]
    assert explanation.graph_count == 1


def test_multitask_training_forward_with_task_ids_and_labels_has_no_graph_breaks():
    """The forward run_digits.py compiles: three tasks, each sample's task id and label, in one graph (the task-id
    range check, a data-dependent branch and a host sync, stays out of compiled graphs)."""
    import torch._dynamo as dynamo

    model = _digits_model(task_names=["mnist", "mnistm", "svhn"]).train()
    explanation = dynamo.explain(model)(
        pixel_values=torch.randn(4, 3, 32, 32),
        task_ids=torch.tensor([0, 1, 2, 0]),
        labels=torch.tensor([1, 2, 3, 4]),
    )
    assert explanation.graph_break_count == 0, [b.reason for b in explanation.break_reasons]
    assert explanation.graph_count == 1


def test_compiled_training_compiles_once_for_steps_of_one_shape():
    """The loss's problem type is inferred in the first forward and, eagerly, written into the config (as
    transformers' classifiers do); while compiling it is not written, since the graph guards on it being unset and
    would be compiled again at the second step."""
    compiles = []

    def counting_backend(graph_module, example_inputs):
        compiles.append(len(example_inputs))
        return graph_module.forward

    model = _digits_model(task_names=["mnist", "mnistm", "svhn"]).train()
    assert model.config.problem_type is None
    compiled = torch.compile(model, backend=counting_backend)
    for _ in range(3):
        inputs = {
            "pixel_values": torch.randn(2, 3, 32, 32),
            "task_ids": torch.tensor([0, 2]),
            "labels": torch.tensor([1, 7]),
        }
        compiled(**inputs).loss.backward()
    assert len(compiles) == 1
    model(**inputs)  # eagerly, the inferred problem type is written into the config, as transformers does
    assert model.config.problem_type == "single_label_classification"


# The second case's second LOC reads each function's own stream, not the shared x that a first LOC reads.
@pytest.mark.parametrize(
    "overrides",
    [{}, {"attn_implementation": "eager", "num_loc_layers": 2}],
    ids=["digits", "eager-attention-two-locs"],
)
def test_fullgraph_compile_matches_eager_in_outputs_and_gradients(overrides):
    """aot_eager traces forward and backward without needing a C++ compiler; a traced output written in place or
    with out= would get no gradient, and every gradient upstream of it would differ from eager execution."""
    model = _untruncated_digits_model(**overrides).train()
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
        torch.testing.assert_close(compiled_grads[name], grad, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (inductor + bf16 autocast)")
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])  # "fast" is CPU code: it refuses a CUDA model
def test_compiled_bf16_training_step_matches_eager_on_gpu(implementation):
    """Inductor's forward and backward under bf16 autocast: the loss and every gradient agree with eager execution
    of the same implementation (compiled on CUDA, both run the literal form of Eq. 6)."""
    model = _untruncated_digits_model(attn_implementation=implementation).cuda().train()
    inputs = {
        "pixel_values": torch.randn(16, 3, 32, 32, device="cuda"),
        "labels": torch.randint(0, 10, (16,), device="cuda"),
    }
    results = []
    for fn in (model, torch.compile(model, fullgraph=True)):
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fn(**inputs).loss
        loss.backward()
        grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss.detach().float(), grads))
    (eager_loss, eager_grads), (compiled_loss, compiled_grads) = results
    assert torch.isfinite(compiled_loss)
    torch.testing.assert_close(compiled_loss, eager_loss, atol=2e-2, rtol=2e-2)
    assert compiled_grads.keys() == eager_grads.keys()
    for name, grad in eager_grads.items():
        # bf16 rounding differs between fused and unfused kernels: compare directions and sizes, per tensor.
        cosine = F.cosine_similarity(compiled_grads[name].flatten(), grad.flatten(), dim=0, eps=1e-12)
        assert cosine > 0.98 or grad.norm() < 1e-6, (name, cosine.item())
        assert compiled_grads[name].norm().item() == pytest.approx(grad.norm().item(), rel=0.1, abs=1e-6), (
            name
        )
