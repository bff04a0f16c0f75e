"""Tests for allocator.sizing: blocks, tokens and sequences that fit in a budget."""

from __future__ import annotations

import pytest

from kvgov.allocator.sizing import (
    Capacity,
    blocks_in_bytes,
    capacity,
    concurrent_sequences,
    tokens_in_bytes,
)
from kvgov.allocator.spec import KVSpec
from kvgov.exceptions import InvalidSpec

GIB = 1024**3
LLAMA = KVSpec(num_layers=32, num_kv_heads=8, head_dim=128)  # 2 MiB per block


def test_blocks_in_bytes_counts_whole_blocks() -> None:
    """80 GiB holds 40,960 blocks of 2 MiB, and a byte short of a block does not count."""
    assert blocks_in_bytes(LLAMA, 80 * GIB) == 40960
    assert blocks_in_bytes(LLAMA, LLAMA.bytes_per_block - 1) == 0


def test_tokens_in_bytes_is_blocks_times_block_size() -> None:
    """1 GiB of 2 MiB blocks holds 512 blocks, 8,192 tokens."""
    assert tokens_in_bytes(LLAMA, GIB) == 8192


def test_concurrent_sequences_rounds_each_sequence_up() -> None:
    """At 17 tokens a sequence needs two blocks, so 512 blocks hold 256 sequences."""
    assert concurrent_sequences(LLAMA, GIB, 17) == 256
    assert concurrent_sequences(LLAMA, GIB, 16) == 512


def test_capacity_combines_everything() -> None:
    """capacity() reports blocks, tokens, bytes used and sequences in one result."""
    got = capacity(LLAMA, GIB + 5, 4096)
    assert got == Capacity(nbytes=GIB + 5, blocks=512, tokens=8192, bytes_used=GIB, sequences=2)


def test_capacity_without_context_has_no_sequence_count() -> None:
    """Without a mean context the sequence count is None."""
    assert capacity(LLAMA, GIB).sequences is None


@pytest.mark.parametrize("nbytes", [-1, 1.5, True, "1"])
def test_bad_budgets_are_refused(nbytes: object) -> None:
    """A negative or non-int budget raises InvalidSpec."""
    with pytest.raises(InvalidSpec):
        blocks_in_bytes(LLAMA, nbytes)  # type: ignore[arg-type]


@pytest.mark.parametrize("context", [0, -5, 2.0])
def test_bad_context_is_refused(context: object) -> None:
    """A mean context that is not a positive int raises InvalidSpec."""
    with pytest.raises(InvalidSpec):
        concurrent_sequences(LLAMA, GIB, context)  # type: ignore[arg-type]
