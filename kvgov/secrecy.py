"""Keeping secrets out of what kvgov prints, logs and writes; reading key files safely.

Every layer may import this module (it imports nothing of kvgov), so there is one
redactor for every URL kvgov shows (:func:`redact_url`) and one reader for every key
file (:func:`read_key_file`).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from urllib.parse import unquote_plus

__all__ = ["HIDDEN", "KeyFileOpenToOthers", "read_key_file", "redact_url", "unshown"]

#: What stands for a hidden secret.
HIDDEN = "***"

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://(.*)", re.DOTALL)
#: Names of query parameters whose value is a secret (any name holding one of these).
_SECRET_PARAM = re.compile(
    r"pass|pwd|secret|token|credential|api_?key|access_?key|private|^auth$|^key$", re.IGNORECASE
)
_PARAM = re.compile(r"(?P<sep>^|[?&;\s])(?P<name>[^=&;?#\s]+)=(?P<value>[^&;#\s]*)")


def _hide_params(text: str) -> str:
    """``text`` with the value of every secret-named ``name=value`` pair hidden."""

    def one(m: re.Match[str]) -> str:
        name = unquote_plus(m["name"])  # p%61ssword still names a password
        if _SECRET_PARAM.search(name) or _SECRET_PARAM.search(m["name"]):
            return f"{m['sep']}{m['name']}={HIDDEN}"
        return m.group(0)

    return _PARAM.sub(one, text)


def _hide_authority(rest: str) -> str:
    """The part after ``scheme://`` with the userinfo's password (or a doubtful port) hidden."""
    if rest.startswith("/"):  # no authority (sqlite:////path, unix:///path): nothing but params
        return _hide_params(rest)
    at = rest.rfind("@")  # an unescaped @ in the password: the host follows the last one
    if at >= 0:
        user, colon, _password = rest[:at].partition(":")
        if not colon and re.search(r"[/?#]", user):  # not a plain user name: unsure
            return f"{HIDDEN}@{_hide_params(rest[at + 1 :])}"
        shown = f"{user}:{HIDDEN}" if colon else user
        return f"{shown}@{_hide_params(rest[at + 1 :])}"
    end = re.search(r"[/?#]", rest)
    host = rest[: end.start()] if end else rest
    tail = rest[end.start() :] if end else ""
    bare = re.sub(r"^\[[^\]]*\]", "", host)  # an IPv6 literal holds colons
    port = bare.partition(":")[2]
    if ":" in bare and not re.fullmatch(r"[0-9]*(,[^:]*:[0-9]*)*", port):
        return HIDDEN  # "user:secret" without "@host", or worse: hide all of it
    return host + _hide_params(tail)


def redact_url(url: object) -> str:
    """The text of a URL fit to print, log or write: every password hidden.

    Hidden: the password of ``user:password@`` (also when it holds an unescaped ``@``,
    ``:``, ``/``, ``#`` or ``?``), and the value of every query parameter named like a
    secret (``password``, ``sslpassword``, ``token``, ...). Text that does not parse as a
    URL is hidden after its scheme, or whole. Never raises.

    Args:
        url: a URL (text, or an object such as a SQLAlchemy URL, whose ``str`` is used).

    Returns:
        The URL with ``***`` for each secret.
    """
    try:
        text = url if isinstance(url, str) else str(url)
        m = _SCHEME.fullmatch(text)
        if m is None:
            if "@" in text or ":" in text:
                return HIDDEN
            return _hide_params(text)
        return f"{m[1]}://{_hide_authority(m[2])}"
    except Exception:  # redacting must never be what fails
        return HIDDEN


def unshown(value: str) -> str:
    """How a value that may be a secret is described instead of shown.

    Args:
        value: the value (a path that may hold a key instead).

    Returns:
        ``"N characters"``.
    """
    return f"{len(value)} characters"


class KeyFileOpenToOthers(PermissionError):
    """A key file that its group or other users may access.

    Args:
        path: the file.
        mode: its permission bits.
    """

    def __init__(self, path: Path, mode: int) -> None:
        self.path = path
        self.mode = mode
        super().__init__(
            f"{path} is accessible by group or others (mode {mode:04o}); run: chmod 600 {path}"
        )


def read_key_file(path: Path) -> bytes:
    """Read a file holding a secret key, refused when group or others may access it.

    The mode is checked on the open file (no window between check and read). On
    systems without POSIX permissions the check is skipped.

    Args:
        path: the file.

    Returns:
        Its bytes.

    Raises:
        KeyFileOpenToOthers: its mode grants anything to group or others.
        OSError: it cannot be opened or read (ValueError: the name holds a NUL).
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise KeyFileOpenToOthers(path, mode)
        return f.read()
