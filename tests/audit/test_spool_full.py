"""A spool whose disk is full: appending raises ENOSPC and memory stays bounded.

The fault test ``test_spool_disk_full_while_postgresql_is_down`` points the spool at
``/dev/full`` (every write fails with ENOSPC, every read returns zeros without end).
A sealing spool reads the file once to chain on from its last seal; that read must
take only what the file held (its size), not read a stream until memory runs out.
Each case runs in a child process under an address-space limit, so that the defect
ends in a ``MemoryError`` there instead of exhausting the test machine.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")

#: Address space the child may add after its imports: far more than the spool needs,
#: far less than an unbounded read reaches.
HEADROOM = 768 * 1024 * 1024

CHILD = """
import errno, json, resource, sys
from pathlib import Path

from kvgov.audit.sealer import Sealer
from kvgov.audit.signing import SigningKey
from kvgov.audit.chain import GENESIS_HASH
from kvgov.audit.spool import Spool
from tests.audit.conftest import sample_event

vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize"))
limit = vm + int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

key = SigningKey.from_private_key(SigningKey.ephemeral().private_key, "configured")
sealer = Sealer("w1", key, lambda: 1_700_000_000.0, 0, GENESIS_HASH, -1, 100, 60.0)
spool = Spool(Path(sys.argv[1]), key, "w1")
out = {"errors": [], "read": None}
for attempt in range(3):  # the writer retries: each attempt fails the same way
    rows = []
    sealer.seal([(attempt + 1, 1, sample_event(attempt))], rows, [])
    try:
        spool.append(rows)
        out["errors"].append("appended")
    except MemoryError:
        out["errors"].append("MemoryError")
        break
    except OSError as exc:
        out["errors"].append(errno.errorcode.get(exc.errno or 0, str(exc)))
try:
    c = spool.read()
    out["read"] = [len(c.events), len(c.damaged), len(c.rejected)]
except MemoryError:
    out["read"] = "MemoryError"
print(json.dumps(out))
"""


def _run_child(spool: Path) -> dict[str, object]:
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(spool), str(HEADROOM)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    return result


def test_sealing_spool_on_a_full_disk_raises_enospc_with_bounded_memory() -> None:
    """Every append to a spool on a full disk raises ENOSPC (the writer reports
    ``AuditUnavailable`` and retries), and neither append nor read reads past the
    file's end: before the fix the first append read ``/dev/full`` until MemoryError."""
    # the device itself, not a link to it: spool files are not opened through links
    result = _run_child(Path("/dev/full"))
    assert result["errors"] == ["ENOSPC", "ENOSPC", "ENOSPC"]
    assert result["read"] == [0, 0, 0]  # nothing was spooled: nothing to replay


def test_append_cut_short_by_a_full_disk_leaves_the_spool_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC after part of a batch went out: the file is cut back, so the retried batch
    and the next ones read back authentic, with no unsealed partial batch between them
    (before the fix its lines were rejected as not covered by a seal, and quarantined)."""
    from kvgov.audit import spool as spool_mod
    from kvgov.audit.chain import GENESIS_HASH
    from kvgov.audit.sealer import Sealer
    from kvgov.audit.signing import SigningKey

    from .conftest import sample_event

    key = SigningKey.from_private_key(SigningKey.ephemeral().private_key, "configured")
    sealer = Sealer("w1", key, lambda: 1_700_000_000.0, 0, GENESIS_HASH, -1, 100, 60.0)
    path = tmp_path / "s.spool.jsonl"
    spool = spool_mod.Spool(path, key, "w1")

    def batch(first: int) -> list[Any]:
        rows: list[Any] = []
        sealer.seal([(first + i, 1, sample_event(first + i)) for i in range(3)], rows, [])
        return rows

    spool.append(batch(1))
    size = path.stat().st_size
    real_write = os.write
    calls = 0

    def fills_the_disk(fd: int, data: Any) -> int:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, bytes(data)[: len(data) // 2])  # a short write, then full

    second = batch(4)
    monkeypatch.setattr(spool_mod.os, "write", fills_the_disk)
    with pytest.raises(OSError) as info:
        spool.append(second)
    monkeypatch.setattr(spool_mod.os, "write", real_write)
    assert info.value.errno == errno.ENOSPC and calls == 2
    assert path.stat().st_size == size  # nothing of the failed batch stays

    spool.append(second)  # the writer retries the same records
    spool.append(batch(7))
    contents = spool_mod.Spool(path, key, "w1").read()
    assert [int(r[1]) for r in contents.events] == list(range(1, 10))
    assert not contents.rejected and not contents.damaged and not contents.breaks
