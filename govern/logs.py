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
        _state.level = numeric


class _Logger:
    """kvgov's logger: level checks first, so a disabled level costs one attribute read.

    Until :func:`configure_logging` runs (or the host configures structlog
    itself), only warnings and errors are emitted: an embedded library must not
    flood its host's output, nor pay for formatting on the hot path.
    """

    __slots__ = ()

    def _emit(self, level: int, event: str, kw: dict[str, object]) -> None:
        if level >= _state.level or structlog.is_configured():
            getattr(structlog.get_logger("kvgov"), logging.getLevelName(level).lower())(event, **kw)

    def debug(self, event: str, **kw: object) -> None:
        """An event per governed action."""
        if _state.level <= logging.DEBUG or structlog.is_configured():
            self._emit(logging.DEBUG, event, kw)

    def info(self, event: str, **kw: object) -> None:
        """Decisions and erasures."""
        if _state.level <= logging.INFO or structlog.is_configured():
            self._emit(logging.INFO, event, kw)

    def warning(self, event: str, **kw: object) -> None:
        """Something an operator should look at."""
        self._emit(logging.WARNING, event, kw)


class _State:
    level = logging.WARNING


_state = _State()


def get_logger() -> _Logger:
    """kvgov's logger (see :class:`_Logger`)."""
    return _Logger()
