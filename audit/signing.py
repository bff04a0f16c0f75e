"""Ed25519 checkpoint signing: keys, key ids, and the signed message.

A checkpoint states "stream S had chain hash H at sequence number N" and is signed
so that nobody without the private key can rewrite a chain and re-sign it.

Signed message layout (``checkpoint_message``)::

    b"kvgov-checkpoint-1\\n"
    || uint16 big-endian length of the stream id || stream id (UTF-8)
    || uint64 big-endian sequence number
    || 32-byte chain hash

Key id: the first 16 hex characters of SHA-256 of the 32-byte raw public key, so
keys can rotate and each checkpoint names the key that signed it.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from kvgov.audit.chain import ChainHash
from kvgov.defaults import SIGNING_KEY_ENV
from kvgov.exceptions import SigningKeyError
from kvgov.secrecy import KeyFileOpenToOthers, read_key_file, unshown

__all__ = [
    "KeyFiles",
    "SigningKey",
    "checkpoint_message",
    "generate_key_files",
    "key_id",
    "load_public_key",
    "load_signing_key",
    "public_key_from_raw",
    "raw_public_key",
    "verify_signature",
]

_CHECKPOINT_TAG = b"kvgov-checkpoint-1\n"


def raw_public_key(public_key: Ed25519PublicKey) -> bytes:
    """Return the 32 raw bytes of an Ed25519 public key.

    Args:
        public_key: the key.

    Returns:
        The raw public key bytes.
    """
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_key_from_raw(raw: bytes) -> Ed25519PublicKey:
    """Rebuild an Ed25519 public key from its 32 raw bytes.

    Args:
        raw: the raw key bytes.

    Returns:
        The public key.

    Raises:
        SigningKeyError: the bytes are not an Ed25519 public key.
    """
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as exc:
        raise SigningKeyError(f"not a raw Ed25519 public key ({exc})") from exc


def key_id(public_key: Ed25519PublicKey) -> str:
    """Name a public key: the first 16 hex characters of SHA-256 of its raw bytes.

    Args:
        public_key: the key.

    Returns:
        The key id.
    """
    return hashlib.sha256(raw_public_key(public_key)).hexdigest()[:16]


def checkpoint_message(stream: str, seq: int, chain_hash: ChainHash) -> bytes:
    """The bytes a checkpoint signs (layout in the module docstring).

    Args:
        stream: the stream id.
        seq: the sequence number of the last event covered.
        chain_hash: that event's chain hash.

    Returns:
        The message to sign or verify.
    """
    sid = stream.encode("utf-8")
    return (
        _CHECKPOINT_TAG
        + len(sid).to_bytes(2, "big")
        + sid
        + seq.to_bytes(8, "big")
        + bytes(chain_hash)
    )


def verify_signature(public_key: Ed25519PublicKey, signature: bytes, message: bytes) -> bool:
    """Check an Ed25519 signature.

    Args:
        public_key: the signer's public key.
        signature: the 64-byte signature.
        message: the signed message.

    Returns:
        True when the signature is valid.
    """
    try:
        public_key.verify(signature, message)
    except InvalidSignature:
        return False
    return True


@dataclass(frozen=True, slots=True)
class SigningKey:
    """An Ed25519 private key with its id and where it came from.

    Attributes:
        private_key: the key.
        key_id: first 16 hex of SHA-256 of the raw public key.
        public_raw: the 32-byte raw public key.
        origin: ``"configured"`` (file, PEM, env) or ``"ephemeral"`` (generated for this
            process because none was configured; verifiers do not trust it by default).
    """

    private_key: Ed25519PrivateKey
    key_id: str
    public_raw: bytes
    origin: str

    @classmethod
    def from_private_key(cls, private_key: Ed25519PrivateKey, origin: str) -> SigningKey:
        """Wrap a private key.

        Args:
            private_key: the key.
            origin: ``"configured"`` or ``"ephemeral"``.

        Returns:
            The signing key.
        """
        pub = private_key.public_key()
        return cls(private_key, key_id(pub), raw_public_key(pub), origin)

    @classmethod
    def ephemeral(cls) -> SigningKey:
        """Generate a fresh key for this process only.

        Returns:
            A key with origin ``"ephemeral"``.
        """
        return cls.from_private_key(Ed25519PrivateKey.generate(), "ephemeral")

    def sign(self, message: bytes) -> bytes:
        """Sign a message.

        Args:
            message: the bytes to sign.

        Returns:
            The 64-byte Ed25519 signature.
        """
        return self.private_key.sign(message)


def _load_private_pem(data: bytes, where: str) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise SigningKeyError(f"{where} is not an unencrypted PEM private key ({exc})") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(f"{where} holds a {type(key).__name__}, an Ed25519 key is needed")
    return key


def load_signing_key(
    source: Ed25519PrivateKey | SigningKey | str | os.PathLike[str] | bytes | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> SigningKey | None:
    """Load the checkpoint signing key.

    Looks at ``source`` first, then at the environment variable ``KVGOV_SIGNING_KEY``
    (:data:`kvgov.defaults.SIGNING_KEY_ENV`). A string is PEM text when it starts with
    ``-----BEGIN``, otherwise a path to a PEM file, which group and others must not be
    able to access (mode 0600). No message ever shows the text of a value that is
    neither a PEM nor a readable file: it may be the key itself.

    Args:
        source: a key object, PEM text or bytes, a path, or None.
        environ: the environment to read (default ``os.environ``).

    Returns:
        The key (origin ``"configured"``), or None when none is configured.

    Raises:
        SigningKeyError: the key cannot be read, its file is open to group or others,
            or it is not an unencrypted Ed25519 key.
    """
    if isinstance(source, SigningKey):
        return source
    if isinstance(source, Ed25519PrivateKey):
        return SigningKey.from_private_key(source, "configured")
    where = "the signing_key argument"
    if source is None:
        env = os.environ if environ is None else environ
        value = env.get(SIGNING_KEY_ENV)
        if not value:
            return None
        source = value
        where = f"${SIGNING_KEY_ENV}"
    if isinstance(source, bytes):
        return SigningKey.from_private_key(_load_private_pem(source, where), "configured")
    text = os.fspath(source)
    if text.lstrip().startswith("-----BEGIN"):
        return SigningKey.from_private_key(_load_private_pem(text.encode(), where), "configured")
    path = Path(text)
    why = ""
    try:
        data = read_key_file(path)
    except KeyFileOpenToOthers as exc:
        raise SigningKeyError(f"key file {exc} (from {where})") from None
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
    if why:  # raised here, not in the handler: the OSError (naming the text) is not chained
        # The text may be the key itself (quoted, base64 only, after a BOM): never shown.
        shown = f"key file {path}" if isinstance(source, os.PathLike) else where
        raise SigningKeyError(
            f"{shown} is not a PEM and not a readable file ({unshown(text)}): {why}"
        )
    return SigningKey.from_private_key(_load_private_pem(data, str(path)), "configured")


def load_public_key(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    """Load a trusted public key for verification.

    Args:
        path: a PEM file holding an Ed25519 public key (or a private key, whose public
            half is used).

    Returns:
        The public key.

    Raises:
        SigningKeyError: the file cannot be read or holds no Ed25519 key.
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise SigningKeyError(f"cannot read public key file {p}: {exc}") from exc
    if b"PRIVATE KEY" in data:
        # a private key is a secret wherever it is given: the file rule of every key
        # file applies (read again on the open file, so the mode checked is the one read)
        try:
            data = read_key_file(p)
        except KeyFileOpenToOthers as exc:
            raise SigningKeyError(
                f"{exc}; {p} holds a private key: give verifiers the public key instead "
                "(`kvgov audit keygen` writes both)"
            ) from None
        except OSError as exc:
            raise SigningKeyError(f"cannot read public key file {p}: {exc}") from exc
        return _load_private_pem(data, str(p)).public_key()
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise SigningKeyError(f"{p} is not a PEM public key ({exc})") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise SigningKeyError(f"{p} holds a {type(key).__name__}, an Ed25519 key is needed")
    return key


