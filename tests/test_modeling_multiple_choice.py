"""The multiple-choice Neural Interpreter (PGM puzzles, section 4.3): shapes, the candidates' symmetry, each panel
embedded once, the paper's preset, checkpoints through the Auto classes and remote code, and bad inputs."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForMultipleChoice

import ni_hf
from ni_hf import NeuralInterpreterConfig, NeuralInterpreterForMultipleChoice


def test_multiple_choice_output_shapes_and_routing(tester):
    tester.create_and_check_for_multiple_choice(tester.get_pgm_config())


def test_permuting_the_candidates_permutes_their_scores(tester):
    """Each candidate is scored on its own set: the model is equivariant to the order of the candidates."""
    config = tester.get_pgm_config()
    model = NeuralInterpreterForMultipleChoice(config).eval()
    pixel_values = tester.prepare_pgm_inputs(config)["pixel_values"]
    order = torch.randperm(config.num_choices, generator=torch.Generator().manual_seed(0))
    permuted = pixel_values.clone()
    permuted[:, config.num_context_panels :] = pixel_values[:, config.num_context_panels :][:, order]
    with torch.no_grad():
        logits, permuted_logits = model(pixel_values).logits, model(permuted).logits
    torch.testing.assert_close(permuted_logits, logits[:, order], atol=1e-5, rtol=1e-5)


def test_the_context_panels_positions_matter(tester):
    """Learned embeddings of the matrix positions: swapping two context panels changes the scores."""
    config = tester.get_pgm_config()
    model = NeuralInterpreterForMultipleChoice(config).eval()
    pixel_values = tester.prepare_pgm_inputs(config)["pixel_values"]
    swapped = pixel_values.clone()
    swapped[:, [0, 1]] = pixel_values[:, [1, 0]]
    with torch.no_grad():
        assert not torch.allclose(model(pixel_values).logits, model(swapped).logits, atol=1e-4)


def test_each_panel_is_embedded_once_and_the_candidates_fold_into_the_batch(tester):
    config = tester.get_pgm_config()
    model = NeuralInterpreterForMultipleChoice(config).eval()
    seen = {}
    model.panel_embedding.cnn.register_forward_hook(lambda m, args, out: seen.update(cnn=args[0].shape))
    model.neural_interpreter.register_forward_hook(
        lambda m, args, kwargs, out: seen.update(sets=kwargs["inputs_embeds"].shape), with_kwargs=True
    )
    model(tester.prepare_pgm_inputs(config)["pixel_values"])
    b, k = tester.batch_size, config.num_choices
    assert seen["cnn"][0] == b * config.num_panels  # 16 panels per puzzle, not 8 x 9
    assert tuple(seen["sets"]) == (b * k, config.num_context_panels + 1, config.hidden_size)


def test_anytime_inference_and_dropped_functions_reach_the_multiple_choice_model(tester):
    config = tester.get_pgm_config()
    model = NeuralInterpreterForMultipleChoice(config).eval()
    pixel_values = tester.prepare_pgm_inputs(config)["pixel_values"]
    with torch.no_grad():
        full = model(pixel_values, output_routing=True)
        fewer = model(pixel_values, num_function_iterations=1, output_routing=True)
        dropped = model(pixel_values, disabled_functions=[0], output_routing=True)
    assert len(full.compatibilities) == sum(config.iterations_per_script)
    assert len(fewer.compatibilities) == config.num_scripts
    assert not torch.allclose(full.logits, fewer.logits)
    assert all((c[:, 0] == 0).all() for c in dropped.compatibilities)


def test_the_paper_pgm_preset_builds_the_paper_model_per_regime():
    """2 scripts x 8 function iterations, 5 functions, d = 192, 4 heads of 32; tau, d_type and frozen signatures by
    regime. 1,107,987 parameters with WReN's four stride-2 convolutions (the paper reports about 1.6M)."""
    expected = {"neutral": (1.62, 20, False), "attrs.pairs": (1.40, 32, True), "attr.rels": (1.42, 24, True)}
    for regime, (tau, type_dim, frozen) in expected.items():
        config = NeuralInterpreterConfig.from_paper("pgm", regime=regime)
        assert (config.truncation_tau, config.type_dim, config.freeze_signatures) == (tau, type_dim, frozen)
        model = NeuralInterpreterForMultipleChoice(config)
        assert config.iterations_per_script == [8, 8] and config.num_functions == 5
        frozen_count = 2 * 5 * type_dim if frozen else 0
        assert model.num_parameters(only_trainable=True) == model.num_parameters() - frozen_count
    neutral = NeuralInterpreterForMultipleChoice(NeuralInterpreterConfig.from_paper("pgm", regime="neutral"))
    assert neutral.num_parameters() == 1_107_987


