"""PyTorch Neural Interpreters ("Dynamic Inference with Neural Interpreters", Rahaman, Gondal et al., 2021).

Reading order follows the data: ModLin and ModMLP (Eq. 5), the relative positional bias, Eq. 6 (the literal
`eager_attention` and `sdpa_attention`), a line of code (Eqs. 5-7), type inference (Eq. 2), a script (Eqs. 3, 4
and 8: `forward` is one function iteration, `run` its function iterations), then the models and heads.

Every function u of a script runs on every token, so the U function streams live in one tensor (U, B, N, d), and
what depends on a function alone (its code-modulated weights, its positional bias) is computed from the U codes
once per forward, never per token. Which implementation runs a line of code is the model's `attn_implementation`,
looked up once per forward in `ALL_LINE_OF_CODE_FUNCTIONS`: "eager" and "sdpa" live here, faster ones register there
from outside this file (`ni_hf.kernels`), so a checkpoint's copied code runs without them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypedDict, Unpack

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.dynamic_module_utils import custom_object_save
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    ImageClassifierOutput,
    ModelOutput,
    MultipleChoiceModelOutput,
)
from transformers.utils import logging
from transformers.utils.generic import GeneralInterface, can_return_tuple

from .configuration_checks import PANEL_FIELDS
from .configuration_neural_interpreter import (
    BACKBONE_FIELDS,
    IMAGE_FIELDS,
    NeuralInterpreterConfig,
    validate_task_names,
)
from .image_processing_neural_interpreter import patchify
from .modeling_checks import (
    BuiltSettingsMixin,
    CheckedLoadingMixin,
    check_forward,
    check_not_empty,
    check_tensor,
    index_list,
)
from .panel_embedding import PanelEmbedding, init_panel_embedding
from .task_heads import TaskHead, TaskHeadsMixin, multiple_choice_loss

logger = logging.get_logger(__name__)

# The per-function weights of one LOC's ModLins, by name ("query", "key", "value", "output", "fc1", "fc2").
FunctionWeights = dict[str, torch.Tensor]


@dataclass
class RoutingOutput:
    """The routing fields of every model's output (`output_routing=True`), in order of function iteration.

    Args:
        compatibilities: C of every (script, function iteration), each (B, U, N): sample b's token i's weight for
            function u.
        types: the types t of every (script, function iteration), each (B, N, d_type).
    """

    compatibilities: tuple[torch.FloatTensor, ...] | None = None
    types: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class NeuralInterpreterModelOutput(RoutingOutput, BaseModelOutputWithPooling):
    """Output of the backbone.

    Args:
        last_hidden_state: (B, N, d) the set after the last function iteration (task tokens first).
        pooler_output: (B, T, d) the outputs of the T task (CLS) tokens.
        hidden_states: the set before the first and after every function iteration, each (B, N, d).
        attentions: Eq. 6's attention weights W of every (script, function iteration, LOC) in order, each
            (B, U, H, N, N): function u's weight of token j for token i at head h, before attention dropout.
        compatibilities, types: as in `RoutingOutput`.
        routing_peak: () the largest C of the forward, 0 when no function accepted any token (None while compiling).
    """

    routing_peak: torch.FloatTensor | None = None


@dataclass
class NeuralInterpreterImageClassifierOutput(RoutingOutput, ImageClassifierOutput):
    """Output of the multi-task image classifier: `loss` and `logits` (B, num_labels) of each sample's own task
    head; `hidden_states`, `attentions`, `compatibilities` and `types` as in `NeuralInterpreterModelOutput`."""


@dataclass
class NeuralInterpreterMultipleChoiceOutput(RoutingOutput, MultipleChoiceModelOutput):
    """Output of the multiple-choice model (PGM puzzles): cross-entropy `loss` over the choices and their scores
    `logits` (B, num_choices); the routing fields of `NeuralInterpreterModelOutput` come for the B * num_choices
    sets (CLS token, context panels, one candidate), sample b's candidate k at row b * num_choices + k."""


@dataclass
class SetRegressionOutput(ModelOutput):
    """What a set-regression model returns (transformers has no such output class): the mean squared error `loss`
    against the labels, `predictions` (B, T), one scalar per task token, the hidden states and attentions."""

    loss: torch.FloatTensor | None = None
    predictions: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class NeuralInterpreterSetRegressionOutput(RoutingOutput, SetRegressionOutput):
    """Output of the set-regression model: `SetRegressionOutput` and the routing fields."""


class RoutingKwargs(TypedDict, total=False):
    """The routing options every model's `forward` takes and hands, as one group, to `NeuralInterpreterModel.forward`.

    output_hidden_states: return the set before the first and after every function iteration, each (B, N, d).
    output_attentions: return Eq. 6's attention weights W (B, U, H, N, N) of every LOC of every function
        iteration (the LOCs then run the literal form).
    output_routing: return the compatibilities C (B, U, N) and the types of every function iteration.
    num_function_iterations: iterations to run per script (int, or one per script) instead of the config's:
        anytime inference.
    disabled_functions: functions whose C_ui is forced to 0 before normalisation (indices for all scripts, or a
        dict script -> indices).
    """

    output_hidden_states: bool | None
    output_attentions: bool | None
    output_routing: bool
    num_function_iterations: int | Sequence[int] | None
    disabled_functions: Sequence[int] | dict[int, Sequence[int]] | None


# ----------------------------------------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------------------------------------


