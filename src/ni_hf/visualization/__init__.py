"""Pictures of what a Neural Interpreter computes, from the numbers of one forward pass.

`trace_routing` (trace.py) runs the model once and keeps, for every function iteration, the compatibilities C
(Eq. 4), the types t (Eq. 2) and Eq. 6's attention weights W. The `*_data` functions (numbers.py) and
`FunctionUsage` (usage.py) turn a trace into the arrays behind each figure, with numpy alone; the `plot_*`
functions (figures.py) draw them with matplotlib (the `vis` extra: `pip install -e ".[vis]"`), imported only when a
figure is drawn; the `write_*_card_assets` functions (card_assets.py) write what a model card shows. Tokens are the
task (CLS) tokens first, then the patches in row-major order, or a set's elements in their order; a
`NeuralInterpreterForMultipleChoice` scores each candidate of a PGM puzzle on its own set (CLS, the context panels
in the matrix's row-major order, the candidate). Inputs may be torch tensors or numpy arrays; an argument that
cannot be drawn raises a TypeError or ValueError that names it and what was expected.
"""

from .card_assets import (
    write_pgm_routing_card_assets,
    write_routing_card_assets,
    write_set_routing_card_assets,
)
from .figures import (
    CHOSEN_COLOUR,
    CORRECT_COLOUR,
    figure_to_image,
    plot_attention,
    plot_computational_path,
    plot_function_usage,
    plot_set_path,
    plot_type_space,
    save_figure,
)
from .numbers import attention_data, computational_path_data, type_projection_data
from .trace import MULTIPLE_CHOICE_MODEL, TRACEABLE_MODELS, RoutingTrace, trace_routing
from .usage import RELATION_TYPES, FunctionUsage

__all__ = [
    "CHOSEN_COLOUR",
    "CORRECT_COLOUR",
    "MULTIPLE_CHOICE_MODEL",
    "RELATION_TYPES",
    "TRACEABLE_MODELS",
    "FunctionUsage",
    "RoutingTrace",
    "attention_data",
    "computational_path_data",
    "figure_to_image",
    "plot_attention",
    "plot_computational_path",
    "plot_function_usage",
    "plot_set_path",
    "plot_type_space",
    "save_figure",
    "trace_routing",
    "type_projection_data",
    "write_routing_card_assets",
    "write_pgm_routing_card_assets",
    "write_set_routing_card_assets",
]
