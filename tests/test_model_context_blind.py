"""The context-blind PGM baseline: the Neural Interpreter's panel CNN and scorer seeing only the candidates."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForMultipleChoice, ViTConfig

import ni_hf
from ni_hf import ContextBlindConfig, ContextBlindForMultipleChoice, NeuralInterpreterForMultipleChoice


@pytest.fixture
def config(tester) -> ContextBlindConfig:
    return ContextBlindConfig.from_panel_config(tester.get_pgm_config())


def test_scores_every_candidate_with_the_cross_entropy_over_the_choices(tester, config):
    model = ContextBlindForMultipleChoice(config).eval()
    inputs = tester.prepare_pgm_inputs(config)
    out = model(**inputs)
    assert out.logits.shape == (tester.batch_size, config.num_choices)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, inputs["labels"]))
    ignored = torch.tensor([-100, 1, -100])
    torch.testing.assert_close(
        model(inputs["pixel_values"], labels=ignored).loss, F.cross_entropy(out.logits[1:2], ignored[1:2])
    )
    assert model(inputs["pixel_values"], labels=torch.full((3,), -100)).loss == 0


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_the_context_panels_change_nothing(tester, config, mode):
    """Other puzzles' context panels, blank ones or noise: the same logits, in evaluation and in training mode (where
    BatchNorm normalises with the statistics of the panels it is given: the context panels are not among them)."""
    torch.manual_seed(0)
    model = ContextBlindForMultipleChoice(config).train(mode == "train")
    pixel_values = tester.prepare_pgm_inputs(config)["pixel_values"]
    k = config.num_context_panels
    with torch.no_grad():
        logits = model(pixel_values).logits
        for context in (
            pixel_values[:, :k].roll(1, dims=0),
            torch.zeros_like(pixel_values[:, :k]),
            9 * torch.randn_like(pixel_values[:, :k]),
        ):
            changed = torch.cat([context, pixel_values[:, k:]], dim=1)
            torch.testing.assert_close(model(changed).logits, logits, rtol=0, atol=0)


def test_each_candidate_is_scored_from_its_own_panel_alone(tester, config):
    model = ContextBlindForMultipleChoice(config).eval()
    pixel_values = tester.prepare_pgm_inputs(config)["pixel_values"]
    k = config.num_context_panels
    with torch.no_grad():
        logits = model(pixel_values).logits
        order = torch.randperm(config.num_choices)
        permuted = torch.cat([pixel_values[:, :k], pixel_values[:, k:][:, order]], dim=1)
        torch.testing.assert_close(model(permuted).logits, logits[:, order])
        changed = pixel_values.clone()
        changed[:, k + 2] = torch.randn_like(changed[:, k + 2])
        moved = model(changed).logits != logits
    assert moved[:, 2].all() and not moved[:, [0, 1, 3, 4, 5, 6, 7]].any()


def test_from_panel_config_matches_the_pgm_model_s_panel_cnn_and_scorer(tester):
    """The baseline's panel CNN and scorer have the Neural Interpreter's shapes: its weights load into them."""
    pgm_config = tester.get_pgm_config(layer_norm_eps=1e-6)
    config = ContextBlindConfig.from_panel_config(pgm_config)
    assert (config.hidden_size, config.layer_norm_eps, config.panel_size) == (16, 1e-6, 16)
    pgm = NeuralInterpreterForMultipleChoice(pgm_config)
    model = ContextBlindForMultipleChoice(config)
    model.panel_embedding.load_state_dict(pgm.panel_embedding.state_dict())
    model.scorer.load_state_dict(pgm.scorer.state_dict())
    vit_config = tester.get_vit_config(task_names=["pgm"], num_labels=1, panel_size=16, panel_cnn_layers=2)
    assert ContextBlindConfig.from_panel_config(vit_config).panel_feature_dim == vit_config.panel_feature_dim
    assert ContextBlindConfig.from_panel_config(pgm_config, panel_cnn_channels=2).panel_cnn_channels == 2
    with pytest.raises(
        ValueError,
        match=r"`config` must describe a PGM model's panel CNN.*ViTConfig without \['num_context_panels'",
    ):
        ContextBlindConfig.from_panel_config(ViTConfig())


def test_it_learns_what_the_candidates_alone_give_away(tester, config):
    """A few steps on puzzles whose answer is the one bright candidate: the loss falls, the answers are found."""
    torch.manual_seed(0)
    model = ContextBlindForMultipleChoice(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    b, k = 16, config.num_context_panels
    labels = torch.randint(0, config.num_choices, (b,))
    pixel_values = torch.randn(b, config.num_panels, 1, config.panel_size, config.panel_size)
    pixel_values[torch.arange(b), k + labels] += 2.0
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = model(pixel_values, labels=labels).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    with torch.no_grad():
        assert (model.eval()(pixel_values).logits.argmax(-1) == labels).float().mean() > 0.9


def test_bad_inputs_are_refused_by_name(tester, config):
    model = ContextBlindForMultipleChoice(config).eval()
    pixel_values = tester.prepare_pgm_inputs(config)["pixel_values"]
    with pytest.raises(ValueError, match=r"PGM `pixel_values` must have shape \(batch, 16, 1, 16, 16\)"):
        model(pixel_values[:, :15])
    with pytest.raises(ValueError, match="floating-point tensor"):
        model((pixel_values * 100).to(torch.uint8))
    with pytest.raises(ValueError, match=r"candidate indices in 0\.\.7"):
        model(pixel_values, labels=torch.tensor([0, 8, 1]))
    with pytest.raises(ValueError, match="contains NaN"):
        model(torch.full_like(pixel_values, float("nan")))
    with pytest.raises(TypeError, match="num_function_iterations"):
        model(pixel_values, num_function_iterations=1)
    with pytest.raises(ValueError, match=r"`hidden_size` must be a positive integer, got 0"):
        ContextBlindConfig(hidden_size=0)
    with pytest.raises(TypeError, match=r"'panel_sise' \(did you mean 'panel_size'\?\)"):
        ContextBlindConfig(panel_sise=16)


def test_saves_and_loads_through_the_auto_classes(tester, config, tmp_path):
    model = ContextBlindForMultipleChoice(config).eval()
    pixel_values = tester.prepare_pgm_inputs(config)["pixel_values"]
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "ni_context_blind"
    assert saved["auto_map"] == {
        "AutoConfig": "configuration_context_blind.ContextBlindConfig",
        "AutoModelForMultipleChoice": "modeling_context_blind.ContextBlindForMultipleChoice",
    }
    for name in ("configuration_checks", "modeling_checks", "panel_embedding", "task_heads"):
        assert (tmp_path / f"{name}.py").is_file() and not (tmp_path / f"{name}.py").is_symlink()
    assert type(AutoConfig.from_pretrained(tmp_path)) is ContextBlindConfig
    loaded = AutoModelForMultipleChoice.from_pretrained(tmp_path).eval()
    assert type(loaded) is ContextBlindForMultipleChoice
    with torch.no_grad():
        torch.testing.assert_close(loaded(pixel_values).logits, model(pixel_values).logits)


def test_the_package_exports_it():
    for name in ("ContextBlindConfig", "ContextBlindForMultipleChoice", "ContextBlindPreTrainedModel"):
        assert name in ni_hf.__all__ and hasattr(ni_hf, name)