def apply_function_weights(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W_u^T + b for every function u: weight (U, out, in); x (U, B, N, in), or (B, N, in) read by all."""
    num_functions, out_features, in_features = weight.shape
    if x.dim() == 3:  # every function reads the same x: one matmul for all of them
        flat_bias = None if bias is None else bias.repeat(num_functions)
        y = F.linear(x, weight.reshape(-1, in_features), flat_bias)
        return y.unflatten(-1, (num_functions, out_features)).permute(2, 0, 1, 3)
    u, b, n, _ = x.shape
    y = x.reshape(u, b * n, in_features) @ weight.transpose(1, 2)
    if bias is not None:
        y = y + bias
    return y.view(u, b, n, out_features)


class ModLin(nn.Module):
    """Code-modulated linear layer, Eq. 5: ModLin(x; c) = W (x * LayerNorm(W_c c)) + b."""

    def __init__(self, in_features: int, out_features: int, code_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.code_proj = nn.Linear(code_dim, in_features, bias=False)

    def function_weights(self, codes: torch.Tensor) -> torch.Tensor:
        """(U, out, in): W diag(LayerNorm(W_c c_u)) for every function u (depends on the codes alone)."""
        modulation = F.layer_norm(self.code_proj(codes), (self.in_features,))
        return self.weight.unsqueeze(0) * modulation.unsqueeze(1)

    def forward(self, x: torch.Tensor, function_weights: torch.Tensor) -> torch.Tensor:
        """x (U, B, N, in), or (B, N, in) read by every function -> (U, B, N, out), from `function_weights`."""
        return apply_function_weights(x, function_weights, self.bias)


class ModMLP(nn.Module):
    """ModMLP(x; c) = ModLin(GELU(ModLin(x; c)); c), hidden width d (Eq. 5)."""

    def __init__(self, config: NeuralInterpreterConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.fc1 = ModLin(d, d, config.code_dim)
        self.fc2 = ModLin(d, d, config.code_dim)

    def forward(self, x: torch.Tensor, function_weights: FunctionWeights) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x, function_weights["fc1"])), function_weights["fc2"])


class RelativePositionalBias(nn.Module):
    """Per-function relative positional bias between patch tokens (the reference's "sep_sum" mode)."""

    def __init__(self, config: NeuralInterpreterConfig) -> None:
        super().__init__()
        g, heads, hd = config.grid_size, config.num_attention_heads, config.attention_head_size
        self.grid_size = g
        self.row_offset_embeddings = nn.Parameter(torch.empty(2 * g - 1, hd))
        self.col_offset_embeddings = nn.Parameter(torch.empty(2 * g - 1, hd))
        self.row_head_keys = nn.Linear(hd, heads, bias=False)
        self.col_head_keys = nn.Linear(hd, heads, bias=False)
        self.row_function_keys = nn.Linear(config.code_dim, heads, bias=False)
        self.col_function_keys = nn.Linear(config.code_dim, heads, bias=False)

    def forward(self, codes: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
        """(U, H, N, N): w_row . e_row[r2 - r1] + w_col . e_col[c2 - c1] + a_row(c_u) + a_col(c_u); 0 for task tokens."""
        g = self.grid_size
        # Built here rather than kept as a buffer, which transformers' meta-device loading would leave uninitialised.
        grid = torch.arange(g, device=codes.device)
        offsets = grid[None, :] - grid[:, None] + g - 1  # key - query along one axis, as table rows (G, G)
        row_bias = self.row_head_keys(self.row_offset_embeddings)[offsets]  # (G query, G key, H)
        col_bias = self.col_head_keys(self.col_offset_embeddings)[offsets]
        # (G, G, G, G, H) indexed by query row, query column, key row, key column
        patch_bias = row_bias[:, None, :, None] + col_bias[None, :, None, :]
        patch_bias = patch_bias.reshape(g * g, g * g, -1).permute(2, 0, 1)  # (H, P, P), row-major patches
        function_bias = self.row_function_keys(codes) + self.col_function_keys(codes)  # (U, H)
        bias = patch_bias.unsqueeze(0) + function_bias[:, :, None, None]
        return F.pad(bias, (num_prefix_tokens, 0, num_prefix_tokens, 0))


# ----------------------------------------------------------------------------------------------------------
# Eq. 6: modulated attention
# ----------------------------------------------------------------------------------------------------------
# An Eq. 6 function takes the LOC, its normalised input h ((B, N, d) read by every function, or (U, B, N, d)),
# the LOC's function weights, C (U, B, N), the positional bias (U, H, N, N) or None, and the attention dropout
# probability; it returns the attended values (U, B, N, d) with the heads merged, and W (B, U, H, N, N) or None.
AttentionFunction = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def merge_heads(attended: torch.Tensor) -> torch.Tensor:
    """(B, U, H, N, d_v) -> (U, B, N, H * d_v)."""
    return attended.permute(1, 0, 3, 2, 4).flatten(-2)


def eager_attention(
    module: LineOfCode,
    hidden: torch.Tensor,
    function_weights: FunctionWeights,
    compatibilities: torch.Tensor,
    attention_bias: torch.Tensor | None,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 6 literally: W = A~ / (eps + sum_j A~), A~_ij = C_ui C_uj softmax_j((q_i . k_j + bias_ij) / sqrt(d_h))."""
    query, key, value = (
        module.project_heads(hidden, function_weights, name) for name in ("query", "key", "value")
    )
    logits = query @ key.transpose(-1, -2)  # (B, U, H, N, N)
    if attention_bias is not None:
        logits = logits + attention_bias
    probs = torch.softmax(logits * module.scaling, dim=-1)
    c_query = compatibilities.transpose(0, 1).unsqueeze(2)  # (B, U, 1, N)
    modulated = c_query.unsqueeze(-1) * probs * c_query.unsqueeze(-2)
    # The clamp keeps a row that no function accepts at 0 (not 0/0) when attention_eps is 0.
    normaliser = (module.config.attention_eps + modulated.sum(dim=-1, keepdim=True)).clamp_min(1e-30)
    attention_weights = modulated / normaliser
    attended = F.dropout(attention_weights, p=dropout, training=dropout > 0) @ value
    return merge_heads(attended), attention_weights


def normalise_columns(columns_out: torch.Tensor, c_query: torch.Tensor, eps: float) -> torch.Tensor:
    """Eq. 6 from A @ [C_uj v_j, C_uj] (..., d_v + 1): C_ui (A C v)_i / (eps + C_ui (A C)_i)."""
    numerator, total = columns_out.split([columns_out.shape[-1] - 1, 1], dim=-1)
    return c_query * numerator / (eps + c_query * total).clamp_min(1e-30)


def sdpa_attention(
    module: LineOfCode,
    hidden: torch.Tensor,
    function_weights: FunctionWeights,
    compatibilities: torch.Tensor,
    attention_bias: torch.Tensor | None,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, None]:
    """Eq. 6 through torch's scaled_dot_product_attention, exactly: W v = C_ui A [C_uj v_j] / (eps + C_ui A C_uj).

    The key compatibilities scale the values and ride along as one extra value column, so the normaliser of Eq. 6
    comes out of the same kernel call: no log-compatibility mask and no all -inf rows (a function that accepts no
    token gives 0, not NaN). Functions are folded into the heads, (B, U * H, N, .), so that the bias (U * H, N, N)
    broadcasts over the batch. Dropout, if any, acts on A.
    """
    query, key, value = (
        module.project_heads(hidden, function_weights, name) for name in ("query", "key", "value")
    )
    b, u, h, n, _ = query.shape
    c_key = compatibilities.transpose(0, 1)[:, :, None, :, None]  # (B, U, 1, N, 1)
    columns = torch.cat([value * c_key, c_key.expand(b, u, h, n, 1)], dim=-1)
    mask = None if attention_bias is None else (attention_bias * module.scaling).to(query.dtype).flatten(0, 1)
    out = F.scaled_dot_product_attention(
        query.flatten(1, 2),
        key.flatten(1, 2),
        columns.flatten(1, 2),
        attn_mask=mask,
        dropout_p=dropout,
        scale=module.scaling,
    ).unflatten(1, (u, h))
    return merge_heads(normalise_columns(out, c_key, module.config.attention_eps)), None


# ----------------------------------------------------------------------------------------------------------
# A line of code, its implementations, type inference, a script
# ----------------------------------------------------------------------------------------------------------


class LineOfCode(nn.Module):
    """One LOC (Eqs. 5-7): modulated attention then ModMLP, both gated by C_ui, in U parallel streams."""

    def __init__(self, config: NeuralInterpreterConfig) -> None:
        super().__init__()
        d, cd = config.hidden_size, config.code_dim
        self.config = config
        self.num_heads = config.num_attention_heads
        self.scaling = 1.0 / math.sqrt(config.attention_head_size)
        qk_size = self.num_heads * config.attention_head_size
        self.attention_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.query = ModLin(d, qk_size, cd, bias=False)
        self.key = ModLin(d, qk_size, cd, bias=False)
        self.value = ModLin(d, d, cd, bias=True)
        self.output = ModLin(d, d, cd, bias=True)
        self.mlp_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.mlp = ModMLP(config)
        self.position_bias = RelativePositionalBias(config) if config.use_relative_positional_bias else None
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def function_weights(self, codes: torch.Tensor) -> FunctionWeights:
        """Every ModLin's W diag(LayerNorm(W_c c_u)) (U, out, in): the same in every function iteration."""
        layers = {
            "query": self.query,
            "key": self.key,
            "value": self.value,
            "output": self.output,
            "fc1": self.mlp.fc1,
            "fc2": self.mlp.fc2,
        }
        return {name: layer.function_weights(codes) for name, layer in layers.items()}

    def project_heads(
        self, hidden: torch.Tensor, function_weights: FunctionWeights, name: str
    ) -> torch.Tensor:
        """Query, key or value of every function, split into heads: (B, U, H, N, d_head)."""
        projection = getattr(self, name)(hidden, function_weights[name])  # (U, B, N, H * d_head)
        return projection.unflatten(-1, (self.num_heads, -1)).permute(1, 0, 3, 2, 4)

    def forward(
        self,
        x: torch.Tensor,
        compatibilities: torch.Tensor,
        function_weights: FunctionWeights,
        attention_bias: torch.Tensor | None = None,
        attention: AttentionFunction = eager_attention,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, N, d) read by every function, or (U, B, N, d); C (U, B, N) -> streams (U, B, N, d), and W or None."""
        dropout = self.config.attention_probs_dropout_prob if self.training else 0.0
        gate = compatibilities.unsqueeze(-1)  # a token a function does not accept passes its stream unchanged
        attended, attention_weights = attention(
            self, self.attention_norm(x), function_weights, compatibilities, attention_bias, dropout
        )
        a = x + gate * self.dropout(self.output(attended, function_weights["output"]))
        streams = a + gate * self.dropout(self.mlp(self.mlp_norm(a), function_weights))
        return streams, attention_weights


# A line-of-code implementation: (LOC, x, C, function weights, attention bias) -> (streams, W or None).
LineOfCodeFunction = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def eager_line_of_code(
    module: LineOfCode,
    x: torch.Tensor,
    compatibilities: torch.Tensor,
    function_weights: FunctionWeights,
    bias: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The LOC with the literal Eq. 6: the one implementation that forms W (`output_attentions=True` runs it)."""
    return module(x, compatibilities, function_weights, bias, attention=eager_attention)


def sdpa_line_of_code(
    module: LineOfCode,
    x: torch.Tensor,
    compatibilities: torch.Tensor,
    function_weights: FunctionWeights,
    bias: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The LOC with Eq. 6 through `sdpa_attention`, except under torch.compile on an accelerator.

    There inductor compiled the value-column form into another function (logits off by O(1) on an H200, torch
    2.11) while it compiled the literal form exactly, so a compiled graph on an accelerator records the literal one.
    """
    compiled_off_cpu = torch.compiler.is_compiling() and x.device.type not in ("cpu", "meta")
    attention = eager_attention if compiled_off_cpu else sdpa_attention
    return module(x, compatibilities, function_weights, bias, attention=attention)


class NeuralInterpreterLineOfCodeInterface(GeneralInterface):
    """Line-of-code implementations by name (the model's `attn_implementation`), as transformers'
    `AttentionInterface` holds attention functions: `register(name, function)` adds one, a `LineOfCodeFunction`.
    To register an Eq. 6 function alone, wrap it: `lambda loc, *args: loc(*args, attention=my_attention)`."""

    _global_mapping: dict[str, LineOfCodeFunction] = {"eager": eager_line_of_code, "sdpa": sdpa_line_of_code}


ALL_LINE_OF_CODE_FUNCTIONS = NeuralInterpreterLineOfCodeInterface()


class NeuralInterpreterAttentionInterface(NeuralInterpreterLineOfCodeInterface):
    """Deprecated name of `NeuralInterpreterLineOfCodeInterface`, kept for one release (the registry holds whole
    line-of-code implementations, not attention functions); it registers into the same mapping."""


ALL_ATTENTION_FUNCTIONS = ALL_LINE_OF_CODE_FUNCTIONS
"""Deprecated name of `ALL_LINE_OF_CODE_FUNCTIONS` (the same registry), kept for one release."""


def line_of_code_function(name: str | None) -> LineOfCodeFunction:
    """The registered implementation `name` ("sdpa" for None); a ValueError that lists the registered ones."""
    name = "sdpa" if name is None else name
    if name not in ALL_LINE_OF_CODE_FUNCTIONS:
        raise ValueError(
            f'Specified `attn_implementation="{name}"` is not supported by Neural Interpreters: expected one of '
            f"{sorted(ALL_LINE_OF_CODE_FUNCTIONS)} (`import ni_hf` registers its CPU kernels as 'fast'; register "
            "more with NeuralInterpreterLineOfCodeInterface.register)."
        )
    return ALL_LINE_OF_CODE_FUNCTIONS[name]


class TypeInference(nn.Module):
    """Type inference, Eq. 2: t_i = normalize(MLP(LayerNorm(x_i)))."""

    def __init__(self, config: NeuralInterpreterConfig) -> None:
        super().__init__()
        widths = [config.hidden_size] + [config.type_inference_hidden_size] * (
            config.type_inference_depth - 1
        )
        widths.append(config.type_dim)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(nn.Linear(i, o) for i, o in zip(widths[:-1], widths[1:], strict=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == 0 else layer(F.gelu(x))
        return F.normalize(x, dim=-1)


class FunctionIteration(NamedTuple):
    """What one function iteration leaves: y (B, N, d), C (B, U, N), types (B, N, d_type), every LOC's W or None."""

    hidden_state: torch.Tensor
    compatibilities: torch.Tensor
    types: torch.Tensor
    attentions: tuple[torch.Tensor, ...] | None


def routing_peak(iterations: Sequence[FunctionIteration]) -> torch.Tensor | None:
    """() the largest C of all iterations, 0 when no function accepted any token; None while compiling or tracing."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return None
    return torch.stack([it.compatibilities.detach().amax() for it in iterations]).amax()


class NeuralInterpreterScript(GradientCheckpointingLayer):
    """A script: U functions (signature s_u, code c_u) sharing one interpreter; `forward` is one function iteration."""

    def __init__(self, config: NeuralInterpreterConfig) -> None:
        super().__init__()
        self.config = config
        self.type_inference = TypeInference(config)
        self.signatures = nn.Parameter(torch.empty(config.num_functions, config.type_dim))
        self.codes = nn.Parameter(torch.empty(config.num_functions, config.code_dim))
        self.sigma = nn.Parameter(torch.tensor(float(config.sigma_init)))
        self.locs = nn.ModuleList(LineOfCode(config) for _ in range(config.num_loc_layers))

    def compatibilities(self, types: torch.Tensor, function_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Eqs. 3-4: C_ui = C~_ui / (eps + sum_u C~_ui), C~_ui = exp(-d_ui / sigma) if d_ui <= tau else 0."""
        signatures = F.normalize(self.signatures, dim=-1)
        distance = 1.0 - torch.einsum("bnt,ut->ubn", types, signatures)  # (U, B, N)
        # sigma is learned freely; a floor keeps a sigma driven to 0 (or below) from turning d / sigma into NaN.
        kernel = torch.exp(-distance / self.sigma.clamp_min(1e-4))
        truncated = torch.where(distance <= self.config.truncation_tau, kernel, 0.0)  # tau acts here
        if self.config.straight_through:  # the forward truncates, the gradient is the untruncated kernel's
            truncated = kernel + (truncated - kernel).detach()
        if function_mask is not None:  # dropped functions accept no token
            truncated = truncated * function_mask[:, None, None].to(truncated.dtype)
        return truncated / (self.config.kernel_eps + truncated.sum(dim=0, keepdim=True))

    def function_weights(self) -> tuple[FunctionWeights, ...]:
        """Every LOC's code-modulated weights; formed once per forward and shared by all function iterations."""
        return tuple(loc.function_weights(self.codes) for loc in self.locs)

    def attention_biases(self, num_prefix_tokens: int) -> torch.Tensor | None:
        """(L, U, H, N, N): every LOC's positional bias, computed once per forward, not per iteration or sample."""
        if not self.config.use_relative_positional_bias:
            return None
        # One tensor, not a list: a reentrant activation checkpoint detaches the tensors it is given, not lists.
        return torch.stack([loc.position_bias(self.codes, num_prefix_tokens) for loc in self.locs])

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_biases: torch.Tensor | None,
        function_mask: torch.Tensor | None,
        loc_positions: torch.Tensor | None,
        line_of_code: LineOfCodeFunction = eager_line_of_code,
        function_weights: tuple[FunctionWeights, ...] | None = None,
    ) -> FunctionIteration:
        """One function iteration, Eq. 8: types (Eq. 2), C (Eqs. 3-4), every function's LOCs, y_i = sum_u C_ui LOC_u(x)_i.

        Every LOC's W is kept only when every LOC formed it (the literal Eq. 6).
        loc_positions: (N, d) absolute positions added to the stream before every LOC (zero rows for the task
            tokens), or None; type inference and the outer residual see x without them, as in the reference.
        """
        function_weights = self.function_weights() if function_weights is None else function_weights
        types = self.type_inference(hidden_states)
        compatibilities = self.compatibilities(types, function_mask)  # (U, B, N)
        streams = (
            hidden_states  # every function's stream starts from the same x, unexpanded for the first LOC
        )
        attentions = ()
        for i, loc in enumerate(self.locs):
            if loc_positions is not None:
                streams = streams + loc_positions
            bias = None if attention_biases is None else attention_biases[i]
            streams, attention_weights = line_of_code(
                loc, streams, compatibilities, function_weights[i], bias
            )
            attentions += (attention_weights,)
        output = (compatibilities.unsqueeze(-1) * streams).sum(dim=0)  # Eq. 8: sum over functions
        if self.config.outer_residual:
            output = hidden_states + output
        formed_every_w = all(w is not None for w in attentions)
        return FunctionIteration(
            output, compatibilities.transpose(0, 1), types, attentions if formed_every_w else None
        )

    def run(
        self,
        hidden_states: torch.Tensor,
        num_iterations: int,
        line_of_code: LineOfCodeFunction,
        reads_patches: bool,
        function_mask: torch.Tensor | None = None,
        loc_positions: torch.Tensor | None = None,
    ) -> list[FunctionIteration]:
        """`num_iterations` function iterations, the parameters shared across them: what each iteration left."""
        biases = self.attention_biases(self.config.num_task_tokens) if reads_patches else None
        # A checkpointed iteration forms its own weights inside the checkpoint: tensors shared from outside it
        # would be backpropagated by each reentrant checkpoint's inner backward.
        checkpointed = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        weights = None if checkpointed else self.function_weights()
        iterations = []
        for _ in range(num_iterations):
            # A reentrant activation checkpoint returns a plain tuple: FunctionIteration(*...) names its fields again.
            iteration = FunctionIteration(
                *self(
                    hidden_states,
                    biases,
                    function_mask,
                    loc_positions,
                    line_of_code=line_of_code,
                    function_weights=weights,
                )
            )
            hidden_states = iteration.hidden_state
            iterations.append(iteration)
        return iterations


# ----------------------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------------------


class NeuralInterpreterPreTrainedModel(BuiltSettingsMixin, CheckedLoadingMixin, PreTrainedModel):
    config_class = NeuralInterpreterConfig
    config: NeuralInterpreterConfig
    base_model_prefix = "neural_interpreter"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _no_split_modules = ["NeuralInterpreterScript"]
    # Trainer must not assume the model averages the loss over processes itself.
    accepts_loss_kwargs = False
    # Whether forward raises on NaN or inf and warns when no function accepts any token (one host sync).
    checks_finite = True
    # The heads, by the Auto class that loads each; those whose backbone reads sets (`CheckedLoadingMixin`).
    head_classes = {
        "NeuralInterpreterForImageClassification": "AutoModelForImageClassification",
        "NeuralInterpreterForMultipleChoice": "AutoModelForMultipleChoice",
        "NeuralInterpreterForSetRegression": None,
    }
    set_input_heads = ("NeuralInterpreterForMultipleChoice", "NeuralInterpreterForSetRegression")

    def __init__(self, config: NeuralInterpreterConfig, *inputs: Any, **kwargs: Any) -> None:
        # A config changed in place after construction (`config.num_functions = 0`) is checked here, not later.
        if isinstance(config, NeuralInterpreterConfig):
            config.validate()
        super().__init__(config, *inputs, **kwargs)

    def check_built_settings(self) -> None:
        """As `BuiltSettingsMixin`'s, and `config.attn_implementation` a registered line-of-code implementation."""
        super().check_built_settings()
        line_of_code_function(self.config._attn_implementation)

    def get_correct_attn_implementation(
        self, requested_attention: str | None, is_init_check: bool = False
    ) -> str:
        """The line-of-code implementation by name, from `ALL_LINE_OF_CODE_FUNCTIONS`; "sdpa" by default."""
        name = "sdpa" if requested_attention is None else requested_attention
        line_of_code_function(name)  # refuses a name nobody registered
        return name

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """Load as transformers does, then re-freeze what the config freezes (loading makes every tensor trainable)."""
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        for module in model.modules():
            if isinstance(module, NeuralInterpreterModel):
                module.apply_freezing()
        return loaded

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Save as transformers does, after checking that the config still describes this model's parameters.

        A checkpoint with copied code also names the backbone for `AutoModel`; a head with no Auto class of its
        own (set regression) copies the code through its backbone, so the checkpoint loads without `ni_hf` too.
        """
        self.check_config_matches_parameters()
        backbone = getattr(self, self.base_model_prefix, None)
        is_main_process = kwargs.get("is_main_process", args[0] if args else True)
        if self._auto_class is not None:
            auto_map = dict(getattr(self.config, "auto_map", None) or {})
            auto_map.setdefault("AutoModel", "modeling_neural_interpreter.NeuralInterpreterModel")
            self.config.auto_map = auto_map
        elif isinstance(backbone, NeuralInterpreterModel) and backbone.is_remote_code() and is_main_process:
            os.makedirs(save_directory, exist_ok=True)
            custom_object_save(backbone, save_directory, config=self.config)
        return super().save_pretrained(save_directory, *args, **kwargs)

    def check_config_matches_parameters(self) -> None:
        """Refuse a config edited after the model was built in a way its parameters cannot follow (e.g.
        `config.num_functions = 7`): the saved config would describe another model."""
        self.config.validate()
        with torch.device("meta"):
            expected = type(self)(self.config, **self.construction_arguments()).state_dict()
        actual = self.state_dict()
        differ = [
            f"{name}: {tuple(tensor.shape)} for the config, {tuple(actual[name].shape)} in the model"
            for name, tensor in expected.items()
            if name in actual and tensor.shape != actual[name].shape
        ]
        differ += [f"{name}: in one of them only" for name in set(expected) ^ set(actual)]
        if differ:
            raise ValueError(
                "The config no longer describes this model's parameters ("
                + "; ".join(sorted(differ)[:4])
                + (" ..." if len(differ) > 4 else "")
                + "): a built model cannot take edits to the settings that "
                "fix parameter shapes (hidden_size, num_functions, num_labels, task_names, ...). Change tasks with "
                "reset_tasks / add_tasks and functions with add_functions, or build a new model from the config."
            )

    def construction_arguments(self) -> dict[str, Any]:
        """The constructor's arguments besides the config (none; the backbone's say whether it embeds patches)."""
        return {}

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Signatures, codes, task tokens ~ N(0, 1); Linear weights: PyTorch's default or truncated normal."""
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, ModLin)):
            if std is None:
                init.kaiming_uniform_(module.weight, a=math.sqrt(5))
            else:
                init.trunc_normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Conv2d):
            init.kaiming_uniform_(module.weight, a=math.sqrt(5))
            if module.bias is not None:
                fan_in = module.weight[0].numel()
                init.uniform_(module.bias, -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))
        elif isinstance(module, (nn.LayerNorm, nn.BatchNorm2d)):
            init.ones_(module.weight)
            init.zeros_(module.bias)
            if isinstance(module, nn.BatchNorm2d):
                init.zeros_(module.running_mean)
                init.ones_(module.running_var)
                init.zeros_(module.num_batches_tracked)
        elif isinstance(module, PanelEmbedding):  # after its layers: the panel CNN's own initialisation wins
            init_panel_embedding(module)
        elif isinstance(module, NeuralInterpreterScript):
            init.normal_(module.signatures)
            init.normal_(module.codes)
            init.constant_(module.sigma, float(self.config.sigma_init))
        elif isinstance(module, RelativePositionalBias):
            init.normal_(module.row_offset_embeddings)
            init.normal_(module.col_offset_embeddings)
        elif isinstance(module, NeuralInterpreterModel):
            init.normal_(module.task_tokens)


