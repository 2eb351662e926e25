"""Checks of the models' inputs, outputs, settings and checkpoints: errors that name what was expected.

Every model folder holds a copy of this file (marked "Copied from", checked by tests/test_model_copies.py), which its
checkpoints copy next to the modeling file, so their code runs without `ni_hf`.
"""

from __future__ import annotations

import copy
import numbers
import os
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedConfig
from transformers.utils import logging

from .configuration_checks import check_checkpoint_path

logger = logging.get_logger(__name__)


def check_not_empty(batch_size: int) -> None:
    if batch_size == 0:
        raise ValueError("Got an empty batch (0 samples); pass at least one image or set.")


def check_tensor(name: str, values: Any, expected: str, device: torch.device | None = None) -> None:
    """Refuse anything but a floating-point tensor (a cast would run raw uint8 pixels as garbage), and a tensor
    without values (on the meta device) given to a model that has values (on `device`)."""
    if not isinstance(values, torch.Tensor):
        raise ValueError(
            f"`{name}` must be a torch.Tensor ({expected}), got {type(values).__name__}; convert it with "
            "torch.as_tensor, or pass images through the image processor with return_tensors='pt'."
        )
    if not values.is_floating_point():
        raise ValueError(f"`{name}` must be a floating-point tensor ({expected}), got dtype {values.dtype}.")
    if values.is_meta and device is not None and device.type != "meta":
        raise ValueError(
            f"`{name}` is on the meta device (a shape without values) and the model on {device.type}: pass "
            f"a tensor with values ({expected}), on the model's device."
        )


def check_forward(
    module: nn.Module,
    inputs: dict[str, torch.Tensor | None],
    outputs: dict[str, torch.Tensor],
    routing_peak: torch.Tensor | None = None,
) -> None:
    """Raise, naming the tensor, on NaN or inf in an input or output; warn once when no function accepts any token.

    One host sync for all of it; skipped while compiling or tracing.
    """
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return
    checked = {
        name: t
        for name, t in {**inputs, **outputs}.items()
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    }
    device = next(iter(outputs.values())).device
    if device.type == "meta":  # shapes only (e.g. under accelerate's init_empty_weights): no values to check
        return
    flags = [torch.isfinite(t).all().to(device) for t in checked.values()]
    if routing_peak is not None:
        flags.append(routing_peak.to(device) > 0)
    if bool(torch.stack(flags).all()):
        return
    if routing_peak is not None and not bool(routing_peak > 0):
        logger.warning_once(
            "No function accepted any token in this forward pass (every compatibility C is 0): the model's output "
            "ignores its input. truncation_tau or sigma is too small for these types; raise them, or check that "
            "no function is disabled by mistake."
        )
    for name in inputs:
        if name in checked and not bool(torch.isfinite(checked[name]).all()):
            raise ValueError(f"`{name}` contains NaN or infinite values: expected finite numbers.")
    broken_outputs = [n for n in outputs if not bool(torch.isfinite(checked[n]).all())]
    if not broken_outputs:
        return
    broken = [n for n, p in module.named_parameters() if not bool(torch.isfinite(p).all())]
    if broken:
        cause = (
            f"the parameters {broken[:3]}{' ...' if len(broken) > 3 else ''} are already NaN or inf (a diverged "
            "training run: lower the learning rate, or reload a checkpoint)"
        )
    else:
        magnitudes = [float(t.abs().max()) for n, t in checked.items() if n in inputs and t.numel()]
        largest = f" (largest magnitude {max(magnitudes):.3g})" if magnitudes else ""
        cause = (
            f"the inputs{largest} overflow {next(module.parameters()).dtype} inside the network: normalize them "
            "(NeuralInterpreterImageProcessor does) or use a wider dtype"
        )
    raise FloatingPointError(
        f"The forward pass produced NaN or infinite values in `{broken_outputs[0]}`: {cause}."
    )


def index_list(values: Any, name: str) -> list[int]:
    """Integers from a list, tuple, array or tensor of them; a ValueError naming `name` for anything else."""
    if isinstance(values, torch.Tensor) or hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, int) and not isinstance(values, bool):
        return [values]
    if not isinstance(values, (list, tuple)) or any(
        not isinstance(v, numbers.Integral) or isinstance(v, bool) for v in values
    ):
        raise ValueError(
            f"`{name}` must be integers (a list, tuple, array or tensor of them), got {values!r}."
        )
    return [int(v) for v in values]


