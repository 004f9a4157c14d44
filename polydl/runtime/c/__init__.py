"""C kernels at run time: the C compiler driver and compiled ONNX networks."""
