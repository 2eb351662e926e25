"""Configuration of Neural Interpreters (Rahaman, Gondal et al., NeurIPS 2021)."""

from __future__ import annotations

import contextvars
import dataclasses
import difflib
import functools
import inspect
import math
from collections.abc import Iterable
from typing import Any

from transformers import PretrainedConfig
from transformers.utils import logging

logger = logging.get_logger(__name__)

# Where the learned positions of set inputs enter: once at the input, or inside every LOC (the reference's default).
POSITION_PLACEMENTS = ("input", "every_loc")

# Settings that must be real numbers (int or float, not bool), and those that must be bools.
FLOAT_SETTINGS = (
    "truncation_tau",
    "sigma_init",
    "kernel_eps",
    "attention_eps",
    "input_position_embedding_std",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "layer_norm_eps",
)
BOOL_SETTINGS = (
    "straight_through",
    "outer_residual",
    "freeze_signatures",
    "freeze_codes",
    "freeze_patch_embedding",
    "use_relative_positional_bias",
    "share_task_tokens",
)

# Appendix tables of the paper, as settled in SPEC.md.
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
        type_dim=24,
        truncation_tau=1.5,
        freeze_signatures=False,
        freeze_codes=False,
        use_relative_positional_bias=False,
    ),
}


# Keys a config.json written by transformers (4.x or 5.x) may hold besides the dataclass fields of
# `PretrainedConfig`: what its `__post_init__` pops or sets, what `to_dict` adds, and the common attributes that
# transformers 4 saved in every config. Generation settings are added from `GenerationConfig` below.
PRETRAINED_CONFIG_KEYS = frozenset(
    {
        "model_type",
        "auto_map",
        "custom_pipelines",
        "quantization_config",
        "torch_dtype",
        "num_labels",
        "name_or_path",
        "output_attentions",
        "attn_implementation",
        "experts_implementation",
        "per_layer_config",
        "tie_last_hidden_states",
        "rope_scaling",
        "rope_theta",
        "rope_parameters",
        "use_return_dict",
        "torchscript",
        "use_bfloat16",
        "tf_legacy_loss",
        "pruned_heads",
        "tie_word_embeddings",
        "is_decoder",
        "cross_attention_hidden_size",
        "add_cross_attention",
        "tie_encoder_decoder",
        "finetuning_task",
        "tokenizer_class",
        "prefix",
        "bos_token_id",
        "pad_token_id",
        "eos_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "task_specific_params",
    }
)


@functools.cache
def _pretrained_config_keys() -> frozenset[str]:
    """Every key `PretrainedConfig` accepts: its fields, PRETRAINED_CONFIG_KEYS and the generation settings."""
    keys = set(PRETRAINED_CONFIG_KEYS) | {field.name for field in dataclasses.fields(PretrainedConfig)}
    try:
        from transformers import GenerationConfig

        # Old config.json files hold generation settings, which PretrainedConfig drops.
        keys |= set(GenerationConfig._get_default_generation_params())
    except (ImportError, AttributeError):  # a private helper, absent from some transformers versions
        pass
    return frozenset(keys)


def check_num_labels(num_labels: Any) -> None:
    """Refuse a `num_labels` given as anything but a positive integer (None: not given)."""
    if num_labels is not None and not _is_positive_int(num_labels):
        raise ValueError(
            f"`num_labels` must be a positive integer (one logit per class, 1 for regression), got {num_labels!r}."
        )


def init_settings(config_class: type) -> set[str]:
    """The named keyword arguments of a config class's `__init__`."""
    parameters = inspect.signature(config_class.__init__).parameters.values()
    return {p.name for p in parameters if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD}


# True while `from_dict` builds a config: a config.json may hold attributes set on a config at run time (as
# transformers' own tests do), so unknown keys read from a file are warned about, not refused.
_LOADING: contextvars.ContextVar[bool] = contextvars.ContextVar("ni_hf_loading_config", default=False)


