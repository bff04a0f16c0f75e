"""kvgov's settings inside a vLLM engine: :class:`BindingSettings`.

vLLM builds the scheduler itself, so the binding cannot take arguments. It reads
its settings from ``vllm_config.additional_config["kvgov"]`` (``vllm serve
--additional-config '{"kvgov": {...}}'``, or ``LLM(additional_config=...)``),
and every setting it does not find there from the environment variable
``KVGOV_<SETTING>`` (``audit_url`` from ``KVGOV_AUDIT_URL``), else its default.

Secrets never go in ``additional_config``: vLLM logs its non-default arguments at
start. The cache-key secret comes from ``KVGOV_KEY_SECRET`` or the file named
by ``key_secret_file``; the scope-token key from ``KVGOV_SCOPE_TOKEN_KEY`` or
``scope_token_key_file``; a secret file is read only if its owner alone may
access it (mode 0600 or 0400: :func:`kvgov.secrecy.read_key_file`, the rule of
every key file kvgov reads). This module needs no vLLM.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from kvgov import defaults
from kvgov.audit.writer import WriterKind
from kvgov.exceptions import BindingConfigError
from kvgov.secrecy import KeyFileOpenToOthers, read_key_file, unshown

__all__ = ["SETTINGS", "BindingSettings"]

#: Settings refused in additional_config because they are secrets (vLLM logs its config).
_SECRETS = {
    "key_secret": f"set {defaults.KEY_SECRET_ENV} or key_secret_file",
    "scope_token_key": f"set {defaults.SCOPE_TOKEN_KEY_ENV} or scope_token_key_file",
}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True, slots=True)
class BindingSettings:
    """The binding's settings, validated (see the module docstring for where they come from).

    Attributes:
        audit_url: SQLAlchemy URL of the audit database.
        audit_writer: where the audit trail is sealed and stored: ``"thread"`` (the
            default: a writer thread inside the engine core) or ``"process"`` (a writer
            process of the engine core's own; the engine core's cost per event is a
            hand-off).
        worker_id: the audit stream id of this engine; None derives one per process.
        policy_dir: a Rego bundle directory; None for the bundled policy.
        policy_data: a dict deep-merged over the bundle's ``data.json`` (share groups,
            retention, per-tenant settings); from the environment as JSON text.
        key_secret_file: a file holding the cache-key secret (else ``KVGOV_KEY_SECRET``),
            its owner's alone (no bit of ``077`` in its mode).
        ephemeral_secret: with no secret anywhere, draw a random one for the life of
            the process (development only: a restart makes every cached block unreachable).
        default_tenant: the tenant of a request that names none; None refuses such
            requests (fail closed).
        default_classification: the classification of a request that names none;
            None refuses such requests.
        default_template: the template version of a request that names none; None
            refuses such requests.
        require_scope_token: refuse every request whose scope is not signed by the
            front end (``kvgov_scope_token``), including one whose fields all come from
            the defaults (the token then signs the default values); needs a scope-token key.
        scope_token_key_file: a file holding the scope-token key (else
            ``KVGOV_SCOPE_TOKEN_KEY``), its owner's alone.
        scope_token_max_ttl: the longest a scope token may still be valid for when it
            arrives, seconds.
        model_revision: the model revision to key under, overriding the engine's
            (which is None for a local path); invalidation matches on it.
        tokenizer_revision: the same for the tokenizer.
        connector_kinds: third-party KV connector classes the operator vouches for,
            ``{"package.module.ClassName": "block_hashes" | "cache_salt"}``
            (:mod:`kvgov.govern.vllm.connectors`); from the environment as JSON text.
        fleet_url: the fleet's database (docs/fleet.md); set, the engine runs a fleet
            agent that registers it and runs the operators' signed orders between
            steps; None runs none.
        fleet_engine_id: the engine's id in the fleet, stable across restarts (a
            restarted engine runs the orders it missed); None takes ``worker_id``.
        fleet_operator_keys_file: a PEM file of the operators' Ed25519 public keys (one
            or more); orders signed by any other key are refused. Its owner's alone
            (no bit of ``077`` in its mode), like every key file kvgov reads: who may
            write it may order the engine.
        fleet_poll_interval: seconds between the agent's polls of the database
            (PostgreSQL also wakes it by ``NOTIFY``); an idle engine runs an order
            within about this long after it is issued.
    """

    audit_url: str = defaults.AUDIT_URL
    audit_writer: WriterKind = "thread"
    worker_id: str | None = None
    policy_dir: str | None = None
    policy_data: Mapping[str, Any] | None = None
    key_secret_file: str | None = None
    ephemeral_secret: bool = False
    default_tenant: str | None = None
    default_classification: str | None = None
    default_template: str | None = None
    require_scope_token: bool = False
    scope_token_key_file: str | None = None
    scope_token_max_ttl: float = defaults.SCOPE_TOKEN_MAX_TTL_SECONDS
    model_revision: str | None = None
    tokenizer_revision: str | None = None
    connector_kinds: Mapping[str, Any] | None = None
    fleet_url: str | None = None
    fleet_engine_id: str | None = None
    fleet_operator_keys_file: str | None = None
    fleet_poll_interval: float = 1.0

    @classmethod
    def load(
        cls, additional_config: Mapping[str, Any] | None, environ: Mapping[str, str]
    ) -> BindingSettings:
        """Read the settings: ``additional_config["kvgov"]``, then the environment, then defaults.

        Args:
            additional_config: vLLM's ``additional_config`` (None or a dict).
            environ: the environment (``os.environ``).

        Raises:
            BindingConfigError: an unknown setting, a secret in ``additional_config``,
                or a value of the wrong type.
        """
        given: Any = (additional_config or {}).get(defaults.VLLM_CONFIG_KEY, {})
        if not isinstance(given, Mapping):
            raise BindingConfigError(
                f"additional_config[{defaults.VLLM_CONFIG_KEY!r}]", given, "a JSON object"
            )
        for name in given:
            if name in _SECRETS:
                raise BindingConfigError(
                    name, "<hidden>", f"never put secrets in additional_config: {_SECRETS[name]}"
                )
            if name not in SETTINGS:
                raise BindingConfigError(name, given[name], f"unknown setting; known: {SETTINGS}")
        values: dict[str, Any] = {}
        for f in fields(cls):
            env_name = defaults.SETTING_ENV_PREFIX + f.name.upper()
            if f.name in given:
                values[f.name] = _check(f.name, given[f.name], from_env=False)
            elif env_name in environ:
                values[f.name] = _check(env_name, environ[env_name], from_env=True, field=f.name)
        return cls(**values)

    def key_secret(self) -> bytes | None:
        """The cache-key secret from ``key_secret_file``, or None (then the environment).

        Raises:
            BindingConfigError: the file cannot be read, or its group or others may access it.
        """
        return _read_secret("key_secret_file", self.key_secret_file)

    def scope_token_key(self, environ: Mapping[str, str]) -> bytes | None:
        """The scope-token key: ``scope_token_key_file``, else ``KVGOV_SCOPE_TOKEN_KEY``, else None.

        Raises:
            BindingConfigError: the file cannot be read, or its group or others may access it.
        """
        from_file = _read_secret("scope_token_key_file", self.scope_token_key_file)
        if from_file is not None:
            return from_file
        from_env = environ.get(defaults.SCOPE_TOKEN_KEY_ENV)
        return from_env.encode("utf-8") if from_env else None

    def fleet_engine(self) -> str:
        """The engine's fleet id: ``fleet_engine_id``, else ``worker_id``.

        Raises:
            BindingConfigError: neither is set (an id drawn per process would make a
                restarted engine miss the orders issued while it was down).
        """
        engine_id = self.fleet_engine_id or self.worker_id
        if engine_id is None:
            raise BindingConfigError(
                "fleet_engine_id", None, "set with fleet_url (or set worker_id): a stable id"
            )
        return engine_id

    def fleet_operator_keys(self) -> list[Ed25519PublicKey]:
        """The operators' public keys from ``fleet_operator_keys_file``.

        Raises:
            BindingConfigError: no file named, it cannot be read, group or others may
                access it, or it holds no Ed25519 public key (or anything else).
        """
        setting = "fleet_operator_keys_file"
        raw = _read_secret(setting, self.fleet_operator_keys_file)
        if raw is None:
            raise BindingConfigError(
                setting, None, "set with fleet_url: the operators' public keys"
            )
        keys: list[Ed25519PublicKey] = []
        for block in _PEM_BLOCK.findall(raw):
            try:
                key = load_pem_public_key(block)
            except ValueError:
                key = None
            if not isinstance(key, Ed25519PublicKey):
                raise BindingConfigError(
                    setting, self.fleet_operator_keys_file, "PEM Ed25519 public keys only"
                )
            keys.append(key)
        if not keys:
            raise BindingConfigError(
                setting, self.fleet_operator_keys_file, "at least one PEM Ed25519 public key"
            )
        return keys


#: Every setting's name, in declaration order.
SETTINGS = tuple(f.name for f in fields(BindingSettings))
_BOOLS = {"ephemeral_secret", "require_scope_token"}
_FLOATS = {"scope_token_max_ttl", "fleet_poll_interval"}
#: One PEM block of any kind (a private key among them is refused: not a public key).
_PEM_BLOCK = re.compile(rb"-----BEGIN [A-Z ]+-----.+?-----END [A-Z ]+-----", re.DOTALL)
_MAPPINGS = {"policy_data", "connector_kinds"}
#: Settings that take one of a few words.
_CHOICES = {"audit_writer": ("process", "thread")}


def _check(setting: str, value: Any, *, from_env: bool, field: str | None = None) -> Any:
    """One setting's value, typed; text from the environment is parsed first."""
    name = field or setting
    if name in _BOOLS:
        if from_env:
            text = str(value).strip().lower()
            if text not in _TRUE | _FALSE:
                raise BindingConfigError(setting, value, "true or false (1/0, yes/no, on/off)")
            return text in _TRUE
        if not isinstance(value, bool):
            raise BindingConfigError(setting, value, "true or false")
        return value
    if name in _FLOATS:
        try:
            number = float(value) if from_env else value
        except ValueError:
            raise BindingConfigError(setting, value, "a number of seconds > 0") from None
        if (
            isinstance(number, bool)
            or not isinstance(number, int | float)
            or not math.isfinite(number)
            or number <= 0
        ):
            raise BindingConfigError(setting, value, "a number of seconds > 0")
        return float(number)
    if name in _MAPPINGS:
        if from_env:
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise BindingConfigError(setting, value[:40], f"JSON text ({exc})") from None
        if not isinstance(value, Mapping):
            raise BindingConfigError(setting, value, "a JSON object")
        return dict(value)
    if name in _CHOICES:
        if value not in _CHOICES[name]:
            raise BindingConfigError(setting, value, " or ".join(_CHOICES[name]))
        return value
    if not isinstance(value, str) or not value:
        raise BindingConfigError(setting, value, "a non-empty string")
    return value


def _read_secret(setting: str, path: str | None) -> bytes | None:
    """The secret in the file ``path`` names (one trailing newline dropped), or None."""
    if path is None:
        return None
    why = ""
    try:
        raw = read_key_file(Path(path))
    except KeyFileOpenToOthers as exc:  # a file that exists: its path is a path, shown
        raise BindingConfigError(setting, str(exc.path), str(exc)) from None
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
    if why:  # raised here, not in the handler: the OSError (naming the text) is not chained
        # Not shown: a secret given where its file's path belongs would be printed.
        raise BindingConfigError(setting, f"<{unshown(path)}>", f"cannot read it as a file ({why})")
    return raw.rstrip(b"\r\n")
