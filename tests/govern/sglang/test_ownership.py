"""Who owns the pages an insert adds in a share group's namespace (needs SGLang; issue #32).

Tenants that publish public prompts in one share group share one tree namespace,
so the namespace alone does not say whose pages an insert adds. They are the
inserting request's (SGLang's scheduler inserts through ``checkpoint(req)``), never
those of whichever tenant was admitted into the namespace last: a third tenant's
hit is judged against the real owner's grant, and an erasure of the owner finds
them. A bare ``insert`` (a key, no request) is attributed only where the namespace
has exactly one possible owner, and refused in a namespace several scopes share.
"""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.sglang
torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.mem_cache.unified_radix_cache")

from sglang.srt.mem_cache.base_prefix_cache import InsertParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402

from kvgov.audit.verify import verify  # noqa: E402
from kvgov.exceptions import InvalidArgument  # noqa: E402

from .test_differential import PAGE, _build, _drive_checkpoint  # noqa: E402
from .test_sharing import _environ, _events, _groups, _match, _prompt, _public  # noqa: E402


def test_a_checkpoint_records_the_pages_as_the_inserting_requests(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/audit.db"
    cache, alloc, kv = _build(True, tmp_path, _environ("bank", "clinic", "shop"))
    try:
        prompt = _prompt(5000, 8 * PAGE)
        bank = _public(0, "bank", prompt)
        _match(cache, bank)
        # clinic is admitted into the same namespace after bank, before bank inserts
        clinic = _public(1, "clinic", _prompt(9000, 8 * PAGE))
        _match(cache, clinic)
        assert bank.extra_key == clinic.extra_key
        _drive_checkpoint(cache, alloc, kv, [bank])  # bank's pages go into the tree

        owners = cache.kvgov.gov.ledger.owners
        assert len(owners.of_tenant("bank")) == 8
        assert owners.of_tenant("clinic") == []

        # bank leaves the group: a third tenant's hit on bank's pages is judged by
        # bank's grant (now refused), not clinic's
        cache.kvgov.gov.policy.reload(None, _groups("clinic", "shop"))
        shop = _match(cache, _public(2, "shop", prompt + _prompt(20_000, PAGE)))
        assert shop.device_prefix_len == 0
        (denied,) = _events(cache, url, "share_denied")
        assert (denied.tenant, denied.requester_tenant) == ("bank", "shop")
        assert not _events(cache, url, "cross_tenant_reuse")

        # erasing bank finds bank's pages as bank's
        report = cache.kvgov.purge_tenant("bank")
        assert report.blocks_zeroized == 8 and report.verified
        assert owners.of_tenant("bank") == []
    finally:
        cache.kvgov_close()
    assert verify(url).ok


def _bare_insert(cache: Any, alloc: Any, toks: array, namespace: str) -> Any:
    value = alloc.alloc(len(toks))
    return cache.insert(InsertParams(key=RadixKey(toks, namespace), value=value))


def test_a_bare_insert_is_attributed_only_where_one_scope_can_own_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/audit.db"
    cache, alloc, _kv = _build(True, tmp_path, _environ("bank", "clinic"))
    try:
        owners = cache.kvgov.gov.ledger.owners
        bank = _public(0, "bank", _prompt(5000, 4 * PAGE))
        _match(cache, bank)
        # only bank was admitted into the group's namespace: the pages are bank's
        _bare_insert(cache, alloc, _prompt(5000, 4 * PAGE), bank.extra_key)
        assert len(owners.of_tenant("bank")) == 4

        _match(cache, _public(1, "clinic", _prompt(9000, 4 * PAGE)))
        # bank and clinic may both own pages there: no guessing, the insert is refused
        free = alloc.available_size()
        with pytest.raises(InvalidArgument):
            _bare_insert(cache, alloc, _prompt(7000, 4 * PAGE), bank.extra_key)
        assert len(owners.of_tenant("bank")) == 4 and owners.of_tenant("clinic") == []
        assert alloc.available_size() == free - 4 * PAGE  # the tree took nothing
        assert _match(cache, _public(2, "bank", _prompt(7000, 4 * PAGE))).device_prefix_len == 0
    finally:
        cache.kvgov_close()
    assert verify(url).ok
