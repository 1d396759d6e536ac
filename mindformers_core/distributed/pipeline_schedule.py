"""Pipeline-parallel schedules as pure functions: the ordered compute actions of one rank.

Pure (no MindSpore). ``pp`` stages (ranks of the pipeline group), ``vpp`` model chunks per
stage (``pipeline_parallel_interleave_num``), ``V = pp * vpp`` virtual stages. Virtual stage
``v`` holds chunk ``v // pp`` of stage ``v % pp`` (upstream's numbering: chunk ``c`` of rank
``s`` is virtual stage ``c * pp + s``), so activations go ``v -> v + 1``: stage ``s`` to
``s + 1``, and from the last stage back to stage 0 for the next chunk.

``1f1b`` (``vpp`` 1): stage ``s`` runs ``w = min(pp - s - 1, M)`` warm-up forwards, then
alternates one forward and one backward, then ``w`` cool-down backwards, so it holds at most
``pp - s`` micro-batches' activations (``M`` micro-batches, ``M >= 1``).

``interleaved_1f1b`` (Megatron's order): the ``M * vpp`` forwards of a stage go through the
chunks in groups of ``pp`` micro-batches,

    forward k  -> chunk (k // pp) % vpp,        micro (k // (pp * vpp)) * pp + k % pp
    backward k -> chunk vpp - 1 - (k // pp) % vpp, same micro

with ``w = min((pp - s - 1) * 2 + (vpp - 1) * pp, M * vpp)`` warm-up forwards (all of them when
``M == pp``), then 1F1B, then the cool-down. ``M`` must be a multiple of ``pp`` (upstream's
rule), so the groups are whole. ``pipeline_parallel_schedule`` names the family: ``1f1b``
and ``interleaved_1f1b`` both run interleaved 1F1B when ``vpp > 1`` and plain 1F1B otherwise.

:func:`p2p_program` turns the schedules of all ranks into each rank's program of compute and
transfer operations, ordered by one simulated global timeline, so every pair of ranks issues
its transfers in the same order: with rendezvous transfers (the CPU send/recv is an all-reduce
over the pair) no rank waits for a transfer its peer issues later (deadlock-free by
construction; :func:`run_programs` checks it).
"""
from __future__ import annotations

from typing import Dict, Iterator, List, NamedTuple, Tuple

from ..core.pipeline_split import warmup_forwards

__all__ = ["Action", "Transfer", "SCHEDULES", "one_f_one_b", "interleaved_one_f_one_b",
           "schedule", "check_schedule_args", "virtual_stage", "stage_of", "p2p_program",
           "run_programs", "peak_in_flight"]

FORWARD, BACKWARD = "forward", "backward"
SCHEDULES = ("1f1b", "interleaved_1f1b")


class Action(NamedTuple):
    """One compute step of a rank: ``kind`` forward|backward of ``micro`` on ``chunk``."""
    stage: int
    chunk: int
    micro: int
    kind: str


class Transfer(NamedTuple):
    """A tensor going from virtual stage ``src_v`` to ``dst_v`` (an activation forward or an
    output gradient backward) of micro-batch ``micro``, between global ``src`` and ``dst``."""
    src: int
    dst: int
    src_v: int
    dst_v: int
    micro: int
    kind: str        # FORWARD: an activation; BACKWARD: a gradient


def virtual_stage(pp: int, stage: int, chunk: int) -> int:
    return chunk * pp + stage


def stage_of(pp: int, v: int) -> Tuple[int, int]:
    """(stage, chunk) of virtual stage ``v``."""
    return v % pp, v // pp


def check_schedule_args(pp: int, num_micro: int, vpp: int = 1, name: str = "1f1b") -> None:
    """Raise ValueError with upstream's wording when the schedule cannot run."""
    if name not in SCHEDULES:
        raise ValueError(f"pipeline_parallel_schedule must be one of {list(SCHEDULES)}, "
                         f"got {name!r}")
    if pp < 1 or vpp < 1 or num_micro < 1:
        raise ValueError(f"pipeline_parallel({pp}), pipeline_parallel_interleave_num({vpp}) and "
                         f"the number of micro-batches({num_micro}) must be positive")
    if vpp > 1 and pp == 1:
        raise ValueError("pipeline_parallel_interleave_num > 1 needs pipeline_parallel > 1")
    if vpp > 1 and num_micro % pp:
        raise ValueError(f"number of microbatches ({num_micro}) is not divisible by "
                         f"pipeline-model-parallel-size ({pp}) when using interleaved schedule")


def _interleave(warmup: int, total: int, fwd, bwd) -> Iterator[Tuple[str, int]]:
    """``warmup`` forwards, then forward/backward pairs, then the remaining backwards."""
    for k in range(warmup):
        yield fwd(k)
    for k in range(total - warmup):
        yield fwd(warmup + k)
        yield bwd(k)
    for k in range(total - warmup, total):
        yield bwd(k)


def one_f_one_b(pp: int, stage: int, num_micro: int) -> Iterator[Action]:
    """Stage ``stage``'s actions under 1F1B (module docstring)."""
    check_schedule_args(pp, num_micro, 1)
    warmup = warmup_forwards(pp, stage, num_micro)
    yield from _interleave(warmup, num_micro,
                           lambda k: Action(stage, 0, k, FORWARD),
                           lambda k: Action(stage, 0, k, BACKWARD))


