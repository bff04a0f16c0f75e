"""Admission through vLLM's scheduler: scope, signed tokens, refusals reaching the client, audit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvgov.audit import verify
from kvgov.exceptions import BindingConfigError
from kvgov.govern.scope_token import sign_scope_token

pytestmark = pytest.mark.vllm

PROMPT = list(range(300, 400))
TOKEN_KEY = b"t" * 40


def _refusal(vllm: Any, sched: Any, req: Any) -> Any:
    run = vllm.run(sched, req)
    assert req.request_id not in run.hits  # never scheduled
    out = run.finals[req.request_id]
    assert out.finish_reason.name == "ERROR" and out.new_token_ids == []
    assert isinstance(out.stop_reason, str) and out.stop_reason.startswith("kvgov: ")
    assert not sched.has_requests() and req.request_id not in sched.requests
    return out


def test_a_denied_tenant_is_refused_with_the_reason_and_audited(vllm: Any) -> None:
    """The admission policy's refusal finishes the request with its reason; it is audited."""
    sched = vllm.scheduler(
        kvgov={"policy_data": {"kvgov": {"config": {"tenants": {"evil": {"admission": False}}}}}}
    )
    out = _refusal(vllm, sched, vllm.request("x", PROMPT, tenant="evil"))
    assert "admission disabled" in out.stop_reason
    error = getattr(out, "error", None)
    if error is not None:  # vLLM 0.33: the client gets HTTP 400 with the message
        assert error.code == "validation_error" and error.message == out.stop_reason
    (event,) = vllm.events(sched, type="policy_denied")
    assert event.tenant == "evil" and event.decision_id in out.stop_reason
    assert vllm.hit(sched, vllm.request("ok", PROMPT)) == 0  # the engine keeps serving


def test_a_request_without_scope_is_refused_by_default(vllm: Any) -> None:
    """No kvgov_tenant and no default tenant: refused (fail closed), audited with the path."""
    sched = vllm.scheduler()
    out = _refusal(vllm, sched, vllm.request("x", PROMPT, tenant=None))
    assert "carries no scope" in out.stop_reason
    (event,) = vllm.events(sched, type="policy_denied")
    assert event.details["path"] == "kvgov.vllm/scope" and event.sequence_id == "x"


def test_a_default_scope_admits_unscoped_requests(vllm: Any) -> None:
    """With default_tenant (and defaults for the other fields) an unscoped request is admitted."""
    defaults = {"default_tenant": "anon", "default_classification": "internal"}
    sched = vllm.scheduler(kvgov={**defaults, "default_template": "none"})
    vllm.run(sched, vllm.request("a", PROMPT, tenant=None, classification=None, template=None))
    (event,) = vllm.events(sched, type="admission")
    assert (event.tenant, event.classification, event.template_version) == (
        "anon",
        "internal",
        "none",
    )


@pytest.mark.parametrize(
    ("xargs", "why"),
    [
        ({"kvgov_tenant": 7}, "must be a string"),
        ({"kvgov_tenant": ""}, "must not be empty"),
        ({"kvgov_classification": "top-secret"}, "unknown to the policy"),
        ({"kvgov_template": "x" * 300}, "at most 256"),
    ],
)
def test_a_malformed_scope_is_refused(vllm: Any, xargs: dict[str, Any], why: str) -> None:
    """A scope field that is not a valid identifier, or an unknown label: refused, audited."""
    sched = vllm.scheduler()
    out = _refusal(vllm, sched, vllm.request("x", PROMPT, xargs=xargs))
    assert why in out.stop_reason
    assert len(vllm.events(sched, type="policy_denied")) == 1


def _token(clock: Any, tenant: str = "acme", ttl: int = 60, key: bytes = TOKEN_KEY) -> str:
    return sign_scope_token(
        key,
        tenant=tenant,
        classification="internal",
        template_version="sys-v3",
        expires_at=int(clock()) + ttl,
    )


