"""Structured logging, configured once: JSON in production, console in a terminal.

kvgov logs through ``structlog.get_logger("kvgov")``: one event per governed
action at debug, decisions and erasures at info. A library must not seize
the host's logging, so nothing is configured on import; the ``kvgov`` command
calls :func:`configure_logging`, and an embedding service may call it too or
configure structlog itself.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any, Final

import structlog

__all__ = ["configure_logging", "get_logger"]

_lock = threading.Lock()
_configured = False


def configure_logging(level: str | None = None, *, json: bool | None = None) -> None:
    """Configure structlog for kvgov; later calls do nothing.

    A host that configures structlog itself gets every kvgov event at every
    level and filters them with its own configuration; call this instead to let
    kvgov choose.

    Args:
        level: ``debug``, ``info``, ``warning``...; default ``KVGOV_LOG_LEVEL`` or ``warning``.
        json: JSON lines (production) or a console renderer; default JSON unless
            stderr is a terminal.
    """
    global _configured
    with _lock:
        if _configured:
            return
        name = (level or os.environ.get("KVGOV_LOG_LEVEL") or "warning").upper()
        numeric = logging.getLevelNamesMapping().get(name, logging.WARNING)
        use_json = (not sys.stderr.isatty()) if json is None else json
        renderer: structlog.typing.Processor = (
            structlog.processors.JSONRenderer()
            if use_json
            else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        )
        structlog.configure(
            processors=[
                structlog.contextvars.merge_contextvars,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                renderer,
            ],
            wrapper_class=structlog.make_filtering_bound_logger(numeric),
            logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
            cache_logger_on_first_use=True,
        )
        _configured = True


class _Logger:
    """kvgov's logger: structlog's, or (until structlog is configured) structlog's at warning.

    Why not a bare ``structlog.get_logger("kvgov")``: unconfigured, structlog prints every
    level to stdout, so an embedding service that never configured it would get a debug
    line per admission on its output (and pay for rendering it on the hot path); and a
    library must not configure structlog on import. So until :func:`configure_logging`
    runs (or the host configures structlog), debug and info are dropped here (one
    ``is_configured`` call, 0.5 us a call on the admission path) and warnings go to a
    structlog logger filtered at warning; after, every call goes to
    ``structlog.get_logger("kvgov")``, which the configuration filters and renders.
    """

    __slots__ = ()

    def debug(self, event: str, **kw: Any) -> None:
        """An event per governed action."""
        if structlog.is_configured():
            _CONFIGURED.debug(event, **kw)

    def info(self, event: str, **kw: Any) -> None:
        """Decisions and erasures."""
        if structlog.is_configured():
            _CONFIGURED.info(event, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        """Something an operator should look at."""
        (_CONFIGURED if structlog.is_configured() else _QUIET).warning(event, **kw)

    def error(self, event: str, **kw: Any) -> None:
        """Something failed."""
        (_CONFIGURED if structlog.is_configured() else _QUIET).error(event, **kw)


#: Follows the structlog configuration in force (kvgov's or the host's).
_CONFIGURED: Final = structlog.get_logger("kvgov")
#: Warnings and errors only, rendered by structlog's default processors (to stdout). A
#: bound logger, not a lazy proxy: a proxy binds anew at every call.
_QUIET: Final = structlog.wrap_logger(
    structlog.PrintLogger(), wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING)
).bind()


def get_logger() -> _Logger:
    """kvgov's logger (see :class:`_Logger`)."""
    return _Logger()