def interleaved_one_f_one_b(pp: int, stage: int, num_micro: int, vpp: int) -> Iterator[Action]:
    """Stage ``stage``'s actions under interleaved 1F1B with ``vpp`` chunks."""
    check_schedule_args(pp, num_micro, vpp, "interleaved_1f1b")
    total = num_micro * vpp
    warmup = warmup_forwards(pp, stage, num_micro, vpp)

    def micro(k):
        return (k // (pp * vpp)) * pp + k % pp

    yield from _interleave(
        warmup, total,
        lambda k: Action(stage, (k // pp) % vpp, micro(k), FORWARD),
        lambda k: Action(stage, vpp - 1 - (k // pp) % vpp, micro(k), BACKWARD))


def schedule(name: str, pp: int, stage: int, num_micro: int, vpp: int = 1) -> List[Action]:
    """The actions of ``stage`` under ``pipeline_parallel_schedule`` ``name``: with ``vpp > 1``
    chunks both names run the interleaved order (as Megatron's 1F1B with a virtual pipeline
    size), with one chunk both run plain 1F1B."""
    check_schedule_args(pp, num_micro, vpp, name)
    if vpp == 1:
        return list(one_f_one_b(pp, stage, num_micro))
    return list(interleaved_one_f_one_b(pp, stage, num_micro, vpp))


def peak_in_flight(actions) -> int:
    """The most micro-batch activations (over all chunks) held at once by these actions."""
    held = peak = 0
    for a in actions:
        held += 1 if a.kind == FORWARD else -1
        peak = max(peak, held)
    return peak


# -- transfers --------------------------------------------------------------------------------
def _needs(a: Action, pp: int, vpp: int):
    """The (virtual stage, micro, kind) action that must run before ``a`` on another rank or
    chunk, or None."""
    v = virtual_stage(pp, a.stage, a.chunk)
    if a.kind == FORWARD:
        return (v - 1, a.micro, FORWARD) if v > 0 else None
    if v == pp * vpp - 1:
        return (v, a.micro, FORWARD)   # the loss of the same stage
    return (v + 1, a.micro, BACKWARD)


def p2p_program(schedules: Dict[int, List[Action]], pp: int, vpp: int,
                ranks: Dict[int, int]) -> Dict[int, List[object]]:
    """Each stage's program: its ``Action``s with the ``Transfer``s it takes part in.

    ``schedules``: stage -> actions; ``ranks``: stage -> global rank. Every rank runs one
    action per tick as soon as what it needs finished on an earlier tick; transfers are issued
    right after the action producing them, in one global order (tick, source virtual stage,
    kind), so every rank's transfers are a subsequence of that one order. A transfer between
    two chunks of the same rank is no transfer (the value stays local).
    """
    done: Dict[tuple, int] = {}
    pos = {s: 0 for s in schedules}
    programs: Dict[int, List[object]] = {s: [] for s in schedules}
    tick = 0
    total = sum(len(a) for a in schedules.values())
    while len(done) < total:
        ran = []
        for s in sorted(schedules):
            if pos[s] == len(schedules[s]):
                continue
            a = schedules[s][pos[s]]
            need = _needs(a, pp, vpp)
            if need is None or done.get(need, tick) < tick:
                ran.append(a)
        if not ran:
            raise RuntimeError(f"pipeline schedule deadlocks at tick {tick}: "
                               f"{[schedules[s][pos[s]] for s in schedules if pos[s] < len(schedules[s])]}")
        sends = []
        for a in ran:
            v = virtual_stage(pp, a.stage, a.chunk)
            done[(v, a.micro, a.kind)] = tick
            pos[a.stage] += 1
            programs[a.stage].append(a)
            dst_v = v + 1 if a.kind == FORWARD else v - 1
            if 0 <= dst_v < pp * vpp:
                dst_stage = stage_of(pp, dst_v)[0]
                if dst_stage != a.stage:
                    sends.append(Transfer(ranks[a.stage], ranks[dst_stage], v, dst_v, a.micro,
                                          a.kind))
        for t in sorted(sends, key=lambda t: (t.src_v, t.kind)):
            programs[stage_of(pp, t.src_v)[0]].append(t)
            programs[stage_of(pp, t.dst_v)[0]].append(t)
        tick += 1
    return programs


def run_programs(programs: Dict[int, List[object]], ranks: Dict[int, int]) -> int:
    """Execute the programs with rendezvous transfers (both ends must have the transfer next);
    returns the number of rounds, raises RuntimeError on a deadlock or a mismatched pair."""
    pos = {s: 0 for s in programs}
    stage_of_rank = {r: s for s, r in ranks.items()}
    rounds = 0
    while any(pos[s] < len(programs[s]) for s in programs):
        progressed = False
        for s in sorted(programs):
            while pos[s] < len(programs[s]) and isinstance(programs[s][pos[s]], Action):
                pos[s] += 1
                progressed = True
            if pos[s] == len(programs[s]):
                continue
            t = programs[s][pos[s]]
            peer = stage_of_rank[t.dst if ranks[s] == t.src else t.src]
            if pos[peer] < len(programs[peer]) and programs[peer][pos[peer]] == t and peer != s:
                pos[s] += 1
                pos[peer] += 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline programs deadlock: " + str(
                {s: programs[s][pos[s]] for s in programs if pos[s] < len(programs[s])}))
        rounds += 1
    return rounds
