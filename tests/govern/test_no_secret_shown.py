"""No password or key in the messages of tier URLs, the OPA URL, the KEK and the binding's
secret files (issue #25, 6 and 7)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from kvgov.exceptions import (
    BindingConfigError,
    InvalidArgument,
    InvalidOffloadArgument,
    KEKError,
    PolicyError,
)
from kvgov.govern.offload_config import parse_tier_url
from kvgov.govern.vllm import BindingSettings
from kvgov.offload import LocalKEK
from kvgov.offload.redis_tier import RedisTier
from kvgov.policy.opa_server import OpaServerEngine

SECRET = "s3cret-Pw"


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{SECRET}@cache:6379/0",  # no capacity
        f"rediss://default:{SECRET}@cache:6380/0?name=r&password={SECRET}",  # no capacity
        f"ftp://u:{SECRET}@cache/?capacity=1GiB",  # an unknown scheme
    ],
)
def test_a_refused_tier_url_is_shown_without_its_password(url: str) -> None:
    """The tier URL in the refusal (message and attribute) has ``***`` for the password."""
    with pytest.raises(InvalidArgument) as info:
        parse_tier_url(url)
    assert SECRET not in str(info.value) and SECRET not in repr(info.value.value)
    assert ":***@cache" in str(info.value)


def test_a_redis_tier_refuses_a_url_without_showing_its_password() -> None:
    """A RedisTier given a URL of another scheme shows it redacted."""
    with pytest.raises(InvalidOffloadArgument) as info:
        RedisTier(f"http://u:{SECRET}@cache:6379", 1 << 20)
    assert SECRET not in str(info.value) and "u:***@cache" in str(info.value)


@pytest.mark.parametrize("url", [f"http://u:{SECRET}@opa:8181/v1", f"ftp://u:{SECRET}@opa"])
def test_a_refused_opa_url_is_shown_without_its_password(url: str) -> None:
    """The OPA server URL in a refusal has ``***`` for the password."""
    with pytest.raises(PolicyError) as info:
        OpaServerEngine(url)
    assert SECRET not in str(info.value) and "u:***@opa" in str(info.value)


def test_a_kek_given_where_its_file_belongs_is_not_echoed() -> None:
    """KVGOV_KEK_FILE holding the key itself: refused by its length, no part of the key shown."""
    kek = secrets.token_hex(32)
    with pytest.raises(KEKError) as info:
        LocalKEK.from_env({"KVGOV_KEK_FILE": kek})
    message = str(info.value)
    assert "not a readable file (64 characters)" in message
    assert not [kek[i : i + 8] for i in range(len(kek) - 7) if kek[i : i + 8] in message]
    assert info.value.__context__ is None


@pytest.mark.parametrize("setting", ["key_secret_file", "scope_token_key_file"])
def test_a_secret_given_where_its_file_belongs_is_not_echoed(setting: str) -> None:
    """The binding's secret-file settings holding the secret itself: only its length is shown."""
    key = secrets.token_urlsafe(32)
    settings = BindingSettings(**{setting: key})
    with pytest.raises(BindingConfigError) as info:
        settings.key_secret() if setting == "key_secret_file" else settings.scope_token_key({})
    assert key not in str(info.value) and key not in repr(info.value.value)
    assert f"{len(key)} characters" in str(info.value)


def test_a_missing_kek_file_given_as_a_path_object_is_named(tmp_path: Path) -> None:
    """A Path is a path, not key text: the message may name it."""
    with pytest.raises(KEKError, match=r"absent\.kek"):
        LocalKEK.from_file(tmp_path / "absent.kek")