@pytest.fixture()
def signed(vllm: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("KVGOV_SCOPE_TOKEN_KEY", TOKEN_KEY.decode())
    return vllm.scheduler(kvgov={"require_scope_token": True})


def test_a_signed_scope_is_admitted(vllm: Any, signed: Any, clock: Any) -> None:
    """The front end's token over exactly these fields lets the request in."""
    run = vllm.run(signed, vllm.request("a", PROMPT, xargs={"kvgov_scope_token": _token(clock)}))
    assert run.hits == {"a": 0}


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("missing", "carries no kvgov_scope_token"),
        ("forged", "does not match"),
        ("other-tenant", "does not match"),
        ("expired", "expired"),
        ("too-long", "mint short-lived tokens"),
        ("garbage", "v1.<expiry>.<mac>"),
    ],
)
def test_an_unsigned_or_forged_scope_is_refused(
    vllm: Any, signed: Any, clock: Any, case: str, why: str
) -> None:
    """With tokens required: no token, a wrong key, another tenant's token, an expired or
    over-long one, or garbage: refused with the reason, audited."""
    token = {
        "missing": None,
        "forged": _token(clock, key=b"f" * 40),
        "other-tenant": _token(clock, tenant="globex"),
        "expired": _token(clock, ttl=-1),
        "too-long": _token(clock, ttl=3600),
        "garbage": "v2.1.zz",
    }[case]
    xargs = {} if token is None else {"kvgov_scope_token": token}
    out = _refusal(vllm, signed, vllm.request("x", PROMPT, xargs=xargs))
    assert why in out.stop_reason
    (event,) = vllm.events(signed, type="policy_denied")
    assert event.details["claimed"]["kvgov_tenant"] == "acme"


def test_requiring_tokens_without_a_key_refuses_to_start(vllm: Any) -> None:
    """require_scope_token with no key configured is a configuration error, at start."""
    with pytest.raises(BindingConfigError, match="KVGOV_SCOPE_TOKEN_KEY"):
        vllm.scheduler(kvgov={"require_scope_token": True})


@pytest.mark.parametrize(
    ("settings", "setting"),
    [
        ({"key_secret": "s" * 40}, "key_secret"),
        ({"no_such_setting": 1}, "no_such_setting"),
        ({"require_scope_token": "yes"}, "require_scope_token"),
        ({"scope_token_max_ttl": -1}, "scope_token_max_ttl"),
    ],
)
def test_bad_settings_refuse_to_start(vllm: Any, settings: dict[str, Any], setting: str) -> None:
    """A secret in additional_config, an unknown setting or a wrong type: BindingConfigError."""
    with pytest.raises(BindingConfigError) as info:
        vllm.scheduler(kvgov=settings)
    assert info.value.setting == setting


def test_an_aborted_refusal_sends_nothing_twice(vllm: Any) -> None:
    """A refused request the client aborts before the next step is finished by vLLM only."""
    from vllm.v1.request import RequestStatus

    sched = vllm.scheduler()
    req = vllm.request("x", PROMPT, tenant=None)
    sched.add_request(req)
    sched.finish_requests("x", RequestStatus.FINISHED_ABORTED)
    run = vllm.run(sched)
    assert "x" not in run.finals and not sched.has_requests()


def test_admission_and_reuse_are_audited_from_what_vllm_committed(vllm: Any) -> None:
    """ADMISSION carries the blocks and reused tokens vLLM scheduled; REUSE names both tenants."""
    sched = vllm.scheduler()
    vllm.run(sched, vllm.request("a", PROMPT), vllm.request("b", PROMPT))
    first, second = vllm.events(sched, type="admission")
    assert (first.sequence_id, first.reused_tokens, first.token_count) == ("a", 0, 100)
    assert (second.sequence_id, second.reused_tokens) == ("b", 96)
    (reuse,) = vllm.events(sched, type="reuse")
    assert (reuse.tenant, reuse.requester_tenant, reuse.reused_tokens) == ("acme", "acme", 96)
    assert list(reuse.block_ids) == list(first.block_ids[:6])


def test_the_audit_trail_verifies(vllm: Any, clock: Any) -> None:
    """kvgov audit verify passes on everything the binding wrote (admissions, reuse, refusals,
    evictions, zeroizations ordered and done, an erasure), after the engine shut down."""
    sched = vllm.scheduler(num_blocks=16)
    reqs = [vllm.request(f"r{i}", [i * 7 + j for j in range(60)]) for i in range(6)]
    vllm.run(sched, *reqs, vllm.request("x", PROMPT, tenant=None))
    sched.kvgov_call("purge_tenant", "acme")
    vllm.run(sched)
    sched.shutdown()
    report = verify(vllm.audit_url)
    assert report.ok, report.problems
    kvgov = str(Path(sys.executable).with_name("kvgov"))
    cli = subprocess.run(
        [kvgov, "audit", "verify", "--url", vllm.audit_url, "--no-progress"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr
