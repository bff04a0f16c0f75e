"""A TCP proxy in front of PostgreSQL that a test can freeze, thaw, kill and restart.

``freeze()`` stops relaying bytes but keeps every socket open, as a frozen server
(SIGSTOP) or a partition without RST looks to a client: its kernel (here, the
proxy's) still accepts and acknowledges what the client sends, nothing answers.
``kill()`` closes every connection and refuses new ones, as a dead server does.
The shared PostgreSQL server itself is never touched.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class FreezableProxy:
    """Relay ``127.0.0.1:<port>`` to ``target``, with faults on demand.

    Args:
        target: (host, port) of the real server.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port: int = probe.getsockname()[1]
        probe.close()
        self._server: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._relaying = threading.Event()
        self._relaying.set()

    @property
    def frozen(self) -> bool:
        """Whether bytes are held back."""
        return not self._relaying.is_set()

    def start(self) -> None:
        """Listen (again) and relay."""
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", self.port))
        srv.listen(64)
        self._server = srv
        self._relaying.set()
        threading.Thread(target=self._accept, args=(srv,), daemon=True).start()

    def freeze(self) -> None:
        """Stop relaying; keep every connection open and keep accepting new ones."""
        self._relaying.clear()

    def thaw(self) -> None:
        """Relay again, held-back bytes first."""
        self._relaying.set()

    def kill(self) -> None:
        """Close every connection (the client sees a reset or EOF) and stop listening."""
        if self._server is not None:
            with contextlib.suppress(OSError):  # shutdown wakes the blocked accept()
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self._relaying.set()  # release pipes waiting on a freeze: their sockets are closed

    def _accept(self, srv: socket.socket) -> None:
        while True:
            try:
                client, _ = srv.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                self._relaying.wait()
                data = a.recv(65536)
                if not data:
                    break
                self._relaying.wait()  # frozen meanwhile: hold these bytes
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
