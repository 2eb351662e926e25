"""Model cards of the example scripts' runs, one module per experiment on a shared rendering path (``common``);
the Jinja templates (``*_template.md``) sit beside them and ship with the package."""

from .common import (
    TEMPLATES,
    check_model_card_template,
    describe_hardware,
    mixed_precision,
    training_hyperparameters,
)
from .fuzzy_boolean import (
    DEFAULT_FUZZY_BOOLEAN_TEMPLATE,
    FUZZY_BOOLEAN_ROUTING_POINTS,
    FUZZY_BOOLEAN_TABLE_1,
    build_fuzzy_boolean_model_card,
    fuzzy_boolean_eval_results,
    fuzzy_boolean_results_markdown,
    fuzzy_boolean_routing_section,
    write_fuzzy_boolean_model_card,
)
from .image_classification import (
    DEFAULT_DIGITS_TEMPLATE,
    DEFAULT_IMAGE_CLASSIFICATION_TEMPLATE,
    TaskCardInfo,
    build_digits_model_card,
    digits_eval_results,
    digits_task_info,
    image_task_info,
    write_digits_model_card,
)
from .pgm import DEFAULT_PGM_TEMPLATE, PGM_TABLE_2, pgm_eval_results, write_pgm_model_card

__all__ = [
    "DEFAULT_DIGITS_TEMPLATE",
    "DEFAULT_FUZZY_BOOLEAN_TEMPLATE",
    "DEFAULT_IMAGE_CLASSIFICATION_TEMPLATE",
    "DEFAULT_PGM_TEMPLATE",
    "FUZZY_BOOLEAN_ROUTING_POINTS",
    "FUZZY_BOOLEAN_TABLE_1",
    "PGM_TABLE_2",
    "TEMPLATES",
    "TaskCardInfo",
    "build_digits_model_card",
    "build_fuzzy_boolean_model_card",
    "check_model_card_template",
    "describe_hardware",
    "digits_eval_results",
    "digits_task_info",
    "fuzzy_boolean_eval_results",
    "fuzzy_boolean_results_markdown",
    "fuzzy_boolean_routing_section",
    "image_task_info",
    "mixed_precision",
    "pgm_eval_results",
    "training_hyperparameters",
    "write_digits_model_card",
    "write_fuzzy_boolean_model_card",
    "write_pgm_model_card",
]
