"""CPU seconds of processes, read from /proc (Linux): one process, or a server's whole tree.

Standard library only: the benchmarks import it inside and outside their venvs.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path


def _stat(pid: int) -> tuple[str, float] | None:
    """(command name, CPU seconds user + system) of ``pid``; None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name, _, rest = raw.partition("(")[2].rpartition(")")
    fields = rest.split()
    return name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) a process has used so far, from /proc; 0 if unknown."""
    stat = None if pid is None else _stat(pid)
    return 0.0 if stat is None else stat[1]


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return kids
    for task in tasks:
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
    return kids


def tree_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of ``pid`` and every descendant, summed per command name (the
    name ``/proc/PID/stat`` gives, as ``comm``: vLLM names its engine core and workers by
    process title)."""
    out: dict[str, float] = defaultdict(float)
    todo, seen = [pid], set()
    while todo:
        one = todo.pop()
        if one in seen:
            continue
        seen.add(one)
        stat = _stat(one)
        if stat is None:
            continue
        out[stat[0]] += stat[1]
        todo += _children(one)
    return dict(out)


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """``after - before`` per name (a process born in between counts from zero)."""
    return {name: after[name] - before.get(name, 0.0) for name in after}
