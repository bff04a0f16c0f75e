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

Bundle revision: read from ``GET /v1/data/system/bundles`` (OPA keeps each
activated bundle's manifest there) as ``name=revision`` pairs sorted and joined
by ``,``; where OPA serves no bundles (policies pushed with ``PUT
/v1/policies``), it is ``policies-sha256:`` + 16 hex digits of the SHA-256 of the
policies' ids and sources (``GET /v1/policies``, sorted by id, each ``id 0x00 raw
0x00``). It is read at construction and again when ``revision_ttl`` seconds have
passed (or on :meth:`OpaServerEngine.refresh_revision`); ``"unknown"`` until a
read succeeds. Decisions are tagged, and cached, under the revision known when
they were made, so a bundle swap on the server is seen within ``revision_ttl``.

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
from kvgov.policy.engine import Decision, failed_decision, json_shape, make_decision, normalize_path
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
        revision_ttl: seconds a read bundle revision is trusted.
        clock: monotonic clock for the revision TTL.
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
        self._revision = "unknown"
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
    def bundle_revision(self) -> str:
        """The server's bundle revision, re-read when older than ``revision_ttl``.

        A decision cache reads this on every lookup, so a bundle swap on the server
        is noticed within ``revision_ttl`` even when every lookup hits.
        ``"unknown"`` until a read succeeds.
        """
        if not self._closed and self._clock() - self._revision_at >= self._revision_ttl:
            self.refresh_revision()
        return self._revision

    def refresh_revision(self) -> str:
        """Read the bundle revision from the server now.

        Returns:
            The revision; unchanged (possibly ``"unknown"``) when the server cannot
            be read, in which case the next evaluation tries again.
        """
        self._revision_at = self._clock()
        try:
            self._revision = self._read_revision()
        except BaseException as exc:
            if isinstance(exc, _PASS_THROUGH):
                raise
            self._revision_at = float("-inf")
        return self._revision

    def _read_revision(self) -> str:
        client = self._client()
        try:
            bundles = client.get_data("system/bundles").get("result")
        except requests.RequestException:
            raise  # the server is unreachable: keep the revision we had
        except Exception:
            bundles = None  # no bundle metadata (e.g. PolicyNotFoundError): hash policies
        if isinstance(bundles, dict) and bundles:
            pairs = []
            for name in sorted(bundles):
                meta = bundles[name] if isinstance(bundles[name], dict) else {}
                manifest = meta.get("manifest") or {}
                pairs.append(f"{name}={manifest.get('revision', '')}")
            return ",".join(pairs)
        h = hashlib.sha256()
        for pid in sorted(client.get_policies_list()):
            raw = client.get_policy(pid).get("result", {}).get("raw", "")
            h.update(str(pid).encode() + b"\x00" + str(raw).encode() + b"\x00")
        return "policies-sha256:" + h.hexdigest()[:16]

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
