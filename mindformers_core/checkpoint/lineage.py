"""Which checkpoints of a directory belong to the line of training that is being continued.

A run's id (``trainer/run_dir.py``) is kept by every resume of it, so the id alone cannot tell
an abandoned branch from the current one: resume from an older step with a new lr into the
same directory and the old branch's newer checkpoints are still there. Every checkpoint
therefore records its *lineage* in its metadata (``lineage``, JSON):

* ``chain``: ``[[session, first_step], ...]``: the training sessions (one process each, a
  fresh id per start) whose steps led to this checkpoint, oldest first, each with the step it
  started from (0 for a run from scratch; the resumed checkpoint's step otherwise);
* ``parent``: the checkpoint this session resumed from (``name``, ``step``, ``run_id``), or null.

A checkpoint written before lineages were recorded counts as the chain
``[["run:<run id>", 0]]``: its run's checkpoints form one line, as before.

``X`` is on ``Y``'s line (an ancestor, :func:`is_ancestor`) when ``X`` is not newer and ``Y``'s
chain up to ``X``'s step is ``X``'s chain. A directory resume (:func:`resume_order`) takes the
heads (checkpoints no other one descends from); a head whose session was branched off at an
earlier step by another head's session is abandoned (the branch was made later, from an
older checkpoint: :func:`supersedes`); one head left is the newest of the current line, two
are an ambiguity that is refused naming both. Pruning (``store.prune_checkpoints``) counts
only the current line.
"""
from __future__ import annotations

import json
import os
from typing import List, Optional, Sequence, Tuple

from .file_io import CheckpointError, read_header

__all__ = ["Lineage", "start_lineage", "lineage_json", "read_lineage", "is_ancestor",
           "supersedes", "on_line", "resume_order"]

Chain = Tuple[Tuple[str, int], ...]


class Lineage:
    """One checkpoint's place: its step and chain (module docstring)."""

    def __init__(self, step: int, chain: Sequence, parent: Optional[dict] = None):
        self.step = int(step)
        self.chain: Chain = tuple((str(s), int(f)) for s, f in chain)
        self.parent = parent

    def prefix(self, step: int) -> Chain:
        """The chain of this line's state at ``step`` (sessions that started before it)."""
        kept = tuple(e for e in self.chain if e[1] < step)
        return kept or self.chain[:1]


def start_lineage(session: str, loaded) -> dict:
    """The ``lineage`` of the checkpoints a session writes: a fresh chain, or (``loaded``:
    the checkpoint it resumes from) that checkpoint's chain plus this session."""
    if loaded is None or getattr(loaded, "weights_only", False):
        return {"chain": [[session, 0]], "parent": None}
    chain = [list(e) for e in (loaded.lineage or {}).get("chain") or
             [[f"run:{loaded.run_id or 'unknown'}", 0]]]
    return {"chain": chain + [[session, int(loaded.step)]],
            "parent": {"name": os.path.basename(loaded.path), "step": int(loaded.step),
                       "run_id": loaded.run_id}}


def lineage_json(lineage: Optional[dict]) -> Optional[str]:
    return None if lineage is None else json.dumps(lineage, sort_keys=True)


def read_lineage(path: str) -> Optional[Lineage]:
    """The lineage in a checkpoint's header (legacy files: their run's chain); None when the
    header cannot be read (a damaged file: the resume tries and reports it)."""
    try:
        meta = read_header(path, os.path.getsize(path))["__metadata__"]
        step = int(meta["step"])
        raw = meta.get("lineage")
        if raw is None:
            return Lineage(step, [[f"run:{meta.get('run_id') or 'unknown'}", 0]])
        data = json.loads(raw)
        return Lineage(step, data["chain"], data.get("parent"))
    except (CheckpointError, OSError, KeyError, TypeError, ValueError):
        return None


def is_ancestor(x: Lineage, y: Lineage) -> bool:
    """``x`` is ``y`` or lies on ``y``'s line before it."""
    return x.step <= y.step and y.prefix(x.step) == x.chain


def on_line(x: Lineage, chain: Sequence) -> bool:
    """``x`` lies on the line of a session whose chain is ``chain`` (at any later step)."""
    return Lineage(1 << 62, chain).prefix(x.step) == x.chain


def supersedes(y: Lineage, x: Lineage) -> bool:
    """``y``'s line branched off ``x``'s at a step before ``x``: ``y`` continues an older
    checkpoint of ``x``'s session, so ``x``'s branch was abandoned when ``y``'s began."""
    k = 0
    while k < min(len(x.chain), len(y.chain)) and x.chain[k] == y.chain[k]:
        k += 1
    if k == 0 or k == len(y.chain):
        return False
    fork = y.chain[k][1]
    return fork < x.step and (k == len(x.chain) or x.chain[k][1] > fork)


def _describe(path: str, lin: Lineage) -> str:
    return f"{path} (step {lin.step}, session {lin.chain[-1][0]})"


def resume_order(found: List[Tuple[int, str]], directory: str, log=None) -> List[str]:
    """The checkpoints of ``found`` (``(step, path)``, oldest first) a directory resume tries,
    best first: the head of the current line, then its line newest first; files whose header
    cannot be read keep their place by step (they are tried and reported). Checkpoints of an
    abandoned branch are left out (``log``: one line each). :class:`CheckpointError` naming
    both when two heads remain."""
    lins = {path: read_lineage(path) for _, path in found}
    known = [(p, lin) for p, lin in lins.items() if lin is not None]
    heads = [(p, lin) for p, lin in known
             if not any(q != p and is_ancestor(lin, other) for q, other in known)]
    live = [(p, lin) for p, lin in heads
            if not any(q != p and supersedes(other, lin) for q, other in heads)]
    if len(live) > 1:
        live.sort(key=lambda item: -item[1].step)
        (a, la), (b, lb) = live[:2]
        raise CheckpointError(
            f"checkpoint.load_path: {directory} holds two lines of training and it is not clear "
            f"which one to continue: {_describe(a, la)} and {_describe(b, lb)}; set "
            "checkpoint.load_path to the file to resume")
    order = []
    head = live[0][1] if live else None
    for step, path in reversed(found):
        lin = lins[path]
        if lin is None or head is None or is_ancestor(lin, head):
            order.append(path)
        elif log is not None:
            log(f"checkpoint.load_path: not resuming {path} (step {step}): it is on an "
                f"abandoned branch; the current line continues from "
                f"{_describe(live[0][0], head)}")
    return order
