"""kvgov's logger: structlog's, quiet below warning until structlog is configured."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
import structlog
from structlog.testing import capture_logs

from kvgov.govern import GovernedKVCache, logs

from .conftest import make_scope


@pytest.fixture()
def unconfigured(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """structlog as a host that never configured it leaves it; restored afterwards."""
    structlog.reset_defaults()
    monkeypatch.setattr(logs, "_configured", False)
    # configure_logging caches the logger on first use: a fresh proxy per test
    monkeypatch.setattr(logs, "_CONFIGURED", structlog.get_logger("kvgov"))
    yield
    structlog.reset_defaults()


def test_unconfigured_only_warnings_reach_the_output(
    unconfigured: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before anyone configures structlog, debug and info are dropped, a warning is printed."""
    log = logs.get_logger()
    log.debug("admitted", tenant="acme")
    log.info("admission_denied", tenant="acme")
    log.warning("retention_sweep_failed", error="boom")
    out = capsys.readouterr().out
    assert "admitted" not in out and "admission_denied" not in out
    assert "retention_sweep_failed" in out and "boom" in out


def test_a_host_configuration_gets_every_level(unconfigured: None) -> None:
    """A host that configures structlog itself receives kvgov's events at every level."""
    log = logs.get_logger()
    with capture_logs() as seen:
        log.debug("admitted", tenant="acme")
        log.info("invalidated", blocks_zeroized=2)
        log.warning("offload_failed", error="x")
        log.error("audit_unavailable", error="y")
    assert [(e["event"], e["log_level"]) for e in seen] == [
        ("admitted", "debug"),
        ("invalidated", "info"),
        ("offload_failed", "warning"),
        ("audit_unavailable", "error"),
    ]


def test_configure_logging_filters_by_level_and_renders_json(
    unconfigured: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """configure_logging("info", json=True): info and above as JSON lines on stderr."""
    logs.configure_logging("info", json=True)
    log = logs.get_logger()
    log.debug("admitted", tenant="acme")
    log.info("invalidated", blocks_zeroized=2)
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(e["event"], e["level"], e["blocks_zeroized"]) for e in lines] == [
        ("invalidated", "info", 2)
    ]
    logs.configure_logging("debug")  # later calls do nothing
    log.debug("admitted")
    assert capsys.readouterr().err == ""


def test_the_cache_logs_its_events_by_their_names(
    unconfigured: None, make_cache: Callable[..., GovernedKVCache]
) -> None:
    """An admission logs "admitted" at debug, with the tenant and the decision id."""
    cache = make_cache()
    with capture_logs() as seen:
        adm = cache.admit("req-1", make_scope(), list(range(8)))
    admitted = [e for e in seen if e["event"] == "admitted"]
    assert len(admitted) == 1
    assert admitted[0]["tenant"] == "acme"
    assert admitted[0]["decision_id"] == adm.decision_id
