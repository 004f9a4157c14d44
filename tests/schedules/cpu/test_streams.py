"""The memory streams a loop order keeps open around its microkernel calls, and the ranking's
charge for many: a batch walked row by row across images is slower from DRAM than image by
image."""

from polydl.frontends import builders
from polydl.poly.model import build_model
from polydl.schedules.cpu.calls import trip_count
from polydl.schedules.cpu.rank import rank
from polydl.schedules.cpu.streams import FREE_STREAMS, dram_slowdown, open_streams
from polydl.schedules.schedule import MicrokernelBinding, Schedule
from polydl.target import CpuTarget

ZEN4 = CpuTarget(isa="avx512", cores=2)
CALL = MicrokernelBinding("S0", m="q", n="k", k="c", batch=("cb", "r", "s"))


def _pointwise(n: int = 32):
    nest, params = builders.conv2d(N=n, C=32, K=16, H=112, W=112, R=1, S=1, layout="nchw16c")
    return build_model(nest, params)


def _streams(model, order: tuple[str, ...], tiles: dict[str, int] | None = None) -> int:
    schedule = Schedule(order=order, tiles=tuple(sorted((tiles or {}).items())), microkernel=CALL)
    return open_streams(model, schedule, order, {loop: trip_count(model, schedule, loop)
                                                 for loop in order})


def test_rows_across_images_open_a_stream_per_image_and_block() -> None:
    model = _pointwise()
    inner = ("cb", "r", "s", "q", "k", "c")
    # p > n: a row of each of the 32 images (x: 32, y: 32, w: 1; the call's own input blocks
    # are its box, not streams)
    assert _streams(model, ("p", "n", "kb", "q.t") + inner, {"q": 28}) == 32 + 32 + 1
    # n > p: each image's planes are walked in order
    assert _streams(model, ("n", "kb", "p", "q.t") + inner, {"q": 28}) == 1 + 1 + 1
    assert _streams(model, ("n", "p", "kb") + inner) == 1 + 1 + 1


def test_the_slowdown_starts_past_a_few_streams_and_grows_per_doubling() -> None:
    assert dram_slowdown(0) == dram_slowdown(FREE_STREAMS) == 1.0
    assert dram_slowdown(2 * FREE_STREAMS) < dram_slowdown(4 * FREE_STREAMS)
    assert dram_slowdown(16 * FREE_STREAMS) == 2.0


def test_plain_loops_are_not_charged() -> None:
    model = _pointwise()
    order = ("p", "n", "kb", "q", "k", "cb", "c")
    assert open_streams(model, Schedule(order=order), order,
                        {loop: trip_count(model, Schedule(order=order), loop) for loop in order}) == 0


def test_the_ranking_walks_a_large_batch_image_by_image() -> None:
    best = rank(_pointwise(), ZEN4)[0].schedule
    assert best.order.index("n") < best.order.index("p")
