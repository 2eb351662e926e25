"""ni_hf.visualization: the numbers behind each figure are the model's C, types and W, and the figures render."""

import importlib.util
import io
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import ni_hf
from ni_hf import visualization as vis

ROOT = Path(__file__).resolve().parents[1]
TASK_IDS = torch.tensor([0, 1, 0, 1, 1])
LABELS = np.array([3, 7, 3, 1, 7])


def tiny_config(**overrides) -> ni_hf.NeuralInterpreterConfig:
    settings = dict(
        hidden_size=16,
        code_dim=8,
        num_function_iterations=2,
        num_functions=3,
        num_attention_heads=2,
        attention_head_size=4,
        type_inference_hidden_size=8,
        type_dim=4,
        patch_size=8,
        task_names=["mnist", "mnistm"],
        num_labels=10,
        id2label={i: str(i) for i in range(10)},
    )
    return ni_hf.NeuralInterpreterConfig(**{**settings, **overrides})


def tiny_model(**overrides) -> ni_hf.NeuralInterpreterForImageClassification:
    torch.manual_seed(0)
    return ni_hf.NeuralInterpreterForImageClassification(tiny_config(**overrides)).eval()


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def pixels():
    return torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def trace(model, pixels):
    return vis.trace_routing(model, pixels, TASK_IDS, output_attentions=True)


def png_of(fig) -> bytes:
    buffer = io.BytesIO()
    vis.save_figure(fig, buffer)
    return buffer.getvalue()


def expected_compatibilities(types: np.ndarray, signatures: np.ndarray, sigma: float, tau: float, eps: float):
    """Eqs. 3-4 written out from the trace's types and signatures: (B, U, N)."""
    distance = 1.0 - np.einsum("bnt,ut->bun", types, signatures)
    kernel = np.where(distance <= tau, np.exp(-distance / sigma), 0.0)
    return kernel / (eps + kernel.sum(axis=1, keepdims=True))


def test_trace_holds_the_models_own_outputs(model, pixels, trace):
    with torch.no_grad():
        out = model(pixel_values=pixels, task_ids=TASK_IDS, output_routing=True, output_attentions=True)
    assert trace.compatibilities.shape == (2, 5, 3, 2 + 16)  # (K, B, U, N): 2 task tokens, 4x4 patches
    assert trace.types.shape == (2, 5, 18, 4)
    assert trace.signatures.shape == (2, 3, 4)
    assert trace.attentions.shape == (2, 1, 5, 3, 2, 18, 18)  # (K, L, B, U, H, N, N)
    assert trace.grid == (4, 4) and trace.images.shape == (5, 32, 32, 3)
    assert trace.steps == [(0, 0), (0, 1)]
    for k in range(2):
        np.testing.assert_array_equal(trace.compatibilities[k], out.compatibilities[k].numpy())
        np.testing.assert_array_equal(trace.types[k], out.types[k].numpy())
        np.testing.assert_array_equal(trace.attentions[k, 0], out.attentions[k].numpy())
    np.testing.assert_array_equal(trace.logits, out.logits.numpy())
    np.testing.assert_array_equal(trace.predictions, out.logits.argmax(-1).numpy())
    signatures = F.normalize(model.neural_interpreter.scripts[0].signatures.detach(), dim=-1).numpy()
    np.testing.assert_array_equal(trace.signatures[1], signatures)


@pytest.mark.parametrize("tau", [1.4, 0.6])
def test_compatibilities_follow_eqs_3_and_4(tau):
    """C from the trace's own types and signatures; rows sum to S / (eps + S): 0 where no function accepts a token."""
    model = tiny_model(truncation_tau=tau)
    pixels = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    trace = vis.trace_routing(model, pixels, [0, 1, 1, 0])
    cfg = model.config
    sigma = float(model.neural_interpreter.scripts[0].sigma.detach())
    for k in range(len(trace.steps)):
        expected = expected_compatibilities(
            trace.types[k].astype(np.float64), trace.signatures[k], sigma, tau, cfg.kernel_eps
        )
        np.testing.assert_allclose(trace.compatibilities[k], expected, atol=1e-5)
    accepted = trace.compatibilities.sum(axis=2)  # (K, B, N)
    assert (accepted <= 1.0 + 1e-6).all()
    routed = (trace.compatibilities > 0).any(axis=2)
    np.testing.assert_allclose(accepted[routed], 1.0, atol=1e-3)
    np.testing.assert_array_equal(accepted[~routed], 0.0)
    if tau < 1.0:
        assert (~routed).any(), "with tau = 0.6 some tokens should be accepted by no function"


def test_computational_path_data_is_C_on_the_grid(trace):
    data = vis.computational_path_data(trace, index=3)
    assert data["patches"].shape == (2, 3, 4, 4)
    assert data["task_tokens"].shape == (2, 2, 3)
    c = trace.compatibilities[:, 3]
    # row-major grid: patch (r, c) is token num_task_tokens + 4 r + c
    assert data["patches"][1, 2, 2, 3] == c[1, 2, 2 + 4 * 2 + 3]
    assert data["patches"][0, 0, 3, 0] == c[0, 0, 2 + 12]
    np.testing.assert_array_equal(data["task_tokens"][:, 1], c[:, :, 1])  # task 1's CLS token
    np.testing.assert_array_equal(data["accepted"], c.sum(axis=1))
    assert data["task_id"] == 1 and data["prediction"] == int(trace.logits[3].argmax())


def test_dynamic_inference_shows_in_the_trace(model, pixels):
    short = vis.trace_routing(model, pixels, TASK_IDS, num_function_iterations=1)
    assert short.compatibilities.shape[0] == 1 and short.steps == [(0, 0)]
    off = vis.trace_routing(model, pixels, TASK_IDS, disabled_functions=[1])
    assert off.disabled_functions == [1]
    np.testing.assert_array_equal(off.compatibilities[:, :, 1], 0.0)
    accepted = off.compatibilities.sum(axis=2)
    routed = (off.compatibilities > 0).any(axis=2)
    np.testing.assert_allclose(accepted[routed], 1.0, atol=1e-3)
    with torch.no_grad():
        expected = model(pixel_values=pixels, task_ids=TASK_IDS, disabled_functions=[1]).logits
    np.testing.assert_array_equal(off.logits, expected.numpy())
    assert "functions 1 off" in vis.figures._title(off, 0)


def test_type_projection_data(trace):
    data = vis.type_projection_data(trace, LABELS, method="pca")
    assert data["types"].shape == (2, 5, 18, 2) and data["signatures"].shape == (2, 3, 2)
    np.testing.assert_array_equal(data["function"], trace.compatibilities.argmax(axis=2))
    np.testing.assert_array_equal(data["label"], LABELS)
    assert data["is_task_token"].tolist() == [True, True] + [False] * 16
    # PCA keeps the geometry up to a rotation: the projected types are the centred types times two orthonormal axes.
    points = np.concatenate([trace.types.reshape(-1, 4), trace.signatures[0]]).astype(np.float64)
    centred = points - points.mean(0)
    top = np.linalg.svd(centred, full_matrices=False)[2][:2]
    flat = np.concatenate([data["types"].reshape(-1, 2), data["signatures"][0]])
    np.testing.assert_allclose(np.abs(flat), np.abs(centred @ top.T), atol=1e-6)
    by_prediction = vis.type_projection_data(trace, method="pca")
    assert by_prediction["label_source"] == "predictions"
    np.testing.assert_array_equal(by_prediction["label"], trace.predictions)


