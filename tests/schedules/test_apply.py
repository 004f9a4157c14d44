import pytest

from polydl.errors import ScheduleError
from polydl.frontends.c_loopnest import parse_c
from polydl.poly.model import build_model
from polydl.schedules.apply import apply_schedule
from polydl.schedules.schedule import MicrokernelBinding, Schedule
from tests.poly.test_model import MATMUL, WAVEFRONT


def mm(**params: int):
    return build_model(parse_c(MATMUL), params or {"M": 8, "N": 8, "K": 8})


def test_default_schedule_parallelises_the_outermost_free_loop() -> None:
    plan = apply_schedule(mm(), Schedule()).main
    assert plan.order == ("i", "j", "k")
    assert plan.parallel_dims == (0,)


def test_reduction_loop_cannot_run_in_parallel() -> None:
    with pytest.raises(ScheduleError, match="carries a dependence"):
        apply_schedule(mm(), Schedule(order=("k", "i", "j"), parallel=("k",)))


def test_permuting_a_reduction_outward_is_legal() -> None:
    plan = apply_schedule(mm(), Schedule(order=("k", "i", "j"), parallel=("i",))).main
    assert plan.order == ("k", "i", "j")


def test_wavefront_cannot_be_interchanged_into_anti_diagonal_order() -> None:
    m = build_model(parse_c(WAVEFRONT), {"N": 6})
    # i > j is the original order; j > i is legal too (both distances are non-negative),
    # but running j backwards is not expressible and a parallel loop is never legal.
    apply_schedule(m, Schedule(order=("j", "i"), parallel=()))
    with pytest.raises(ScheduleError):
        apply_schedule(m, Schedule(order=("i", "j"), parallel=("i",)))
    with pytest.raises(ScheduleError):
        apply_schedule(m, Schedule(order=("i", "j"), parallel=("j",)))


def test_tile_validation() -> None:
    with pytest.raises(ScheduleError, match="not a loop"):
        apply_schedule(mm(), Schedule(tiles=(("x", 4),)))
    with pytest.raises(ScheduleError, match=">= 1"):
        apply_schedule(mm(), Schedule(tiles=(("i", 0),)))
    with pytest.raises(ScheduleError, match="before its point loop"):
        apply_schedule(mm(), Schedule(order=("i", "i.t", "j", "k"), tiles=(("i", 4),)))
    with pytest.raises(ScheduleError, match="exactly once"):
        apply_schedule(mm(), Schedule(order=("i", "j")))


def test_microkernel_loops_must_be_innermost() -> None:
    mk = MicrokernelBinding("S0", m="i", n="j", k="k")
    with pytest.raises(ScheduleError, match="innermost"):
        apply_schedule(
            mm(),
            Schedule(order=("i", "j.t", "j", "k"), tiles=(("j", 4),), microkernel=mk, parallel=()),
        )
    plan = apply_schedule(mm(), Schedule(order=("i", "j", "k"), microkernel=mk, parallel=())).main
    assert "S0" in plan.calls


def test_schedule_json_round_trip() -> None:
    s = Schedule(
        order=("i.t", "j", "k", "i"),
        tiles=(("i", 16),),
        parallel=("i.t",),
        microkernel=MicrokernelBinding("S0", "i", "j", "k", ("b",)),
        notes=(("cost", 3),),
    )
    assert Schedule.from_json(s.to_json()) == s
