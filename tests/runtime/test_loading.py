"""A process that called kernels exits cleanly whatever OpenMP's idle threads do: the
libraries, and the OpenMP runtime they brought in, stay mapped past the interpreter's exit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CALLS = {
    "kernel": "import numpy as np, polydl\n"
              "k = polydl.matmul(64, 64, 64)\n"
              "a = np.ones((64, 64), np.float32)\n"
              "assert (k(a, a) == 64).all()\n",
    "network": "import numpy as np, polydl.onnx\n"
               "from onnx import TensorProto, helper, numpy_helper\n"
               "w = numpy_helper.from_array(np.ones((16, 16, 3, 3), np.float32), 'w')\n"
               "conv = helper.make_node('Conv', ['x', 'w'], ['y'], pads=[1, 1, 1, 1])\n"
               "x = helper.make_tensor_value_info('x', TensorProto.FLOAT, [1, 16, 8, 8])\n"
               "y = helper.make_tensor_value_info('y', TensorProto.FLOAT, [1, 16, 8, 8])\n"
               "graph = helper.make_graph([conv], 'g', [x], [y], initializer=[w])\n"
               "net = polydl.onnx.compile(helper.make_model(graph))\n"
               "assert net(np.ones((1, 16, 8, 8), np.float32))[0, 0, 4, 4] == 144\n",
    "fma peak": "from polydl.bench.peak import FmaPeak\n"
                "from polydl.target import host_target\n"
                "FmaPeak(host_target().isa)\n",
}


@pytest.mark.parametrize("case", sorted(CALLS))
@pytest.mark.slow
def test_spinning_openmp_threads_outlive_the_interpreter(case: str) -> None:
    if case == "network":
        pytest.importorskip("onnx")
    # Under OMP_WAIT_POLICY=active the idle threads spin in libgomp's code; before the
    # libraries were loaded with RTLD_NODELETE, the exit unmapped it under them (SIGSEGV)
    env = {**os.environ, "OMP_WAIT_POLICY": "active", "OMP_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", CALLS[case]], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