def test_type_projection_marks_rejected_tokens_and_tsne_is_seeded():
    model = tiny_model(truncation_tau=0.6)
    trace = vis.trace_routing(model, torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2)))
    data = vis.type_projection_data(trace, method="tsne", seed=3)
    rejected = trace.compatibilities.sum(axis=2) == 0
    assert rejected.any()
    assert (data["function"][rejected] == -1).all() and (data["function"][~rejected] >= 0).all()
    again = vis.type_projection_data(trace, method="tsne", seed=3)
    np.testing.assert_array_equal(data["types"], again["types"])
    with pytest.raises(ValueError, match="pca"):
        vis.type_projection_data(trace, method="umap")


def test_function_usage_table(trace):
    usage = vis.FunctionUsage.from_trace(trace, LABELS)
    c = trace.compatibilities.astype(np.float64)  # (K, B, U, N)
    np.testing.assert_allclose(usage.by_iteration, c.mean(axis=(1, 3)))
    np.testing.assert_allclose(usage.by_task[1], c[:, [1, 3, 4]].mean(axis=(0, 1, 3)))
    np.testing.assert_allclose(usage.by_class[7], c[:, [1, 4]].mean(axis=(0, 1, 3)))
    assert np.isnan(usage.by_class[0]).all()  # no sample of class 0
    # every token is accepted by some function here (tau 1.4): the shares of each row sum to 1
    np.testing.assert_allclose(usage.by_iteration.sum(1), 1.0, atol=1e-3)
    table = usage.to_markdown().splitlines()
    assert table[0] == "| | function 0 | function 1 | function 2 | none |"
    names = [line.split("|")[1].strip() for line in table[2:]]
    assert names == [
        "iteration 1",
        "iteration 2",
        "task mnist",
        "task mnistm",
        "class 1",
        "class 3",
        "class 7",
    ]
    cells = [float(x) for x in table[3].split("|")[2:-1]]
    assert cells[:3] == [round(v, 3) for v in usage.by_iteration[1]] and cells[3] == pytest.approx(
        0.0, abs=1e-3
    )
    data = usage.to_dict()
    assert data["by_class"][0] == [None, None, None]
    np.testing.assert_allclose(data["by_task"][0], usage.by_task[0], atol=1e-6)
    json.dumps(data)


def test_function_usage_adds_over_batches(model, pixels, trace):
    whole = vis.FunctionUsage.from_trace(trace, LABELS)
    first = vis.FunctionUsage.from_trace(vis.trace_routing(model, pixels[:2], TASK_IDS[:2]), LABELS[:2])
    rest = vis.FunctionUsage.from_trace(vis.trace_routing(model, pixels[2:], TASK_IDS[2:]), LABELS[2:])
    total = first + rest
    assert total.num_samples == 5
    for name in ("by_iteration", "by_task", "by_class"):
        np.testing.assert_allclose(getattr(total, name), getattr(whole, name), atol=1e-6)
    with pytest.raises(ValueError, match="labels and by predictions"):
        first + vis.FunctionUsage.from_trace(trace)


def test_attention_data_is_eq_6(trace):
    data = vis.attention_data(trace, index=1, step=1, function=2, head=1)
    assert data["token"] == 1  # sample 1's own task token
    row = trace.attentions[1, 0, 1, 2, 1, 1]
    np.testing.assert_array_equal(data["row"], row)
    np.testing.assert_array_equal(data["patches"], row[2:].reshape(4, 4))
    assert data["query_compatibility"] == trace.compatibilities[1, 1, 2, 1]
    w = trace.attentions  # (K, L, B, U, H, N, N)
    assert (w >= 0).all() and (w.sum(-1) <= 1 + 1e-5).all()
    c = trace.compatibilities
    # Eq. 6: W_ij = 0 where function u accepts neither token i (query) nor token j (key)
    rejected_query = np.broadcast_to((c == 0)[:, None, :, :, None, :, None], w.shape)
    rejected_key = np.broadcast_to((c == 0)[:, None, :, :, None, None, :], w.shape)
    assert (w[rejected_query] == 0).all() and (w[rejected_key] == 0).all()


def test_attention_data_on_rejected_tokens():
    model = tiny_model(truncation_tau=0.6)
    trace = vis.trace_routing(model, torch.randn(3, 3, 32, 32), output_attentions=True)
    k, b, u, i = np.argwhere(trace.compatibilities == 0)[0]
    data = vis.attention_data(trace, int(b), int(k), int(u), 0, token=int(i))
    assert not data["row"].any() and data["query_compatibility"] == 0.0
    with pytest.raises(ValueError, match="output_attentions"):
        vis.attention_data(vis.trace_routing(model, torch.randn(1, 3, 32, 32)))


def test_patch_inputs_are_drawn_as_images(model, pixels):
    patches = torch.from_numpy(
        ni_hf.models.neural_interpreter.image_processing_neural_interpreter.patchify(pixels.numpy(), 8)
    )
    from_patches = vis.trace_routing(model, patches, TASK_IDS)
    from_images = vis.trace_routing(model, pixels, TASK_IDS)
    np.testing.assert_allclose(from_patches.images, from_images.images, atol=1e-6)
    np.testing.assert_allclose(from_patches.compatibilities, from_images.compatibilities, atol=1e-5)


# ---------------------------------------------------------------------------------------------- figures

needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="the figures need the vis extra (matplotlib)"
)


def assert_drawn(png: bytes, min_size: tuple[int, int] = (200, 150)) -> np.ndarray:
    image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    assert image.shape[1] >= min_size[0] and image.shape[0] >= min_size[1]
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 20  # more than a blank canvas and some text
    return image


@needs_matplotlib
def test_figures_render_headless_and_deterministically(model, pixels, trace):
    figures = {
        "path": lambda t: vis.plot_computational_path(t, 1),
        "types": lambda t: vis.plot_type_space(t, LABELS, method="pca"),
        "usage": lambda t: vis.plot_function_usage(vis.FunctionUsage.from_trace(t, LABELS)),
        "attention": lambda t: vis.plot_attention(t, 0, 1, 2, 1),
    }
    again = vis.trace_routing(model, pixels, TASK_IDS, output_attentions=True)
    for name, draw in figures.items():
        first = png_of(draw(trace))
        assert_drawn(first)
        assert png_of(draw(again)) == first, name
    path = assert_drawn(png_of(vis.plot_computational_path(trace, 1)))
    # one row of panels per function iteration: the figure for 1 iteration is shorter
    short = vis.trace_routing(model, pixels, TASK_IDS, num_function_iterations=1)
    assert assert_drawn(png_of(vis.plot_computational_path(short, 1))).shape[0] < path.shape[0]
    assert png_of(vis.plot_computational_path(trace, 0)) != png_of(vis.plot_computational_path(trace, 1))


@needs_matplotlib
def test_figure_to_image(trace):
    image = vis.figure_to_image(vis.plot_computational_path(trace, 0))
    assert image.mode == "RGB" and image.width > 300


@needs_matplotlib
def test_write_routing_card_assets(model, pixels, tmp_path):
    result = vis.write_routing_card_assets(
        model, pixels, TASK_IDS, tmp_path / "card", labels=torch.tensor(LABELS)
    )
    png, usage_json = (Path(p) for p in result["files"])
    assert png.name == "routing_path.png" and png.parent == tmp_path / "card"
    assert_drawn(png.read_bytes())
    assert json.loads(usage_json.read_text()) == result["usage"]
    trace = vis.trace_routing(model, pixels, TASK_IDS)
    usage = vis.FunctionUsage.from_trace(trace, LABELS)
    assert result["usage"] == usage.to_dict()
    markdown = result["markdown"]
    assert "![Computational path of one image](routing_path.png)" in markdown
    assert usage.to_markdown() in markdown and "(true class 3)" in markdown
    assert png.read_bytes() == png_of(vis.plot_computational_path(trace, 0))


