"""Extract fenced code blocks from Markdown and the commands inside shell blocks.

A block may be preceded (on the line just above its opening fence, blank lines allowed) by an
HTML comment that says how the docs test treats it:

* ``<!-- check: invalid -->``: a YAML config block that must FAIL to load (troubleshooting
  examples); the test asserts a ``ConfigError``.
* ``<!-- check: fragment -->``: YAML that is only a fragment of a section (not checked
  beyond parsing).
* ``<!-- check: skip -->``: not checked at all (output samples, placeholders).
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import List, Optional

_FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)\s*$")
_MARK = re.compile(r"<!--\s*check:\s*(\w+)\s*-->")


@dataclass
class Block:
    path: str
    line: int          # 1-based line of the opening fence
    lang: str
    text: str
    mark: Optional[str]

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def code_blocks(path: str) -> List[Block]:
    """Every fenced block of the Markdown file ``path`` (unterminated fences are an error)."""
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(2), m.group(3).lower(), i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        if i >= len(lines):
            raise ValueError(f"{path}:{start + 1}: unterminated code fence")
        blocks.append(Block(path, start + 1, lang, "\n".join(body), _mark_before(lines, start)))
        i += 1
    return blocks


def _mark_before(lines: List[str], fence_index: int) -> Optional[str]:
    j = fence_index - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    if j >= 0:
        m = _MARK.search(lines[j])
        if m:
            return m.group(1)
    return None


def shell_commands(text: str) -> List[List[str]]:
    """The commands of a shell block as argv lists: comments and blank lines dropped,
    backslash continuations joined, ``&&`` / ``;`` / ``|`` split into separate commands,
    leading ``VAR=value`` assignments dropped."""
    joined, buf = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        joined.append(buf + line)
        buf = ""
    if buf:
        joined.append(buf)
    commands = []
    for line in joined:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        lexer = shlex.shlex(stripped, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        current: List[str] = []
        for tok in lexer:
            if tok and set(tok) <= set(";&|"):
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(tok)
        if current:
            commands.append(current)
    out = []
    for argv in commands:
        while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
            argv = argv[1:]
        if argv:
            out.append(argv)
    return out
