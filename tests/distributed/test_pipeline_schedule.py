"""The pipeline schedules alone: order, transfers, in-flight activations, upstream's rules."""
import itertools

import pytest

from mindformers_core.core.pipeline_split import peak_in_flight_bound

from mindformers_core.distributed.pipeline_schedule import (
    Action, Transfer, check_schedule_args, p2p_program, peak_in_flight, run_programs, schedule,
    stage_of, virtual_stage)

CASES_1F1B = [(pp, m) for pp in (1, 2, 3, 4) for m in (1, 2, 3, 4, 7, 8)]
CASES_INTERLEAVED = [(pp, m, v) for pp in (2, 3, 4) for v in (2, 3) for m in (pp, 2 * pp, 3 * pp)]


def all_schedules(name, pp, m, vpp=1):
    return {s: schedule(name, pp, s, m, vpp) for s in range(pp)}


@pytest.mark.parametrize("name,pp,m,vpp", [("1f1b", pp, m, 1) for pp, m in CASES_1F1B]
                         + [("interleaved_1f1b", pp, m, v) for pp, m, v in CASES_INTERLEAVED])
def test_each_forward_once_and_before_its_backward(name, pp, m, vpp):
    for s, acts in all_schedules(name, pp, m, vpp).items():
        assert all(a.stage == s for a in acts)
        want = {(c, j) for c in range(vpp) for j in range(m)}
        fwd = [(a.chunk, a.micro) for a in acts if a.kind == "forward"]
        bwd = [(a.chunk, a.micro) for a in acts if a.kind == "backward"]
        assert sorted(fwd) == sorted(want) and sorted(bwd) == sorted(want)
        for key in want:
            i_f = acts.index(Action(s, key[0], key[1], "forward"))
            i_b = acts.index(Action(s, key[0], key[1], "backward"))
            assert i_f < i_b


@pytest.mark.parametrize("pp,m", CASES_1F1B)
def test_1f1b_holds_at_most_pp_minus_stage_activations(pp, m):
    for s, acts in all_schedules("1f1b", pp, m).items():
        assert peak_in_flight(acts) == min(pp - s, m) == peak_in_flight_bound(pp, s, m)


def test_1f1b_order_closed_form():
    # pp 4, 8 micro-batches, stage 1: 2 warm-up forwards, then 1F1B, then 2 backwards
    got = [(a.kind[0], a.micro) for a in schedule("1f1b", 4, 1, 8)]
    assert got == [("f", 0), ("f", 1), ("f", 2), ("b", 0), ("f", 3), ("b", 1), ("f", 4),
                   ("b", 2), ("f", 5), ("b", 3), ("f", 6), ("b", 4), ("f", 7), ("b", 5),
                   ("b", 6), ("b", 7)]


def test_interleaved_order_closed_form():
    # pp 2, vpp 2, 4 micro-batches, stage 0: warm-up (2-0-1)*2 + (2-1)*2 = 4 forwards
    got = [(a.kind[0], a.chunk, a.micro) for a in schedule("interleaved_1f1b", 2, 0, 4, 2)]
    assert got == [("f", 0, 0), ("f", 0, 1), ("f", 1, 0), ("f", 1, 1),
                   ("f", 0, 2), ("b", 1, 0), ("f", 0, 3), ("b", 1, 1),
                   ("f", 1, 2), ("b", 0, 0), ("f", 1, 3), ("b", 0, 1),
                   ("b", 1, 2), ("b", 1, 3), ("b", 0, 2), ("b", 0, 3)]


@pytest.mark.parametrize("pp,m,vpp", CASES_INTERLEAVED)
def test_interleaved_peak_is_the_warmup_plus_one(pp, m, vpp):
    for s, acts in all_schedules("interleaved_1f1b", pp, m, vpp).items():
        total = m * vpp
        warmup = total if m == pp else min((pp - s - 1) * 2 + (vpp - 1) * pp, total)
        assert peak_in_flight(acts) == min(warmup + 1, total) == \
            peak_in_flight_bound(pp, s, m, vpp)
        # fewer than GPipe's all-forwards-first once there are more micro-batches than stages
        if m > pp:
            assert peak_in_flight(acts) < total


