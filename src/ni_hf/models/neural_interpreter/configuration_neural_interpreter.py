"""Configuration of Neural Interpreters (Rahaman, Gondal et al., NeurIPS 2021)."""

# Annotations stay strings, so `@strict` leaves each type to the field's validator: one check of type and range,
# whose error names the setting and what it expects.
from __future__ import annotations

import math
from typing import Any

from huggingface_hub.dataclasses import as_validated_field, strict, validated_field
from transformers import PreTrainedConfig
from transformers.utils import logging

from .configuration_checks import (
    PANEL_FIELDS,
    InvalidSetting,
    MultiTaskConfigMixin,
    PanelConfigMixin,
    is_positive_int,
    named_errors,
    positive_int,
    preset_settings,
    validate_task_names,
)

logger = logging.get_logger(__name__)

# Where the learned positions of set inputs enter: once at the input, or inside every LOC (the reference's default).
POSITION_PLACEMENTS = ("input", "every_loc")

# The settings that fix the shapes of a model's parameters: a built model refuses a forward once one of these was
# edited, and its `save_pretrained` a config that no longer describes its parameters. The backbone's, those of its
# patches (when it reads images), then the heads' own.
BACKBONE_FIELDS = (
    "hidden_size",
    "code_dim",
    "num_scripts",
    "num_loc_layers",
    "num_functions",
    "num_attention_heads",
    "attention_head_size",
    "type_inference_depth",
    "type_inference_hidden_size",
    "type_dim",
    "task_names",
    "share_task_tokens",
    "use_relative_positional_bias",
)
IMAGE_FIELDS = ("image_size", "patch_size", "num_channels")
ARCHITECTURE_FIELDS = (*BACKBONE_FIELDS, *IMAGE_FIELDS, "num_labels", "num_input_variables", *PANEL_FIELDS)

# Appendix tables of the paper (digits, fuzzy Boolean, and the PGM constants with the neutral regime's selection).
PAPER_PRESETS: dict[str, dict[str, Any]] = {
    "digits": dict(
        hidden_size=192,
        code_dim=192,
        num_scripts=1,
        num_function_iterations=8,
        num_loc_layers=1,
        num_functions=5,
        num_attention_heads=4,
        attention_head_size=128,
        type_inference_depth=2,
        type_inference_hidden_size=192,
        type_dim=24,
        truncation_tau=1.4,
        freeze_signatures=True,
        freeze_codes=False,
        image_size=32,
        patch_size=4,
        num_channels=3,
        use_relative_positional_bias=True,
        task_names=["mnist", "mnistm", "svhn"],
        num_labels=10,
    ),
    "fuzzy_boolean": dict(
        hidden_size=128,
        code_dim=128,
        num_scripts=2,
        num_function_iterations=2,
        num_loc_layers=1,
        num_functions=4,
        num_attention_heads=1,
        attention_head_size=32,
        type_inference_depth=2,
        type_inference_hidden_size=128,
        type_dim=24,
        truncation_tau=1.6,
        freeze_signatures=False,
        freeze_codes=False,
        use_relative_positional_bias=False,
        num_input_variables=5,
        input_position_embedding_std=1.0,
        task_names=[f"f{i}" for i in range(20)],
        num_labels=1,
    ),
    "pgm": dict(
        hidden_size=192,
        code_dim=192,
        num_scripts=2,
        num_function_iterations=8,
        num_loc_layers=1,
        num_functions=5,
        num_attention_heads=4,
        attention_head_size=32,
        type_inference_depth=2,
        type_inference_hidden_size=192,
        type_dim=20,
        truncation_tau=1.62,
        freeze_signatures=False,
        freeze_codes=False,
        use_relative_positional_bias=False,
        num_labels=1,  # one score per candidate panel
        num_context_panels=8,
        num_choices=8,
        panel_size=80,
        panel_channels=1,
        panel_cnn_channels=32,
        panel_cnn_layers=4,
    ),
}

