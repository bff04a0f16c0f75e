"""The one thing pyproject.toml cannot declare: kvgov's optional compiled key chain.

``kvgov.govern._keychain`` (govern/_keychain.c) derives the block-key chain over
OpenSSL's SHA-256, 3-4x faster than the pure path in ``kvgov.govern.keys``, which
stays the specification and the fallback. The extension is optional: where no C
compiler or no OpenSSL headers are found the build goes on without it, and kvgov
uses the pure path (``kvgov.govern.keys.NATIVE_KEYCHAIN`` says which; docs/performance.md).
Everything else about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kvgov.govern._keychain",
            sources=["govern/_keychain.c"],
            libraries=["crypto"],
            optional=True,
        )
    ]
)
