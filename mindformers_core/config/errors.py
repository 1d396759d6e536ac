"""The one error type of the config layer."""


class ConfigError(ValueError):
    """A bad configuration value.

    The message always starts with the full dotted path of the offending key, e.g.
    ``optimizer.betas: expected 2 values in [0, 1), got [0.9]``.
    """

    def __init__(self, path: str, message: str):
        self.path = path
        self.detail = message
        super().__init__(f"{path}: {message}" if path else message)
