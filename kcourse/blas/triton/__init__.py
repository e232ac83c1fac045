"""The ``triton`` backend: hand-written Triton kernels, one module per op.

Each module reads top to bottom: the math with its FLOPs and bytes moved, the ``@triton.jit`` kernel,
then the launcher that the public API calls. ``_launch`` holds what several kernels share.
On a machine without a GPU the kernels run through Triton's interpreter (``TRITON_INTERPRET=1``).
"""
