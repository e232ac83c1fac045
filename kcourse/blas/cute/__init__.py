"""The cute backend: CuTe DSL kernels (nvidia-cutlass-dsl). No kernels yet: every op raises
NotImplementedError naming itself and this backend."""
