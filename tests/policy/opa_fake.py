"""A local stand-in for an OPA server, speaking OPA's REST data API on 127.0.0.1.

Answers come from the engine it is given: in the tests, the reference engine
(OPA v1.20.2 itself, in-process, :mod:`kvgov.policy.reference`), so the OPA
server engine is tested against OPA's semantics, not regorus's; the embedded
engine works too. They are computed on one worker thread owned by the server (a
regorus engine is bound to its thread; handler threads may outlive a test on
keep-alive connections, and an engine must not be dropped on another thread).
``mode`` makes it misbehave: ``"slow"`` (sleeps ``delay`` seconds first),
``"error500"``, ``"garbage"`` (a body that is not JSON), ``"undefined"`` (200 with
no ``result``), ``"list"`` (a JSON body that is not an object). Used by the tests
and by benchmarks/bench_policy.py.

What it serves besides decisions, as OPA does: ``GET /v1/data`` (the whole data
document: the engine's data and ``system.bundles``), ``GET /v1/data/system/bundles``,
``GET /v1/policies`` and ``GET /v1/policies/<id>``; ``PUT /v1/data/<path>`` sets a
value in the data and re-activates the engine with it (:meth:`FakeOpa.put_data`).
``get_status`` answers every GET with that HTTP status instead (e.g. 403: a server
whose authorization policy keeps the token from reading data and policies).
"""

from __future__ import annotations

import copy
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kvgov.policy.embedded import EmbeddedEngine
from kvgov.policy.reference import ReferenceEngine

# The misbehaving modes that answer a decision with a fixed (status, body).
_CANNED: dict[str, tuple[int, bytes]] = {
    "error500": (500, b'{"code": "internal_error", "message": "boom"}'),
    "garbage": (200, b"<html>not json"),
    "undefined": (200, b"{}"),
    "list": (200, b"[1, 2]"),
}


class FakeOpa:
    """An OPA-like HTTP server in a background thread (ephemeral port).

    Args:
        engine: the in-process engine answering decisions (the reference engine in
            the tests).
        revision: the revision in the manifest of the bundle ``kvgov`` served at
            /v1/data/system/bundles; ``""`` serves that bundle with a manifest
            that has no revision (as ``opa run --bundle policy/rego`` does); None
            serves no bundles (policies pushed with the policy API).
        token: when set, requests without ``Authorization: Bearer <token>`` get 401.
    """

    def __init__(
        self,
        engine: EmbeddedEngine | ReferenceEngine,
        revision: str | None = "r1",
        token: str | None = None,
    ) -> None:
        self.engine = engine
        self.revision = revision
        self.token = token
        self.mode = "ok"
        self.delay = 0.3
        self.requests = 0
        self.gets = 0
        # When set, every request is answered with this status and a Location
        # header pointing at redirect_to + the request's path.
        self.redirect_to: str | None = None
        self.redirect_status = 307
        # When set, every GET is answered with this status (and no data).
        self.get_status: int | None = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fake-opa-eval")
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _redirected(self) -> bool:
                if fake.redirect_to is None:
                    return False
                self.send_response(fake.redirect_status)
                self.send_header("Location", fake.redirect_to + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return True

            def _authorised(self) -> bool:
                if fake.token is None:
                    return True
                if self.headers.get("Authorization") == f"Bearer {fake.token}":
                    return True
                self._send(401, b'{"code": "unauthorized", "message": "missing token"}')
                return False

            def do_GET(self) -> None:
                fake.gets += 1
                if self._redirected() or not self._authorised():
                    return
                if fake.get_status is not None:
                    self._send(fake.get_status, b'{"code": "unauthorized"}')
                    return
                if self.path.rstrip("/") == "/v1/data/system/bundles":
                    bundles = fake.bundles()
                    self._send(200, json.dumps({"result": bundles} if bundles else {}).encode())
                elif self.path.rstrip("/") == "/v1/data":
                    self._send(200, json.dumps({"result": fake.data_document()}).encode())
                elif self.path.rstrip("/") == "/v1/policies":
                    bundle = fake.engine.bundle
                    ids = [f.name for f in bundle.policies] if bundle else []
                    self._send(200, json.dumps({"result": [{"id": i} for i in ids]}).encode())
                elif self.path.startswith("/v1/policies/"):
                    pid = self.path[len("/v1/policies/") :]
                    bundle = fake.engine.bundle
                    raw = {f.name: f.source for f in bundle.policies}.get(pid) if bundle else None
                    if raw is None:
                        self._send(404, b'{"code": "resource_not_found"}')
                    else:
                        self._send(200, json.dumps({"result": {"id": pid, "raw": raw}}).encode())
                else:
                    self._send(404, b'{"code": "resource_not_found"}')

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                fake.requests += 1
                if self._redirected() or not self._authorised():
                    return
                if not self.path.startswith("/v1/data/"):
                    self._send(404, b"{}")
                    return
                if fake.mode == "slow":
                    time.sleep(fake.delay)
                canned = _CANNED.get(fake.mode)
                if canned is not None:
                    self._send(*canned)
                    return
                path = self.path[len("/v1/data/") :].split("?")[0]
                try:
                    job = fake._worker.submit(fake.engine.evaluate, path, body.get("input", {}))
                except RuntimeError:  # closed while a slow request was still sleeping
                    self._send(503, b'{"code": "unavailable"}')
                    return
                d = job.result()
                answer = {} if d.result is None else {"result": d.result}
                self._send(200, json.dumps(answer).encode())

            def do_PUT(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                value = json.loads(self.rfile.read(length) or b"null")
                if self._redirected() or not self._authorised():
                    return
                if not self.path.startswith("/v1/data/"):
                    self._send(404, b"{}")
                    return
                fake.put_data(self.path[len("/v1/data/") :].split("?")[0], value)
                self._send(204, b"")

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                return  # a client that timed out and hung up is expected here

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def bundles(self) -> dict[str, Any]:
        """What OPA keeps at ``data.system.bundles``: the bundle's manifest, if one."""
        if self.revision is None:
            return {}
        manifest = {"revision": self.revision} if self.revision else {}
        return {"kvgov": {"manifest": {**manifest, "roots": [""]}}}

    def data_document(self) -> dict[str, Any]:
        """The data ``GET /v1/data`` answers: the engine's data and ``system.bundles``."""
        bundle = self.engine.bundle
        doc = copy.deepcopy(dict(bundle.data)) if bundle is not None else {}
        bundles = self.bundles()
        if bundles:
            doc["system"] = {"bundles": bundles}
        return doc

    def put_data(self, path: str, value: Any) -> None:
        """As OPA's ``PUT /v1/data/<path>``: set ``value`` there (creating objects on the
        way) and re-activate the engine with the new data, on the evaluating thread.

        The new data is the engine's data with that value replaced, handed to the
        engine's ``reload`` (which merges it over data.json: a key of data.json cannot
        be removed this way, which the tests do not need).
        """
        bundle = self.engine.bundle
        data = copy.deepcopy(dict(bundle.data)) if bundle is not None else {}
        *parents, last = [p for p in path.split("/") if p]
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
        self._worker.submit(self.engine.reload, None, data).result()

    def close(self) -> None:
        """Stop the server."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._worker.shutdown(wait=True)
