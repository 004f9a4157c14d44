"""Weights that the calls read in whole vectors are copied onto a cache line when the caller
gives them off one (a large numpy array starts 16 bytes past a line), where the copy is short
beside the kernel; the results do not depend on where the arrays start."""

from dataclasses import replace

import numpy as np
import pytest

import polydl
from polydl import layouts
from polydl.bench.forward import numpy_conv2d
from polydl.target.host import host_target


def _at(array: np.ndarray, offset: int) -> np.ndarray:
    """A copy of `array` whose data starts `offset` bytes past a cache line."""
    raw = np.empty(array.nbytes + 128, np.uint8)
    start = -raw.ctypes.data % 64 + offset
    view = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    view[...] = array
    return view


TWO_CORES = replace(host_target(), cores=2)


@pytest.mark.parametrize("R, padding", [(1, 0), (3, 1)])
def test_blocked_weights_off_a_line_are_copied_and_the_results_do_not_change(R: int, padding: int) -> None:
    """1 x 1 (calls only) and 3 x 3 (a padded input in scratch beside the copy), called
    again and again with the weights at every offset within a line."""
    N, C, K, H = 4, 32, 64, 28
    kernel = polydl.conv2d(N=N, C=C, K=K, H=H, W=H, R=R, S=R, padding=padding,
                           layout="nchw16c", machine=TWO_CORES)
    body = kernel.source.split("int conv2d(")[1]
    assert "pd_on_line(_pd_given_w, " in body  # the definition reads `w` through the copy
    assert "const float *POLYDL_RESTRICT w)" in kernel.header  # callers see the array's name
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (N, C, H, H)).astype(np.float32)
    w = rng.uniform(-1, 1, (K, C, R, R)).astype(np.float32)
    want = numpy_conv2d(x.astype(np.float64), w.astype(np.float64), 1, padding)
    xb, wb = layouts.to_nchw16c(x), layouts.to_kcrs16c16k(w)
    for offset in (16, 0, 4, 32, 48, 16):
        y = kernel(_at(xb, offset), _at(wb, offset))
        got = layouts.from_nchw16c(y, K)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_copy_made_by_every_thread_gives_the_same_numbers() -> None:
    """Weights of 512 KiB and more are copied in chunks by all the kernel's threads."""
    N, C, K, H = 8, 256, 512, 14
    kernel = polydl.conv2d(N=N, C=C, K=K, H=H, W=H, R=1, S=1, layout="nchw16c",
                           machine=replace(TWO_CORES, cores=1))  # one core: any copy pays
    assert "pd_on_line(_pd_given_w, 131072 * sizeof(float)" in kernel.source
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (N, C, H, H)).astype(np.float32)
    w = rng.uniform(-1, 1, (K, C, 1, 1)).astype(np.float32)
    y = kernel(_at(layouts.to_nchw16c(x), 16), _at(layouts.to_kcrs16c16k(w), 16))
    np.testing.assert_allclose(
        layouts.from_nchw16c(y, K), numpy_conv2d(x.astype(np.float64), w.astype(np.float64), 1, 0), rtol=1e-4, atol=1e-4
    )


def _copies(kernel: polydl.runtime.c.kernel.Kernel) -> bool:  # type: ignore[name-defined]
    return "pd_on_line(_pd_given_" in kernel.source


def test_the_copy_is_made_only_where_it_is_short_beside_the_kernel() -> None:
    """On 16 cores: res3_1x1c's 256 KiB of weights at N=2 (a 0.2 ms layer, 11% slower with the
    copy on the Sapphire Rapids host) stay in place, at N=32 they are copied."""
    spr = polydl.target.CPU_PRESETS["sapphirerapids"]
    layer = dict(C=512, K=128, H=28, W=28, R=1, S=1, layout="nchw16c", machine=spr)
    assert not _copies(polydl.conv2d(N=2, **layer))
    assert _copies(polydl.conv2d(N=32, **layer))


def test_operands_whose_vectors_are_not_on_lines_or_are_packed_are_not_copied() -> None:
    spr = polydl.target.CPU_PRESETS["sapphirerapids"]
    # NCHW: the calls' B is a row of 28 positions, its vectors anywhere within lines
    assert not _copies(polydl.conv2d(N=32, C=128, K=128, H=28, W=28, R=3, S=3, padding=1,
                                     machine=spr))
    # a large GEMM reads B from its packed copy, which starts on a line
    gemm = polydl.matmul(M=1024, N=1024, K=1024, machine=spr)
    assert gemm.schedule.microkernel is not None and gemm.schedule.microkernel.pack_b
    assert not _copies(gemm)


def test_aligned_gives_an_array_on_a_line_and_keeps_one_that_is() -> None:
    w = np.arange(40000, dtype=np.float32).reshape(200, 200)
    off = _at(w, 16)
    on = polydl.aligned(off)
    assert on.ctypes.data % 64 == 0 and on.flags.c_contiguous and on.dtype == np.float32
    np.testing.assert_array_equal(on, w)
    assert polydl.aligned(on) is on
    strided = polydl.aligned(_at(w, 0)[:, ::2])  # not contiguous: copied
    assert strided.flags.c_contiguous and strided.ctypes.data % 64 == 0
    np.testing.assert_array_equal(strided, w[:, ::2])


def test_scalar_code_reads_its_inputs_in_place() -> None:
    generic = polydl.target.CPU_PRESETS["generic"]
    assert generic.isa == "scalar"
    kernel = polydl.conv2d(N=4, C=32, K=64, H=28, W=28, R=1, S=1, layout="nchw16c",
                           machine=replace(generic, cores=2))
    assert not _copies(kernel)


def test_a_copy_that_cannot_be_allocated_is_a_polydl_error() -> None:
    """64 MiB of weights off a line, in a process whose address space has no room for their
    copy: the call fails with polydl's error, before any arithmetic, and the process lives on."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import resource
        from dataclasses import replace
        import numpy as np
        import polydl
        from polydl.target.host import host_target
        k = polydl.conv2d(N=2, C=4096, K=4096, H=28, W=28, R=1, S=1, layout="nchw16c",
                          machine=replace(host_target(), cores=1))
        assert "pd_on_line(_pd_given_w, " in k.source
        x, w = (np.zeros(a.shape, np.float32) for a in k.inputs)
        raw = np.zeros(w.nbytes + 64, np.uint8)
        start = -raw.ctypes.data % 64 + 16
        w = raw[start:start + w.nbytes].view(np.float32).reshape(w.shape)
        y = np.zeros(k.outputs[0].shape, np.float32)
        pages = int(open("/proc/self/statm").read().split()[0])
        room = pages * resource.getpagesize() + (16 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (room, resource.getrlimit(resource.RLIMIT_AS)[1]))
        try:
            k(x, w, y=y)
        except polydl.PolyDLError as exc:
            print("error:", exc)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "error: kernel conv2d could not allocate its scratch memory" in done.stdout
