"""The reference backend: each op is its equation in elementwise tensor arithmetic and reductions
(no matmul, mv, outer, addmm ...), accumulated in float32 (float64 for float64 inputs). It is the
oracle every other backend is tested against: readability first."""