class NeuralInterpreterModel(NeuralInterpreterPreTrainedModel):
    """The backbone: patch embedding, task (CLS) tokens, and scripts of function iterations."""

    def __init__(self, config: NeuralInterpreterConfig, add_patch_embedding: bool = True) -> None:
        r"""add_patch_embedding: False for a head that feeds sets (`inputs_embeds`), which never reads patches."""
        super().__init__(config)
        self.config = config
        self.patch_embedding = (
            nn.Linear(config.patch_dim, config.hidden_size) if add_patch_embedding else None
        )
        num_token_params = 1 if config.share_task_tokens else config.num_task_tokens
        self.task_tokens = nn.Parameter(torch.empty(num_token_params, config.hidden_size))
        self.scripts = nn.ModuleList(NeuralInterpreterScript(config) for _ in range(config.num_scripts))
        self.post_init()
        self.apply_freezing()

    def construction_arguments(self) -> dict[str, Any]:
        return {"add_patch_embedding": self.patch_embedding is not None}

    def fixed_settings(self) -> tuple[str, ...]:
        reads_images = self.patch_embedding is not None or self.config.use_relative_positional_bias
        return BACKBONE_FIELDS + (IMAGE_FIELDS if reads_images else ())

    def apply_freezing(self) -> None:
        """Make the tensors the config freezes non-trainable (so optimizers and DDP never see them)."""
        for script in self.scripts:
            script.signatures.requires_grad_(not self.config.freeze_signatures)
            script.codes.requires_grad_(not self.config.freeze_codes)
        if self.patch_embedding is not None:
            self.patch_embedding.requires_grad_(not self.config.freeze_patch_embedding)

    def get_input_embeddings(self) -> nn.Module | None:
        return self.patch_embedding

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.patch_embedding = value

    def reset_task_tokens(self, task_names: Sequence[str]) -> None:
        """Replace the task (CLS) tokens by fresh, trainable N(0, 1) ones, one per new task (adaptation)."""
        names = validate_task_names(
            task_names
        )  # before any change: a refused call leaves the model as it was
        self.config.task_names = names
        self.config.default_task = 0
        num = 1 if self.config.share_task_tokens else len(names)
        ref = self.task_tokens
        self.task_tokens = nn.Parameter(torch.randn(num, ref.shape[1], device=ref.device, dtype=ref.dtype))
        self.record_built_settings()

    def add_task_tokens(self, task_names: Sequence[str]) -> list[int]:
        """Append fresh N(0, 1) task (CLS) tokens for new tasks; the existing ones stay in the set, unchanged.

        Returns the indices of the new tasks. This is the reference implementation's ``finetune``: the tokens of
        the tasks seen so far remain part of every sample's set. Shared task tokens only gain the names. The
        set-regression model's shared head reads every token; an image classifier needs a head per new task too.
        """
        names = validate_task_names(task_names)
        if set(names) & set(self.config.task_names):
            raise ValueError(
                f"`task_names` must be new, distinct names (existing: {self.config.task_names}); got {names}."
            )
        old = self.config.num_tasks
        self.config.task_names = [*self.config.task_names, *names]
        if not self.config.share_task_tokens:
            ref = self.task_tokens
            fresh = torch.randn(len(names), ref.shape[1], device=ref.device, dtype=ref.dtype)
            self.task_tokens = nn.Parameter(torch.cat([ref.data, fresh]), requires_grad=ref.requires_grad)
        self.record_built_settings()
        return list(range(old, old + len(names)))

    def add_functions(self, num_new: int) -> list[int]:
        """Capacity extension: append `num_new` functions (fresh N(0, 1) signature and code) to every script."""
        if not isinstance(num_new, int) or isinstance(num_new, bool) or num_new < 1:
            raise ValueError(f"`num_new` must be a positive integer, got {num_new!r}.")
        old = self.config.num_functions
        for script in self.scripts:
            for name in ("signatures", "codes"):
                param = getattr(script, name)
                fresh = torch.randn(num_new, param.shape[1], device=param.device, dtype=param.dtype)
                new = nn.Parameter(torch.cat([param.data, fresh]), requires_grad=param.requires_grad)
                setattr(script, name, new)
        self.config.num_functions = old + num_new
        self.record_built_settings()
        return list(range(old, old + num_new))

    def embed_task_tokens(self, batch_size: int) -> torch.Tensor:
        """(B, T, d): every task's CLS token, for every sample (one copy per task when they are shared)."""
        tokens = self.task_tokens.expand(self.config.num_task_tokens, -1)
        return tokens.unsqueeze(0).expand(batch_size, -1, -1)

    def embed(
        self, pixel_values: torch.Tensor | None, inputs_embeds: torch.Tensor | None
    ) -> tuple[torch.Tensor, bool]:
        """(B, N_in, d) input set, and whether it is a grid of patches (which the positional bias reads)."""
        if (pixel_values is None) == (inputs_embeds is None):
            raise ValueError(
                "Pass exactly one of `pixel_values` (images or patches) and `inputs_embeds` (a set)."
            )
        config = self.config
        if inputs_embeds is not None:
            check_tensor(
                "inputs_embeds", inputs_embeds, "a set of embedding vectors", self.task_tokens.device
            )
            if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != config.hidden_size:
                raise ValueError(
                    f"`inputs_embeds` must have shape (batch, set_size, {config.hidden_size}), got "
                    f"{tuple(inputs_embeds.shape)}."
                )
            check_not_empty(inputs_embeds.shape[0])
            return inputs_embeds.to(self.task_tokens.dtype), False
        if self.patch_embedding is None:
            raise ValueError(
                "This backbone was built without a patch embedding: pass `inputs_embeds`, a set."
            )
        check_tensor(
            "pixel_values",
            pixel_values,
            "pixels normalized to about [-1, 1], as NeuralInterpreterImageProcessor gives them; raw 0-255 images go "
            "through the processor first",
            self.task_tokens.device,
        )
        image_shape = (config.num_channels, config.image_size, config.image_size)
        if pixel_values.dim() == 4:
            if pixel_values.shape[1:] != image_shape:
                raise ValueError(
                    f"Images must have shape (batch, {', '.join(map(str, image_shape))}), got "
                    f"{tuple(pixel_values.shape)}; resize them with NeuralInterpreterImageProcessor."
                )
            pixel_values = patchify(pixel_values, config.patch_size)
        elif pixel_values.dim() != 3 or pixel_values.shape[1:] != (config.num_patches, config.patch_dim):
            raise ValueError(
                f"`pixel_values` must be images (batch, {', '.join(map(str, image_shape))}) or patches "
                f"(batch, {config.num_patches}, {config.patch_dim}), got {tuple(pixel_values.shape)}."
            )
        check_not_empty(pixel_values.shape[0])
        return self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype)), True

    def loc_positions(self, loc_position_embeddings: torch.Tensor | None, embeddings: torch.Tensor) -> Any:
        """(N, d) positions added before every LOC, zero for the task tokens; None without `loc_position_embeddings`."""
        if loc_position_embeddings is None:
            return None
        if loc_position_embeddings.shape != embeddings.shape[1:]:
            raise ValueError(
                f"`loc_position_embeddings` must have shape {tuple(embeddings.shape[1:])} (one row per input "
                f"element), got {tuple(loc_position_embeddings.shape)}."
            )
        return F.pad(loc_position_embeddings.to(embeddings.dtype), (0, 0, self.config.num_task_tokens, 0))

    def function_masks(
        self, disabled_functions: Sequence[int] | dict[int, Sequence[int]] | None, device: torch.device
    ) -> list[torch.Tensor | None]:
        """One (U,) 0/1 mask per script, or None; `disabled_functions` lists functions (per script if a dict)."""
        num_scripts, num_functions = self.config.num_scripts, self.config.num_functions
        if disabled_functions is None:
            return [None] * num_scripts
        per_script = (
            disabled_functions
            if isinstance(disabled_functions, dict)
            else dict.fromkeys(range(num_scripts), disabled_functions)
        )
        unknown = [key for key in per_script if key not in range(num_scripts)]
        if unknown:
            raise ValueError(
                f"`disabled_functions` keys must be script indices 0..{num_scripts - 1}, got {unknown}."
            )
        masks = []
        for s in range(num_scripts):
            disabled = index_list(per_script.get(s, []), "disabled_functions")
            if any(not 0 <= u < num_functions for u in disabled):
                raise ValueError(
                    f"`disabled_functions` must index functions 0..{num_functions - 1}, got {disabled}."
                )
            mask = torch.ones(num_functions, device=device)
            mask[disabled] = 0.0
            masks.append(mask if disabled else None)
        return masks

    def iterations_to_run(self, num_function_iterations: int | Sequence[int] | None) -> list[int]:
        """Function iterations to run per script: the config's, or fewer (or more) for anytime inference."""
        config = self.config
        iterations = (
            config.iterations_per_script if num_function_iterations is None else num_function_iterations
        )
        if isinstance(iterations, torch.Tensor) and iterations.dim() == 0:
            iterations = iterations.item()
        if isinstance(iterations, int) and not isinstance(iterations, bool):
            iterations = [iterations] * config.num_scripts
        iterations = index_list(iterations, "num_function_iterations")
        if len(iterations) != config.num_scripts or any(k < 0 for k in iterations) or not any(iterations):
            raise ValueError(
                f"`num_function_iterations` must be a non-negative int or one per script ({config.num_scripts}), "
                f"with at least one iteration in all, got {iterations}."
            )
        return iterations

    def run_scripts(
        self,
        hidden: torch.Tensor,
        reads_patches: bool,
        num_function_iterations: int | Sequence[int] | None,
        disabled_functions: Sequence[int] | dict[int, Sequence[int]] | None,
        loc_positions: torch.Tensor | None,
        output_attentions: bool,
    ) -> list[FunctionIteration]:
        """Every script's function iterations in turn, through the LOC implementation looked up once."""
        line_of_code = line_of_code_function(
            "eager" if output_attentions else self.config._attn_implementation
        )
        masks = self.function_masks(disabled_functions, hidden.device)
        iterations: list[FunctionIteration] = []
        for script, num, mask in zip(
            self.scripts, self.iterations_to_run(num_function_iterations), masks, strict=True
        ):
            iterations += script.run(hidden, num, line_of_code, reads_patches, mask, loc_positions)
            hidden = iterations[-1].hidden_state if iterations else hidden
        return iterations

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_routing: bool = False,
        num_function_iterations: int | Sequence[int] | None = None,
        disabled_functions: Sequence[int] | dict[int, Sequence[int]] | None = None,
        loc_position_embeddings: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        check_finite: bool | None = None,
    ) -> NeuralInterpreterModelOutput:
        r"""Embed the inputs, prepend the task tokens, run every script's function iterations, pool the task tokens.

        Args:
            pixel_values: images (B, C, H, W) or patches (B, num_patches, patch_dim) from the image processor.
            inputs_embeds: a set of vectors (B, N_in, d), used as is (no patch embedding, no positions).
            output_hidden_states, output_routing, num_function_iterations (anytime inference),
                disabled_functions, output_attentions: the routing options, as `RoutingKwargs` describes them;
                with `output_attentions` every LOC runs the literal Eq. 6, whatever the implementation.
            loc_position_embeddings: (N_in, d) positions of the input elements, added to the stream inside every
                LOC (`input_position_embedding_placement="every_loc"`); the task tokens get none.
            check_finite: check the inputs and the output (default `self.checks_finite`); a head passes False and
                checks them with its own, in one host sync.
        """
        self.check_built_settings()
        config = self.config
        output_hidden_states = (
            config.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        output_attentions = config.output_attentions if output_attentions is None else output_attentions
        embeddings, reads_patches = self.embed(pixel_values, inputs_embeds)
        hidden = torch.cat(
            [self.embed_task_tokens(embeddings.shape[0]).to(embeddings.dtype), embeddings], dim=1
        )
        loc_positions = self.loc_positions(loc_position_embeddings, embeddings)
        first = hidden
        iterations = self.run_scripts(
            hidden,
            reads_patches,
            num_function_iterations,
            disabled_functions,
            loc_positions,
            output_attentions,
        )
        hidden, peak = iterations[-1].hidden_state, routing_peak(iterations)
        if self.checks_finite if check_finite is None else check_finite:
            names = ("pixel_values", "inputs_embeds", "loc_position_embeddings")
            inputs = dict(zip(names, (pixel_values, inputs_embeds, loc_position_embeddings), strict=True))
            check_forward(self, inputs, {"last_hidden_state": hidden}, peak)
        return NeuralInterpreterModelOutput(
            last_hidden_state=hidden,
            pooler_output=hidden[:, : config.num_task_tokens],
            hidden_states=(first, *(it.hidden_state for it in iterations)) if output_hidden_states else None,
            attentions=tuple(w for it in iterations for w in it.attentions) if output_attentions else None,
            compatibilities=tuple(it.compatibilities for it in iterations) if output_routing else None,
            types=tuple(it.types for it in iterations) if output_routing else None,
            routing_peak=peak,
        )


# ----------------------------------------------------------------------------------------------------------
# Heads (TaskHead, its losses and the task adaptation live in task_heads.py, shared with the other models)
# ----------------------------------------------------------------------------------------------------------


class NeuralInterpreterForImageClassification(TaskHeadsMixin, NeuralInterpreterPreTrainedModel):
    """Multi-task image classifier: each sample's task id picks its CLS token output and its head."""

    def __init__(self, config: NeuralInterpreterConfig) -> None:
        if config.input_position_embedding_placement != "input":
            # Patches carry no absolute positions to re-add: "every_loc" would silently change nothing.
            raise ValueError(
                "`input_position_embedding_placement` must be 'input' for image classification, got "
                f"{config.input_position_embedding_placement!r}: 'every_loc' re-adds the learned positions of set "
                "inputs (NeuralInterpreterForSetRegression); patch positions come from `use_relative_positional_bias`."
            )
        super().__init__(config)
        self.num_labels = config.num_labels
        self.neural_interpreter = NeuralInterpreterModel(config)
        self.classifier = nn.ModuleList(self._fresh_heads(self._num_task_heads(config.num_tasks)))
        self.post_init()

    def fixed_settings(self) -> tuple[str, ...]:
        return ("num_labels",)

    def get_input_embeddings(self) -> nn.Module:
        return self.neural_interpreter.patch_embedding

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.neural_interpreter.patch_embedding = value

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        task_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **routing: Unpack[RoutingKwargs],
    ) -> NeuralInterpreterImageClassifierOutput:
        r"""Logits of each sample's task head; the loss of `config.problem_type` when `labels` are given.

        Args:
            task_ids: (B,) index of each sample's task in `config.task_names` (default `config.default_task`).
            labels: (B,) class indices (cross-entropy); (B, num_labels) floats for multi-label classification or
                regression, as in transformers' classifiers (`TaskHeadsMixin.classification_loss`).
            routing: the routing options (`RoutingKwargs`), handed to `NeuralInterpreterModel.forward`.
        """
        self.check_built_settings()
        self.check_task_heads()
        outputs = self.neural_interpreter(
            pixel_values=pixel_values,
            check_finite=False,
            **routing,
        )
        logits = self.task_logits(outputs.pooler_output, task_ids)
        labels = None if labels is None else torch.as_tensor(labels)
        if self.checks_finite:
            inputs = {"pixel_values": pixel_values, "labels": labels}
            check_forward(self, inputs, {"logits": logits}, outputs.routing_peak)
        return NeuralInterpreterImageClassifierOutput(
            loss=None if labels is None else self.classification_loss(logits, labels),
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            compatibilities=outputs.compatibilities,
            types=outputs.types,
        )


