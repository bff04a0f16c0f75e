"""The ``kvgov`` command line, the top layer: it may import every other layer, none imports it.

One module per command group: :mod:`kvgov.cli.main` (the root group and the console
script's entry point, with ``demo``, ``replay``, ``capacity``), :mod:`kvgov.cli.audit`
(``kvgov audit``) and :mod:`kvgov.cli.audit_ops` (its ``status``, ``streams`` and
``quarantine``), :mod:`kvgov.cli.db` (``kvgov db``), :mod:`kvgov.cli.policy`
(``kvgov policy``) and :mod:`kvgov.cli.policy_replay` (``kvgov policy replay``);
:mod:`kvgov.cli.common` holds the shared options and output helpers and
:mod:`kvgov.cli.errors` the exit codes. The logic the commands run lives in its layer.
"""
