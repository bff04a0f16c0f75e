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
"""

from __future__ import annotations

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
        revision: the bundle revision served at /v1/data/system/bundles; None
            serves no bundles (then the policies are listed at /v1/policies).
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
                if self.path.rstrip("/") == "/v1/data/system/bundles":
                    if fake.revision is None:
                        self._send(200, b"{}")
                    else:
                        doc = {"kvgov": {"manifest": {"revision": fake.revision}}}
                        self._send(200, json.dumps({"result": doc}).encode())
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

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                return  # a client that timed out and hung up is expected here

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the server."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._worker.shutdown(wait=True)
