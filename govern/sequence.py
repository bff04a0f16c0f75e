"""A live sequence of the governed cache, and the check of ``admit``'s arguments."""

from __future__ import annotations

from collections.abc import Sequence

from kvgov import defaults
from kvgov.exceptions import InvalidArgument, InvalidScope
from kvgov.schema import TEXT_LIMITS, text_problem

from .keys import pack_tokens
from .plan import KeyPlan
from .scope import CacheScope
from .views import ScopeView

__all__ = ["NativeSequence", "check_admission", "check_live_ids", "check_seq_id"]


class NativeSequence:
    """A running sequence of the native cache (:class:`~kvgov.govern.cache.GovernedKVCache`),
    one :class:`~kvgov.govern.protocol.RunningSequence`; only the cache, under the
    governor's lock, changes it."""

    __slots__ = (
        "admitted_blocks",
        "block_ids",
        "cacheable",
        "decision_id",
        "num_tokens",
        "parent",
        "priority",
        "seq_id",
        "tail",
        "ttl",
        "view",
    )

    def __init__(
        self,
        seq_id: str,
        view: ScopeView,
        block_ids: list[int],
        plan: KeyPlan,
        packed: bytes,
        block_size: int,
        priority: int,
        decision_id: str,
    ) -> None:
        self.seq_id = seq_id  # the caller's id
        self.view = view  # the scope it was admitted under
        self.block_ids = block_ids  # block table in token order; grows on append
        self.admitted_blocks = len(block_ids)  # blocks listed in the admission event
        self.num_tokens = plan.num_tokens  # tokens so far (prompt + appended)
        self.tail = packed[plan.num_full * block_size * 4 :]  # packed tokens of the partial block
        self.parent = plan.last_parent()  # key of the last full block, or its chain's root
        self.cacheable = plan.cacheable  # admission said cache; purge/invalidate/rotate clear it
        self.priority = priority  # eviction priority for its cached blocks
        self.ttl = plan.ttl  # retention seconds once CACHED (None: no deadline)
        self.decision_id = decision_id  # the admission decision

    @property
    def scope(self) -> CacheScope:
        """The scope it was admitted under."""
        return self.view.scope


def check_seq_id(seq_id: object) -> str:
    """A caller's sequence id: a non-empty string the audit store can hold.

    Raises:
        InvalidArgument: it is not a string, is empty, or the store would refuse it
            (too long, a NUL character, a lone surrogate).
    """
    limit = TEXT_LIMITS["sequence_id"]
    if not isinstance(seq_id, str) or not seq_id:
        raise InvalidArgument("seq_id", seq_id, f"a non-empty string of at most {limit} characters")
    problem = text_problem(seq_id, limit)
    if problem is not None:
        raise InvalidArgument("seq_id", seq_id[:32], f"the sequence id {problem}")
    return seq_id


def check_live_ids(live_seq_ids: object) -> set[str]:
    """The ids ``reconcile`` keeps: an iterable of sequence ids, never one bare string.

    Raises:
        InvalidArgument: not an iterable of strings (a str is refused: iterating it would
            name its characters and release every live sequence).
    """
    if isinstance(live_seq_ids, str | bytes) or not hasattr(live_seq_ids, "__iter__"):
        raise InvalidArgument(
            "live_seq_ids", live_seq_ids, "an iterable of sequence ids (a list or set of str)"
        )
    keep = set(live_seq_ids)
    for seq_id in keep:
        if not isinstance(seq_id, str):
            raise InvalidArgument("live_seq_ids", seq_id, "every sequence id is a str")
    return keep


def check_admission(
    seq_id: object,
    scope: object,
    token_ids: Sequence[int],
    priority: object,
    public_prefix_tokens: object,
) -> bytes:
    """Validate ``admit``'s arguments; return the packed tokens."""
    check_seq_id(seq_id)
    if not isinstance(scope, CacheScope):
        raise InvalidScope("scope", scope, "must be a CacheScope")
    if priority is not None and (
        not isinstance(priority, int)
        or isinstance(priority, bool)
        or not defaults.MIN_PRIORITY <= priority <= defaults.MAX_PRIORITY
    ):
        raise InvalidArgument(
            "priority",
            priority,
            f"an int in {defaults.MIN_PRIORITY}..{defaults.MAX_PRIORITY}, or None",
        )
    packed = pack_tokens(token_ids)
    if (
        not isinstance(public_prefix_tokens, int)
        or isinstance(public_prefix_tokens, bool)
        or not 0 <= public_prefix_tokens <= len(packed) // 4
    ):
        raise InvalidArgument(
            "public_prefix_tokens", public_prefix_tokens, "an int from 0 to len(token_ids)"
        )
    return packed