def test_wrong_panels_and_labels_are_refused_by_name(tester):
    config = tester.get_pgm_config()
    model = NeuralInterpreterForMultipleChoice(config).eval()
    pixel_values = tester.prepare_pgm_inputs(config)["pixel_values"]
    with pytest.raises(
        ValueError, match=r"must have shape \(batch, 16, 1, 16, 16\).* got \(3, 15, 1, 16, 16\)"
    ):
        model(pixel_values[:, :15])
    with pytest.raises(ValueError, match="`pixel_values` must be a floating-point tensor"):
        model((pixel_values * 100).to(torch.uint8))
    with pytest.raises(ValueError, match=r"candidate indices in 0\.\.7"):
        model(pixel_values, labels=torch.tensor([0, 8, 1]))
    with pytest.raises(ValueError, match="contains NaN"):
        model(torch.full_like(pixel_values, float("nan")))
    with pytest.raises(ValueError, match="num_labels=1 and one task"):
        NeuralInterpreterForMultipleChoice(tester.get_pgm_config(num_labels=3))


def test_multiple_choice_checkpoint_loads_through_auto_classes(tester, tmp_path):
    config = tester.get_pgm_config()
    torch.manual_seed(0)
    model = NeuralInterpreterForMultipleChoice(config).eval()
    pixel_values = tester.prepare_pgm_inputs(config)["pixel_values"]
    with torch.no_grad():
        expected = model(pixel_values).logits
    path = tmp_path / "ckpt"
    model.save_pretrained(path)
    saved = json.loads((path / "config.json").read_text())
    assert saved["auto_map"]["AutoModelForMultipleChoice"].endswith("NeuralInterpreterForMultipleChoice")
    assert (path / "panel_embedding.py").is_file()
    reloaded = AutoModelForMultipleChoice.from_pretrained(path).eval()
    assert type(reloaded) is NeuralInterpreterForMultipleChoice
    with torch.no_grad():
        torch.testing.assert_close(reloaded(pixel_values).logits, expected)


def test_the_multiple_choice_model_is_exported_by_the_package():
    assert ni_hf.NeuralInterpreterForMultipleChoice is NeuralInterpreterForMultipleChoice
    assert "NeuralInterpreterForMultipleChoice" in ni_hf.__all__


def test_the_vit_baseline_scores_candidates_with_the_same_scaffolding_and_a_like_parameter_count(
    tester, tmp_path
):
    """The paper's PGM ViT: the same panel CNN and candidate sets; its preset within 10% of the NI's parameters."""
    nfi = NeuralInterpreterForMultipleChoice(NeuralInterpreterConfig.from_paper("pgm")).num_parameters()
    vit = ni_hf.MultiTaskViTForMultipleChoice(ni_hf.MultiTaskViTConfig.from_paper("pgm")).num_parameters()
    assert abs(vit - nfi) / nfi < 0.1, (vit, nfi)
    config = ni_hf.MultiTaskViTConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        task_names=["pgm"],
        num_labels=1,
        panel_size=16,
        panel_cnn_channels=4,
        panel_cnn_layers=2,
    )
    model = ni_hf.MultiTaskViTForMultipleChoice(config).eval()
    inputs = tester.prepare_pgm_inputs(config)
    assert not any("patch_embeddings" in name for name, _ in model.named_parameters())
    out = model(**inputs)
    assert out.logits.shape == (tester.batch_size, 8) and torch.isfinite(out.loss)
    order = torch.tensor([7, 6, 5, 4, 3, 2, 1, 0])
    permuted = inputs["pixel_values"].clone()
    permuted[:, 8:] = inputs["pixel_values"][:, 8:][:, order]
    with torch.no_grad():
        torch.testing.assert_close(model(permuted).logits, model(inputs["pixel_values"]).logits[:, order])
    model.save_pretrained(tmp_path / "vit")
    assert (tmp_path / "vit" / "panel_embedding.py").is_file()
    reloaded = AutoModelForMultipleChoice.from_pretrained(tmp_path / "vit").eval()
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(inputs["pixel_values"]).logits, model(inputs["pixel_values"]).logits
        )
