"""The OPA server engine: decisions from a running OPA over its REST data API.

It wraps ``opa-python-client`` (pinned ``>=3,<4``; its API changed between
majors, so only :meth:`OpaClient.query_rule`, :meth:`OpaClient.get_data`,
:meth:`OpaClient.get_policies_list` and :meth:`OpaClient.get_policy` are used, all
here). A decision is ``POST /v1/data/<path>`` with ``{"input": ...}``; OPA answers
``{"result": ...}``, or ``{}`` (200, no ``result``) when the rule is undefined,
which is a deny from the policy, not an error to retry.

Fail closed: a connection error, a timeout, an HTTP error status, a body that is
not a JSON object, or an answer that arrives after the timeout each deny, with
the error in the decision. The client is built with ``retries=0``: a decision must
not wait through retries and back-off.

Timeouts: opa-python-client hands ``timeout`` to ``requests``, which bounds the
connect and **each socket read**, not the whole exchange; a server that trickles
bytes can take longer. The engine therefore also measures the whole call and
denies any answer that took longer than ``timeout`` (it cannot abort it earlier
without leaving the wrapped client).

Revision: a digest of what the server decides from, its policies **and** its
data: ``opa-sha256:`` + 16 hex digits of the SHA-256 of the policies (``GET
/v1/policies``, then each one's source, sorted by id, each ``id 0x00 raw 0x00``)
followed by ``data 0x00`` and the canonical JSON (RFC 8785) of the whole data
document (``GET /v1/data``, which holds ``system.bundles`` too). Where the data names
bundles whose manifests carry a revision, those come first, for people:
``kvgov=r1+opa-sha256:...`` (``name=revision`` pairs sorted by name, joined by
``,``). A manifest revision alone is never trusted: a bundle re-published without
bumping it, a bundle with no ``.manifest`` (the bundled ``policy/rego`` has none)
and data written with ``PUT /v1/data`` all change the digest. It is read at
construction and again once ``revision_ttl`` seconds have passed (or on
:meth:`OpaServerEngine.refresh_revision`), never per decision. When it cannot be
read (server unreachable, an error status, a token not allowed to read
``/v1/data`` or ``/v1/policies``), it is :data:`~kvgov.policy.engine.UNKNOWN_REVISION`
until the next read, ``revision_ttl`` later: the old revision is not kept, and a
decision cache neither stores nor serves decisions under it. Decisions are tagged
with the revision known when they were made; as that may be up to ``revision_ttl``
old, the engine is a :class:`~kvgov.policy.engine.TimedRevision` and a
:class:`~kvgov.policy.cache.CachedEngine` keeps its decisions at most
``revision_ttl`` seconds. So a change on the server, of policy or data, is seen by a
cached client within ``revision_ttl``.

Redirects are refused: a 3xx answer fails closed and its target is never
contacted, so neither the policy input (which carries tenants and scopes) nor the
bearer token can be sent to another host by a misconfigured or hostile server.
``requests`` follows redirects by default, re-sending a 307/308 POST with its body.

Threads: one ``OpaClient`` (one ``requests`` session) per thread.
"""

from __future__ import annotations

import hashlib
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

import requests
from opa_client import OpaClient

from kvgov.defaults import OPA_REVISION_TTL_SECONDS, OPA_TIMEOUT_SECONDS
from kvgov.exceptions import PolicyError
from kvgov.policy.bundle import canonical_json
from kvgov.policy.engine import (
    UNKNOWN_REVISION,
    Decision,
    failed_decision,
    json_shape,
    make_decision,
    normalize_path,
)
from kvgov.secrecy import redact_url

__all__ = ["OpaServerEngine"]

_PASS_THROUGH = (KeyboardInterrupt, SystemExit, GeneratorExit)


class RedirectRefused(requests.RequestException):
    """OPA answered with a redirect; kvgov does not follow it."""


