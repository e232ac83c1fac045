"""Launch choices: each op's table, and the one way to override it.

A kernel's launch has choices that its operands do not force: how many CTAs a row is spread over,
threads per CTA, the walk of the attention tiles. Each op keeps them in one table, a frozen
dataclass ``LAUNCH`` in the module that plans its launches, whose docstring says what each field
means; its defaults are what ships. A field whose default is None leaves the choice to the op's
rule for the call's shape (``_rows.split_rows``, ``_norm.backward_launch``,
``_attention_fwd_sm90.config``, ...); a value fixes it for every call.

========================  =====================================  ===================================
op                        table                                  fields
========================  =====================================  ===================================
softmax, log_softmax      ``kcourse.blas.cute._softmax.LAUNCH``  cluster, row_threads, backward_threads,
                                                                 staged
cross_entropy             ``kcourse.blas.cute.cross_entropy``    cluster
layer_norm, rms_norm      ``kcourse.blas.cute._norm.LAUNCH``     row_threads, backward_threads,
                                                                 backward_ctas_per_sm, backward_prefetch,
                                                                 backward_cluster, cluster, staged
attention                 ``kcourse.blas.cute.attention``        the Hopper forward's and backward's
                                                                 walk, buffers and stores
========================  =====================================  ===================================

(Only the cute backend has such tables: triton's kernels pick theirs with ``triton.autotune``, or
from module constants named for what they choose, ``_norm.FORWARD_THREAD_ELEMENTS`` say, which
``benchmarks/experiments/triton_*_launch.py`` sweep.)
Ops that share a table's type keep separate tables: overriding softmax leaves log_softmax alone.

Benchmarks try a variant against the shipped launch with ``override``::

    from kcourse.blas import tuning

    with tuning.override("softmax", cluster=4, backward_threads=256):
        y = kcourse.softmax(x, dim=-1)     # every softmax launch in the block uses 4 CTAs a row

and a test or an experiment that calls a kernel's entry point directly passes it a table,
``tuning.launch("attention", paired=True)`` (the table in effect with those fields replaced).

How an override reaches the kernels: an op reads its table (``launch(op)``) on every call and hands
it to its planner as an argument. The planners are memoized (``_compile.plan_cache``) on their
arguments, the table among them, so a plan made under one table is never reused under another, and
every field the kernels bake in is part of their compile key: a variant compiles once, and switching
back and forth between variants costs a dictionary look-up. An override is process-wide (not per
thread: autograd runs backward kernels on its own threads) and lasts for its ``with`` block;
overrides nest.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib

# op -> (module, attribute) of its shipped table; imported on first use, so that an override can be
# set up before the op has run (and on a machine without the backend it fails with the import error)
TABLES = {
    "softmax": ("kcourse.blas.cute._softmax", "LAUNCH"),
    "log_softmax": ("kcourse.blas.cute._softmax", "LAUNCH"),
    "cross_entropy": ("kcourse.blas.cute.cross_entropy", "LAUNCH"),
    "layer_norm": ("kcourse.blas.cute._norm", "LAUNCH"),
    "rms_norm": ("kcourse.blas.cute._norm", "LAUNCH"),
    "attention": ("kcourse.blas.cute.attention", "LAUNCH"),
}
_in_effect: dict = {}  # op -> its table now (the shipped one until an override replaces it)


def default(op: str):
    """The table ``op`` ships with."""
    if op not in TABLES:
        raise KeyError(f"tuning: no launch table for {op!r}; the ops with one: {', '.join(TABLES)}")
    module, name = TABLES[op]
    return getattr(importlib.import_module(module), name)


def launch(op: str, **fields):
    """The table ``op``'s launches use now (the shipped one, or an ``override``'s), with ``fields``
    replaced if any (a ``TypeError`` names a field the table does not have)."""
    table = _in_effect.get(op)
    if table is None:
        table = _in_effect[op] = default(op)
    return dataclasses.replace(table, **fields) if fields else table


@contextlib.contextmanager
def override(op: str, **fields):
    """Within this block every launch of ``op`` uses its table with ``fields`` replaced (on top of an
    enclosing override of the same op); yields that table. See the module doc."""
    before = launch(op)
    _in_effect[op] = table = dataclasses.replace(before, **fields)
    try:
        yield table
    finally:
        _in_effect[op] = before
