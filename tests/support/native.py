"""Whether this machine could have built kvgov's compiled extensions (setup.py).

Three optional C extensions: over OpenSSL, the key chain (``kvgov.govern._keychain``,
govern/_keychain.c) and the audit chain's link (``kvgov.audit._seal``, audit/_seal.c);
without it, the per-block loops (``kvgov.govern._blocks``, govern/_blocks.c).
Where this machine could build them and the install did not, their tests fail instead
of skipping.
"""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

from kvgov.audit.sealer import NATIVE_LINK
from kvgov.govern.keys import NATIVE_KEYCHAIN
from kvgov.govern.native import NATIVE_BLOCKS


def native_unbuildable(module: str, *, openssl: bool = True) -> str | None:
    """Why this machine could not have built the extension ``module``, or None if it could.

    setup.py builds it where a C compiler, Python's headers and (``openssl``) OpenSSL's
    headers are present; there its absence is a broken install.
    """
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler}) to build {module}"
    python_h = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not python_h.is_file():
        return f"no Python headers ({python_h}) to build {module}"
    if not openssl:
        return None
    include = Path(sysconfig.get_config_var("INCLUDEDIR") or "/usr/include")
    if not any((d / "openssl" / "sha.h").is_file() for d in (include, Path("/usr/include"))):
        return f"no OpenSSL headers (openssl/sha.h) to build {module}"
    return None


def native_keychain_unbuildable() -> str | None:
    """Why this machine could not have built the compiled key chain, or None."""
    return native_unbuildable("kvgov.govern._keychain")


def native_keychain_skip() -> str | None:
    """Why the tests of the compiled key chain skip here (None: they run): it is not
    installed because this machine could not build it."""
    return None if NATIVE_KEYCHAIN else native_keychain_unbuildable()


def native_link_unbuildable() -> str | None:
    """Why this machine could not have built the compiled audit chain link, or None."""
    return native_unbuildable("kvgov.audit._seal")


def native_link_skip() -> str | None:
    """Why the tests of the compiled audit chain link skip here (None: they run)."""
    return None if NATIVE_LINK else native_link_unbuildable()


def native_blocks_unbuildable() -> str | None:
    """Why this machine could not have built the compiled per-block loops, or None."""
    return native_unbuildable("kvgov.govern._blocks", openssl=False)


def native_blocks_skip() -> str | None:
    """Why the tests of the compiled per-block loops skip here (None: they run)."""
    return None if NATIVE_BLOCKS else native_blocks_unbuildable()
