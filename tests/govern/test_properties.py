"""The governed cache's public API under random operations and injected faults.

A hypothesis state machine admits, grows, releases and cancels sequences of a few
tenants, scopes and prompts (so hits, share grants and evictions happen), purges,
invalidates, sweeps after the clock moves, and makes steps fail on purpose. After
every step:

* reference counts balance: each block's count is the number of live block tables
  holding it;
* no block is reachable from two scopes without a grant: a block in a sequence's
  table was written by that sequence's scope, or by another tenant's scope equal
  in every other field, public, in a share group both tenants belong to;
* every block that left an owner is zero (every FREE block reads back zero), and
  the governor's owner table and deadlines agree with the pool;
* the audit chain verifies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvgov.allocator import BlockState
from kvgov.audit import verify
from kvgov.exceptions import KVGovError
from kvgov.govern import CacheScope, GovernedKVCache
from tests.support.clock import FakeClock

from .conftest import SECRET, SPEC, make_scope, share_group

TENANTS = ("acme", "globex", "initech")
#: acme and globex share public blocks; initech shares nothing
GRANTED = {"acme", "globex"}
PROMPTS = [list(range(100, 113)), [*range(100, 109), 7, 7, 7]]


class Injected(RuntimeError):
    """A fault a rule injects."""


def _fail(*_: Any, **__: Any) -> Any:
    raise Injected("injected fault")


class CacheMachine(RuleBasedStateMachine):
    """Random use of one GovernedKVCache, with a model of which sequence holds what."""

    workdir: Path

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.url = f"sqlite:///{self.workdir / f'audit-{id(self)}.db'}"
        data = share_group("pub", *sorted(GRANTED))
        data["kvgov"]["config"]["retention_seconds"] = {"public": 30, "internal": 60}
        self.cache = GovernedKVCache.create(
            spec=SPEC,
            num_blocks=16,
            audit_url=self.url,
            key_secret=SECRET,
            clock=self.clock,
            verify_zeroization=True,
            policy_data=data,
        )
        self.live: dict[str, CacheScope] = {}
        self.serial = 0

    def teardown(self) -> None:
        self.cache.close()
        report = verify(self.url)
        assert report.ok, report

    # ------------------------------------------------------------------ rules

    @rule(
        tenant=st.sampled_from(TENANTS),
        classification=st.sampled_from(["public", "public", "internal", "restricted"]),
        revision=st.sampled_from(["r1", "r1", "r1", "r2"]),
        prompt=st.sampled_from(range(len(PROMPTS))),
    )
    def admit(self, tenant: str, classification: str, revision: str, prompt: int) -> None:
        scope = make_scope(tenant=tenant, classification=classification, model_revision=revision)
        seq_id = f"s{self.serial}"
        self.serial += 1
        try:
            adm = self.cache.admit(seq_id, scope, PROMPTS[prompt])
        except KVGovError:  # out of blocks, a denial: nothing changed
            return
        first_new = adm.cached_tokens // SPEC.block_size
        for b in adm.block_ids[first_new:]:
            self.cache.block(b).fill_(1.0 + len(self.live))  # the model writes KV
        self.live[seq_id] = scope

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data(), n=st.integers(1, 6))
    def append(self, data: st.DataObject, n: int) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.live)))
        try:
            for b in self.cache.append(seq_id, list(range(900, 900 + n))):
                self.cache.block(b).fill_(2.0)
        except KVGovError:
            pass

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data(), cache_it=st.booleans())
    def end(self, data: st.DataObject, cache_it: bool) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.live)))
        ended = self.cache.release(seq_id) if cache_it else self.cache.cancel(seq_id)
        assert ended
        del self.live[seq_id]

    @rule(tenant=st.sampled_from(TENANTS))
    def purge(self, tenant: str) -> None:
        report = self.cache.purge_tenant(tenant)
        # verified rests on ownership: none of the tenant's blocks, keyed or not, is held
        held = self.cache.governor.ledger.owners.of_tenant(tenant)
        assert report.held_blocks == len(held)
        assert report.verified == (not held)

    @rule(revision=st.sampled_from(["r1", "r2"]))
    def invalidate(self, revision: str) -> None:
        report = self.cache.invalidate(model_revision=revision)
        held = self.cache.governor.ledger.owners.select(lambda s: s.model_revision == revision)
        assert report.held_blocks == len(held)
        assert report.verified == (not held)

    @rule(seconds=st.sampled_from([1.0, 31.0, 61.0]))
    def sweep(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.cache.sweep()

    @rule(
        step=st.sampled_from(["allocate", "set_keys", "record"]),
        tenant=st.sampled_from(TENANTS),
        prompt=st.sampled_from(range(len(PROMPTS))),
    )
    def admit_with_a_fault(self, step: str, tenant: str, prompt: int) -> None:
        target: Any = self.cache.pool if step != "record" else self.cache.governor
        name = {"allocate": "allocate", "set_keys": "set_keys", "record": "record_admission"}
        scope = make_scope(tenant=tenant)
        seq_id = f"f{self.serial}"
        self.serial += 1
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(target, name[step], _fail)
            try:
                adm = self.cache.admit(seq_id, scope, PROMPTS[prompt])
            except (Injected, KVGovError):
                return
        # every admission allocates and records; only one that found every full block
        # cached (a live sequence of the same scope keyed them) has nothing to key
        full = len(PROMPTS[prompt]) // SPEC.block_size * SPEC.block_size
        assert step == "set_keys" and adm.cached_tokens == full, f"the {step} fault did not fire"
        self.live[seq_id] = scope

    # ------------------------------------------------------------------ invariants

    @invariant()
    def references_balance(self) -> None:
        pool = self.cache.pool
        held: dict[int, int] = {}
        for seq in self.cache._seqs.values():
            for b in seq.block_ids:
                held[b] = held.get(b, 0) + 1
        for b in range(pool.num_blocks):
            assert pool.ref_count(b) == held.get(b, 0), b
        assert set(self.cache._seqs) == set(self.live)

    @invariant()
    def no_block_crosses_scopes_without_a_grant(self) -> None:
        owners = self.cache.governor.ledger.owners.table
        for seq in self.cache._seqs.values():
            mine = seq.scope
            for b in seq.block_ids:
                owner = owners[b]
                assert owner is not None
                if owner == mine:
                    continue
                assert dataclasses.replace(owner, tenant=mine.tenant) == mine, (owner, mine)
                assert owner.classification == "public"
                assert {owner.tenant, mine.tenant} <= GRANTED, (owner.tenant, mine.tenant)

    @invariant()
    def what_left_an_owner_is_zero(self) -> None:
        self.cache._check_invariants()
        self.cache.pool._check_invariants(check_zero=True)
        for b in range(self.cache.pool.num_blocks):
            if self.cache.pool.state(b) is BlockState.FREE:
                assert not self.cache.block(b).any(), b

    @invariant()
    def the_audit_chain_verifies(self) -> None:
        self.cache.audit.flush()
        report = verify(self.url)
        assert report.ok, report


@pytest.fixture()
def machine_dir(tmp_path: Path) -> Iterator[Path]:
    CacheMachine.workdir = tmp_path
    yield tmp_path


def test_the_public_api_keeps_its_invariants(machine_dir: Path) -> None:
    """Random admissions, growth, releases, purges, invalidations, sweeps and faults."""
    test = CacheMachine.TestCase
    test.settings = settings(
        max_examples=20,
        stateful_step_count=40,
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    test("runTest").runTest()
