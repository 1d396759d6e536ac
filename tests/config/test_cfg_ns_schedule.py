"""normalize_ns_schedule: both forms and upstream MindFormers' messages."""
import pytest

from mindformers_core.core.ns_schedule import (NS_COEFFICIENT_PRESETS, normalize_ns_schedule,
                                                preset_schedule)

ABC = (3.4445, -4.7750, 2.0315)


def test_flat_repeated_ns_steps_times():
    assert normalize_ns_schedule(list(ABC), 5) == [ABC] * 5
    assert normalize_ns_schedule(ABC, 1) == [ABC]


def test_segmented_counts_give_steps_dsv4():
    sched = normalize_ns_schedule([[list(ABC), 8], [[2.0, -1.5, 0.5], 2]], ns_steps=5)
    assert len(sched) == 10
    assert sched[:8] == [ABC] * 8 and sched[8:] == [(2.0, -1.5, 0.5)] * 2
    assert sched == NS_COEFFICIENT_PRESETS["deepseekv4"]


@pytest.mark.parametrize("coeffs, steps, msg", [
    ([], 5, "ns_coefficients must be a non-empty list/tuple, got [].",),
    ("abc", 5, "ns_coefficients must be a non-empty list/tuple, got 'abc'."),
    (3.0, 5, "ns_coefficients must be a non-empty list/tuple, got 3.0."),
    ([1.0, 2.0], 5, "flat ns_coefficients must have 3 elements, got [1.0, 2.0]."),
    ([1.0, 2.0, 3.0], 0, "ns_steps must be positive, got 0."),
    ([1.0, 2.0, 3.0], -1, "ns_steps must be positive, got -1."),
    ([[1.0, 2.0, 3.0]], 5, "segmented ns_coefficients entry 0 must be [[a, b, c], count], "
                           "got [1.0, 2.0, 3.0]."),
    ([[[1.0, 2.0], 3]], 5, "segmented ns_coefficients entry 0 must hold a 3-element triple, "
                           "got [1.0, 2.0]."),
    ([[[1.0, 2.0, 3.0], 2], [[1.0, 2.0, 3.0], 0]], 5,
     "segmented ns_coefficients entry 1 count must be positive, got 0."),
    ([[[1.0, 2.0, 3.0], "x"]], 5, "segmented ns_coefficients entry 0 count must be positive, "
                                  "got 'x'."),
    ([True, 2.0, 3.0], 5, "segmented ns_coefficients entry 0 must be [[a, b, c], count], "
                          "got True."),
    ([1.0, "b", 3.0], 5, "flat ns_coefficients must hold 3 finite numbers"),
    ([[[1.0, float("nan"), 3.0], 2]], 5, "segmented ns_coefficients entry 0 must hold 3 finite"),
])
def test_messages(coeffs, steps, msg):
    with pytest.raises(ValueError) as info:
        normalize_ns_schedule(coeffs, steps)
    assert str(info.value).startswith(msg)


def test_preset_cycles_over_steps():
    q = NS_COEFFICIENT_PRESETS["quintic"]
    assert preset_schedule("quintic", 7) == q + q[:2]
    assert preset_schedule("simple", 3) == [ABC] * 3
    with pytest.raises(ValueError, match="unknown Newton-Schulz coefficient preset 'quintik'"):
        preset_schedule("quintik", 5)
