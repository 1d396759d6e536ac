"""The one error type of the config layer."""

#: longest message kept; a longer one (a huge value repr()'d into it) is cut in the middle
MAX_MESSAGE_CHARS = 2000


def truncate_message(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` if it is at most ``limit`` characters, else its head and tail around a
    ``... [N characters cut] ...`` marker (the result stays within ``limit`` + 40)."""
    if len(text) <= limit:
        return text
    head, tail = text[:limit * 3 // 4], text[-(limit // 4):]
    return f"{head} ... [{len(text) - len(head) - len(tail)} characters cut] ... {tail}"


class ConfigError(ValueError):
    """A bad configuration value.

    The message always starts with the full dotted path of the offending key, e.g.
    ``optimizer.betas: expected 2 values in [0, 1), got [0.9]``.
    """

    def __init__(self, path: str, message: str):
        self.path = path
        self.detail = truncate_message(message)
        super().__init__(f"{path}: {self.detail}" if path else self.detail)
