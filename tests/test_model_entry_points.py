"""What a user meets at the models' entry points: each case gives the right result, or an error naming the input,
the setting or the file, before any expensive work (issues 69 and 72, the model-level cases)."""

from __future__ import annotations

import json
import logging

import numpy as np
import PIL.Image
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModel,
    AutoModelForImageClassification,
    AutoModelForMultipleChoice,
    ViTConfig,
)

import ni_hf
from ni_hf import (
    ContextBlindConfig,
    ContextBlindForMultipleChoice,
    MultiTaskViTForImageClassification,
    MultiTaskViTForMultipleChoice,
    NeuralInterpreterConfig,
    NeuralInterpreterForImageClassification,
    NeuralInterpreterForMultipleChoice,
    NeuralInterpreterForSetRegression,
    NeuralInterpreterImageProcessor,
    NeuralInterpreterModel,
)


def vit_pgm_config(tester):
    return tester.get_vit_config(
        task_names=["pgm"], num_labels=1, panel_size=16, panel_cnn_channels=4, panel_cnn_layers=2
    )


def build(tester, kind: str):
    """A tiny model of `kind` in evaluation mode, and the inputs of one forward."""
    image_inputs = {k: v for k, v in tester.prepare_inputs(tester.get_config()).items() if k != "labels"}
    panels = {"pixel_values": tester.prepare_pgm_inputs(tester.get_pgm_config())["pixel_values"]}
    models = {
        "ni_image": lambda: (NeuralInterpreterForImageClassification(tester.get_config()), image_inputs),
        "ni_backbone": lambda: (
            NeuralInterpreterModel(tester.get_config()),
            {"pixel_values": image_inputs["pixel_values"]},
        ),
        "ni_set": lambda: (
            NeuralInterpreterForSetRegression(tester.get_set_regression_config()),
            {"inputs": torch.rand(tester.batch_size, 5)},
        ),
        "ni_pgm": lambda: (NeuralInterpreterForMultipleChoice(tester.get_pgm_config()), panels),
        "vit_image": lambda: (MultiTaskViTForImageClassification(tester.get_vit_config()), image_inputs),
        "vit_pgm": lambda: (MultiTaskViTForMultipleChoice(vit_pgm_config(tester)), panels),
        "context_blind": lambda: (
            ContextBlindForMultipleChoice(ContextBlindConfig.from_panel_config(tester.get_pgm_config())),
            panels,
        ),
    }
    torch.manual_seed(0)
    model, inputs = models[kind]()
    return model.eval(), inputs


# --- a config edited after the model was built ---------------------------------------------------------------

EDITS = [
    ("ni_image", "num_functions", 7),
    ("ni_image", "hidden_size", 32),
    ("ni_image", "num_labels", 3),
    ("ni_image", "patch_size", 4),
    ("ni_image", "num_scripts", 1),
    ("ni_image", "task_names", ["a", "b", "c"]),
    ("ni_backbone", "type_dim", 4),
    ("ni_set", "num_input_variables", 6),
    ("ni_set", "code_dim", 4),
    ("ni_pgm", "panel_size", 32),
    ("ni_pgm", "hidden_size", 8),
    ("vit_image", "hidden_size", 32),
    ("vit_image", "num_labels", 3),
    ("vit_image", "patch_size", 4),
    ("vit_pgm", "panel_cnn_layers", 3),
    ("context_blind", "panel_size", 32),
    ("context_blind", "hidden_size", 8),
]


@pytest.mark.parametrize("kind, name, value", EDITS, ids=[f"{k}-{n}" for k, n, _ in EDITS])
def test_a_setting_edited_after_the_model_was_built_is_refused_at_forward_by_name(tester, kind, name, value):
    """The forward would ignore the edit (or fail in a matmul): refused before any script runs."""
    model, inputs = build(tester, kind)
    ran = []
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d | torch.nn.LayerNorm):
            module.register_forward_hook(lambda *_: ran.append(1))
    built = getattr(model.config, name)
    setattr(model.config, name, value)
    with pytest.raises(
        ValueError,
        match=rf"`config\.{name}` is {value!r}.*was built with {name}={built!r}".replace("[", r"\["),
    ):
        model(**inputs)
    assert ran == []
    setattr(model.config, name, built)  # put back, the model runs again
    model(**inputs)


