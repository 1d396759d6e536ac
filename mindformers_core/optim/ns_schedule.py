"""Newton-Schulz coefficient schedules: the pure rules of :mod:`mindformers_core.core.ns_schedule`,
re-exported next to the optimizers that use them."""
from ..core.ns_schedule import (DEFAULT_NS_COEFFICIENTS, MAX_NS_STEPS, NS_COEFFICIENT_PRESETS,
                                normalize_ns_schedule, preset_schedule)

__all__ = ["DEFAULT_NS_COEFFICIENTS", "NS_COEFFICIENT_PRESETS", "normalize_ns_schedule",
           "preset_schedule", "MAX_NS_STEPS"]