# The paper's selection per PGM regime (appendix "Abstract Reasoning with PGMs"), by DeepMind's regime names.
_NEUTRAL = dict(truncation_tau=1.62, type_dim=20, freeze_signatures=False)
PGM_REGIMES: dict[str, dict[str, Any]] = {
    "neutral": _NEUTRAL,
    "interpolation": dict(truncation_tau=1.62, type_dim=20, freeze_signatures=False),
    "extrapolation": dict(truncation_tau=1.42, type_dim=24, freeze_signatures=True),
    "attr.rel.pairs": dict(
        truncation_tau=1.66, type_dim=24, freeze_signatures=False
    ),  # held-out triple pairs
    "attr.rels": dict(truncation_tau=1.42, type_dim=24, freeze_signatures=True),  # held-out triples
    "attrs.pairs": dict(truncation_tau=1.40, type_dim=32, freeze_signatures=True),  # held-out attribute pairs
    # The paper leaves out the held-out shape-color and line-type regimes: they get the neutral selection.
    "attrs.shape.color": _NEUTRAL,
    "attrs.line.type": _NEUTRAL,
}
PGM_REGIMES_NOT_IN_THE_PAPER = ("attrs.shape.color", "attrs.line.type")

# Label names that `from_paper` gives a preset unless the caller sets the labels.
PRESET_ID2LABEL: dict[str, dict[int, str]] = {"digits": {i: str(i) for i in range(10)}}


# --- field validators: each refuses a bad value at construction and on assignment --------------------------


@as_validated_field
def boolean(value: Any) -> None:
    # bool(value) would read any non-empty string ("no", "false") as True.
    if not isinstance(value, bool):
        raise InvalidSetting(f"must be True or False, got {value!r}.")


@as_validated_field
def iteration_counts(value: Any) -> None:
    counts = value if isinstance(value, (list, tuple)) else [value]
    if not counts or not all(is_positive_int(count) for count in counts):
        raise InvalidSetting(
            f"must be a positive integer or a list of positive integers (one per script), got {value!r}."
        )


@as_validated_field
def position_placement(value: Any) -> None:
    if value not in POSITION_PLACEMENTS:
        raise InvalidSetting(f"must be one of {POSITION_PLACEMENTS}, got {value!r}.")


def real_field(
    default: float | None,
    *,
    greater_than: float | None = None,
    at_least: float | None = None,
    within: tuple[float, float] | None = None,
    optional: bool = False,
    why: str = "",
) -> Any:
    """A field holding a finite int or float: > `greater_than`, >= `at_least`, or in [low, high) for `within`."""
    prefix = "None or " if optional else ""

    def check(value: Any) -> None:
        if optional and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InvalidSetting(f"must be {prefix}a finite real number (int or float), got {value!r}.")
        if greater_than is not None and not value > greater_than:
            raise InvalidSetting(f"must be {prefix}> {greater_than:g}{why}, got {value!r}.")
        if at_least is not None and not value >= at_least:
            raise InvalidSetting(f"must be {prefix}>= {at_least:g}{why}, got {value!r}.")
        if within is not None and not within[0] <= value < within[1]:
            raise InvalidSetting(f"must lie in [{within[0]:g}, {within[1]:g}){why}, got {value!r}.")

    return validated_field(check, default=default)


