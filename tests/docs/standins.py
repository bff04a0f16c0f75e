"""Local stand-ins for the deployment that ``server`` blocks of the docs name.

The docs show a reader's deployment as it is (``db.internal``, ``kv-cache.internal``,
``opa.internal``, roles such as ``auditor``, spools under ``/var/lib/kvgov``); the docs
test runs those blocks against stand-ins on this host. :data:`SUBSTITUTIONS` is the
whole table: each row is what a block names, and what the test puts in its place.
A failing block is reported with the substitutions that were made in it.

* PostgreSQL (``127.0.0.1:5432``, the test database server): every database a page
  names is a fresh one, created for that page and dropped at the end of the session;
  every role is created for the session and dropped after. ``auditor`` can read every
  table and write none (``pg_read_all_data``); every other role (``kvgov``,
  ``kvgov_owner``, ...) writes: it is a member of the role that owns the databases.
* Redis (``127.0.0.1:6379``, no TLS): the tier's key prefix is made unique to the
  session (``prefix=`` is prefixed, or added), and every key under it is deleted after.
* OPA (``opa.internal:8181``): :class:`tests.policy.opa_fake.FakeOpa`, answering from
  the reference engine (OPA v1.20.2 in-process) over the bundled policy, requiring the
  bearer token the deployment's ``OPA_TOKEN`` holds.
* Paths (``/var/lib/kvgov``, ``/var/cache/kvgov``): directories under the page's
  temporary directory.
* A CI host has no GPU and little memory: ``device="cuda"`` runs on the CPU and the
  fleet's ``num_blocks=4096`` is 16.

A deployment also has secrets in its environment (:meth:`Standins.deployment_env`), and
pages in :data:`WITH_HISTORY` describe one that has been running: :meth:`Standins.prepare`
writes its trail before the page's first server block runs (see there).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import PG_HOST, PG_PORT, _pg_admin_connect, _pg_unavailable_reason

REDIS_URL = os.environ.get("KVGOV_TEST_REDIS_URL", "redis://127.0.0.1:6379")

#: The read-only role of the docs; every other role a URL names writes.
READER_ROLE = "auditor"

#: Pages whose server blocks read the trail of a deployment that has been running.
WITH_HISTORY = frozenset({"operations", "policy"})


@dataclass(frozen=True)
class Substitution:
    """One row of the table: a pattern of the docs and the stand-in put in its place."""

    what: str  # what the docs name, in words
    pattern: re.Pattern[str]
    standin: str  # what replaces it: the exact text for a "text" row, else in words
    kind: str  # "postgres", "redis", "opa" (a service), "path", or "text" (fixed text)

    @property
    def service(self) -> str | None:
        """The service the stand-in is, or None (a path or fixed text needs nothing)."""
        return self.kind if self.kind in ("postgres", "redis", "opa") else None


#: Everything the docs test changes in a server block before it runs.
SUBSTITUTIONS: tuple[Substitution, ...] = (
    Substitution(
        "a PostgreSQL URL on db.internal or db",
        re.compile(
            r"(?P<scheme>postgresql(?:\+psycopg)?)://(?P<role>\w+)@(?:db\.internal|db)/(?P<db>\w+)"
        ),
        "the same scheme, role RUN_<role>, 127.0.0.1:5432, a fresh database RUN_<page>_<db>",
        "postgres",
    ),
    Substitution(
        "a Redis tier URL on kv-cache.internal",
        re.compile(r"rediss?://kv-cache\.internal:\d+/(?P<n>\d+)(?P<query>\?[^\"'\s]*)?"),
        "redis://127.0.0.1:6379/<n> (no TLS), the key prefix RUN-<prefix>",
        "redis",
    ),
    Substitution(
        "the OPA server",
        re.compile(r"http://opa\.internal:8181"),
        "a FakeOpa on 127.0.0.1 answering from the reference engine",
        "opa",
    ),
    Substitution(
        "a worker host's directory",
        re.compile(r"(?<![\w.-])/var/(?P<dir>lib|cache)/kvgov\b"),
        "<page tmp>/var/<dir>/kvgov",
        "path",
    ),
    Substitution("a CUDA device", re.compile(r'device="cuda"'), 'device="cpu"', "text"),
    Substitution("a fleet's pool size", re.compile(r"num_blocks=4096\b"), "num_blocks=16", "text"),
)


@dataclass
class Rewritten:
    """A server block's code with the stand-ins in, and what was substituted."""

    code: str
    made: list[tuple[str, str]] = field(default_factory=list)  # (docs text, stand-in text)

    def report(self) -> str:
        """The substitutions, one a line, for a failure message."""
        lines = [f"  {old}  ->  {new}" for old, new in dict(self.made).items()]
        return "--- stand-ins substituted\n" + ("\n".join(lines) or "  (none)")


