"""CUDA and HIP code generation from a GPU schedule."""