def test_core_package_and_data_need_no_matplotlib():
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "import torch, ni_hf\n"
        "from ni_hf import visualization as vis\n"
        "torch.manual_seed(0)\n"
        "cfg = ni_hf.NeuralInterpreterConfig(hidden_size=16, code_dim=8, num_functions=2, num_attention_heads=1,"
        " attention_head_size=4, type_inference_hidden_size=8, type_dim=4, patch_size=8, task_names=['a'])\n"
        "m = ni_hf.NeuralInterpreterForImageClassification(cfg)\n"
        "t = vis.trace_routing(m, torch.randn(2, 3, 32, 32))\n"
        "print(vis.FunctionUsage.from_trace(t).to_markdown().splitlines()[0])\n"
        "try:\n    vis.plot_computational_path(t)\nexcept ImportError:\n    print('no matplotlib')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert out.stdout.splitlines() == ["| | function 0 | function 1 | none |", "no matplotlib"]


@needs_matplotlib
def test_visualize_routing_script(model, tmp_path):
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    ni_hf.NeuralInterpreterImageProcessor(patch_size=8).save_pretrained(ckpt)
    rng = np.random.default_rng(0)
    images = []
    for i in range(3):
        path = tmp_path / f"digit{i}.png"
        Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)).save(path)
        images.append(str(path))
    out = tmp_path / "out"
    spec = importlib.util.spec_from_file_location(
        "visualize_routing", ROOT / "examples" / "visualize_routing.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(
        [
            "--model",
            str(ckpt),
            "--images",
            *images,
            "--task",
            "mnistm",
            "--output_dir",
            str(out),
            "--attention",
        ]
    )
    numbers = json.loads((out / "routing.json").read_text())
    assert [s["image"] for s in numbers["samples"]] == images
    processor = ni_hf.NeuralInterpreterImageProcessor.from_pretrained(ckpt)
    batch = processor(images=[Image.open(p) for p in images], return_tensors="pt")
    trace = vis.trace_routing(model, batch["pixel_values"], [1, 1, 1])
    np.testing.assert_allclose(
        numbers["samples"][2]["compatibilities"], trace.compatibilities[:, 2], atol=1e-6
    )
    assert numbers["samples"][0]["prediction"] == str(int(trace.predictions[0]))
    assert numbers["usage"] == vis.FunctionUsage.from_trace(trace).to_dict()
    for name in ("path_0.png", "path_2.png", "types.png", "usage.png", "attention_0.png"):
        assert_drawn((out / name).read_bytes())


# ---------------------------------------------------------------------------------------------- set inputs


@pytest.fixture(scope="module")
def set_model():
    """Two scripts of two function iterations, as the fuzzy_boolean preset, with three tasks (CLS tokens)."""
    config = tiny_config(
        num_scripts=2,
        use_relative_positional_bias=False,
        task_names=["f0", "f1", "f2"],
        num_labels=1,
        id2label=None,
        num_input_variables=5,
    )
    torch.manual_seed(0)
    return ni_hf.NeuralInterpreterForSetRegression(config).eval()


@pytest.fixture(scope="module")
def set_inputs():
    return torch.rand(6, 5, generator=torch.Generator().manual_seed(2))


def test_set_trace_holds_the_models_own_routing_of_every_script_and_iteration(set_model, set_inputs):
    trace = vis.trace_routing(set_model, inputs=set_inputs)
    with torch.no_grad():
        out = set_model(inputs=set_inputs, output_routing=True)
    assert trace.is_set and trace.grid is None and trace.images is None and trace.logits is None
    assert trace.steps == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert trace.compatibilities.shape == (4, 6, 3, 3 + 5)  # (K, B, U, N): 3 CLS tokens, 5 variables
    for k in range(4):
        np.testing.assert_array_equal(trace.compatibilities[k], out.compatibilities[k].numpy())
    np.testing.assert_array_equal(trace.regression, out.predictions.numpy())
    np.testing.assert_array_equal(trace.set_inputs, set_inputs.numpy())
    data = vis.computational_path_data(trace, index=4)
    c = trace.compatibilities[:, 4]
    np.testing.assert_array_equal(data["elements"], c[:, :, 3:])
    np.testing.assert_array_equal(data["task_tokens"][:, 2], c[:, :, 2])  # task 2's CLS token
    np.testing.assert_array_equal(data["inputs"], set_inputs[4].numpy())
    with pytest.raises(ValueError, match="either pixel_values"):
        vis.trace_routing(set_model)
    with pytest.raises(ValueError, match="no task_ids"):
        vis.trace_routing(set_model, task_ids=[0] * 6, inputs=set_inputs)


def test_set_usage_is_mean_C_per_script_iteration_and_per_task_CLS_token_and_none_is_the_rest(
    set_model, set_inputs
):
    trace = vis.trace_routing(set_model, inputs=set_inputs)
    usage = vis.FunctionUsage.from_trace(trace)
    c = trace.compatibilities.astype(np.float64)  # (K, B, U, N)
    assert (c.sum(axis=2) <= 1 + 1e-6).all()  # Eq. 4: a token's C over the functions sums to at most 1
    np.testing.assert_allclose(usage.by_iteration, c.mean(axis=(1, 3)))
    for task in range(3):
        np.testing.assert_allclose(usage.by_task[task], c[:, :, :, task].mean(axis=(0, 1)))
    assert usage.class_names == [] and usage.by_class.shape == (0, 3) and usage.task_source == "cls_token"
    table = usage.to_markdown().splitlines()
    names = [line.split("|")[1].strip() for line in table[2:]]
    assert names == [f"script {s}, iteration {k}" for s in (1, 2) for k in (1, 2)] + [
        f"CLS token of f{t}" for t in range(3)
    ]
    for line, (_, values) in zip(table[2:], usage.rows(), strict=True):
        cells = [float(x) for x in line.split("|")[2:-1]]
        assert cells[:3] == [round(v, 3) for v in values]
        assert cells[3] == pytest.approx(1.0 - values.sum(), abs=1e-3)
    both = vis.FunctionUsage.from_trace(vis.trace_routing(set_model, inputs=set_inputs[:2])) + (
        vis.FunctionUsage.from_trace(vis.trace_routing(set_model, inputs=set_inputs[2:]))
    )
    np.testing.assert_allclose(both.by_task, usage.by_task, atol=1e-6)
    assert json.loads(json.dumps(usage.to_dict()))["task_source"] == "cls_token"
    with pytest.raises(ValueError, match="no classes"):
        vis.FunctionUsage.from_trace(trace, labels=[0] * 6)


@needs_matplotlib
def test_set_path_and_usage_figures_render_deterministically_and_images_keep_their_own(
    set_model, set_inputs, trace
):
    set_trace = vis.trace_routing(set_model, inputs=set_inputs)
    first = png_of(vis.plot_set_path(set_trace, 1))
    assert_drawn(first)
    assert png_of(vis.plot_set_path(vis.trace_routing(set_model, inputs=set_inputs), 1)) == first
    assert png_of(vis.plot_set_path(set_trace, 0)) != first
    assert_drawn(png_of(vis.plot_function_usage(vis.FunctionUsage.from_trace(set_trace))))
    with pytest.raises(ValueError, match="plot_set_path"):
        vis.plot_computational_path(set_trace)
    with pytest.raises(ValueError, match="plot_computational_path"):
        vis.plot_set_path(trace)


