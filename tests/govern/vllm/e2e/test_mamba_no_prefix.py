"""A Mamba2 hybrid on a real engine, prefix caching off: its state zeroed when it leaves.

The tiny GraniteMoeHybrid (``vllm_cpu_tiny_model.write_granite_hybrid``: Mamba2 and
attention layers alternating) runs on the CPU build only without prefix caching (with it,
vLLM's ``mamba_mixer2.py`` fails with an ``IndexError``). vLLM then builds its
no-prefix-cache coordinator over a Mamba group in ``mamba_cache_mode="none"`` (one state
block per request, spanning the model's 512 tokens) and a full-attention group of 32-token
blocks, the two laid over the same tensors. Stock (kvgov's plugin excluded) and governed
``LLM(...)``, one engine each for the module; every check reads the worker's tensors back
(``benchmarks/vllm_kv_probe.py``): every attention layer's KV tensor and every Mamba
layer's conv and ssm state tensors.

* requests of two tenants (the same prompt) finish: nothing is reused (no cache), and on
  governed every block, state blocks included, reads zero in every tensor once its
  request let it go; stock (the control) keeps the KV and the conv and ssm state;
* ``purge_tenant`` of a tenant whose requests finished: nothing held or cached is left
  to erase, the erasure is audited, the tensors still read zero;
* the audit trail (last: it shuts the governed engine down) verifies, with the
  admissions and the zeroizations (ordered, then done) of both tenants' blocks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm_cpu_env import prompt

from . import conftest
from .conftest import engine_pair, start_llm

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_e2e]

KVGOV_CLI = str(Path(sys.executable).with_name("kvgov"))
KINDS = ["MambaSpec", "FullAttentionSpec"]  # the model's groups, in vLLM's order
NUM_BLOCKS = 40


class Engines(conftest.GroupEngines):
    def __init__(self, stock: Any, governed: Any, audit_url: str) -> None:
        super().__init__(stock, governed, KINDS)
        self.audit_url = audit_url

    def left(self, name: str) -> dict[str, list[int]]:
        """Per tensor kind, the blocks holding a non-zero byte that no request holds
        (none does between requests: no prefix cache keeps any): every attention layer's
        KV (``FullAttentionSpec``), every Mamba layer's conv and ssm state."""
        owned = set(self.pool()["owned"]) if name == "governed" else set()
        state = self.kv(name)
        (mamba,) = [g for g in state["groups"] if g["kind"] == "MambaSpec"]
        (full,) = [g for g in state["groups"] if g["kind"] == "FullAttentionSpec"]
        conv, ssm = mamba["states"]
        return {
            kind: sorted(set(ids) - owned)
            for kind, ids in (("attention", full["nonzero"]), ("conv", conv), ("ssm", ssm))
        }

    def settled(self, name: str, settle: float = 5.0) -> dict[str, list[int]]:
        """:meth:`left`, waiting up to ``settle`` s for the idle governed engine's zeroing
        step (stock: read once)."""
        wait = settle if name == "governed" else 0.0
        return conftest.poll(lambda: self.left(name), lambda left: not any(left.values()), wait)


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    import vllm_cpu_tiny_model

    model = tmp_path_factory.mktemp("tiny-granite-hybrid")
    vllm_cpu_tiny_model.write_granite_hybrid(str(model))
    audit_url = f"sqlite:///{tmp_path_factory.mktemp('mamba') / 'audit.db'}"

    def start(governed: bool) -> Any:
        return start_llm(
            model,
            governed,
            {"audit_url": audit_url, "model_revision": "r1"},
            enable_prefix_caching=False,
            num_gpu_blocks_override=NUM_BLOCKS,
        )

    with engine_pair(start) as pair:
        yield Engines(*pair, audit_url)


def test_a_mamba_group_and_an_attention_group_over_one_pool(engines: Engines) -> None:
    """vLLM built a Mamba group (two layers, each a conv and an ssm state) and a
    full-attention group; a Mamba layer and an attention layer view each tensor."""
    for name in engines.by_name:
        state = engines.kv(name)
        assert state["num_blocks"] == NUM_BLOCKS
        assert [g["kind"] for g in state["groups"]] == KINDS, state["groups"]
        mamba, full = state["groups"]
        assert len(mamba["layers"]) == len(full["layers"]) == 2
        assert len(mamba["states"]) == 2, "conv and ssm state"
        assert mamba["tensors"] == full["tensors"]


def test_finished_requests_leave_no_kv_and_no_state(engines: Engines) -> None:
    """Two tenants, the same prompt, then the first again: no reuse on either engine (no
    prefix cache); governed, every block reads zero in every attention KV tensor and
    every conv and ssm state tensor once the requests are done; stock keeps them."""
    text = prompt("mamba shared", 200)
    hits = {
        name: [
            engines.generate(name, text, tenant, max_tokens=16)
            for tenant in ("acme", "globex", "acme")
        ]
        for name in engines.by_name
    }
    print(f"\ncached tokens acme, globex, acme: {hits}")
    assert hits == {"stock": [0, 0, 0], "governed": [0, 0, 0]}
    stock, governed = engines.settled("stock"), engines.settled("governed")
    counts = {n: {k: len(v) for k, v in left.items()} for n, left in
              (("stock", stock), ("governed", governed))}  # fmt: skip
    print(f"blocks holding bytes after the requests, per tensor kind: {counts}")
    assert all(stock.values()), "control: stock leaves KV, conv and ssm state behind"
    assert governed == {"attention": [], "conv": [], "ssm": []}
    tenants = engines.stats()["tenants"]
    for tenant in ("acme", "globex"):
        assert tenants[tenant]["blocks_zeroized"] > 0, tenants


def test_purge_after_the_requests_leaves_nothing(engines: Engines) -> None:
    """``purge_tenant`` of a tenant whose requests finished: no block is held or cached
    (nothing to erase), the tensors read zero; the tenant is served again."""
    engines.generate("governed", prompt("mamba purge", 150), "umbrella", max_tokens=8)
    report = engines.core.call_utility("kvgov_call", "purge_tenant", "umbrella")
    assert report["held_blocks"] == 0 and report["blocks_zeroized"] == 0, report
    assert engines.settled("governed") == {"attention": [], "conv": [], "ssm": []}
    assert engines.generate("governed", prompt("mamba purge", 150), "umbrella") == 0


def test_the_trail_verifies_with_the_zeroizations(engines: Engines) -> None:
    """Last (it shuts the governed engine down, which flushes its trail): ``kvgov audit
    verify`` passes, and the trail has both tenants' admissions, the zeroizations of
    their blocks (ordered, then done) and umbrella's erasure."""
    engines.core.shutdown()
    url = engines.audit_url
    verify = _cli("audit", "verify", "--url", url, "--no-progress")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    events = _cli("audit", "events", "--url", url, "--json")
    assert events.returncode == 0, events.stderr
    rows = json.loads(events.stdout)
    admitted = {r["tenant"] for r in rows if r["type"] == "admission"}
    assert {"acme", "globex", "umbrella"} <= admitted, admitted
    zero = [r for r in rows if r["type"] == "zeroization"]
    for state in ("ordered", "done"):
        owners = {r["tenant"] for r in zero if r["details"].get("state") == state}
        assert {"acme", "globex", "umbrella"} <= owners, (state, owners)
    assert [r["tenant"] for r in rows if r["type"] == "erasure"] == ["umbrella"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KVGOV_CLI, *args], capture_output=True, text=True, check=False)