def resolve_task_ids(task_ids: Any, config: Any, batch_size: int, device: torch.device) -> torch.Tensor:
    """(B,) long task ids; `config.default_task` when not given (e.g. under `pipeline`)."""
    if task_ids is None:
        if not 0 <= config.default_task < config.num_tasks:
            raise ValueError(
                f"`config.default_task` is {config.default_task}, the task of samples given no `task_ids`, but the "
                f"model has {config.num_tasks} tasks {config.task_names}: set it to an index 0..{config.num_tasks - 1}."
            )
        return torch.full((batch_size,), config.default_task, dtype=torch.long, device=device)
    task_ids = torch.as_tensor(task_ids, device=device)
    if task_ids.is_floating_point() or task_ids.is_complex() or task_ids.dtype == torch.bool:
        raise ValueError(f"`task_ids` must be integer task indices, got {task_ids.dtype} values.")
    if task_ids.dim() > 1 or (task_ids.dim() == 1 and task_ids.shape[0] not in (1, batch_size)):
        raise ValueError(
            f"`task_ids` must be one task index, or a 1-D tensor with one per sample ({batch_size}), got shape "
            f"{tuple(task_ids.shape)}."
        )
    task_ids = task_ids.long().reshape(-1).expand(batch_size)
    # One host sync in eager execution; none when compiling (a data-dependent branch would break the graph).
    if (
        not task_ids.is_meta
        and not torch.compiler.is_compiling()
        and bool(((task_ids < 0) | (task_ids >= config.num_tasks)).any())
    ):
        raise ValueError(
            f"`task_ids` must lie in 0..{config.num_tasks - 1} (tasks {config.task_names}), got {task_ids.tolist()}."
        )
    return task_ids


# ----------------------------------------------------------------------------------------------------------
# A config edited after the model was built
# ----------------------------------------------------------------------------------------------------------


class BuiltSettingsMixin:
    """Refuses, at forward, a config whose settings that fix parameter shapes changed after the model was built.

    The forward would ignore such an edit, or fail on it far from its cause. Each model lists its own settings in
    `fixed_settings` (a head lists the head's, its backbone the backbone's); they are recorded when the model is
    built, and again by the methods that change a setting together with the parameters (`record_built_settings`).
    """

    config: Any

    def fixed_settings(self) -> tuple[str, ...]:
        return ()

    def post_init(self) -> None:
        super().post_init()
        self.record_built_settings()

    def record_built_settings(self) -> None:
        self._built_settings = {
            name: copy.deepcopy(getattr(self.config, name)) for name in self.fixed_settings()
        }

    def check_built_settings(self) -> None:
        """Refuse a setting of this model or of its backbone changed since it was built (attribute reads only)."""
        models = (self,) if self.base_model is self else (self.base_model, self)
        for model in models:
            for name, built in getattr(model, "_built_settings", {}).items():
                now = getattr(self.config, name)
                if now != built:
                    raise ValueError(
                        f"`config.{name}` is {now!r}, but this {type(self).__name__} was built with {name}={built!r}: "
                        "its parameters follow the setting it was built with, and a forward cannot follow the edit. "
                        "Build a new model from the edited config, or change tasks, labels and functions with the "
                        "model's reset_tasks / add_tasks / add_functions, which change the parameters too."
                    )


# ----------------------------------------------------------------------------------------------------------
# Loading checkpoints
# ----------------------------------------------------------------------------------------------------------

# Arguments of `from_pretrained` that say where its config.json is.
_HUB_ARGUMENTS = (
    "cache_dir",
    "force_download",
    "proxies",
    "local_files_only",
    "token",
    "revision",
    "subfolder",
)


def saved_architectures(path: Any, kwargs: dict[str, Any]) -> list[str]:
    """The model classes a checkpoint's config.json names (`architectures`); none where it cannot be read."""
    config = kwargs.get("config")
    if isinstance(config, PreTrainedConfig):
        return list(config.architectures or [])
    if isinstance(config, (str, os.PathLike)):
        path = config
    try:
        config_dict, _ = PreTrainedConfig.get_config_dict(
            path, **{key: kwargs[key] for key in _HUB_ARGUMENTS if key in kwargs}
        )
    except (OSError, ValueError):  # from_pretrained reports a missing or broken config.json itself
        return []
    return list(config_dict.get("architectures") or [])