def _absent(service: str) -> str | None:
    """Why ``service`` (``postgres`` or ``redis``) cannot be reached here, or None."""
    if service == "postgres":
        return _pg_unavailable_reason()
    try:
        import redis

        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
        return None
    except Exception as exc:  # any failure to connect means "absent" here
        return f"{service} not reachable at {REDIS_URL}: {exc}"


class Standins:
    """The stand-ins of one test session: created as blocks need them, removed by close()."""

    def __init__(self) -> None:
        self.run = f"kvgovdocs_{uuid.uuid4().hex[:8]}"
        self._roles: list[str] = []
        self._databases: list[str] = []
        self._absent: dict[str, str | None] = {}
        self._opa: Any = None
        self._redis_dbs: set[str] = set()
        self._prepared: set[str] = set()
        self._env = {
            "KVGOV_KEY_SECRET": secrets.token_hex(32),
            "KVGOV_KEK": secrets.token_hex(32),
            "OPA_TOKEN": secrets.token_urlsafe(16),
        }

    def deployment_env(self) -> dict[str, str]:
        """The secrets a deployment's workers have in their environment (random here)."""
        return dict(self._env)

    def missing(self, code: str, page: str) -> str | None:
        """Why a server block of ``page`` cannot run here (a service it needs is absent)."""
        for sub in SUBSTITUTIONS:
            named = sub.pattern.search(code) or (sub.service == "postgres" and page in WITH_HISTORY)
            if sub.service in ("postgres", "redis") and named:
                if sub.service not in self._absent:
                    self._absent[sub.service] = _absent(sub.service)
                if self._absent[sub.service] is not None:
                    return self._absent[sub.service]
        return None

    def rewrite(self, code: str, page: str, tmp: Path) -> Rewritten:
        """``code`` with every row of :data:`SUBSTITUTIONS` applied, the stand-ins started."""
        out = Rewritten(code)
        for sub in SUBSTITUTIONS:
            fn = self._replacer(sub, page, tmp)

            def one(m: re.Match[str], fn: Callable[[re.Match[str]], str] = fn) -> str:
                new = fn(m)
                out.made.append((m.group(0), new))
                return new

            out.code = sub.pattern.sub(one, out.code)
        left = re.search(r"\b[\w-]+\.internal\b", out.code)
        if left:
            raise AssertionError(f"names {left[0]}, which no stand-in covers\n{out.report()}")
        return out

    def _replacer(self, sub: Substitution, page: str, tmp: Path) -> Callable[[re.Match[str]], str]:
        if sub.kind == "postgres":
            return lambda m: self.pg_url(m["role"], page, m["db"], m["scheme"])
        if sub.kind == "redis":
            return lambda m: self._redis_url(m["n"], m["query"] or "")
        if sub.kind == "opa":
            return lambda m: self._opa_url()
        if sub.kind == "path":

            def path(m: re.Match[str]) -> str:
                local = tmp / "var" / m["dir"] / "kvgov"
                local.mkdir(parents=True, exist_ok=True)
                return str(local)

            return path
        return lambda m: sub.standin

    # -- PostgreSQL --------------------------------------------------------------------

    def pg_url(self, role: str, page: str, db: str, scheme: str = "postgresql+psycopg") -> str:
        """The stand-in URL of ``role@db`` on ``page``, its role and database created."""
        name = f"{self.run}_{page}_{db}"
        user = self._role(role)
        if name not in self._databases:
            with _pg_admin_connect() as conn:
                conn.execute(f'CREATE DATABASE "{name}" OWNER "{self._role("")}"')
            self._databases.append(name)
        return f"{scheme}://{user}@{PG_HOST}:{PG_PORT}/{name}"

    def _role(self, role: str) -> str:
        """The session's role for ``role`` ("" is the owner of the databases)."""
        name = f"{self.run}_{role}" if role else f"{self.run}_owners"
        if name in self._roles:
            return name
        with _pg_admin_connect() as conn:
            if not role:
                conn.execute(f'CREATE ROLE "{name}" NOLOGIN')
            elif role == READER_ROLE:
                conn.execute(f'CREATE ROLE "{name}" LOGIN IN ROLE pg_read_all_data')
            else:
                conn.execute(f'CREATE ROLE "{name}" LOGIN IN ROLE "{self._role("")}"')
        self._roles.append(name)
        return name

    # -- Redis and OPA -----------------------------------------------------------------

    def _redis_url(self, n: str, query: str) -> str:
        self._redis_dbs.add(n)
        params = [p for p in query.lstrip("?").split("&") if p]
        prefix = next((p[7:] for p in params if p.startswith("prefix=")), "kvgov:offload")
        params = [p for p in params if not p.startswith("prefix=")]
        params.append(f"prefix={self.run}-{prefix}")
        return f"{REDIS_URL}/{n}?" + "&".join(params)

    def _opa_url(self) -> str:
        if self._opa is None:
            from kvgov.policy.reference import ReferenceEngine
            from tests.policy.opa_fake import FakeOpa

            self._opa = FakeOpa(ReferenceEngine(run_tests=False), token=self._env["OPA_TOKEN"])
        return str(self._opa.url)

    # -- a deployment that has been running --------------------------------------------

    def prepare(self, page: str, work: Path, env: dict[str, str]) -> None:
        """Give ``page``'s directory what a running deployment has, once, if it needs it.

        For a page in :data:`WITH_HISTORY`: the writers' key (``writer.pem.pub`` here,
        the private key with the workers), a trail in the page's ``kvgov`` database
        written by the demo as role ``kvgov`` and signed with that key (its spool in
        ``/var/lib/kvgov``), the auditor's key ``auditor.pem`` with a signed list of
        the trail's streams ``streams.json``, and the deployment's policy data
        ``deployment.json`` (the demo's). All of it is made with kvgov's own commands.
        """
        if page not in WITH_HISTORY or page in self._prepared:
            return
        self._prepared.add(page)
        from kvgov.govern.demo import DEMO_POLICY_DATA

        host = work.parent / "worker-host"
        spool = work.parent / "var" / "lib" / "kvgov"
        spool.mkdir(parents=True, exist_ok=True)
        writer, auditor = (
            self.pg_url("kvgov", page, "kvgov"),
            self.pg_url(READER_ROLE, page, "kvgov"),
        )
        kvgov = str(Path(sys.executable).parent / "kvgov")
        steps = [
            ([kvgov, "audit", "keygen", str(host / "writer.pem")], work),
            ([kvgov, "db", "upgrade", writer], work),
            ([kvgov, "demo", "--quick", "--audit-url", writer, "--out", str(host / "demo")], spool),
            ([kvgov, "audit", "keygen", "auditor.pem"], work),
            ([kvgov, "audit", "streams", "--url", auditor, "--key", "auditor.pem",
              "--public-key", str(host / "writer.pem.pub"), "--output", "streams.json"], work),
        ]  # fmt: skip
        host.mkdir()
        for argv, cwd in steps:
            step_env = {**env, "KVGOV_SIGNING_KEY": str(host / "writer.pem")}
            proc = subprocess.run(argv, cwd=cwd, env=step_env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise AssertionError(
                    f"preparing {page}'s deployment failed: {' '.join(argv)}: exit "
                    f"{proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
                )
            if argv[1:3] == ["audit", "keygen"] and "writer.pem" in argv[3]:
                (work / "writer.pem.pub").write_bytes((host / "writer.pem.pub").read_bytes())
        (work / "deployment.json").write_text(json.dumps(DEMO_POLICY_DATA, indent=2))

    # -- the end -----------------------------------------------------------------------

    def close(self) -> None:
        """Drop the session's databases and roles, delete its Redis keys, stop OPA.

        Each step runs even if one before it failed (a block may have pointed a tier at
        a Redis database that does not exist); the first error is raised at the end.
        """
        errors: list[Exception] = []
        for step in (self._close_opa, self._clean_redis, self._drop_pg):
            try:
                step()
            except Exception as exc:  # the next steps must still run
                errors.append(exc)
        if errors:
            raise errors[0]

    def _close_opa(self) -> None:
        if self._opa is not None:
            engine = self._opa.engine
            self._opa.close()
            engine.close()

    def _clean_redis(self) -> None:
        import redis

        for n in sorted(self._redis_dbs):
            with redis.Redis.from_url(f"{REDIS_URL}/{n}") as client:
                try:
                    keys = list(client.scan_iter(match=f"{self.run}-*"))
                except redis.ResponseError:  # "DB index is out of range": nothing was written
                    continue
                if keys:
                    client.delete(*keys)

    def _drop_pg(self) -> None:
        if self._databases or self._roles:
            with _pg_admin_connect() as conn:
                for name in self._databases:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                for name in reversed(self._roles):
                    conn.execute(f'DROP ROLE IF EXISTS "{name}"')