def test_set_card_assets_without_matplotlib_keep_the_table_and_json(set_model, set_inputs, tmp_path):
    result = vis.write_set_routing_card_assets(
        set_model, set_inputs, tmp_path, "routing_x", "### x", draw=False
    )
    assert not result["drawn"] and "![" not in result["markdown"]
    assert [Path(f).name for f in result["files"]] == ["routing_x_usage.json"]
    usage = vis.FunctionUsage.from_trace(vis.trace_routing(set_model, inputs=set_inputs))
    assert json.loads((tmp_path / "routing_x_usage.json").read_text()) == usage.to_dict() == result["usage"]
    assert result["markdown"].startswith("### x") and usage.to_markdown() in result["markdown"]


# ---------------------------------------------------------------------------------------------- bad arguments


@pytest.fixture(scope="module")
def set_trace(set_model, set_inputs):
    return vis.trace_routing(set_model, inputs=set_inputs)


@pytest.fixture(scope="module")
def vits():
    """Image classifiers that are not Neural Interpreters: the multi-task ViT baseline and transformers' ViT."""
    import transformers

    sizes = dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8, patch_size=8)
    torch.manual_seed(0)
    return SimpleNamespace(
        multitask=ni_hf.MultiTaskViTForImageClassification(ni_hf.MultiTaskViTConfig(**sizes)),
        plain=transformers.ViTForImageClassification(transformers.ViTConfig(image_size=32, **sizes)),
    )


@pytest.fixture
def s(model, pixels, trace, set_model, set_inputs, set_trace, vits, tmp_path):
    """What the rows of BAD_CALLS call with: the image model and its trace (5 samples, 2 function iterations, 3
    functions, 2 heads, 1 LOC, 2 tasks, 10 classes, 18 tokens), the set model (5 variables, 6 samples), the ViTs."""
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    return SimpleNamespace(
        model=model,
        pixels=pixels,
        trace=trace,
        set_model=set_model,
        set_inputs=set_inputs,
        set_trace=set_trace,
        vits=vits,
        tmp=tmp_path,
        a_file=a_file,
    )