def weight_files(path: Any, subfolder: str = "") -> str:
    """The safetensors files of a local checkpoint folder, for an error message; the path itself otherwise."""
    folder = os.path.join(os.fspath(path), subfolder) if isinstance(path, (str, os.PathLike)) else None
    if folder is None or not os.path.isdir(folder):
        return str(path)
    files = sorted(name for name in os.listdir(folder) if name.endswith(".safetensors"))
    return ", ".join(os.path.join(folder, name) for name in files) or folder


class CheckedLoadingMixin:
    """`from_pretrained` that names the file or folder it cannot read, refuses a checkpoint of another of the
    package's heads (its own parts would start random), and warns when none of the weights belongs to the model
    or part of its backbone is missing from the checkpoint.

    `head_classes` maps each head of the model family to the Auto class that loads it; `set_input_heads` lists the
    heads whose backbone reads sets (built without a patch embedding).
    """

    head_classes: dict[str, str | None] = {}
    set_input_heads: tuple[str, ...] = ()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> Any:
        from safetensors import SafetensorError

        check_checkpoint_path(pretrained_model_name_or_path)
        architectures = saved_architectures(pretrained_model_name_or_path, kwargs)
        cls.check_checkpoint_architecture(pretrained_model_name_or_path, architectures, kwargs)
        wants_info = kwargs.pop("output_loading_info", False)
        try:
            model, info = super().from_pretrained(
                pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs
            )
        except SafetensorError as error:
            files = weight_files(pretrained_model_name_or_path, kwargs.get("subfolder", ""))
            raise OSError(
                f"The weights in {files} cannot be read ({error}): the file is damaged or truncated; save or "
                "download the checkpoint again."
            ) from error
        model.check_loaded_weights(pretrained_model_name_or_path, info)
        return (model, info) if wants_info else model

    @classmethod
    def check_checkpoint_architecture(
        cls, path: Any, architectures: list[str], kwargs: dict[str, Any]
    ) -> None:
        """Refuse another head's checkpoint; build a backbone that reads sets for a checkpoint whose backbone does."""
        others = [name for name in architectures if name in cls.head_classes and name != cls.__name__]
        if not others:
            return
        if cls.__name__ in cls.head_classes:
            auto_class = cls.head_classes[others[0]]
            how = f"{auto_class}.from_pretrained, or {others[0]}" if auto_class else others[0]
            raise ValueError(
                f"{os.fspath(path)} is a checkpoint of {others[0]}: loaded as {cls.__name__}, only its backbone "
                f"would load and this head's own layers would start random. Load it with {how}.from_pretrained."
            )
        if others[0] in cls.set_input_heads and "add_patch_embedding" not in kwargs:
            kwargs["add_patch_embedding"] = False
            logger.warning(
                f"{os.fspath(path)} is a checkpoint of {others[0]}, whose backbone reads sets: {cls.__name__} is "
                f"built without a patch embedding (pass inputs_embeds). The checkpoint's input layers belong to "
                f"{others[0]}: load that class to read its inputs."
            )

    def check_loaded_weights(self, path: Any, info: dict[str, Any]) -> None:
        """Warn when none of the weights belongs to the model, or part of its backbone is missing: it starts random.

        A warning, as transformers gives, not a refusal: a fresh model from unrelated weights is what its own
        tests ask for; the example scripts refuse such checkpoints (`--allow_mismatched_weights`).
        """
        names = [name for name, _ in self.named_parameters()]
        missing = set(info.get("missing_keys") or ())
        where = os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path)
        if names and missing.issuperset(names):
            logger.warning(
                f"None of the weights in {where} belong to {type(self).__name__}: all of its {len(names)} parameters "
                f"start random (the checkpoint holds other weights, e.g. {sorted(info.get('unexpected_keys') or ())[:3]})."
                " Load it with the class that saved it, or train this model from scratch."
            )
            return
        prefix = f"{self.base_model_prefix}."
        in_backbone = sorted(name for name in missing if name.startswith(prefix) or self.base_model is self)
        if in_backbone:
            logger.warning(
                f"{len(in_backbone)} of the backbone's parameters are not in {where} and start random "
                f"({', '.join(in_backbone[:4])}{' ...' if len(in_backbone) > 4 else ''}): the checkpoint is not "
                f"a complete {type(self).__name__}; train it, or load a checkpoint of this model."
            )
