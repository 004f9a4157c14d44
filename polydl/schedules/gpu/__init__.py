"""The GPU schedule: thread mappings, GEMM tilings and staging for the CUDA and HIP targets."""