BAD_CALLS = {
    # trace_routing: the model
    "a multi-task ViT is not traced": (
        lambda s: vis.trace_routing(s.vits.multitask, s.pixels),
        TypeError,
        "`model` must be a Neural Interpreter",
    ),
    "a transformers ViT is not traced": (
        lambda s: vis.trace_routing(s.vits.plain, s.pixels),
        TypeError,
        "got ViTForImageClassification (model_type 'vit')",
    ),
    "a model that is no module": (
        lambda s: vis.trace_routing("model", s.pixels),
        TypeError,
        "`model` must be a Neural Interpreter",
    ),
    "pixels for a set model": (
        lambda s: vis.trace_routing(s.set_model, s.pixels),
        ValueError,
        "pixel_values is for an image model",
    ),
    "a set for an image model": (
        lambda s: vis.trace_routing(s.model, inputs=s.set_inputs),
        ValueError,
        "inputs= is for a set-regression model",
    ),
    # trace_routing: the inputs
    "pixels as a list": (
        lambda s: vis.trace_routing(s.model, s.pixels.tolist()),
        TypeError,
        "`pixel_values` must be a torch.Tensor or numpy array",
    ),
    "uint8 numpy pixels": (
        lambda s: vis.trace_routing(s.model, np.zeros((2, 3, 32, 32), np.uint8)),
        ValueError,
        "`pixel_values` must be floating-point",
    ),
    "integer tensor pixels": (
        lambda s: vis.trace_routing(s.model, torch.zeros(2, 3, 32, 32, dtype=torch.long)),
        ValueError,
        "`pixel_values` must be floating-point",
    ),
    "pixels of the wrong size": (
        lambda s: vis.trace_routing(s.model, torch.randn(2, 3, 28, 28)),
        ValueError,
        "`pixel_values` must be images (batch, 3, 32, 32) or patches (batch, 16, 192), got shape (2, 3, 28",
    ),
    "0-d pixels": (
        lambda s: vis.trace_routing(s.model, torch.tensor(1.0)),
        ValueError,
        "`pixel_values` must be a batch",
    ),
    "an empty batch": (
        lambda s: vis.trace_routing(s.model, s.pixels[:0]),
        ValueError,
        "`pixel_values` is an empty batch",
    ),
    "NaN pixels": (
        lambda s: vis.trace_routing(s.model, torch.full((1, 3, 32, 32), float("nan"))),
        ValueError,
        "`pixel_values` contains NaN",
    ),
    "NaN set inputs": (
        lambda s: vis.trace_routing(s.set_model, inputs=torch.full((2, 5), float("nan"))),
        ValueError,
        "`inputs` contains NaN",
    ),
    "set inputs of the wrong width": (
        lambda s: vis.trace_routing(s.set_model, inputs=np.zeros((2, 4), np.float32)),
        ValueError,
        "`inputs` must have shape (batch, 5), got (2, 4)",
    ),
    # trace_routing: task ids, iterations, functions
    "float task ids": (
        lambda s: vis.trace_routing(s.model, s.pixels, np.zeros(5)),
        ValueError,
        "`task_ids` must be task indices",
    ),
    "a bool task id": (
        lambda s: vis.trace_routing(s.model, s.pixels, True),
        ValueError,
        "`task_ids` must be task indices",
    ),
    "a task id out of range": (
        lambda s: vis.trace_routing(s.model, s.pixels, [0, 1, 2, 0, 1]),
        ValueError,
        "`task_ids` must lie in 0..1 (tasks ['mnist', 'mnistm']), got [2]",
    ),
    "a negative task id": (
        lambda s: vis.trace_routing(s.model, s.pixels, -1),
        ValueError,
        "`task_ids` must lie in 0..1 (tasks ['mnist', 'mnistm']), got [-1]",
    ),
    "task ids of the wrong length": (
        lambda s: vis.trace_routing(s.model, s.pixels, [0, 1]),
        ValueError,
        "`task_ids` must be one task index, or one per sample (5), got shape (2,)",
    ),
    "2-D task ids": (
        lambda s: vis.trace_routing(s.model, s.pixels, np.zeros((5, 1), np.int64)),
        ValueError,
        "`task_ids` must be one task index, or one per sample (5)",
    ),
    "fractional iterations": (
        lambda s: vis.trace_routing(s.model, s.pixels, num_function_iterations=1.5),
        ValueError,
        "`num_function_iterations` must be a non-negative int or one per script (1)",
    ),
    "iterations for two scripts of a one-script model": (
        lambda s: vis.trace_routing(s.model, s.pixels, num_function_iterations=[1, 1]),
        ValueError,
        "`num_function_iterations` must be a non-negative int or one per script (1)",
    ),
    "no iteration at all": (
        lambda s: vis.trace_routing(s.model, s.pixels, num_function_iterations=0),
        ValueError,
        "with at least one iteration in all, got [0]",
    ),
    "a disabled function out of range": (
        lambda s: vis.trace_routing(s.model, s.pixels, disabled_functions=[3]),
        ValueError,
        "`disabled_functions` must index functions 0..2, got [3]",
    ),
    "a negative disabled function": (
        lambda s: vis.trace_routing(s.model, s.pixels, disabled_functions=np.array([-1])),
        ValueError,
        "`disabled_functions` must index functions 0..2, got [-1]",
    ),
    "a float disabled function": (
        lambda s: vis.trace_routing(s.model, s.pixels, disabled_functions=[0.5]),
        ValueError,
        "`disabled_functions` must be function indices",
    ),
    "disabled functions per script": (
        lambda s: vis.trace_routing(s.model, s.pixels, disabled_functions={0: [1]}),
        TypeError,
        "does not take a per-script dict",
    ),
    "output_attentions not a bool": (
        lambda s: vis.trace_routing(s.model, s.pixels, output_attentions="yes"),
        TypeError,
        "`output_attentions` must be a bool",
    ),
    # the sample index of the data and figures
    "a sample index past the batch": (
        lambda s: vis.computational_path_data(s.trace, 5),
        ValueError,
        "`index` must be a sample index of the trace in 0..4, got 5",
    ),
    "a negative sample index": (
        lambda s: vis.plot_computational_path(s.trace, -1),
        ValueError,
        "`index` must be a sample index of the trace in 0..4, got -1",
    ),
    "a float sample index": (
        lambda s: vis.computational_path_data(s.trace, 1.0),
        TypeError,
        "`index` must be an int",
    ),
    "a set sample index past the batch": (
        lambda s: vis.plot_set_path(s.set_trace, 6),
        ValueError,
        "`index` must be a sample index of the trace in 0..5, got 6",
    ),
    "a usage for a trace": (
        lambda s: vis.computational_path_data(vis.FunctionUsage.from_trace(s.trace)),
        TypeError,
        "`trace` must be a RoutingTrace",
    ),
    # labels
    "float labels": (
        lambda s: vis.FunctionUsage.from_trace(s.trace, LABELS + 0.5),
        ValueError,
        "`labels` must be class indices (a list, tuple, numpy array or tensor of ints), got float64 values",
    ),
    "a label past the classes": (
        lambda s: vis.FunctionUsage.from_trace(s.trace, [3, 7, 3, 1, 10]),
        ValueError,
        "`labels` must be class indices in 0..9 (the model's 10 classes), got [10]",
    ),
    "an ignored (-100) label": (
        lambda s: vis.FunctionUsage.from_trace(s.trace, torch.tensor([3, 7, -100, 1, 7])),
        ValueError,
        "`labels` must be class indices >= 0, got [-100]",
    ),
    "labels of the wrong length": (
        lambda s: vis.FunctionUsage.from_trace(s.trace, LABELS[:4]),
        ValueError,
        "`labels` must be one class index per sample of the trace, shape (5,), got shape (4,)",
    ),
    "one-hot labels": (
        lambda s: vis.type_projection_data(s.trace, np.eye(10, dtype=np.int64)[LABELS]),
        ValueError,
        "`labels` must be one class index per sample of the trace, shape (5,), got shape (5, 10)",
    ),
    "label names": (
        lambda s: vis.plot_type_space(s.trace, [str(v) for v in LABELS]),
        ValueError,
        "`labels` must be class indices",
    ),
    "a float label in the type space": (
        lambda s: vis.plot_type_space(s.trace, [3.0, 7, 3, 1, 7]),
        ValueError,
        "`labels` must be class indices",
    ),
    "a set trace projected without labels": (
        lambda s: vis.type_projection_data(s.set_trace),
        ValueError,
        "`labels` are needed: this trace has no class predictions",
    ),
    "a projection that is not offered": (
        lambda s: vis.type_projection_data(s.trace, method="PCA"),
        ValueError,
        "`method` must be 'pca' or 'tsne', got 'PCA'",
    ),
    "a float seed": (
        lambda s: vis.type_projection_data(s.trace, seed=0.5),
        ValueError,
        "`seed` must be an int",
    ),
    # attention
    "an attention sample past the batch": (
        lambda s: vis.attention_data(s.trace, index=5),
        ValueError,
        "`index` must be a sample index of the trace in 0..4, got 5",
    ),
    "a function iteration past the trace": (
        lambda s: vis.attention_data(s.trace, step=2),
        ValueError,
        "`step` must be a function iteration of the trace in 0..1, got 2",
    ),
    "a function past the functions": (
        lambda s: vis.plot_attention(s.trace, function=3),
        ValueError,
        "`function` must be a function index in 0..2, got 3",
    ),
    "a negative function": (
        lambda s: vis.attention_data(s.trace, function=-1),
        ValueError,
        "`function` must be a function index in 0..2, got -1",
    ),
    "a head past the heads": (
        lambda s: vis.attention_data(s.trace, head=2),
        ValueError,
        "`head` must be an attention head index in 0..1, got 2",
    ),
    "a token past the tokens": (
        lambda s: vis.attention_data(s.trace, token=18),
        ValueError,
        "`token` must be a token index in 0..17, got 18",
    ),
    "a LOC past the LOCs": (
        lambda s: vis.attention_data(s.trace, loc=1),
        ValueError,
        "`loc` must be a LOC index within the function iteration in 0..0, got 1",
    ),
    # figures
    "a trace for a usage": (
        lambda s: vis.plot_function_usage(s.trace),
        TypeError,
        "`usage` must be a FunctionUsage",
    ),
    "a usage added to a number": (
        lambda s: vis.FunctionUsage.from_trace(s.trace) + 1,
        TypeError,
        "unsupported operand",
    ),
    "a trace saved as a figure": (
        lambda s: vis.save_figure(s.trace, s.tmp / "x.png"),
        TypeError,
        "`fig` must be a matplotlib Figure",
    ),
    "nothing rendered as an image": (
        lambda s: vis.figure_to_image(None),
        TypeError,
        "`fig` must be a matplotlib Figure",
    ),
    # model card assets: refused before anything is written
    "a card's sample index past the batch": (
        lambda s: vis.write_routing_card_assets(s.model, s.pixels, TASK_IDS, s.tmp / "card", index=5),
        ValueError,
        "`index` must be a sample index of the batch in 0..4, got 5",
    ),
    "a card's label past the classes": (
        lambda s: vis.write_routing_card_assets(
            s.model, s.pixels, TASK_IDS, s.tmp / "card", labels=LABELS + 3
        ),
        ValueError,
        "`labels` must be class indices in 0..9 (the model's 10 classes), got [10]",
    ),
    "a card folder that is a number": (
        lambda s: vis.write_routing_card_assets(s.model, s.pixels, TASK_IDS, 3),
        TypeError,
        "`output_dir` must be a str or Path",
    ),
    "a card folder that is a file": (
        lambda s: vis.write_routing_card_assets(s.model, s.pixels, TASK_IDS, s.a_file),
        ValueError,
        "`output_dir` must be a folder",
    ),
    "an image card for a set model": (
        lambda s: vis.write_routing_card_assets(s.set_model, s.set_inputs, None, s.tmp / "card"),
        ValueError,
        "pixel_values is for an image model",
    ),
    "a set card for an image model": (
        lambda s: vis.write_set_routing_card_assets(s.model, s.pixels, s.tmp / "card"),
        ValueError,
        "inputs= is for a set-regression model",
    ),
    "a set card's stem with a folder": (
        lambda s: vis.write_set_routing_card_assets(s.set_model, s.set_inputs, s.tmp, stem="a/b"),
        ValueError,
        "`stem` must be a file name prefix",
    ),
    "a set card's heading that is no text": (
        lambda s: vis.write_set_routing_card_assets(s.set_model, s.set_inputs, s.tmp, heading=2),
        TypeError,
        "`heading` must be a str",
    ),
    "a set card's draw that is no bool": (
        lambda s: vis.write_set_routing_card_assets(s.set_model, s.set_inputs, s.tmp, draw="no"),
        TypeError,
        "`draw` must be True, False or None",
    ),
    "a set card's sample index past the batch": (
        lambda s: vis.write_set_routing_card_assets(s.set_model, s.set_inputs, s.tmp / "card", index=6),
        ValueError,
        "`index` must be a sample index of the batch in 0..5, got 6",
    ),
}