@dataclass(frozen=True, slots=True)
class KeyFiles:
    """Where :func:`generate_key_files` wrote a key pair.

    Attributes:
        private: the private key PEM (mode 0600).
        public: the public key PEM, to hand to verifiers.
        key_id: the key id checkpoints will carry.
    """

    private: Path
    public: Path
    key_id: str


def _make_private_dirs(directory: Path) -> None:
    """Create ``directory`` and its missing parents, each mode 0700 (whatever the umask)."""
    missing = []
    d = directory
    while not d.exists():
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700)
        os.chmod(d, 0o700)


def _write_private_file(path: Path, data: bytes, *, replace: bool) -> None:
    """Write ``data`` to ``path``, mode 0600; an existing file is replaced atomically
    when ``replace``, else refused (``FileExistsError``)."""
    target = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp") if replace else path
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(target, path)
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def generate_key_files(private_path: str | os.PathLike[str], *, force: bool = False) -> KeyFiles:
    """Generate an Ed25519 key pair: ``private_path`` and ``<private_path>.pub``, both 0600.

    Missing folders on the way are created with mode 0700.

    Args:
        private_path: where to write the private key.
        force: replace existing key files (the old private key is gone: keep its
            ``.pub`` elsewhere to verify the checkpoints it signed).

    Returns:
        The paths written and the key id.

    Raises:
        SigningKeyError: a key file exists (without ``force``), the path is a
            directory, or the files cannot be written (nothing is left half written).
    """
    priv = Path(private_path)
    pub = priv.with_name(priv.name + ".pub")
    if priv.is_dir():
        raise SigningKeyError(f"{priv} is a directory; give the path of the key file")
    existing = [str(p) for p in (priv, pub) if p.exists()]
    if existing and not force:
        raise SigningKeyError(
            f"{' and '.join(existing)} already exist(s); not overwritten (a key that "
            "signed checkpoints is evidence); pass --force to replace it"
        )
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    try:
        _make_private_dirs(priv.parent)
        _write_private_file(priv, pem, replace=force)
        try:
            _write_private_file(pub, public_pem, replace=force)
        except BaseException:
            if not force:
                priv.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise SigningKeyError(f"cannot write key files {priv}: {exc}") from exc
    return KeyFiles(priv, pub, key_id(key.public_key()))
