"""Paged KV-cache arithmetic: blocks of a token count and token phases
within a block. The engine divides by block_size with a shift and a mask where
it is a power of two (vLLM's always are): a 64-bit division takes 15-40 cycles,
and was a noticeable share of the engine's time. ``bsh``: log2(block_size), or -1.
"""

from __future__ import annotations

from .._numba_options import njit_noalloc


@njit_noalloc
def _log2_exact(b):
    """log2(b) for b a power of two, else -1."""
    if b < 1 or b & (b - 1) != 0:
        return -1
    # its one bit's place, bit by bit of the place (no branch: a loop's exit, at each resumed call of the
    # engine, was mispredicted); the masks leave out bit 63 (b < 2**63)
    return (((b & 0x2AAAAAAAAAAAAAAA) != 0) * 1 + ((b & 0x4CCCCCCCCCCCCCCC) != 0) * 2
            + ((b & 0x70F0F0F0F0F0F0F0) != 0) * 4 + ((b & 0x7F00FF00FF00FF00) != 0) * 8
            + ((b & 0x7FFF0000FFFF0000) != 0) * 16 + ((b & 0x7FFFFFFF00000000) != 0) * 32)


@njit_noalloc(inline="llvm")
def _blocks_of(tokens, bs, bsh):
    """ceil(tokens / bs), the blocks that hold ``tokens`` (tokens >= 0; for
    any integer, the floor of (tokens + bs - 1) / bs, as Python's ``//``)."""
    if bsh >= 0:
        return (tokens + bs - 1) >> bsh
    return (tokens + bs - 1) // bs


@njit_noalloc(inline="llvm")
def _phase(x, bs, bsh):
    """x mod bs, in [0, bs) for any sign of x (Python's %)."""
    if bsh >= 0:
        return x & (bs - 1)
    return x % bs