@pytest.mark.parametrize("call, error, message", list(BAD_CALLS.values()), ids=list(BAD_CALLS))
def test_bad_arguments_are_refused_with_an_error_that_names_them(s, call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call(s)
    assert not (s.tmp / "card").exists()  # a refused card writes nothing


@needs_matplotlib
def test_a_non_positive_dpi_is_refused_by_name(trace):
    fig = vis.plot_computational_path(trace, 0)
    for dpi in (0, -10, float("nan"), True):
        with pytest.raises(ValueError, match="`dpi` must be a positive number"):
            vis.save_figure(fig, io.BytesIO(), dpi=dpi)


def test_numpy_inputs_give_the_same_trace_as_torch_inputs(tester, set_model, set_inputs):
    """Arrays of any float width for the inputs, arrays of ints for the indices: the trace of the tensors."""
    model = ni_hf.NeuralInterpreterForImageClassification(tester.get_config()).eval()
    patches = tester.prepare_inputs(model.config)[
        "pixel_values"
    ]  # (3, 16, 12): 2 scripts of 2 and 1 iterations
    options = dict(output_attentions=True)
    expected = vis.trace_routing(
        model,
        patches,
        torch.tensor([1, 0, 1]),
        num_function_iterations=[2, 1],
        disabled_functions=[2],
        **options,
    )
    traced = vis.trace_routing(
        model,
        patches.numpy().astype(np.float64),
        np.array([1, 0, 1], dtype=np.int32),
        num_function_iterations=np.array([2, 1]),
        disabled_functions=np.array([2]),
        **options,
    )
    assert traced.steps == expected.steps == [(0, 0), (0, 1), (1, 0)]
    assert traced.disabled_functions == expected.disabled_functions == [2]
    for name in ("compatibilities", "types", "signatures", "attentions", "logits", "task_ids", "images"):
        np.testing.assert_array_equal(getattr(traced, name), getattr(expected, name), err_msg=name)
    set_expected = vis.trace_routing(set_model, inputs=set_inputs)
    set_traced = vis.trace_routing(set_model, inputs=set_inputs.numpy())
    for name in ("compatibilities", "types", "regression", "set_inputs"):
        np.testing.assert_array_equal(getattr(set_traced, name), getattr(set_expected, name), err_msg=name)


def test_one_task_id_is_the_task_of_every_sample(model, pixels):
    each = vis.trace_routing(model, pixels, [1] * 5)
    for one in (1, [1], np.int64(1), torch.tensor(1)):
        trace = vis.trace_routing(model, pixels, one)
        np.testing.assert_array_equal(trace.task_ids, [1] * 5)
        np.testing.assert_array_equal(trace.logits, each.logits)


def test_a_model_in_training_mode_is_traced_in_eval_mode_and_left_training(tester):
    model = ni_hf.NeuralInterpreterForImageClassification(tester.get_config(hidden_dropout_prob=0.5))
    patches = tester.prepare_inputs(model.config)["pixel_values"]
    expected = vis.trace_routing(model.eval(), patches)
    model.train()
    np.testing.assert_array_equal(vis.trace_routing(model, patches).compatibilities, expected.compatibilities)
    assert model.training


def test_a_model_with_nan_parameters_gives_no_trace_and_is_left_in_its_mode(tester):
    model = ni_hf.NeuralInterpreterForImageClassification(tester.get_config()).train()
    patches = tester.prepare_inputs(model.config)["pixel_values"]
    with torch.no_grad():
        model.neural_interpreter.patch_embedding.weight.fill_(float("nan"))
    with pytest.raises(FloatingPointError):  # the model's own check, inside its forward pass
        vis.trace_routing(model, patches)
    assert model.training
    model.checks_finite = False
    with torch.no_grad():
        assert torch.isnan(model(pixel_values=patches).logits).all()  # the NaN the trace must not hand on
    with pytest.raises(FloatingPointError, match="`model` produced NaN or infinite"):
        vis.trace_routing(model, patches)
    assert model.training


def test_a_backbone_counts_any_class_the_caller_labels(tester):
    """A backbone has no head, so no classes of its own: the caller's labels name them, past num_labels too."""
    model = ni_hf.NeuralInterpreterModel(tester.get_config()).eval()
    patches = tester.prepare_inputs(model.config)["pixel_values"]
    trace = vis.trace_routing(model, patches, [0, 1, 1])
    assert trace.logits is None
    usage = vis.FunctionUsage.from_trace(trace, [0, 12, 12])
    assert usage.class_names[-1] == "12" and usage.class_tokens[12] == 2 * usage.class_tokens[0] > 0
    with pytest.raises(ValueError, match="`labels` are needed"):
        vis.FunctionUsage.from_trace(trace)


# ---------------------------------------------------------------------------------------------- PGM puzzles

# Meta-target bits of the 3 test puzzles (columns in ni_hf.data.pgm.META_TARGET_NAMES' order): progression in
# puzzles 0 and 2, XOR in 1, AND in 2; OR and consistent_union in none.
PGM_META_TARGETS = np.zeros((3, 12), dtype=np.int64)
PGM_META_TARGETS[0, [0, 2, 7]] = 1  # shape, color, progression
PGM_META_TARGETS[1, [1, 8]] = 1  # line, XOR
PGM_META_TARGETS[2, [0, 5, 7, 10]] = 1  # shape, size, progression, AND


@pytest.fixture
def pgm(tester, model, pixels, set_model, set_inputs, vits, tmp_path):
    """A tiny multiple-choice model (2 scripts of 2 and 1 function iterations, 3 functions, 2 heads, 2 LOCs) and 3
    puzzles of 16 x 16 panels with their correct candidates; the image and set models for what they refuse."""
    config = tester.get_pgm_config()
    inputs = tester.prepare_pgm_inputs(config)
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    return SimpleNamespace(
        model=ni_hf.NeuralInterpreterForMultipleChoice(config).eval(),
        pixels=inputs["pixel_values"],
        labels=inputs["labels"],
        image_model=model,
        image_pixels=pixels,
        set_model=set_model,
        set_inputs=set_inputs,
        vits=vits,
        tmp=tmp_path,
        a_file=a_file,
    )


def pgm_trace(pgm, **options):
    return vis.trace_routing(
        pgm.model, pgm.pixels, labels=pgm.labels, meta_targets=PGM_META_TARGETS, **options
    )


def test_pgm_trace_holds_the_set_of_the_chosen_candidate_and_of_the_correct_one(pgm):
    trace = pgm_trace(pgm, output_attentions=True)
    with torch.no_grad():
        out = pgm.model(pixel_values=pgm.pixels, output_routing=True, output_attentions=True)
    chosen = out.logits.argmax(-1).numpy()
    rows = np.arange(3) * 8 + chosen  # candidate k of puzzle b is the set at row b * 8 + k
    correct_rows = np.arange(3) * 8 + pgm.labels.numpy()
    assert trace.is_multiple_choice and not trace.is_set and trace.grid is None and trace.images is None
    assert trace.compatibilities.shape == (3, 3, 3, 10)  # (K, B, U, N): CLS, 8 context panels, the candidate
    assert trace.types.shape == (3, 3, 10, 6) and trace.correct_compatibilities.shape == (3, 3, 3, 10)
    assert trace.attentions.shape == (3, 2, 3, 3, 2, 10, 10)  # (K, L, B, U, H, N, N)
    assert trace.steps == [(0, 0), (0, 1), (1, 0)]
    np.testing.assert_array_equal(trace.predictions, chosen)
    np.testing.assert_array_equal(trace.logits, out.logits.numpy())
    np.testing.assert_array_equal(trace.labels, pgm.labels.numpy())
    np.testing.assert_array_equal(trace.meta_targets, PGM_META_TARGETS)
    for k in range(3):
        np.testing.assert_array_equal(trace.compatibilities[k], out.compatibilities[k][rows].numpy())
        np.testing.assert_array_equal(trace.types[k], out.types[k][rows].numpy())
        np.testing.assert_array_equal(
            trace.correct_compatibilities[k], out.compatibilities[k][correct_rows].numpy()
        )
        np.testing.assert_array_equal(trace.correct_types[k], out.types[k][correct_rows].numpy())
        for loc in range(2):
            np.testing.assert_array_equal(trace.attentions[k, loc], out.attentions[2 * k + loc][rows].numpy())
    # the candidates' sets differ, so the rows above are told apart
    assert not np.array_equal(out.compatibilities[0][rows].numpy(), out.compatibilities[0][rows ^ 1].numpy())
    context = [f"context {i}" for i in range(1, 9)]
    assert trace.token_names == [["CLS", *context, f"candidate {k + 1}"] for k in chosen]
    assert trace.class_names == [f"candidate {k}" for k in range(1, 9)]
    assert trace.panels.shape == (3, 16, 16, 16) and trace.panels.min() == 0.0 and trace.panels.max() == 1.0
    data = vis.computational_path_data(trace, 2)
    c = trace.compatibilities[:, 2]
    assert data["matrix"].shape == (3, 3, 3, 3)  # (K, U, 3, 3): context panels row-major, the candidate last
    assert data["matrix"][1, 2, 0, 1] == c[1, 2, 2] and data["matrix"][0, 1, 2, 2] == c[0, 1, 9]
    assert data["prediction"] == chosen[2] and data["label"] == 2
    np.testing.assert_array_equal(data["correct_tokens"], trace.correct_compatibilities[:, 2])
    without_labels = vis.trace_routing(pgm.model, pgm.pixels)
    assert without_labels.labels is None and without_labels.correct_compatibilities is None
    # without attentions the model takes another Eq. 6 kernel: the same numbers up to rounding
    np.testing.assert_allclose(without_labels.compatibilities, trace.compatibilities, atol=1e-6)


def test_pgm_trace_follows_function_iterations_and_disabled_functions(pgm):
    trace = pgm_trace(pgm, num_function_iterations=[1, 1], disabled_functions=[1])
    assert trace.steps == [(0, 0), (1, 0)] and trace.disabled_functions == [1]
    np.testing.assert_array_equal(trace.compatibilities[:, :, 1], 0.0)
    with torch.no_grad():
        out = pgm.model(pixel_values=pgm.pixels, num_function_iterations=[1, 1], disabled_functions=[1])
    np.testing.assert_array_equal(trace.logits, out.logits.numpy())
    assert not np.array_equal(trace.logits, pgm_trace(pgm).logits)


def test_pgm_trace_of_a_checkpoints_copied_class(pgm, tmp_path, monkeypatch):
    """The class a checkpoint's code defines (what trust_remote_code loads) is traced by its name."""
    path = tmp_path / "ckpt_code"
    pgm.model.save_pretrained(path)
    (path / "__init__.py").write_text("")
    spec = importlib.util.spec_from_file_location(
        "ckpt_code", path / "__init__.py", submodule_search_locations=[str(path)]
    )
    package = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "ckpt_code", package)
    spec.loader.exec_module(package)
    modeling = importlib.import_module("ckpt_code.modeling_neural_interpreter")
    monkeypatch.setitem(sys.modules, "ckpt_code.modeling_neural_interpreter", modeling)
    copied = modeling.NeuralInterpreterForMultipleChoice.from_pretrained(path).eval()
    assert type(copied) is not ni_hf.NeuralInterpreterForMultipleChoice
    trace = vis.trace_routing(copied, pgm.pixels, labels=pgm.labels)
    expected = vis.trace_routing(pgm.model, pgm.pixels, labels=pgm.labels)
    np.testing.assert_allclose(trace.compatibilities, expected.compatibilities, atol=1e-6)
    assert trace.token_names == expected.token_names