@named_errors
@strict
class NeuralInterpreterConfig(MultiTaskConfigMixin, PanelConfigMixin, PreTrainedConfig):
    r"""Configuration of a Neural Interpreter: scripts of functions routed by type-signature matching.

    `dataclasses.fields(NeuralInterpreterConfig)` lists every setting (with `PreTrainedConfig`'s); a bad value is
    refused when the config is built and when it is assigned, naming the setting and what was expected.
    `ARCHITECTURE_FIELDS` lists those a built model cannot take edits to.

    Args:
        hidden_size: dimension d of every set element (token).
        code_dim: dimension of each function's code vector c_u.
        num_scripts: number of scripts stacked in sequence (parameters are not shared between scripts).
        num_function_iterations: function iterations per script (int, or one int per script); the
            parameters of a script are shared across its iterations.
        num_loc_layers: lines of code (LOCs) in each function's interpreter.
        num_functions: functions U per script.
        num_attention_heads: heads H of each LOC's attention.
        attention_head_size: query/key features per head (values use hidden_size / H per head).
        type_inference_depth: number of Linear layers of the type-inference MLP.
        type_inference_hidden_size: width of the type-inference MLP.
        type_dim: dimension of the type space (types t_i and signatures s_u).
        truncation_tau: truncation threshold of the kernel (Eq. 3), in [0, 2); distance d > tau gives C~ = 0.
        sigma_init: initial value of the learnable kernel bandwidth sigma.
        kernel_eps: epsilon of the compatibility normalisation (Eq. 4).
        attention_eps: epsilon of the modulated attention normalisation (Eq. 6).
        straight_through: if True, truncated kernel entries pass the gradient of the untruncated kernel.
        outer_residual: if True, add the paper's outer residual of Eq. 8 (y = x + sum_u C_u LOC_u(x)).
        freeze_signatures / freeze_codes / freeze_patch_embedding: keep those tensors fixed (they are
            then not trainable parameters).
        image_size / patch_size / num_channels: image geometry; patches are patch_size x patch_size.
        use_relative_positional_bias: per-function relative positional bias between patch tokens.
        task_names: one learned CLS token and one LayerNorm + Linear head per task (unless shared); None: one
            task, "default".
        share_task_tokens: if True, one CLS token and one head are shared by all tasks (the reference).
        default_task: index of the task used when `task_ids` is not given (e.g. by `pipeline`).
        num_input_variables: number of scalar inputs of set-regression models (fuzzy Boolean).
        input_position_embedding_std: std of the normal init of those inputs' learned positional embeddings:
            1.0, `torch.randn` as the reference's set ("entities") inputs; GPT-2, which the paper cites for
            learned positions, uses 0.02 (with it our fuzzy-Boolean type-inference row fell 0.007-0.022 short).
        input_position_embedding_placement: where those positions enter. "input" adds them once to the input
            set. "every_loc" re-adds them inside every LOC, to the stream before its LayerNorm (so the LOC's
            residual carries them on), and type inference sees the set without them: the reference's default
            for set inputs (`layerwise_positional_encoding=True`, `pre_positional_encoding=False`). Set
            inputs only: the image classifier refuses "every_loc" (its patches carry relative positions).
        num_context_panels / num_choices / panel_size / panel_channels / panel_cnn_channels / panel_cnn_layers:
            PGM puzzles and their panel CNN for `NeuralInterpreterForMultipleChoice` (see `PanelConfigMixin`).
        hidden_dropout_prob / attention_probs_dropout_prob: dropout on LOC outputs / attention weights.
        initializer_range: std of the truncated-normal init of Linear weights; None keeps PyTorch's
            default Linear init (as the reference implementation does).
        layer_norm_eps: epsilon of every LayerNorm.
    """

    model_type = "neural_interpreter"

    hidden_size: int = positive_int(default=192)
    code_dim: int = positive_int(default=192)
    num_scripts: int = positive_int(default=1)
    num_function_iterations: int | list[int] | tuple[int, ...] = iteration_counts(default=8)
    num_loc_layers: int = positive_int(default=1)
    num_functions: int = positive_int(default=5)
    num_attention_heads: int = positive_int(default=4)
    attention_head_size: int = positive_int(default=128)
    type_inference_depth: int = positive_int(default=2)
    type_inference_hidden_size: int = positive_int(default=192)
    type_dim: int = positive_int(default=24)
    truncation_tau: float = real_field(1.4, within=(0, 2), why=" (distances 1 - s.t lie in [0, 2])")
    sigma_init: float = real_field(1.0, greater_than=0)
    # Eqs. 4 and 6 divide by eps + a sum that is 0 where every weight is truncated: eps = 0 gives 0/0 = NaN.
    kernel_eps: float = real_field(1e-6, greater_than=0)
    attention_eps: float = real_field(1e-6, greater_than=0)
    straight_through: bool = boolean(default=False)
    outer_residual: bool = boolean(default=False)
    freeze_signatures: bool = boolean(default=True)
    freeze_codes: bool = boolean(default=False)
    freeze_patch_embedding: bool = boolean(default=False)
    image_size: int = positive_int(default=32)
    patch_size: int = positive_int(default=4)
    num_channels: int = positive_int(default=3)
    use_relative_positional_bias: bool = boolean(default=True)
    share_task_tokens: bool = boolean(default=False)
    num_input_variables: int = positive_int(default=5)
    input_position_embedding_std: float = real_field(1.0, at_least=0)
    input_position_embedding_placement: str = position_placement(default="input")
    hidden_dropout_prob: float = real_field(0.0, within=(0, 1))
    attention_probs_dropout_prob: float = real_field(0.0, within=(0, 1))
    initializer_range: float | None = real_field(None, greater_than=0, optional=True)
    # LayerNorm divides by sqrt(var + eps): NaN wherever var < -eps, and 1/0 on constant inputs at eps = 0.
    layer_norm_eps: float = real_field(1e-5, greater_than=0)

    @classmethod
    def from_paper(cls, name: str, regime: str | None = None, **overrides: Any) -> NeuralInterpreterConfig:
        """Config of a preset of the paper's appendix tables: "digits", "fuzzy_boolean" or "pgm".

        `regime` (the "pgm" preset only, "neutral" when not given) picks that PGM regime's tau, type_dim and
        frozen signatures, by DeepMind's names (`PGM_REGIMES`); "attrs.shape.color" and "attrs.line.type", which
        the paper leaves out, get the neutral regime's.
        """
        if name not in PAPER_PRESETS:
            raise ValueError(f"Unknown preset {name!r}; expected one of {sorted(PAPER_PRESETS)}.")
        preset = dict(PAPER_PRESETS[name])
        if name == "pgm":
            regime = "neutral" if regime is None else regime
            if regime not in PGM_REGIMES:
                raise ValueError(f"Unknown PGM regime {regime!r}; expected one of {list(PGM_REGIMES)}.")
            if regime in PGM_REGIMES_NOT_IN_THE_PAPER:
                logger.warning(
                    f"The paper selects no hyper-parameters for the PGM regime {regime!r}; using the neutral "
                    f"regime's ({PGM_REGIMES[regime]})."
                )
            preset.update(PGM_REGIMES[regime])
        elif regime is not None:
            raise ValueError(
                f"`regime` applies to the 'pgm' preset only, got regime={regime!r} for {name!r}."
            )
        return cls(**preset_settings(preset, PRESET_ID2LABEL.get(name), overrides))

    # --- derived sizes -------------------------------------------------------------------------

    @property
    def iterations_per_script(self) -> list[int]:
        """Function iterations of each script."""
        n = self.num_function_iterations
        return [int(n)] * self.num_scripts if isinstance(n, int) else [int(k) for k in n]

    @property
    def num_task_tokens(self) -> int:
        """CLS tokens prepended to every sample (one per task, whatever the sample's own task)."""
        return self.num_tasks

    # --- class validators: rules across settings, run at construction and by `validate()` ------------------

    def validate_function_iterations(self) -> None:
        n = self.num_function_iterations
        if isinstance(n, (list, tuple)) and (
            len(n) != self.num_scripts or not all(is_positive_int(k) for k in n)
        ):
            raise ValueError(
                "`num_function_iterations` must be one positive integer for all scripts or a list of one per "
                f"script (num_scripts={self.num_scripts}), got {n!r}."
            )


def vit_baseline_config(**overrides: Any):
    """The paper's digits ViT baseline as a plain `transformers.ViTConfig` (1.81M parameters with its head)."""
    from transformers import ViTConfig

    settings = dict(
        image_size=32,
        patch_size=4,
        num_channels=3,
        hidden_size=192,
        num_hidden_layers=8,
        num_attention_heads=3,
        intermediate_size=192,
        num_labels=10,
    )
    return ViTConfig(**{**settings, **overrides})


__all__ = [
    "ARCHITECTURE_FIELDS",
    "BACKBONE_FIELDS",
    "IMAGE_FIELDS",
    "NeuralInterpreterConfig",
    "PAPER_PRESETS",
    "PGM_REGIMES",
    "validate_task_names",
    "vit_baseline_config",
]
