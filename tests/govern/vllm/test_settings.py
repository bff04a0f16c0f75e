"""The binding's settings and scope resolution (no vLLM needed)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvgov import defaults
from kvgov.exceptions import BindingConfigError, InvalidScope, ScopeTokenError
from kvgov.govern.scope_resolver import revision_of
from kvgov.govern.scope_token import ScopeTokenVerifier
from kvgov.govern.vllm import BindingSettings, EngineScope, ScopeResolver, sign_scope_token
from tests.support.clock import FakeClock

ENGINE = EngineScope("llama", "r1", "llama-tok", "t1")
FULL = {"kvgov_tenant": "acme", "kvgov_classification": "internal", "kvgov_template": "v3"}


def test_additional_config_wins_over_the_environment_over_defaults() -> None:
    """A setting in additional_config["kvgov"] beats KVGOV_<SETTING>, which beats the default."""
    settings = BindingSettings.load(
        {"kvgov": {"audit_url": "sqlite:///a.db"}},
        {"KVGOV_AUDIT_URL": "sqlite:///env.db", "KVGOV_DEFAULT_TENANT": "anon"},
    )
    assert settings.audit_url == "sqlite:///a.db"
    assert settings.default_tenant == "anon"
    assert settings.scope_token_max_ttl == defaults.SCOPE_TOKEN_MAX_TTL_SECONDS
    assert BindingSettings.load(None, {}) == BindingSettings()


@pytest.mark.parametrize(
    ("environ", "field", "value"),
    [
        ({"KVGOV_REQUIRE_SCOPE_TOKEN": "yes"}, "require_scope_token", True),
        ({"KVGOV_EPHEMERAL_SECRET": "0"}, "ephemeral_secret", False),
        ({"KVGOV_SCOPE_TOKEN_MAX_TTL": "30"}, "scope_token_max_ttl", 30.0),
        ({"KVGOV_POLICY_DATA": '{"kvgov": {}}'}, "policy_data", {"kvgov": {}}),
        ({"KVGOV_AUDIT_WRITER": "thread"}, "audit_writer", "thread"),
        ({}, "audit_writer", "thread"),
    ],
)
def test_environment_text_is_parsed(environ: dict[str, str], field: str, value: Any) -> None:
    """Booleans, numbers and JSON objects come from the environment as text."""
    assert getattr(BindingSettings.load(None, environ), field) == value


@pytest.mark.parametrize(
    ("config", "environ", "setting"),
    [
        ({"key_secret": "s" * 40}, {}, "key_secret"),
        ({"scope_token_key": "s" * 40}, {}, "scope_token_key"),
        ({"typo": 1}, {}, "typo"),
        ({"require_scope_token": "true"}, {}, "require_scope_token"),
        ({"scope_token_max_ttl": 0}, {}, "scope_token_max_ttl"),
        ({"policy_data": [1]}, {}, "policy_data"),
        ({"audit_url": ""}, {}, "audit_url"),
        ({"audit_writer": "fork"}, {}, "audit_writer"),
        ({}, {"KVGOV_AUDIT_WRITER": "Process"}, "KVGOV_AUDIT_WRITER"),
        ({}, {"KVGOV_REQUIRE_SCOPE_TOKEN": "maybe"}, "KVGOV_REQUIRE_SCOPE_TOKEN"),
        ({}, {"KVGOV_SCOPE_TOKEN_MAX_TTL": "soon"}, "KVGOV_SCOPE_TOKEN_MAX_TTL"),
        ({}, {"KVGOV_POLICY_DATA": "{"}, "KVGOV_POLICY_DATA"),
    ],
)
def test_bad_settings_are_typed_errors(
    config: dict[str, Any], environ: dict[str, str], setting: str
) -> None:
    """A secret in additional_config, an unknown name or a wrong type names the setting."""
    with pytest.raises(BindingConfigError) as info:
        BindingSettings.load({"kvgov": config}, environ)
    assert info.value.setting == setting
    assert "s" * 40 not in str(info.value)


def test_secrets_come_from_files_or_the_environment(tmp_path: Path) -> None:
    """key_secret_file and scope_token_key_file are read (one trailing newline dropped)."""
    secret, token_key = tmp_path / "secret", tmp_path / "token"
    secret.write_bytes(b"s" * 40 + b"\n")
    token_key.write_bytes(b"t" * 40)
    secret.chmod(0o600)
    token_key.chmod(0o400)
    settings = BindingSettings(key_secret_file=str(secret), scope_token_key_file=str(token_key))
    assert settings.key_secret() == b"s" * 40
    assert settings.scope_token_key({}) == b"t" * 40
    assert BindingSettings().scope_token_key({"KVGOV_SCOPE_TOKEN_KEY": "e" * 40}) == b"e" * 40
    with pytest.raises(BindingConfigError):
        BindingSettings(key_secret_file=str(tmp_path / "absent")).key_secret()


def _read(setting: str, path: Path) -> bytes | None:
    settings = BindingSettings(**{setting: str(path)})
    return settings.key_secret() if setting == "key_secret_file" else settings.scope_token_key({})


@pytest.mark.parametrize("setting", ["key_secret_file", "scope_token_key_file"])
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o601])
def test_a_secret_file_others_may_access_is_refused(
    tmp_path: Path, setting: str, mode: int
) -> None:
    """Issue #25 leftover: the binding's secret files follow the rule of every key file
    (kvgov.secrecy.read_key_file): any bit of 077 refuses the file with a typed error
    naming the setting, the path and the mode, never the content; 0600 is read."""
    secret = b"k" * 40
    path = tmp_path / "secret.key"
    path.write_bytes(secret)
    path.chmod(mode)
    with pytest.raises(BindingConfigError) as info:
        _read(setting, path)
    message = str(info.value)
    assert info.value.setting == setting
    assert str(path) in message and f"mode {mode:04o}" in message and "chmod 600" in message
    assert secret.decode() not in message and secret.decode()[:8] not in repr(info.value.value)
    path.chmod(0o600)
    assert _read(setting, path) == secret


def test_a_request_scope_comes_from_extra_args_engine_and_adapter() -> None:
    """Tenant, classification and template from extra_args; model and tokenizer from the
    engine; adapter name and revision (its path) from the LoRA request."""
    resolver = ScopeResolver(BindingSettings(), ENGINE, None)
    lora = SimpleNamespace(lora_name="fin", lora_path="/adapters/fin/v2")
    scope = resolver.resolve(FULL, lora)
    assert (scope.tenant, scope.classification, scope.template_version) == (
        "acme",
        "internal",
        "v3",
    )
    assert (scope.model, scope.model_revision, scope.tokenizer) == ("llama", "r1", "llama-tok")
    assert (scope.adapter, scope.adapter_revision) == ("fin", "/adapters/fin/v2")
    assert resolver.resolve(FULL, None).adapter is None
    assert resolver.resolve(dict(FULL), None) is resolver.resolve(FULL, None)  # cached


@pytest.mark.parametrize("missing", ["kvgov_tenant", "kvgov_classification", "kvgov_template"])
def test_a_missing_field_without_a_default_is_refused(missing: str) -> None:
    """Fail closed: every field comes from the request or a configured default."""
    resolver = ScopeResolver(BindingSettings(), ENGINE, None)
    with pytest.raises(InvalidScope) as info:
        resolver.resolve({k: v for k, v in FULL.items() if k != missing}, None)
    assert info.value.field == missing


def test_defaults_fill_what_the_request_does_not_name() -> None:
    """With defaults configured, an unscoped request gets the default scope."""
    settings = BindingSettings(
        default_tenant="anon", default_classification="public", default_template="none"
    )
    scope = ScopeResolver(settings, ENGINE, None).resolve(None, None)
    assert (scope.tenant, scope.classification, scope.template_version) == (
        "anon",
        "public",
        "none",
    )


def test_a_required_token_is_checked_against_the_resolved_fields() -> None:
    """With tokens required, a scope the front end set must carry its valid signature."""
    clock = FakeClock()
    key = b"k" * 40
    verifier = ScopeTokenVerifier(key, clock=clock)
    resolver = ScopeResolver(BindingSettings(require_scope_token=True), ENGINE, verifier)
    token = sign_scope_token(
        key, tenant="acme", classification="internal", template_version="v3",
        expires_at=int(clock()) + 60,
    )  # fmt: skip
    assert resolver.resolve({**FULL, "kvgov_scope_token": token}, None).tenant == "acme"
    with pytest.raises(ScopeTokenError):
        resolver.resolve(FULL, None)
    with pytest.raises(ScopeTokenError):
        resolver.resolve({**FULL, "kvgov_tenant": "globex", "kvgov_scope_token": token}, None)


def test_a_token_without_a_key_is_refused() -> None:
    """A token the engine cannot check is not silently ignored."""
    resolver = ScopeResolver(BindingSettings(), ENGINE, None)
    with pytest.raises(ScopeTokenError, match="no scope-token key"):
        resolver.resolve({**FULL, "kvgov_scope_token": "v1.1.00"}, None)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "unversioned"),
        ("", "unversioned"),
        ("r1", "r1"),
        ("/p" * 200, "sha256:"),
        ("a\nb", "sha256:"),
    ],
)
def test_revisions_fit_a_scope_field(value: Any, expected: str) -> None:
    """None is unversioned; a path too long (or unprintable) for a scope field is digested."""
    assert revision_of(value).startswith(expected)
