"""Rows split over several programs that meet once per row: read once, written once.

A row-wise op needs a statistic of the whole row before it can write any of it. A row that fits
one program's registers is read once; a longer one swept by one program is read twice (statistics,
then output). Here a row of D columns is cut into ``parts`` blocks of ``block`` columns, one
program per block: each loads its block, keeps it in registers, publishes its two partial sums
(``exchange``), waits until every block of the row has published, combines all of them in the same
order in every program (deterministic), and writes its block. Rows go ``ROWS`` at a time
(consecutive ones): a group of ``parts`` programs takes them together, each loading its block of
the next row while this row's blocks meet.

Where it pays (H200, 2026-11-29, ``benchmarks/experiments/split_rows.py``, 2^27 elements): the
norms' backward on rows of 8192 < D <= 16384 columns, which one program cannot hold with its
column sums (``_norm.ON_CHIP_BACKWARD``): at 8192 x 16384, bf16 rms_norm forward + backward 0.613 ->
0.420 ms, layer_norm 0.630 -> 0.438 ms. Not elsewhere: the meeting costs a program a round trip
through L2 while it holds its registers, and on longer rows, and in every forward and softmax
tried (one program a row, or ``ROWS`` with the next row loading), that cost more than the second
read it saves, which mostly hits L2 (2048 x 65536 bf16 rms_norm forward: split 0.27-0.36 ms, two
sweeps 0.20, quack's cluster of CTAs sharing shared memory 0.135). Triton's ``tl`` has no clusters.

Meeting. A program's work is the ticket it draws on starting (``take_ticket``, an atomic counter),
not its program id: group ``t // parts``, block ``t % parts``. Tickets go out in the order programs
start, so whenever a program waits, every block of its group with a smaller ticket is running, and
only the group of the newest ticket can have blocks not yet started: at most ``parts - 1`` programs
wait for programs that have not started. While the GPU holds ``parts`` programs at once (one an SM
is always possible: ``split`` asks for ``parts <= SMs``), one more starts, so every wait ends.
Program ids would not do: the hardware does not promise to start blocks in id order.

Slots. A block publishes each partial as one int64 store, the float32's bits beside a flag bit
(bit 32), and reads the row's slots back with volatile loads (from L2, never a stale L1 line) until
every flag is set: a value and its flag arrive together, so no fence or counter is needed, and the
values come with the read that finds them all there.

Scratch per call: ``scratch``, 1 + 2 * rows * parts int64 zeros (the ticket counter, then the
slots). Triton's interpreter runs programs one after another, so a wait would never end there:
``split`` returns None under it (the ops sweep the row twice).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import INTERPRET, cdiv, sm_count

LONGEST = 16384  # the longest row split: past it, one program's two sweeps measured as fast (above)


def split(d: int, on_chip: int, block: int, device: torch.device) -> int | None:
    """How many programs of ``block`` columns a row of ``d`` columns is split over, or None: rows that
    fit one program (``d <= on_chip``), rows longer than ``LONGEST``, more parts than the device has
    SMs, or the interpreter."""
    if INTERPRET or not on_chip < d <= LONGEST:
        return None
    parts = cdiv(d, block)
    return None if parts > sm_count(device) else parts


def scratch(rows: int, parts: int, device: torch.device) -> torch.Tensor:
    """The zeroed int64 scratch of one call: the ticket counter, then two slots per (row, block)."""
    return torch.zeros(1 + 2 * rows * parts, dtype=torch.int64, device=device)


def rows_per_program(rows: int, parts: int, device: torch.device, programs_per_sm: int) -> int:
    """Rows a program takes (consecutive ones, the next one loading while this one's blocks meet), so
    that about ``programs_per_sm`` programs an SM cover the rows."""
    return cdiv(rows, max(1, min(rows, programs_per_sm * sm_count(device) // parts)))


@triton.jit
def take_ticket(sync_ptr):
    """This program's place in the order programs started: 0, 1, 2, ... (int64)."""
    return tl.atomic_add(sync_ptr, 1, sem="relaxed")


@triton.jit
def _flagged(value):
    # a float32 scalar's bits in the low half of an int64 whose bit 32 says "written"
    return (value.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF) | 0x100000000


@triton.jit
def _value(slot):
    # the float32 of a flagged slot
    return (slot & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def exchange(sync_ptr, row, part, a, b, PARTS, BLOCK_P: tl.constexpr):
    """Publish this block's partials ``(a, b)`` (float32 scalars) of ``row``, wait for the row's other
    blocks', and return all of them: ``(a_all, b_all)``, (BLOCK_P,), 0 past ``PARTS``."""
    slots = sync_ptr + 1 + row * PARTS * 2
    tl.store(slots + part * 2, _flagged(a))
    tl.store(slots + part * 2 + 1, _flagged(b))
    index = tl.arange(0, BLOCK_P)
    mask = index < PARTS
    got_a = tl.load(slots + index * 2, mask=mask, other=0x100000000, volatile=True)
    got_b = tl.load(slots + index * 2 + 1, mask=mask, other=0x100000000, volatile=True)
    while tl.min(got_a & got_b, axis=0) < 0x100000000:  # some block's flag still 0: read them again
        got_a = tl.load(slots + index * 2, mask=mask, other=0x100000000, volatile=True)
        got_b = tl.load(slots + index * 2 + 1, mask=mask, other=0x100000000, volatile=True)
    return tl.where(mask, _value(got_a), 0.0), tl.where(mask, _value(got_b), 0.0)
