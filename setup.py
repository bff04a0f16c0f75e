"""The one thing pyproject.toml cannot declare: kvgov's optional compiled hot paths.

``kvgov.govern._keychain`` (govern/_keychain.c) derives the block-key chain over
OpenSSL's SHA-256, 3-4x faster than the pure path in ``kvgov.govern.keys``;
``kvgov.audit._seal`` (audit/_seal.c) computes one link of the audit hash chain for
the audit writer's sealer (``kvgov.audit.sealer``); ``kvgov.govern._blocks``
(govern/_blocks.c, no OpenSSL) runs the per-block loops of the owner table and the
SGLang binding's page bookkeeping. The pure paths stay the specification and the
fallback. Every extension is optional: where no C compiler (or, for the first two, no
OpenSSL headers) is found the build goes on without it, and kvgov uses the pure paths
(``kvgov.govern.keys.NATIVE_KEYCHAIN``, ``kvgov.audit.sealer.NATIVE_LINK`` and
``kvgov.govern.native.NATIVE_BLOCKS`` say which; docs/performance.md). Everything else
about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kvgov.govern._keychain",
            sources=["govern/_keychain.c"],
            libraries=["crypto"],
            optional=True,
        ),
        Extension(
            "kvgov.audit._seal",
            sources=["audit/_seal.c"],
            libraries=["crypto"],
            optional=True,
        ),
        Extension(
            "kvgov.govern._blocks",
            sources=["govern/_blocks.c"],
            optional=True,
        ),
    ]
)
