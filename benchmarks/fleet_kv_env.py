"""Two vLLM servers sharing a KV tier: governed (``GovernedKVConnector``) or the control.

Shared by ``tests/fleet/test_fleet_kv_servers.py`` and ``benchmarks/bench_fleet.py``.
Standard library only (as ``vllm_cpu_env``): the benchmark's ``--tier-only`` mode and
the test import it inside their venvs.

* :func:`governed_pair` -- two governed OpenAI servers (``--scheduler-cls`` kvgov's,
  kvgov's plugin) with kvgov's connector on one Redis prefix, one PostgreSQL (audit
  trail, one stream per server, and the shared wrapped-key store), one cache-key
  secret and one KEK; the first runs a fleet agent (``kvgov fleet purge`` reaches it).
* :func:`control_pair` -- two stock servers (kvgov's plugin excluded) with vLLM's
  ``ExampleConnector`` on one shared folder: it keys KV by the token ids alone.
* :func:`ttft` -- one streamed completion: the time to its first token and its usage.
* :func:`metric` -- one counter of a server's ``/metrics``.
* :func:`cost_figures` -- the cost rule's figures and verdict as a governed server's
  worker measured them (``figures=True``: the :class:`CostFigures` worker extension,
  over vLLM's development endpoint ``/collective_rpc``).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from vllm_cpu_env import MODEL_NAME, Server

#: the fleet's cache-key secret and key-encryption key (every server holds the same)
KEY_SECRET = "fleet-kv-cache-key-secret-" + "s" * 24
KEK_HEX = "4b" * 32
CONNECTOR_MODULE = "kvgov.govern.vllm.kv_connector"
#: every server of the fleet: the same tier name (bound into each object's AAD)
TIER_NAME = "fleet"
#: blocks of each server's KV cache (not 64: the tiny model's head size, a dimension the
#: connector must not mistake for the block index)
NUM_BLOCKS = 100
#: the worker extension that reads the connector's cost figures (this module, on the
#: servers' PYTHONPATH through benchmarks/)
FIGURES_EXTENSION = "fleet_kv_env.CostFigures"
#: the policy: the connector's tier may hold "internal" KV (the default allows only "host")
POLICY_DATA = {"kvgov": {"config": {"offload_tiers": {"internal": ["host", TIER_NAME]}}}}


def governed_transfer(
    redis_url: str, key_store_url: str, prefix: str, **more: Any
) -> dict[str, Any]:
    """``--kv-transfer-config`` of a governed server: kvgov's connector; a failed load is
    recomputed."""
    return {
        "kv_connector": "GovernedKVConnector",
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_both",
        # a block the tier refuses (tampered, shredded) is recomputed, not an error
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "kvgov": {
                "redis_url": redis_url,
                "key_store_url": key_store_url,
                "prefix": prefix,
                "tier_name": TIER_NAME,
                **more,
            }
        },
    }


def governed_pair(
    python: Path,
    model: Path,
    logs: Path,
    *,
    db_url: str,
    redis_url: str,
    prefix: str,
    operator_keys: Path | None = None,
    key_recheck_s: float = 1.0,
    timeout_s: float = 1.0,
    cost_rule: bool = True,
    figures: bool = False,
) -> list[Server]:
    """Servers ``vllm-1`` and ``vllm-2`` (not started); ``vllm-1`` runs a fleet agent if
    ``operator_keys`` (the operators' public keys, mode 0600) is given; with ``figures``,
    each loads :class:`CostFigures` (read by :func:`cost_figures`)."""
    transfer = governed_transfer(
        redis_url,
        db_url,
        prefix,
        key_recheck_s=key_recheck_s,
        timeout_s=timeout_s,
        cost_rule=cost_rule,
    )
    extension = ["--worker-extension-cls", FIGURES_EXTENSION] if figures else []
    servers = []
    for n in (1, 2):
        name = f"vllm-{n}"
        kvgov: dict[str, Any] = {
            "audit_url": db_url,
            "worker_id": name,  # the server's audit stream
            "policy_data": POLICY_DATA,
        }
        if n == 1 and operator_keys is not None:
            kvgov |= {
                "fleet_url": db_url,
                "fleet_engine_id": name,
                "fleet_operator_keys_file": str(operator_keys),
                "fleet_poll_interval": 0.5,
            }
        servers.append(
            Server(
                name,
                python,
                model,
                logs / f"{name}.log",
                governed=True,
                kvgov=kvgov,
                env={
                    "KVGOV_KEY_SECRET": KEY_SECRET,
                    "KVGOV_KEK": KEK_HEX,
                    "VLLM_SERVER_DEV_MODE": "1",  # /reset_prefix_cache
                },
                num_blocks=NUM_BLOCKS,
                extra_args=["--kv-transfer-config", json.dumps(transfer), *extension],
            )
        )
    return servers


class CostFigures:
    """vLLM worker extension: ``collective_rpc("kvgov_cost_figures")`` returns the worker
    connector's :meth:`~kvgov.govern.vllm.kv_connector.GovernedKVConnector.kvgov_metrics`:
    the cost rule's figures from the worker's own measurements (the samples it reports to
    the scheduler, whose rule decides on the same figures) and their verdict."""

    def kvgov_cost_figures(self) -> dict[str, Any]:
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        return dict(get_kv_transfer_group().kvgov_metrics())


def cost_figures(server: Server) -> dict[str, Any]:
    """The cost rule's figures on ``server``'s worker (started with ``figures=True``)."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/collective_rpc",
        data=json.dumps({"method": "kvgov_cost_figures"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        (figures,) = json.loads(r.read())["results"]
    return dict(figures)


def control_pair(python: Path, model: Path, logs: Path, shared: Path) -> list[Server]:
    """Stock servers ``stock-1`` and ``stock-2`` with ``ExampleConnector`` on ``shared``."""
    transfer = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(shared)},
    }
    return [
        Server(
            f"stock-{n}",
            python,
            model,
            logs / f"stock-{n}.log",
            governed=False,
            num_blocks=NUM_BLOCKS,
            env={"VLLM_SERVER_DEV_MODE": "1"},
            # the engine's worker in its engine core process: one process fewer to start
            extra_args=[
                "--kv-transfer-config",
                json.dumps(transfer),
                "--distributed-executor-backend",
                "uni",
            ],
        )
        for n in (1, 2)
    ]


def scope(tenant: str, classification: str = "internal") -> dict[str, Any]:
    """``extra_body`` naming a request's scope (the governed server's ``vllm_xargs``)."""
    return {
        "vllm_xargs": {
            "kvgov_tenant": tenant,
            "kvgov_classification": classification,
            "kvgov_template": "sys-v1",
        }
    }


def ttft(server: Server, prompt: str, extra_body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """One streamed completion (one token): seconds to its first token, and its usage.

    Raises:
        urllib.error.HTTPError: the server refused it.
    """
    body = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": 1,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra_body,
    }
    req = urllib.request.Request(
        f"{server.base_url}/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    first: float | None = None
    usage: dict[str, Any] = {}
    started = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and any(c.get("text") for c in chunk.get("choices") or []):
                first = time.perf_counter() - started
            if chunk.get("usage"):
                usage = chunk["usage"]
    return (first if first is not None else time.perf_counter() - started), usage


def cached_tokens(usage: dict[str, Any]) -> int:
    """The prompt tokens a completion was served from a cache (device or external)."""
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def metric(server: Server, name: str) -> float:
    """The sum of a counter's samples in the server's ``/metrics`` (0 if absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=30) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def reset_prefix_cache(server: Server) -> None:
    """vLLM's ``/reset_prefix_cache`` (``VLLM_SERVER_DEV_MODE``): the device cache emptied."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/reset_prefix_cache", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(req, timeout=60):
        pass