@pytest.mark.parametrize("kind", ["ni_image", "ni_pgm", "vit_image", "vit_pgm"])
def test_an_attn_implementation_assigned_on_the_config_is_the_one_the_forward_checks(tester, kind):
    model, inputs = build(tester, kind)
    model.config.attn_implementation = "nope"
    assert model.config._attn_implementation == "nope" and "attn_implementation" not in vars(model.config)
    with pytest.raises(ValueError, match='attn_implementation.*"nope"'):
        model(**inputs)
    model.config.attn_implementation = "eager"
    model(**inputs)


def test_methods_that_change_settings_with_the_parameters_still_work(tester):
    model, inputs = build(tester, "ni_image")
    model.neural_interpreter.add_functions(2)  # through the backbone, as the adaptation example does
    assert model(**inputs).logits.shape == (tester.batch_size, 5)
    model.reset_tasks(["x"], num_labels=4)
    assert model(pixel_values=inputs["pixel_values"]).logits.shape == (tester.batch_size, 4)
    assert model.add_tasks(["y"]) == [1]
    assert model(**{**inputs, "task_ids": torch.tensor([0, 1, 1])}).logits.shape == (tester.batch_size, 4)
    vit, vit_inputs = build(tester, "vit_image")
    vit.reset_tasks(["x", "y"], num_labels=2)
    assert vit(**{**vit_inputs, "task_ids": torch.tensor([0, 1, 0])}).logits.shape == (tester.batch_size, 2)


def test_a_default_task_out_of_range_is_named(tester):
    model, inputs = build(tester, "ni_image")
    model.config.default_task = 1  # another task: followed
    assert model(pixel_values=inputs["pixel_values"]).logits.shape == (tester.batch_size, 5)
    model.config.default_task = 5
    with pytest.raises(ValueError, match=r"`config.default_task` is 5.*2 tasks \['a', 'b'\].*0\.\.1"):
        model(pixel_values=inputs["pixel_values"])
    vit, vit_inputs = build(tester, "vit_image")
    vit.config.default_task = 9
    with pytest.raises(ValueError, match=r"`config.default_task` is 9"):
        vit(pixel_values=vit_inputs["pixel_values"])


@pytest.mark.parametrize(
    "kind", ["ni_image", "ni_backbone", "ni_set", "ni_pgm", "vit_image", "vit_pgm", "context_blind"]
)
def test_an_input_on_the_meta_device_is_named(tester, kind):
    model, inputs = build(tester, kind)
    name = next(iter(inputs))
    meta = {**inputs, name: inputs[name].to("meta")}
    with pytest.raises(ValueError, match=rf"`{name}` is on the meta device \(a shape without values\)"):
        model(**meta)


# --- loading ---------------------------------------------------------------------------------------------------


@pytest.fixture
def saved(tester, tmp_path):
    """Save a tiny model of a kind under tmp_path/<kind> and return its folder."""

    def save(kind: str):
        model, _ = build(tester, kind)
        model.save_pretrained(tmp_path / kind)
        return tmp_path / kind

    return save


@pytest.mark.parametrize(
    "kind, backbone_class",
    [
        ("ni_pgm", NeuralInterpreterModel),
        ("ni_set", NeuralInterpreterModel),
        ("vit_pgm", ni_hf.MultiTaskViTModel),
    ],
)
def test_auto_model_on_a_checkpoint_whose_backbone_reads_sets_loads_nothing_random(
    saved, kind, backbone_class, caplog
):
    path = saved(kind)
    with caplog.at_level(logging.WARNING):
        backbone, info = AutoModel.from_pretrained(path, output_loading_info=True)
    assert type(backbone) is backbone_class
    assert not info["missing_keys"], info["missing_keys"]
    assert backbone.get_input_embeddings() is None
    assert "whose backbone reads sets" in caplog.text