def _refuse_redirect(response: requests.Response, *args: Any, **kwargs: Any) -> None:
    """A ``requests`` response hook: raise before the session follows a redirect."""
    if response.is_redirect or response.is_permanent_redirect:
        target = response.headers.get("location", "?")
        raise RedirectRefused(
            f"OPA answered HTTP {response.status_code} redirecting to {target!r}; "
            "redirects are refused",
            response=response,
        )


class _Client(OpaClient):  # type: ignore[misc]
    """``OpaClient`` whose session refuses redirects (see the module notes)."""

    def _init_session(self) -> requests.Session:
        session: requests.Session = super()._init_session()
        session.max_redirects = 0
        session.hooks["response"].append(_refuse_redirect)
        return session


class OpaServerEngine:
    """Evaluate rules on a running OPA server (``opa run --server``).

    Args:
        url: the server, e.g. ``http://127.0.0.1:8181`` (``https`` for TLS); no path.
        token: bearer token sent as ``Authorization: Bearer ...``.
        timeout: seconds a decision may take before it fails closed.
        revision_ttl: seconds a read revision is trusted, and a decision cached
            (see the module notes).
        clock: monotonic clock for the revision TTL and the age of cached decisions.
        timer: timer for ``Decision.seconds`` and the whole-call timeout.

    Raises:
        PolicyError: the URL is not ``http(s)://host[:port]``.

    Attributes:
        name: ``"opa-server"``.
    """

    name = "opa-server"

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = OPA_TIMEOUT_SECONDS,
        revision_ttl: float = OPA_REVISION_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PolicyError(f"OPA url {redact_url(url)!r} must look like http://host:port")
        if parts.path not in ("", "/") or parts.query:
            raise PolicyError(f"OPA url {redact_url(url)!r} must not carry a path or query")
        self.url = url
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 8181)
        self._ssl = parts.scheme == "https"
        self._token = token
        self._timeout = timeout
        self._revision_ttl = revision_ttl
        self._clock = clock
        self._timer = timer
        self._local = threading.local()
        self._clients: list[OpaClient] = []
        self._clients_lock = threading.Lock()
        self._closed = False
        self._revision = UNKNOWN_REVISION
        self._revision_at = float("-inf")
        self.refresh_revision()

    def _client(self) -> OpaClient:
        client: OpaClient | None = getattr(self._local, "client", None)
        if client is None:
            client = _Client(
                host=self._host,
                port=self._port,
                ssl=self._ssl,
                token=self._token,
                retries=0,
                timeout=self._timeout,
            )
            self._local.client = client
            with self._clients_lock:
                self._clients.append(client)
        return client

    @property
    def revision(self) -> str:
        """The digest of the server's policies and data, re-read when older than ``revision_ttl``.

        See the module notes for what it covers. A decision cache reads it on every
        lookup; it costs a clock read, and the server is asked again only once
        ``revision_ttl`` has passed. :data:`~kvgov.policy.engine.UNKNOWN_REVISION`
        while it cannot be read.
        """
        if not self._closed and self._clock() - self._revision_at >= self._revision_ttl:
            self.refresh_revision()
        return self._revision

    @property
    def bundle_revision(self) -> str:
        """The same as :attr:`revision` (the name every engine has)."""
        return self.revision

    @property
    def revision_ttl(self) -> float:
        """Seconds a read revision is trusted, and a decision kept by a cache."""
        return self._revision_ttl

    def now(self) -> float:
        """The engine's monotonic clock (the one ``revision_ttl`` is measured on).

        Returns:
            Seconds.
        """
        return self._clock()

    def refresh_revision(self) -> str:
        """Read the revision from the server now.

        Returns:
            The revision; :data:`~kvgov.policy.engine.UNKNOWN_REVISION` when the
            server's policies or data cannot be read (the next read is
            ``revision_ttl`` later, or at the next call of this method).
        """
        self._revision_at = self._clock()
        try:
            revision = self._read_revision()
        except BaseException as exc:
            if isinstance(exc, _PASS_THROUGH):
                raise
            revision = UNKNOWN_REVISION
        self._revision = revision
        return revision

    def _read_revision(self) -> str:
        """The revision (see the module notes); raises when anything cannot be read."""
        client = self._client()
        data = client.get_data("").get("result")
        if not isinstance(data, dict):
            raise PolicyError(f"GET /v1/data answered {type(data).__name__}, not an object")
        h = hashlib.sha256()
        for pid in sorted(str(p) for p in client.get_policies_list()):
            policy = client.get_policy(pid).get("result")
            raw = policy.get("raw") if isinstance(policy, dict) else None
            if not isinstance(raw, str):
                raise PolicyError(f"GET /v1/policies/{pid} answered no source")
            h.update(pid.encode() + b"\x00" + raw.encode() + b"\x00")
        h.update(b"data\x00" + canonical_json(data).encode())
        digest = "opa-sha256:" + h.hexdigest()[:16]
        system = data.get("system")
        bundles = system.get("bundles") if isinstance(system, dict) else None
        declared = []
        for name, meta in sorted(bundles.items()) if isinstance(bundles, dict) else ():
            manifest = meta.get("manifest") if isinstance(meta, dict) else None
            revision = manifest.get("revision") if isinstance(manifest, dict) else None
            if isinstance(revision, str) and revision:
                declared.append(f"{name}={revision}")
        return f"{','.join(declared)}+{digest}" if declared else digest

    def evaluate(self, path: str, input: Mapping[str, Any]) -> Decision:
        """Ask the server for one rule's value; never raises for server failures.

        Args:
            path: the rule, slash or dotted form.
            input: the policy input.

        Returns:
            The decision: an undefined rule (no ``result``) denies without error;
            every failure denies with ``error`` set.
        """
        start = self._timer()
        if self._closed:
            return failed_decision(
                path, "engine closed", bundle_revision=self._revision, engine=self.name, seconds=0.0
            )
        revision = self.bundle_revision
        try:
            slash = normalize_path(path)
            body = self._client().query_rule(input_data=json_shape(input), package_path=slash)
        except BaseException as exc:
            if isinstance(exc, _PASS_THROUGH):
                raise
            return failed_decision(
                path,
                _describe(exc, self._timeout),
                bundle_revision=revision,
                engine=self.name,
                seconds=self._timer() - start,
            )
        seconds = self._timer() - start
        if seconds > self._timeout:
            error = f"timeout: OPA answered after {seconds:.3f}s (limit {self._timeout}s)"
        elif not isinstance(body, dict):
            error = f"malformed answer: expected a JSON object, got {type(body).__name__}"
        else:
            result = body.get("result")
            return make_decision(
                slash, result, bundle_revision=revision, engine=self.name, seconds=seconds
            )
        return failed_decision(
            slash, error, bundle_revision=revision, engine=self.name, seconds=seconds
        )

    def close(self) -> None:
        """Close every thread's HTTP session; later evaluations fail closed."""
        self._closed = True
        with self._clients_lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close_connection()


def _describe(exc: BaseException, timeout: float) -> str:
    """A one-line description of why a request to OPA failed."""
    if isinstance(exc, requests.Timeout):
        return f"timeout: OPA did not answer within {timeout}s ({type(exc).__name__})"
    if isinstance(exc, requests.HTTPError):
        response = exc.response
        status = response.status_code if response is not None else "?"
        text = response.text[:200].strip() if response is not None else ""
        return f"HTTP {status} from OPA: {text}" if text else f"HTTP {status} from OPA"
    if isinstance(exc, RedirectRefused):
        return str(exc)
    if isinstance(exc, requests.JSONDecodeError):
        return f"malformed answer: body is not JSON ({exc})"
    if isinstance(exc, requests.RequestException):
        return f"OPA unreachable: {type(exc).__name__}: {exc}"
    return f"{type(exc).__name__}: {exc}"