def check_config_keys(config_class: type, own_keys: Iterable[str], kwargs: Iterable[str]) -> None:
    """Refuse keyword arguments that are neither the config's own settings nor `PretrainedConfig`'s.

    Keys starting with "_" (transformers' private state) pass; a misspelt key is named with the closest setting.
    While `from_dict` loads a file, an unknown key is a warning instead.
    """
    own = set(own_keys)
    known = own | _pretrained_config_keys()
    unknown = [key for key in kwargs if not key.startswith("_") and key not in known]
    if not unknown:
        return
    closest = {key: difflib.get_close_matches(key, sorted(known), n=1) for key in unknown}
    named = ", ".join(
        f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key) for key, close in closest.items()
    )
    listed = (
        "" if all(closest.values()) else f" Its own settings are {sorted(own)}, besides PretrainedConfig's."
    )
    message = f"{config_class.__name__} got unknown setting(s) {named}.{listed}"
    if _LOADING.get():
        logger.warning(f"{message} Kept as attributes; the model does not read them.")
        return
    raise TypeError(message)


# Label names that `from_paper` gives a preset unless the caller sets the labels (kept out of PAPER_PRESETS,
# where they would override a caller's `num_labels`).
PRESET_ID2LABEL: dict[str, dict[int, str]] = {"digits": {i: str(i) for i in range(10)}}


def validate_task_names(task_names: Any) -> list[str]:
    """A new list of the task names; a ValueError unless they are a non-empty sequence of distinct names."""
    # A string is iterable: list("mnist") would silently make five one-letter tasks.
    if isinstance(task_names, (str, bytes)):
        raise ValueError(f"`task_names` must be a list of names, got the string {task_names!r}.")
    # A task's index is its id: a set's order changes from one process to the next.
    if isinstance(task_names, (set, frozenset)):
        raise ValueError(f"`task_names` must be an ordered list of names, got the set {task_names!r}.")
    try:
        names = list(task_names)
    except TypeError:
        raise ValueError(f"`task_names` must be a list of names, got {task_names!r}.") from None
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"`task_names` must hold non-empty strings, got {name!r} in {names!r}.")
    if not names:
        raise ValueError("`task_names` must name at least one task, got an empty list.")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"`task_names` must be distinct, got {repeated} more than once in {names!r}.")
    return [str(name) for name in names]