def test_a_pgm_model_with_nan_parameters_gives_no_trace(pgm):
    with torch.no_grad():
        pgm.model.panel_embedding.projection.weight.fill_(float("nan"))
    pgm.model.checks_finite = False
    with pytest.raises(FloatingPointError, match="`model` produced NaN or infinite"):
        pgm_trace(pgm)


def test_pgm_usage_is_mean_C_per_iteration_token_and_relation_type(pgm):
    trace = pgm_trace(pgm)
    usage = vis.FunctionUsage.from_trace(trace)
    c = trace.compatibilities.astype(np.float64)  # (K, B, U, N)
    np.testing.assert_allclose(usage.by_iteration, c.mean(axis=(1, 3)))
    np.testing.assert_allclose(usage.by_position_iteration, c.mean(axis=1).transpose(0, 2, 1))  # (K, N, U)
    np.testing.assert_allclose(usage.by_position, c.mean(axis=(0, 1)).T)
    relations = ["progression", "XOR", "OR", "AND", "consistent_union"]
    assert usage.class_names == relations and usage.class_source == "meta_targets"
    np.testing.assert_allclose(usage.by_class[0], c[:, [0, 2]].mean(axis=(0, 1, 3)))  # progression: 0 and 2
    np.testing.assert_allclose(usage.by_class[3], c[:, [2]].mean(axis=(0, 1, 3)))  # AND: puzzle 2
    assert np.isnan(usage.by_class[2]).all()  # no puzzle with OR
    names = [line.split("|")[1].strip() for line in usage.to_markdown().splitlines()[2:]]
    tokens = ["token CLS", *[f"token context {i}" for i in range(1, 9)], "token candidate"]
    iterations = ["script 1, iteration 1", "script 1, iteration 2", "script 2, iteration 1"]
    assert names == [*iterations, "task pgm", *tokens, "relation progression", "relation XOR", "relation AND"]
    data = json.loads(json.dumps(usage.to_dict()))
    assert data["positions"][-1] == "candidate" and len(data["by_position_iteration"]) == 3
    halves = vis.FunctionUsage.from_trace(
        vis.trace_routing(pgm.model, pgm.pixels[:1], labels=pgm.labels[:1], meta_targets=PGM_META_TARGETS[:1])
    ) + vis.FunctionUsage.from_trace(
        vis.trace_routing(pgm.model, pgm.pixels[1:], labels=pgm.labels[1:], meta_targets=PGM_META_TARGETS[1:])
    )
    for name in ("by_iteration", "by_position_iteration", "by_class"):
        np.testing.assert_allclose(getattr(halves, name), getattr(usage, name), atol=1e-6)
    plain = vis.FunctionUsage.from_trace(vis.trace_routing(pgm.model, pgm.pixels))
    assert plain.class_names == [] and plain.class_source == "none"
    np.testing.assert_allclose(plain.by_position, usage.by_position)


@needs_matplotlib
def test_pgm_path_and_usage_figures_render_deterministically(pgm):
    trace = pgm_trace(pgm)
    first = png_of(vis.plot_computational_path(trace, 1))
    assert_drawn(first, (500, 350))
    assert png_of(vis.plot_computational_path(pgm_trace(pgm), 1)) == first
    without_labels = png_of(vis.plot_computational_path(vis.trace_routing(pgm.model, pgm.pixels), 1))
    assert_drawn(without_labels)
    assert without_labels != first  # the correct candidate is marked only when the labels are known
    assert_drawn(png_of(vis.plot_function_usage(vis.FunctionUsage.from_trace(trace))))


