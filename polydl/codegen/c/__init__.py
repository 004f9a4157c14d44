"""C/OpenMP code generation: isl AST to loops, microkernel calls, the kernel and network sources."""