def transfers_are_consistent(name, pp, m, vpp):
    scheds = all_schedules(name, pp, m, vpp)
    ranks = {s: 10 + s for s in range(pp)}    # global ranks need not be the stage numbers
    programs = p2p_program(scheds, pp, vpp, ranks)
    for s in range(pp):   # the compute order is the schedule's
        assert [a for a in programs[s] if isinstance(a, Action)] == scheds[s]
    sends = {}
    for s, prog in programs.items():
        for op in prog:
            if isinstance(op, Transfer):
                assert ranks[s] in (op.src, op.dst)
                sends.setdefault(op, set()).add(s)
    # every transfer appears in exactly its two ends' programs, between neighbours v -> v +- 1
    for t, ends in sends.items():
        assert ends == {stage_of(pp, t.src_v)[0], stage_of(pp, t.dst_v)[0]}
        assert abs(t.src_v - t.dst_v) == 1
        assert (t.dst_v > t.src_v) == (t.kind == "forward")
    V = pp * vpp
    want = (V - 1) * m * 2 if pp > 1 else 0
    assert len(sends) == want
    # each receive comes before the action that consumes it, each send after the producer
    for s, prog in programs.items():
        for i, op in enumerate(prog):
            if isinstance(op, Transfer) and stage_of(pp, op.dst_v)[0] == s:
                c = stage_of(pp, op.dst_v)[1]
                consumer = Action(s, c, op.micro, op.kind)
                assert prog.index(consumer) > i
            if isinstance(op, Transfer) and stage_of(pp, op.src_v)[0] == s:
                c = stage_of(pp, op.src_v)[1]
                assert prog.index(Action(s, c, op.micro, op.kind)) < i
    assert run_programs(programs, ranks) > 0


@pytest.mark.parametrize("pp,m", CASES_1F1B)
def test_1f1b_sends_match_receives_without_deadlock(pp, m):
    transfers_are_consistent("1f1b", pp, m, 1)


@pytest.mark.parametrize("pp,m,vpp", CASES_INTERLEAVED)
def test_interleaved_sends_match_receives_without_deadlock(pp, m, vpp):
    transfers_are_consistent("interleaved_1f1b", pp, m, vpp)


def test_run_programs_detects_a_crossed_order():
    """The checker is real: two ranks that both receive first never meet."""
    a = Transfer(0, 1, 0, 1, 0, "forward")
    b = Transfer(1, 0, 1, 0, 0, "backward")
    with pytest.raises(RuntimeError, match="deadlock"):
        run_programs({0: [b, a], 1: [a, b]}, {0: 0, 1: 1})


def test_the_schedule_name_is_the_family_the_chunks_decide():
    assert schedule("1f1b", 2, 0, 4, 2) == schedule("interleaved_1f1b", 2, 0, 4, 2)
    assert schedule("interleaved_1f1b", 4, 1, 8, 1) == schedule("1f1b", 4, 1, 8, 1)


def test_virtual_stage_numbering_is_upstreams():
    # chunk c of rank s is virtual stage c * pp + s
    assert [virtual_stage(4, s, c) for c, s in itertools.product(range(2), range(4))] == \
        list(range(8))
    assert stage_of(4, 6) == (2, 1)


@pytest.mark.parametrize("args,msg", [
    ((2, 3, 2, "interleaved_1f1b"), r"number of microbatches \(3\) is not divisible by "
                                    r"pipeline-model-parallel-size \(2\) when using interleaved "
                                    r"schedule"),
    ((2, 3, 2, "1f1b"), r"number of microbatches \(3\) is not divisible"),
    ((1, 4, 2, "interleaved_1f1b"), "needs pipeline_parallel > 1"),
    ((2, 0, 1, "1f1b"), "must be positive"),
    ((2, 4, 1, "gpipe"), r"must be one of \['1f1b', 'interleaved_1f1b'\]"),
])
def test_schedule_rules_messages(args, msg):
    with pytest.raises(ValueError, match=msg):
        check_schedule_args(*args)