@needs_matplotlib
def test_pgm_card_assets_are_pngs_and_the_usage_table(pgm):
    result = vis.write_pgm_routing_card_assets(
        pgm.model,
        pgm.pixels,
        pgm.labels,
        pgm.tmp / "card",
        meta_targets=PGM_META_TARGETS,
        index=1,
        stem="pgm",
    )
    path_png, usage_png, usage_json = (Path(f) for f in result["files"])
    assert [f.name for f in (path_png, usage_png, usage_json)] == [
        "pgm_path.png",
        "pgm_usage.png",
        "pgm_usage.json",
    ]
    for png in (path_png, usage_png):
        assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
        assert_drawn(png.read_bytes())
    trace = pgm_trace(pgm)
    usage = vis.FunctionUsage.from_trace(trace)
    assert json.loads(usage_json.read_text()) == usage.to_dict() == result["usage"]
    assert path_png.read_bytes() == png_of(vis.plot_computational_path(trace, 1))
    markdown = result["markdown"]
    assert markdown.startswith("## Routing")
    assert (
        "![Computational path of one test puzzle](pgm_path.png)" in markdown and "(pgm_usage.png)" in markdown
    )
    assert f"the model chose candidate {int(trace.predictions[1]) + 1}" in markdown
    assert usage.to_markdown() in markdown and "relation type" in markdown
    solved = int((trace.predictions == trace.labels).sum())
    assert f"the model solves {solved} of them" in markdown


PGM_BAD_CALLS = {
    "too few panels": (
        lambda p: vis.trace_routing(p.model, p.pixels[:, :15]),
        ValueError,
        "`pixel_values` must be PGM puzzles (batch, 16, 1, 16, 16): the 8 context panels of the incomplete "
        "matrix, then the 8 candidates",
    ),
    "panels of the wrong size": (
        lambda p: vis.trace_routing(p.model, torch.randn(3, 16, 1, 8, 8)),
        ValueError,
        "got shape (3, 16, 1, 8, 8)",
    ),
    "images for a PGM model": (
        lambda p: vis.trace_routing(p.model, p.image_pixels),
        ValueError,
        "`pixel_values` must be PGM puzzles",
    ),
    "integer panels": (
        lambda p: vis.trace_routing(p.model, torch.zeros(3, 16, 1, 16, 16, dtype=torch.uint8)),
        ValueError,
        "`pixel_values` must be floating-point",
    ),
    "task ids for a PGM model": (
        lambda p: vis.trace_routing(p.model, p.pixels, [0, 0, 0]),
        ValueError,
        "A multiple-choice model takes no task_ids",
    ),
    "a label past the candidates": (
        lambda p: vis.trace_routing(p.model, p.pixels, labels=[0, 8, 1]),
        ValueError,
        "`labels` must be the correct candidate of each puzzle, ints in 0..7, got [8]",
    ),
    "a label of -100": (
        lambda p: vis.trace_routing(p.model, p.pixels, labels=torch.tensor([0, -100, 1])),
        ValueError,
        "`labels` must be the correct candidate of each puzzle, ints in 0..7, got [-100]",
    ),
    "too few labels": (
        lambda p: vis.trace_routing(p.model, p.pixels, labels=[0, 1]),
        ValueError,
        "one per puzzle: shape (3,), got shape (2,)",
    ),
    "float labels": (
        lambda p: vis.trace_routing(p.model, p.pixels, labels=[0.0, 1.0, 2.0]),
        ValueError,
        "`labels` must be the correct candidate of each puzzle",
    ),
    "meta targets of 11 bits": (
        lambda p: vis.trace_routing(p.model, p.pixels, meta_targets=PGM_META_TARGETS[:, :11]),
        ValueError,
        "`meta_targets` must be bits (0 or 1) of shape (3, 12)",
    ),
    "meta targets that are no bits": (
        lambda p: vis.trace_routing(p.model, p.pixels, meta_targets=PGM_META_TARGETS * 2),
        ValueError,
        "got the values [2]",
    ),
    "float meta targets": (
        lambda p: vis.trace_routing(p.model, p.pixels, meta_targets=PGM_META_TARGETS.astype(np.float32)),
        ValueError,
        "`meta_targets` must be bits",
    ),
    "labels for an image model": (
        lambda p: vis.trace_routing(p.image_model, p.image_pixels, labels=[0] * 5),
        ValueError,
        "`labels` is for the multiple-choice (PGM) model",
    ),
    "meta targets for a set model": (
        lambda p: vis.trace_routing(
            p.set_model, inputs=p.set_inputs, meta_targets=np.zeros((6, 12), np.int64)
        ),
        ValueError,
        "`meta_targets` is for the multiple-choice (PGM) model",
    ),
    "classes for a PGM usage": (
        lambda p: vis.FunctionUsage.from_trace(pgm_trace(p), [0, 1, 2]),
        ValueError,
        "A PGM trace is split by relation type",
    ),
    "a PGM usage added to an image usage": (
        lambda p: (
            vis.FunctionUsage.from_trace(pgm_trace(p))
            + vis.FunctionUsage.from_trace(vis.trace_routing(p.image_model, p.image_pixels))
        ),
        ValueError,
        "Only usages of the same model",
    ),
    "usages with and without meta targets": (
        lambda p: (
            vis.FunctionUsage.from_trace(pgm_trace(p))
            + vis.FunctionUsage.from_trace(vis.trace_routing(p.model, p.pixels))
        ),
        ValueError,
        "Usages counted by meta_targets and by none do not add up",
    ),
    "a puzzle index past the trace": (
        lambda p: vis.plot_computational_path(pgm_trace(p), 3),
        ValueError,
        "`index` must be a sample index of the trace in 0..2, got 3",
    ),
    "an attention map of a puzzle": (
        lambda p: vis.attention_data(pgm_trace(p, output_attentions=True)),
        ValueError,
        "The attention map is drawn on a patch grid",
    ),
    "a set path of a puzzle": (
        lambda p: vis.plot_set_path(pgm_trace(p)),
        ValueError,
        "plot_set_path draws a set input",
    ),
    "a PGM card for an image model": (
        lambda p: vis.write_pgm_routing_card_assets(p.image_model, p.image_pixels, None, p.tmp / "card"),
        TypeError,
        "`model` must be a NeuralInterpreterForMultipleChoice (PGM puzzles), got "
        "NeuralInterpreterForImageClassification",
    ),
    "a PGM card for a ViT": (
        lambda p: vis.write_pgm_routing_card_assets(p.vits.multitask, p.image_pixels, None, p.tmp / "card"),
        TypeError,
        "`model` must be a Neural Interpreter",
    ),
    "a PGM card's puzzle index past the batch": (
        lambda p: vis.write_pgm_routing_card_assets(p.model, p.pixels, p.labels, p.tmp / "card", index=3),
        ValueError,
        "`index` must be a puzzle index of the batch in 0..2, got 3",
    ),
    "a PGM card's label past the candidates": (
        lambda p: vis.write_pgm_routing_card_assets(p.model, p.pixels, [0, 1, 9], p.tmp / "card"),
        ValueError,
        "got [9]",
    ),
    "a PGM card's stem with a folder": (
        lambda p: vis.write_pgm_routing_card_assets(p.model, p.pixels, p.labels, p.tmp / "card", stem="a/b"),
        ValueError,
        "`stem` must be a file name prefix",
    ),
    "a PGM card folder that is a file": (
        lambda p: vis.write_pgm_routing_card_assets(p.model, p.pixels, p.labels, p.a_file),
        ValueError,
        "`output_dir` must be a folder",
    ),
}


@pytest.mark.parametrize("call, error, message", list(PGM_BAD_CALLS.values()), ids=list(PGM_BAD_CALLS))
def test_bad_pgm_arguments_are_refused_with_an_error_that_names_them(pgm, call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call(pgm)
    assert not (pgm.tmp / "card").exists()  # a refused card writes nothing