class NeuralInterpreterForSetRegression(NeuralInterpreterPreTrainedModel):
    """Set regression (the fuzzy-Boolean experiment): N scalars + one CLS token per task -> one scalar per task."""

    main_input_name = "inputs"
    input_modalities = ("text",)
    # Checkpoints written before the backbone could be built without one hold a (frozen, unused) patch embedding.
    _keys_to_ignore_on_load_unexpected = [r"neural_interpreter\.patch_embedding\.(weight|bias)"]

    def __init__(self, config: NeuralInterpreterConfig) -> None:
        if config.use_relative_positional_bias:
            # A set has no grid: the bias would be built, saved and trained by nobody (and break DDP).
            raise ValueError(
                "`use_relative_positional_bias` must be False for set regression (the fuzzy_boolean preset's "
                "value): the bias is between patches of an image grid; set elements get learned positions instead."
            )
        super().__init__(config)
        d = config.hidden_size
        self.input_projection = nn.Linear(1, d)
        self.input_position_embeddings = nn.Parameter(torch.empty(config.num_input_variables, d))
        self.neural_interpreter = NeuralInterpreterModel(config, add_patch_embedding=False)
        self.regressor = TaskHead(d, 1, config.layer_norm_eps)
        self.post_init()

    def fixed_settings(self) -> tuple[str, ...]:
        return ("num_input_variables",)

    def get_input_embeddings(self) -> nn.Module:
        return self.input_projection

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.input_projection = value

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, NeuralInterpreterForSetRegression):
            # Learned positional embeddings: N(0, std), std 1.0 by default as the reference's (GPT-2's is 0.02).
            init.normal_(module.input_position_embeddings, std=self.config.input_position_embedding_std)

    @can_return_tuple
    def forward(
        self,
        inputs: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **routing: Unpack[RoutingKwargs],
    ) -> NeuralInterpreterSetRegressionOutput:
        r"""Predictions (B, T) from inputs (B, num_input_variables); MSE loss against labels (B, T).

        The routing options (`RoutingKwargs`) are handed to `NeuralInterpreterModel.forward`.
        """
        self.check_built_settings()
        config = self.config
        check_tensor("inputs", inputs, "the input variables' values", self.input_projection.weight.device)
        if inputs.dim() != 2 or inputs.shape[1] != config.num_input_variables:
            raise ValueError(
                f"`inputs` must have shape (batch, {config.num_input_variables}), got {tuple(inputs.shape)}."
            )
        embeds = self.input_projection(inputs.to(self.input_projection.weight.dtype).unsqueeze(-1))
        every_loc = config.input_position_embedding_placement == "every_loc"
        outputs = self.neural_interpreter(
            inputs_embeds=embeds if every_loc else embeds + self.input_position_embeddings,
            loc_position_embeddings=self.input_position_embeddings if every_loc else None,
            check_finite=False,
            **routing,
        )
        predictions = self.regressor(outputs.pooler_output).squeeze(-1)  # (B, T)
        if self.checks_finite:
            inputs_and_labels = {"inputs": inputs, "labels": labels}
            check_forward(self, inputs_and_labels, {"predictions": predictions}, outputs.routing_peak)
        if labels is not None and labels.shape != predictions.shape:
            raise ValueError(
                f"`labels` must have shape (batch, num_tasks) = {tuple(predictions.shape)}, got {tuple(labels.shape)}."
            )
        return NeuralInterpreterSetRegressionOutput(
            loss=None
            if labels is None
            else F.mse_loss(predictions.float(), labels.to(predictions.device).float()),
            predictions=predictions,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            compatibilities=outputs.compatibilities,
            types=outputs.types,
        )


