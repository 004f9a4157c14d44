"""GPU kernels at run time: nvcc/hipcc builds, loading, calls over device arrays, timing."""
