"""C kernels at run time: the cffi-loaded `Kernel`, the C compiler driver and compiled ONNX
networks."""
