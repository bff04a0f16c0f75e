"""Capacity math: how many blocks, tokens and sequences fit in a memory budget.

All functions are exact integer arithmetic over a :class:`~kvgov.allocator.spec.KVSpec`;
partial blocks are never counted as capacity (a sequence of 17 tokens at
``block_size=16`` needs two whole blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvgov.allocator.spec import KVSpec, positive_int
from kvgov.exceptions import InvalidSpec

__all__ = [
    "Capacity",
    "blocks_in_bytes",
    "capacity",
    "concurrent_sequences",
    "tokens_in_bytes",
]


def _budget(nbytes: object) -> int:
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise InvalidSpec("nbytes", nbytes, "must be an int of zero or more bytes")
    return nbytes


def blocks_in_bytes(spec: KVSpec, nbytes: int) -> int:
    """Whole blocks that fit in ``nbytes`` bytes.

    Args:
        spec: the KV layout.
        nbytes: memory budget in bytes.

    Returns:
        ``nbytes // spec.bytes_per_block``.

    Raises:
        InvalidSpec: ``nbytes`` is negative or not an int.
    """
    return _budget(nbytes) // spec.bytes_per_block


def tokens_in_bytes(spec: KVSpec, nbytes: int) -> int:
    """Tokens that fit in ``nbytes`` bytes, counting whole blocks only.

    Args:
        spec: the KV layout.
        nbytes: memory budget in bytes.

    Returns:
        ``blocks_in_bytes(spec, nbytes) * spec.block_size``.

    Raises:
        InvalidSpec: ``nbytes`` is negative or not an int.
    """
    return blocks_in_bytes(spec, nbytes) * spec.block_size


def concurrent_sequences(spec: KVSpec, nbytes: int, mean_context_tokens: int) -> int:
    """Sequences of ``mean_context_tokens`` tokens each that fit in ``nbytes`` at once.

    Each sequence is rounded up to whole blocks and no prefix sharing is assumed,
    so this is the worst case a server can promise.

    Args:
        spec: the KV layout.
        nbytes: memory budget in bytes.
        mean_context_tokens: mean prompt plus generated tokens per sequence (> 0).

    Returns:
        The number of sequences.

    Raises:
        InvalidSpec: ``nbytes`` is negative or ``mean_context_tokens`` is not positive.
    """
    per_seq = spec.blocks_for_tokens(positive_int("mean_context_tokens", mean_context_tokens))
    return blocks_in_bytes(spec, nbytes) // per_seq


@dataclass(frozen=True, slots=True)
class Capacity:
    """What a memory budget holds for one spec.

    Attributes:
        nbytes: the budget.
        blocks: whole blocks that fit.
        tokens: tokens those blocks hold.
        bytes_used: bytes those blocks take (``blocks * bytes_per_block``).
        sequences: concurrent sequences at the given mean context, or None if none given.
    """

    nbytes: int
    blocks: int
    tokens: int
    bytes_used: int
    sequences: int | None


def capacity(spec: KVSpec, nbytes: int, mean_context_tokens: int | None = None) -> Capacity:
    """Everything :func:`blocks_in_bytes`, :func:`tokens_in_bytes` and
    :func:`concurrent_sequences` say about one budget, in one result.

    Args:
        spec: the KV layout.
        nbytes: memory budget in bytes.
        mean_context_tokens: mean tokens per sequence, or None to skip the sequence count.

    Returns:
        The :class:`Capacity`.

    Raises:
        InvalidSpec: as the functions it combines.
    """
    blocks = blocks_in_bytes(spec, nbytes)
    sequences = (
        None
        if mean_context_tokens is None
        else concurrent_sequences(spec, nbytes, mean_context_tokens)
    )
    return Capacity(
        nbytes=nbytes,
        blocks=blocks,
        tokens=blocks * spec.block_size,
        bytes_used=blocks * spec.bytes_per_block,
        sequences=sequences,
    )