class NeuralInterpreterForMultipleChoice(NeuralInterpreterPreTrainedModel):
    """Multiple choice for PGM puzzles (section 4.3): each candidate's set of 10 elements (a CLS token, the 8 context
    panels, the candidate) through the interpreter; a head scores the CLS output; softmax over the candidates."""

    # Checkpoints of the other heads share the config class, not the parameters: nothing to ignore on load.
    def __init__(self, config: NeuralInterpreterConfig) -> None:
        if config.use_relative_positional_bias or config.num_labels != 1 or config.num_tasks != 1:
            raise ValueError(
                "NeuralInterpreterForMultipleChoice scores each candidate with one CLS token and one output: it needs "
                "use_relative_positional_bias=False, num_labels=1 and one task (the 'pgm' preset's values), got "
                f"{config.use_relative_positional_bias}, {config.num_labels} and {config.num_tasks} tasks."
            )
        super().__init__(config)
        self.panel_embedding = PanelEmbedding(config)
        self.neural_interpreter = NeuralInterpreterModel(config, add_patch_embedding=False)
        self.scorer = TaskHead(config.hidden_size, 1, config.layer_norm_eps)
        self.post_init()

    def fixed_settings(self) -> tuple[str, ...]:
        return PANEL_FIELDS

    def get_input_embeddings(self) -> nn.Module:
        return self.panel_embedding

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.panel_embedding = value

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **routing: Unpack[RoutingKwargs],
    ) -> NeuralInterpreterMultipleChoiceOutput:
        r"""Scores (B, num_choices) of the candidates; cross-entropy against `labels` (B,), the correct ones.

        Args:
            pixel_values: (B, 16, 1, 80, 80) panels, the 8 context panels then the 8 candidates, from
                `NeuralInterpreterPanelProcessor`.
            labels: (B,) index of each puzzle's correct candidate (-100: not counted).
            routing: the routing options (`RoutingKwargs`), handed to `NeuralInterpreterModel.forward`.
        """
        self.check_built_settings()
        device = self.scorer.linear.weight.device
        check_tensor(
            "pixel_values", pixel_values, "panels as NeuralInterpreterPanelProcessor gives them", device
        )
        check_not_empty(pixel_values.shape[0])
        context, candidates = self.panel_embedding(pixel_values)  # each panel once: (B, 8, d), (B, K, d)
        outputs = self.neural_interpreter(
            inputs_embeds=PanelEmbedding.candidate_sets(
                context, candidates
            ),  # candidates folded into the batch
            check_finite=False,
            **routing,
        )
        logits = self.scorer(outputs.pooler_output[:, 0]).view(candidates.shape[0], candidates.shape[1])
        labels = None if labels is None else torch.as_tensor(labels)
        if self.checks_finite:
            inputs = {"pixel_values": pixel_values, "labels": labels}
            check_forward(self, inputs, {"logits": logits}, outputs.routing_peak)
        return NeuralInterpreterMultipleChoiceOutput(
            loss=None if labels is None else multiple_choice_loss(logits, labels),
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            compatibilities=outputs.compatibilities,
            types=outputs.types,
        )


__all__ = [
    "ALL_ATTENTION_FUNCTIONS",
    "ALL_LINE_OF_CODE_FUNCTIONS",
    "FunctionIteration",
    "LineOfCode",
    "ModLin",
    "ModMLP",
    "NeuralInterpreterAttentionInterface",
    "NeuralInterpreterLineOfCodeInterface",
    "NeuralInterpreterForImageClassification",
    "NeuralInterpreterForMultipleChoice",
    "NeuralInterpreterForSetRegression",
    "NeuralInterpreterMultipleChoiceOutput",
    "NeuralInterpreterImageClassifierOutput",
    "NeuralInterpreterModel",
    "NeuralInterpreterModelOutput",
    "NeuralInterpreterPreTrainedModel",
    "NeuralInterpreterScript",
    "NeuralInterpreterSetRegressionOutput",
    "RoutingKwargs",
    "RoutingOutput",
    "SetRegressionOutput",
    "eager_attention",
    "eager_line_of_code",
    "line_of_code_function",
    "sdpa_attention",
    "sdpa_line_of_code",
]
