"""The one error type of the config layer (defined in the leaf module ``mindformers_core.errors``
so that the LR schedules and the optimizers raise it without importing the config layer)."""
from ..errors import ConfigError

from ..errors import MAX_MESSAGE_CHARS, truncate_message

__all__ = ["ConfigError", "MAX_MESSAGE_CHARS", "truncate_message"]
