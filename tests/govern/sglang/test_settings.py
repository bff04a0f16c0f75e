"""The SGLang binding reads the vLLM binding's settings: each one it takes is honoured,
each one it cannot honour is refused at start, none is ignored (needs SGLang).

An operator who sets ``KVGOV_MODEL_REVISION`` expects cache keys (and invalidation) to
carry it; one who sets ``KVGOV_FLEET_URL`` expects the engine in the fleet, its erasure
orders run. A setting read and then dropped would leave either believing what is false.
"""

from __future__ import annotations

from array import array
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang
torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.mem_cache.unified_radix_cache")

from kvgov.audit.handoff import ProcessAuditLog  # noqa: E402
from kvgov.audit.queries import AuditQueries  # noqa: E402
from kvgov.exceptions import BindingConfigError  # noqa: E402

from .test_differential import PAGE, _build, _req  # noqa: E402

PROMPT = array("q", range(1000, 1000 + 4 * PAGE))


def test_the_revision_settings_go_into_every_scope(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/audit.db"
    environ = {"KVGOV_MODEL_REVISION": "weights-7", "KVGOV_TOKENIZER_REVISION": "tok-3"}
    cache, _, _ = _build(True, tmp_path, environ)
    (tmp_path / "plain").mkdir()
    plain, _, _ = _build(True, tmp_path / "plain")
    try:
        ns = cache.kvgov_admit(_req(0, "acme", PROMPT))
        assert ns != plain.kvgov_admit(_req(0, "acme", PROMPT))  # the revision is in the key
        cache.kvgov.gov.audit.flush()
        with AuditQueries(url) as q:
            (event,) = q.events(type="admission")
        assert (event.model_revision, event.tokenizer_revision) == ("weights-7", "tok-3")
    finally:
        cache.kvgov_close()
        plain.kvgov_close()


def test_the_audit_writer_setting_is_honoured(tmp_path: Path) -> None:
    cache, _, _ = _build(True, tmp_path, {"KVGOV_AUDIT_WRITER": "process"})
    try:
        assert isinstance(cache.kvgov.gov.audit, ProcessAuditLog)
        cache.kvgov_admit(_req(0, "acme", PROMPT))
        cache.kvgov.gov.audit.flush()
        with AuditQueries(f"sqlite:///{tmp_path}/audit.db") as q:
            assert [e.sequence_id for e in q.events(type="admission")] == ["r0"]
    finally:
        cache.kvgov_close()


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("KVGOV_FLEET_URL", "postgresql:///fleet"),
        ("KVGOV_FLEET_ENGINE_ID", "engine-1"),
        ("KVGOV_FLEET_OPERATOR_KEYS_FILE", "/etc/kvgov/operators.pem"),
        ("KVGOV_FLEET_POLL_INTERVAL", "2"),
        ("KVGOV_CONNECTOR_KINDS", '{"pkg.Connector": "block_hashes"}'),
    ],
)
def test_a_setting_the_binding_cannot_honour_is_refused(
    tmp_path: Path, env: str, value: str
) -> None:
    with pytest.raises(BindingConfigError) as refused:
        _build(True, tmp_path, {env: value})
    assert env in str(refused.value)
    assert "SGLang" in str(refused.value)
    assert not (tmp_path / "audit.db").exists()  # refused before anything was opened