@pytest.mark.parametrize(
    "kind, loader, hint",
    [
        ("ni_pgm", AutoModelForImageClassification, "AutoModelForMultipleChoice"),
        ("ni_set", AutoModelForImageClassification, "NeuralInterpreterForSetRegression.from_pretrained"),
        ("ni_image", AutoModelForMultipleChoice, "AutoModelForImageClassification"),
        ("ni_image", NeuralInterpreterForSetRegression, "AutoModelForImageClassification"),
        ("vit_pgm", AutoModelForImageClassification, "AutoModelForMultipleChoice"),
    ],
)
def test_a_checkpoint_of_another_head_is_refused_naming_the_class_that_reads_it(saved, kind, loader, hint):
    path = saved(kind)
    with pytest.raises(ValueError, match=rf"is a checkpoint of .*Load it with {hint}"):
        loader.from_pretrained(path)


def test_unrelated_or_partial_weights_warn_that_they_start_random(saved, tester, caplog):
    path = saved("ni_image")
    weights = load_file(path / "model.safetensors")
    partial = {name: tensor for name, tensor in weights.items() if ".scripts.1." not in name}
    save_file(partial, path / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING):
        NeuralInterpreterForImageClassification.from_pretrained(path)
    assert (
        "of the backbone's parameters are not in" in caplog.text
        and "neural_interpreter.scripts.1" in caplog.text
    )
    save_file({"other.weight": torch.ones(2)}, path / "model.safetensors", metadata={"format": "pt"})
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        NeuralInterpreterForImageClassification.from_pretrained(path)
    assert "None of the weights in" in caplog.text and "start random" in caplog.text


@pytest.mark.parametrize("damage", ["flipped header", "truncated"])
def test_a_damaged_weights_file_is_named(saved, damage):
    path = saved("ni_image")
    file = path / "model.safetensors"
    data = bytearray(file.read_bytes())
    if damage == "flipped header":
        data[:8] = b"\xff" * 8
    else:
        data = data[: len(data) // 2]
    file.write_bytes(bytes(data))
    with pytest.raises(OSError, match=rf"The weights in {file} cannot be read .*damaged or truncated"):
        AutoModelForImageClassification.from_pretrained(path)


@pytest.mark.parametrize(
    "load",
    [
        NeuralInterpreterConfig.from_pretrained,
        NeuralInterpreterForImageClassification.from_pretrained,
        ni_hf.MultiTaskViTForImageClassification.from_pretrained,
        ContextBlindForMultipleChoice.from_pretrained,
    ],
)
def test_a_missing_folder_is_said_to_be_missing(tmp_path, load):
    missing = tmp_path / "not" / "there"
    with pytest.raises(OSError, match=rf"`{missing}` is not a folder that exists"):
        load(missing)


def test_an_unknown_or_missing_model_type_reads_by_name(saved):
    path = saved("ni_image")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "nonsense"}))
    for load in (
        NeuralInterpreterConfig.from_pretrained,
        NeuralInterpreterForImageClassification.from_pretrained,
    ):
        with pytest.raises(
            ValueError,
            match=r"reads configs of model_type 'neural_interpreter', got one of model_type 'nonsense'",
        ):
            load(path)
    del config["model_type"]
    (path / "config.json").write_text(json.dumps(config))
    assert (
        type(NeuralInterpreterForImageClassification.from_pretrained(path))
        is NeuralInterpreterForImageClassification
    )


def test_a_vit_config_given_to_the_neural_interpreter_s_config_names_vit_config(tmp_path):
    ViTConfig().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"got one of model_type 'vit': read it with ViTConfig"):
        NeuralInterpreterConfig.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"got one of model_type 'vit'"):
        NeuralInterpreterForImageClassification.from_pretrained(tmp_path)


# --- images of any size and channels; fine-tuning on new labels (issue 69) ----------------------------------------


@pytest.mark.parametrize(
    "image_size, patch_size, num_channels", [(28, 4, 1), (48, 8, 3), (20, 5, 1), (12, 6, 3)]
)
def test_the_processor_and_the_model_follow_image_size_patch_size_and_channels(
    tester, image_size, patch_size, num_channels
):
    config = tester.get_config(image_size=image_size, patch_size=patch_size, num_channels=num_channels)
    processor = NeuralInterpreterImageProcessor(
        size={"height": image_size, "width": image_size}, patch_size=patch_size, num_channels=num_channels
    )
    rng = np.random.default_rng(0)
    images = [
        PIL.Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)),  # RGB, another size
        PIL.Image.fromarray(rng.integers(0, 256, (19, 19), dtype=np.uint8)),  # grayscale
        PIL.Image.fromarray(rng.integers(0, 256, (30, 30, 4), dtype=np.uint8)),  # RGBA
    ]
    batch = processor(images, return_tensors="pt")
    assert batch["pixel_values"].shape == (3, config.num_patches, config.patch_dim)
    model = NeuralInterpreterForImageClassification(config).eval()
    assert model(**batch).logits.shape == (3, config.num_labels)
    as_images = processor(images, do_patchify=False, return_tensors="pt")["pixel_values"]
    assert as_images.shape == (3, num_channels, image_size, image_size)
    torch.testing.assert_close(model(pixel_values=as_images).logits, model(**batch).logits)


def test_grayscale_is_pil_s_gray_and_rgb_images_read_the_same_as_their_gray_version():
    processor = NeuralInterpreterImageProcessor(num_channels=1)
    rgb = PIL.Image.fromarray(np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    gray = processor(rgb, return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(
        gray, processor(rgb.convert("L"), return_tensors="pt")["pixel_values"], rtol=0, atol=0
    )
    torch.testing.assert_close(
        gray, processor(np.asarray(rgb), return_tensors="pt")["pixel_values"], rtol=0, atol=0
    )
    assert processor.image_mean == [0.5] or tuple(processor.image_mean) == (0.5,)


@pytest.mark.parametrize(
    "build_bad, message",
    [
        (
            lambda: NeuralInterpreterConfig(image_size=30, patch_size=4),
            r"`patch_size` \(4\) must divide `image_size` \(30\)",
        ),
        (
            lambda: ni_hf.MultiTaskViTConfig(image_size=30, patch_size=4),
            r"`patch_size` \(4\) must divide `image_size` \(30\)",
        ),
        (
            lambda: NeuralInterpreterImageProcessor(size={"height": 30, "width": 30}, patch_size=4),
            r"patch_size=4 must divide the image size \(height=30, width=30\)",
        ),
        (
            lambda: NeuralInterpreterImageProcessor(num_channels=4),
            r"`num_channels` must be 1 \(grayscale\) or 3 \(RGB\), got 4",
        ),
        (
            lambda: NeuralInterpreterImageProcessor(num_channels=1, image_std=[0.5, 0.5, 0.5]),
            r"`image_std` must hold one value per channel \(num_channels=1\)",
        ),
        (
            lambda: NeuralInterpreterImageProcessor()(PIL.Image.new("RGB", (8, 8)), num_channels=2),
            r"`num_channels` must be 1",
        ),
    ],
)
def test_a_geometry_that_cannot_be_patched_is_refused_by_name(build_bad, message):
    with pytest.raises(ValueError, match=message):
        build_bad()


@pytest.mark.parametrize(
    "model_class", [NeuralInterpreterForImageClassification, MultiTaskViTForImageClassification]
)
def test_fine_tuning_on_a_new_label_set_gives_fresh_heads_that_train(tester, tmp_path, model_class):
    """`from_pretrained(CKPT, num_labels=N, ignore_mismatched_sizes=True)`, as for any transformers model."""
    config = (
        tester.get_config()
        if model_class is NeuralInterpreterForImageClassification
        else tester.get_vit_config()
    )
    torch.manual_seed(0)
    pretrained = model_class(config)
    pretrained.save_pretrained(tmp_path)
    model, info = AutoModelForImageClassification.from_pretrained(
        tmp_path, num_labels=3, ignore_mismatched_sizes=True, output_loading_info=True
    )
    assert type(model) is model_class and model.config.num_labels == 3 and len(model.config.id2label) == 3
    assert {key for key, *_ in info["mismatched_keys"]} == {
        "classifier.0.linear.weight",
        "classifier.0.linear.bias",
        "classifier.1.linear.weight",
        "classifier.1.linear.bias",
    }
    assert not info["missing_keys"]
    backbone = pretrained.base_model.state_dict()
    for name, tensor in model.base_model.state_dict().items():
        assert torch.equal(tensor, backbone[name]), name
    model.train()
    inputs = tester.prepare_inputs(config)
    inputs["labels"] = torch.tensor([0, 1, 2])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        optimizer.zero_grad()
        loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert model(**inputs).logits.shape == (3, 3)
    assert losses[-1] < 0.5 * losses[0], losses