def _is_real(value: Any) -> bool:
    """Whether `value` is a finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _preset_settings(
    presets: dict[str, dict[str, Any]],
    labels: dict[str, dict[int, str]],
    name: str,
    overrides: dict[str, Any],
) -> dict[str, Any]:
    """A preset's settings with the caller's overrides, and its label names unless the caller sets labels."""
    settings = {**presets[name], **overrides}
    if "id2label" in overrides and "num_labels" not in overrides:
        # The caller's id2label sets the number of labels; the preset's num_labels would conflict with it.
        settings.pop("num_labels", None)
    id2label = labels.get(name)
    if (
        id2label is not None
        and not {"id2label", "label2id"} & overrides.keys()
        and settings.get("num_labels") == len(id2label)
    ):
        settings["id2label"] = dict(id2label)
        settings["label2id"] = {label: i for i, label in id2label.items()}
    return settings


class NeuralInterpreterConfig(PretrainedConfig):
    r"""Configuration of a Neural Interpreter: scripts of functions routed by type-signature matching.

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
        truncation_tau: truncation threshold of the kernel, in [0, 2); distance d > tau gives C~ = 0.
        sigma_init: initial value of the learnable kernel bandwidth sigma.
        kernel_eps: epsilon of the compatibility normalisation (Eq. 4).
        attention_eps: epsilon of the modulated attention normalisation (Eq. 6).
        straight_through: if True, truncated kernel entries pass the gradient of the untruncated kernel.
        outer_residual: if True, add the paper's outer residual of Eq. 8 (y = x + sum_u C_u LOC_u(x)).
        freeze_signatures / freeze_codes / freeze_patch_embedding: keep those tensors fixed (they are
            then not trainable parameters).
        image_size / patch_size / num_channels: image geometry; patches are patch_size x patch_size.
        use_relative_positional_bias: per-function relative positional bias between patch tokens.
        task_names: one learned CLS token and one LayerNorm + Linear head per task (unless shared).
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
        hidden_dropout_prob / attention_probs_dropout_prob: dropout on LOC outputs / attention weights.
        initializer_range: std of the truncated-normal init of Linear weights; None keeps PyTorch's
            default Linear init (as the reference implementation does).
        layer_norm_eps: epsilon of every LayerNorm.
    """

    model_type = "neural_interpreter"

    def __init__(
        self,
        hidden_size: int = 192,
        code_dim: int = 192,
        num_scripts: int = 1,
        num_function_iterations: int | list[int] = 8,
        num_loc_layers: int = 1,
        num_functions: int = 5,
        num_attention_heads: int = 4,
        attention_head_size: int = 128,
        type_inference_depth: int = 2,
        type_inference_hidden_size: int = 192,
        type_dim: int = 24,
        truncation_tau: float = 1.4,
        sigma_init: float = 1.0,
        kernel_eps: float = 1e-6,
        attention_eps: float = 1e-6,
        straight_through: bool = False,
        outer_residual: bool = False,
        freeze_signatures: bool = True,
        freeze_codes: bool = False,
        freeze_patch_embedding: bool = False,
        image_size: int = 32,
        patch_size: int = 4,
        num_channels: int = 3,
        use_relative_positional_bias: bool = True,
        task_names: list[str] | None = None,
        share_task_tokens: bool = False,
        default_task: int = 0,
        num_input_variables: int = 5,
        input_position_embedding_std: float = 1.0,
        input_position_embedding_placement: str = "input",
        hidden_dropout_prob: float = 0.0,
        attention_probs_dropout_prob: float = 0.0,
        initializer_range: float | None = None,
        layer_norm_eps: float = 1e-5,
        **kwargs: Any,
    ) -> None:
        self.hidden_size = hidden_size
        self.code_dim = code_dim
        self.num_scripts = num_scripts
        self.num_function_iterations = num_function_iterations
        self.num_loc_layers = num_loc_layers
        self.num_functions = num_functions
        self.num_attention_heads = num_attention_heads
        self.attention_head_size = attention_head_size
        self.type_inference_depth = type_inference_depth
        self.type_inference_hidden_size = type_inference_hidden_size
        self.type_dim = type_dim
        self.truncation_tau = truncation_tau
        self.sigma_init = sigma_init
        self.kernel_eps = kernel_eps
        self.attention_eps = attention_eps
        self.straight_through = straight_through
        self.outer_residual = outer_residual
        self.freeze_signatures = freeze_signatures
        self.freeze_codes = freeze_codes
        self.freeze_patch_embedding = freeze_patch_embedding
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_channels = num_channels
        self.use_relative_positional_bias = use_relative_positional_bias
        self.task_names = validate_task_names(task_names) if task_names is not None else ["default"]
        self.share_task_tokens = share_task_tokens
        self.default_task = default_task
        self.num_input_variables = num_input_variables
        self.input_position_embedding_std = input_position_embedding_std
        self.input_position_embedding_placement = input_position_embedding_placement
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        check_config_keys(type(self), init_settings(type(self)), kwargs)
        check_num_labels(kwargs.get("num_labels"))
        super().__init__(**kwargs)
        self.validate_neural_interpreter()

    @classmethod
    def from_paper(cls, name: str, **overrides: Any) -> NeuralInterpreterConfig:
        """Config of a preset of the paper's appendix tables: "digits", "fuzzy_boolean" or "pgm"."""
        if name not in PAPER_PRESETS:
            raise ValueError(f"Unknown preset {name!r}; expected one of {sorted(PAPER_PRESETS)}.")
        return cls(**_preset_settings(PAPER_PRESETS, PRESET_ID2LABEL, name, overrides))

    @classmethod
    def from_dict(
        cls, config_dict: dict[str, Any], **kwargs: Any
    ) -> NeuralInterpreterConfig | tuple[NeuralInterpreterConfig, dict[str, Any]]:
        """As `PretrainedConfig.from_dict` (unknown keys warned about), validated again after the kwargs are set."""
        loading = _LOADING.set(True)
        try:
            result = super().from_dict(config_dict, **kwargs)
        finally:
            _LOADING.reset(loading)
        config = result[0] if isinstance(result, tuple) else result
        if config.task_names is None:
            config.task_names = ["default"]
        else:
            config.task_names = validate_task_names(config.task_names)
        config.validate_neural_interpreter()
        return result

    # --- derived sizes -------------------------------------------------------------------------

    @property
    def iterations_per_script(self) -> list[int]:
        """Function iterations of each script."""
        n = self.num_function_iterations
        return [int(n)] * self.num_scripts if isinstance(n, int) else [int(k) for k in n]

    @property
    def num_tasks(self) -> int:
        return len(self.task_names)

    @property
    def num_task_tokens(self) -> int:
        """CLS tokens prepended to every sample (one per task, whatever the sample's own task)."""
        return self.num_tasks

    @property
    def grid_size(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid_size**2

    @property
    def patch_dim(self) -> int:
        return self.patch_size * self.patch_size * self.num_channels

    def validate(self) -> None:
        """transformers' checks, then ours: run by `save_pretrained`, and by the models on a config changed in place."""
        if hasattr(super(), "validate"):
            super().validate()
        self.validate_neural_interpreter()

    def validate_neural_interpreter(self) -> None:
        """Raise a ValueError naming what was expected for any inconsistent hyperparameter."""
        positive = [
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
            "image_size",
            "patch_size",
            "num_channels",
            "num_input_variables",
        ]
        for name in positive:
            value = getattr(self, name)
            if not _is_positive_int(value):
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        for name in FLOAT_SETTINGS:
            value = getattr(self, name)
            if not _is_real(value):
                raise ValueError(f"`{name}` must be a finite real number (int or float), got {value!r}.")
        if self.initializer_range is not None and not _is_real(self.initializer_range):
            raise ValueError(
                "`initializer_range` must be None or a finite real number (int or float), got "
                f"{self.initializer_range!r}."
            )
        for name in BOOL_SETTINGS:
            value = getattr(self, name)
            # bool(value) would read any non-empty string ("no", "false") as True.
            if not isinstance(value, bool):
                raise ValueError(f"`{name}` must be True or False, got {value!r}.")
        n = self.num_function_iterations
        if isinstance(n, int) and not isinstance(n, bool):
            if n < 1:
                raise ValueError(f"`num_function_iterations` must be >= 1, got {n}.")
        elif not (
            isinstance(n, (list, tuple))
            and len(n) == self.num_scripts
            and all(_is_positive_int(k) for k in n)
        ):
            raise ValueError(
                "`num_function_iterations` must be a positive int or a list of one positive int per script "
                f"(num_scripts={self.num_scripts}), got {n!r}."
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"`hidden_size` ({self.hidden_size}) must be divisible by `num_attention_heads` "
                f"({self.num_attention_heads}): values use hidden_size / heads features per head."
            )
        if not 0.0 <= self.truncation_tau < 2.0:
            raise ValueError(
                f"`truncation_tau` must lie in [0, 2) (distances 1 - s.t lie in [0, 2]), got {self.truncation_tau}."
            )
        if self.sigma_init <= 0:
            raise ValueError(f"`sigma_init` must be > 0, got {self.sigma_init}.")
        # Eqs. 4 and 6 divide by eps + a sum that is 0 where every weight is truncated: eps = 0 gives 0/0 = NaN.
        for name in ("kernel_eps", "attention_eps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"`{name}` must be > 0, got {getattr(self, name)!r}.")
        if self.input_position_embedding_std < 0:
            raise ValueError(
                f"`input_position_embedding_std` must be >= 0, got {self.input_position_embedding_std!r}."
            )
        # `num_labels = n` sets id2label; n <= 0 leaves it empty, and the heads would give empty logits.
        if not self.id2label:
            raise ValueError(
                "`num_labels` must be a positive integer (one logit per class, 1 for regression), got "
                f"{self.num_labels!r} (id2label={self.id2label!r})."
            )
        # LayerNorm divides by sqrt(var + eps): NaN wherever var < -eps, and 1/0 on constant inputs at eps = 0.
        if self.layer_norm_eps <= 0:
            raise ValueError(f"`layer_norm_eps` must be > 0, got {self.layer_norm_eps!r}.")
        if self.initializer_range is not None and self.initializer_range <= 0:
            raise ValueError(f"`initializer_range` must be None or > 0, got {self.initializer_range!r}.")
        if self.input_position_embedding_placement not in POSITION_PLACEMENTS:
            raise ValueError(
                f"`input_position_embedding_placement` must be one of {POSITION_PLACEMENTS}, got "
                f"{self.input_position_embedding_placement!r}."
            )
        if self.image_size % self.patch_size:
            raise ValueError(
                f"`patch_size` ({self.patch_size}) must divide `image_size` ({self.image_size})."
            )
        validate_task_names(self.task_names)
        if not isinstance(self.default_task, int) or isinstance(self.default_task, bool):
            raise ValueError(
                f"`default_task` must be an integer index of `task_names`, got {self.default_task!r}."
            )
        if not 0 <= self.default_task < len(self.task_names):
            raise ValueError(
                f"`default_task` must index `task_names` (0..{len(self.task_names) - 1}), got {self.default_task}."
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"`{name}` must lie in [0, 1), got {getattr(self, name)}.")


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


__all__ = ["NeuralInterpreterConfig", "PAPER_PRESETS", "validate_task_names", "vit_baseline_config"]
