"""YAML reading with the YAML 1.2 core schema for plain scalars, and bounded alias expansion.

PyYAML implements YAML 1.1, whose implicit types silently change values in a config:
``1:30`` is the sexagesimal int 90, ``010`` the octal 8, ``0x10`` 16, ``yes``/``on``/``off``
booleans, ``2024-01-01`` a date, and ``1e-5`` a *string*. Here a plain scalar resolves as in
the YAML 1.2 core schema, restricted to decimal numbers:

* ``null``: ``~``, ``null``, ``Null``, ``NULL`` or empty;
* bool: ``true``/``True``/``TRUE``/``false``/``False``/``FALSE`` only;
* int: ``[-+]?[0-9]+``, always decimal (``010`` is 10);
* float: ``1.5``, ``1e-5``, ``-2.E+3``, ``.5``, ``.inf``/``-.inf``, ``.nan``;
* everything else is a string. ``1:30``, ``0x10``, ``0o17``, ``1_000``, ``yes`` and
  ``2024-01-01`` stay strings, so a numeric or boolean field given one is an error naming the
  field ("expected an int, got str ('1:30')") instead of a silently different number.

Aliases: ``*x`` shares the anchored node, so a few lines (a "billion laughs") can describe an
exponentially large tree that every later walk (validation, error messages) expands. The
loader counts the nodes of the expanded document and refuses more than
:data:`MAX_EXPANDED_NODES` (a real config has a few hundred), and refuses self-referencing
aliases, before anything walks the tree.
"""
from __future__ import annotations

import re
from typing import Any

import yaml

__all__ = ["FloatSafeLoader", "load_yaml_text", "parse_yaml_value", "MAX_EXPANDED_NODES"]

#: nodes an expanded document may have (aliases counted as often as they are used)
MAX_EXPANDED_NODES = 100_000

_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT = re.compile(r"^[-+]?[0-9]+$")
_FLOAT = re.compile(r"""^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?
                        |[-+]?\.(?:inf|Inf|INF)
                        |\.(?:nan|NaN|NAN))$""", re.X)


class FloatSafeLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core plain scalars and bounded alias expansion (see above)."""

    def compose_document(self):
        node = super().compose_document()
        _check_expansion(node)
        return node

    def construct_yaml_int(self, node):
        return int(self.construct_scalar(node), 10)   # decimal only: "010" is 10


# A resolver table of our own (the stock SafeLoader is unchanged): YAML 1.2 core, decimal.
FloatSafeLoader.yaml_implicit_resolvers = {}
for _tag, _regexp, _first in (
        ("tag:yaml.org,2002:null", _NULL, ["~", "n", "N", ""]),
        ("tag:yaml.org,2002:bool", _BOOL, list("tTfF")),
        ("tag:yaml.org,2002:int", _INT, list("-+0123456789")),
        ("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789.")),
        ("tag:yaml.org,2002:merge", re.compile(r"^(?:<<)$"), ["<"])):
    FloatSafeLoader.add_implicit_resolver(_tag, _regexp, _first)
FloatSafeLoader.add_constructor("tag:yaml.org,2002:int", FloatSafeLoader.construct_yaml_int)


class _ExpansionError(yaml.YAMLError):
    def __init__(self, problem: str, mark):
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark


def _check_expansion(root) -> None:
    """Count the expanded size of the node graph (shared nodes once per use, memoised)."""
    if root is None:
        return
    sizes, active = {}, set()

    def size(node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise _ExpansionError("an alias refers to a node that contains it (a "
                                  "self-referencing anchor)", node.start_mark)
        active.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = ()
        for child in children:
            total += size(child)
            if total > MAX_EXPANDED_NODES:
                raise _ExpansionError(
                    f"the document expands to more than {MAX_EXPANDED_NODES:,} nodes through "
                    "its aliases (an alias bomb?)", node.start_mark)
        active.discard(key)
        sizes[key] = total
        return total

    size(root)


def load_yaml_text(text: str) -> Any:
    """Parse a YAML document with :class:`FloatSafeLoader`."""
    return yaml.load(text, Loader=FloatSafeLoader)  # noqa: S506 - SafeLoader subclass


def parse_yaml_value(text: str) -> Any:
    """Parse the value of a ``--set key=value`` override as YAML (``[0.9,0.999]``, ``null``,
    ``True``, ``1e-5``); an empty string stays an empty string."""
    if text == "":
        return ""
    return load_yaml_text(text)
