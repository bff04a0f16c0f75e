"""Drive vLLM's scheduler without a model: build schedulers, requests, steps, and a fake worker.

Imported by the fixtures of ``conftest.py`` only (it imports vLLM, which kvgov's own
venv does not have). Works on vLLM 0.32 and 0.33: it uses what both share.
"""

from __future__ import annotations

import contextlib
import copy
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from vllm.config import (
    CacheConfig,
    KVTransferConfig,
    LoRAConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import MultiModalFeatureSpec, MultiModalKwargsItem, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from kvgov.audit import AuditQueries, AuditRecord
from kvgov.govern.vllm import GovernedScheduler

SECRET = "k" * 40
TOKEN_KEY = "t" * 40
BS = 16
init_none_hash(sha256)


@dataclass
class Run:
    """What a run of requests through a scheduler showed."""

    hits: dict[str, int] = field(default_factory=dict)  # tokens reused at first scheduling
    zero_lists: list[list[int]] = field(default_factory=list)  # new_block_ids_to_zero per step
    finals: dict[str, Any] = field(default_factory=dict)  # the finishing output per request
    steps: int = 0


class FakeWorker:
    """A worker's KV tensor reduced to "who wrote each block", checking the zeroing order.

    Per step, as vLLM's runners do: zero the ids of ``new_block_ids_to_zero`` first,
    then the forward pass writes every block newly given to a request; each such
    block must read zero (None) then. ``remnants`` are blocks holding a request's
    KV that are neither owned nor cached: what stock vLLM leaves behind.
    """

    def __init__(self, num_blocks: int) -> None:
        self.content: list[str | None] = [None] * num_blocks
        self.violations: list[tuple[int, str, str]] = []

    def apply(self, so: Any) -> None:
        for b in so.new_block_ids_to_zero or ():
            self.content[b] = None
        for new in so.scheduled_new_reqs:
            hit = new.num_computed_tokens // BS
            for group in new.block_ids:  # every KV cache group
                self._write(new.req_id, group[hit:])
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            new_ids = cached.new_block_ids[i]
            if new_ids is not None:
                for group in new_ids:
                    self._write(req_id, group)

    def _write(self, req_id: str, block_ids: Iterable[int]) -> None:
        for b in block_ids:
            if b == 0:
                continue  # vLLM's null block (a sliding window's padding), never written
            if self.content[b] is not None and self.content[b] != req_id:
                self.violations.append((b, str(self.content[b]), req_id))
            self.content[b] = req_id

    def remnants(self, sched: Any) -> list[int]:
        pool = sched.kv_cache_manager.block_pool
        return [
            b.block_id
            for b in pool.blocks
            if self.content[b.block_id] is not None and b.ref_cnt == 0 and b.block_hash is None
        ]


class Harness:
    """Schedulers on a config-only model, requests, steps; every scheduler shut down at the end."""

    def __init__(self, model_dir: Path, tmp_path: Path) -> None:
        self.model_dir = model_dir
        self.tmp_path = tmp_path
        self.audit_url = f"sqlite:///{tmp_path / 'audit.db'}"
        self.made: list[Any] = []
        self.workers: dict[int, FakeWorker] = {}

    # ------------------------------------------------------------------ building

    def config(
        self,
        *,
        kvgov: dict[str, Any] | None = None,
        num_blocks: int = 200,
        caching: bool = True,
        async_scheduling: bool = False,
        lora: bool = False,
        max_num_seqs: int = 16,
        kv_transfer_config: KVTransferConfig | None = None,
        model_dir: Path | None = None,
        tokenizer: Path | None = None,
        mamba_cache_mode: str | None = None,
        max_model_len: int = 2048,
    ) -> VllmConfig:
        settings = {"audit_url": self.audit_url, "model_revision": "r1", **(kvgov or {})}
        model_config = ModelConfig(
            model=str(model_dir or self.model_dir),
            tokenizer=str(tokenizer) if tokenizer else None,
            dtype="float16",
            seed=42,
            # an encoder-decoder model's processor needs its tokenizer (``tokenizer``), and
            # hashes its dummy inputs (sha256: blake3 is not in the venv)
            skip_tokenizer_init=tokenizer is None,
            max_model_len=max_model_len,
            **({"mm_hasher_algorithm": "sha256"} if tokenizer else {}),
        )
        scheduler_config = SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=8192,
            max_model_len=max_model_len,
            enable_chunked_prefill=True,
            async_scheduling=async_scheduling,
            is_encoder_decoder=model_config.is_encoder_decoder,
        )
        cache_config = CacheConfig(
            block_size=BS,
            gpu_memory_utilization=0.9,
            cache_dtype="auto",
            enable_prefix_caching=caching,
            **({"mamba_cache_mode": mamba_cache_mode} if mamba_cache_mode else {}),
        )
        cache_config.num_gpu_blocks = num_blocks
        vllm_config = VllmConfig(
            scheduler_config=scheduler_config,
            model_config=model_config,
            cache_config=cache_config,
            lora_config=LoRAConfig(max_lora_rank=8, max_loras=4) if lora else None,
            kv_transfer_config=kv_transfer_config,
            additional_config={"kvgov": settings},
        )
        register_all_kvcache_specs(vllm_config)
        return vllm_config

    def scheduler(
        self,
        cls: Callable[..., Any] = GovernedScheduler,
        *,
        specs: list[KVCacheSpec] | None = None,
        num_blocks: int = 200,
        retention_interval: int | None = None,
        kv_cache_tensors: list[Any] | None = None,
        block_size: int = BS,
        **config: Any,
    ) -> Any:
        """A scheduler (``cls``) over KV cache groups of ``specs`` (default: one full
        attention group); ``block_size`` is the scheduler's (vLLM's engine gives it the
        least common multiple of the groups' block sizes)."""
        vllm_config = self.config(num_blocks=num_blocks, **config)
        if config.get("async_scheduling"):  # the CPU platform turns it off; the engine may not
            vllm_config.scheduler_config.async_scheduling = True
        specs = specs or [
            FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)
        ]
        kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=list(kv_cache_tensors or []),
            kv_cache_groups=[KVCacheGroupSpec([f"layer{i}"], s) for i, s in enumerate(specs)],
        )
        if retention_interval is not None:  # vLLM's engine sets it from its cache config (0)
            kv_cache_config.prefix_cache_retention_interval = retention_interval
        sched = cls(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            block_size=block_size,
            log_stats=True,
            structured_output_manager=StructuredOutputManager(vllm_config),
        )
        self.made.append(sched)
        self.workers[id(sched)] = FakeWorker(num_blocks)
        return sched

    def copy_model(self, name: str) -> Path:
        """Another config-only model directory (another model or tokenizer name)."""
        path = self.tmp_path / name
        if not path.exists():
            shutil.copytree(self.model_dir, path)
        return path

    def stock(self, **config: Any) -> Any:
        return self.scheduler(Scheduler, **config)

    def request(
        self,
        req_id: str,
        tokens: list[int],
        *,
        tenant: str | None = "acme",
        classification: str | None = "internal",
        template: str | None = "sys-v3",
        xargs: dict[str, Any] | None = None,
        lora: tuple[str, str] | None = None,
        mm: list[tuple[str, int, int]] | None = None,
        modality: str = "image",
        salt: str | None = None,
        max_tokens: int = 2,
    ) -> Request:
        args: dict[str, Any] = {}
        for key, value in (
            ("kvgov_tenant", tenant),
            ("kvgov_classification", classification),
            ("kvgov_template", template),
        ):
            if value is not None:
                args[key] = value
        args.update(xargs or {})
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        sp = copy.copy(sp)
        sp.extra_args = args or None
        features = None
        if mm:
            features = [
                MultiModalFeatureSpec(
                    data=MultiModalKwargsItem.dummy(),
                    mm_position=PlaceholderRange(offset=offset, length=length),
                    identifier=identifier,
                    modality=modality,
                )
                for identifier, offset, length in mm
            ]
        return Request(
            request_id=req_id,
            prompt_token_ids=list(tokens),
            sampling_params=sp,
            pooling_params=None,
            mm_features=features,
            lora_request=LoRARequest(lora[0], abs(hash(lora)) % 1000 + 1, lora[1])
            if lora
            else None,
            cache_salt=salt,
            # what a stock engine gives a request: vLLM's sha256 chain (the binding replaces it)
            block_hasher=get_request_block_hasher(BS, sha256),
        )

    # ------------------------------------------------------------------ running

    def step(self, sched: Any) -> tuple[Any, dict[int, Any]]:
        so = sched.schedule()
        self.workers[id(sched)].apply(so)
        req_ids = list(so.num_scheduled_tokens)
        out = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[[1000] for _ in req_ids],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
        )
        return so, sched.update_from_output(so, out)

    def run(self, sched: Any, *requests: Request, max_steps: int = 200) -> Run:
        """Add the requests, step until nothing is left (zeroing and refusals included)."""
        run = Run()
        for r in requests:
            sched.add_request(r)
        while sched.has_requests() and run.steps < max_steps:
            so, outputs = self.step(sched)
            run.steps += 1
            for new in so.scheduled_new_reqs:
                run.hits.setdefault(new.req_id, new.num_computed_tokens)
            if so.new_block_ids_to_zero:
                run.zero_lists.append(list(so.new_block_ids_to_zero))
            for batch in outputs.values():
                for o in batch.outputs:
                    if o.finish_reason is not None:
                        run.finals[o.request_id] = o
        return run

    def hit(self, sched: Any, request: Request) -> int:
        """Tokens the request reused when it was first scheduled."""
        return self.run(sched, request).hits.get(request.request_id, -1)

    def worker(self, sched: Any) -> FakeWorker:
        return self.workers[id(sched)]

    # ------------------------------------------------------------------ audit

    def events(self, sched: Any, **filters: Any) -> list[AuditRecord]:
        sched.kvgov.gov.audit.flush()
        with AuditQueries(self.audit_url) as q:
            return list(q.events(**filters))

    def close(self) -> None:
        for sched in self.made:
            with contextlib.suppress(Exception):  # a test may have shut it down itself
                sched.shutdown()
