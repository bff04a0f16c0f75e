"""The blocks of docs/vllm.md that need a vLLM engine, run as written on the tiny model.

``make test``'s docs test (``tests/docs``) skips every ``vllm`` block; the ones whose
marker names this module run here, their text taken from the page by
``tests/docs/blocks.py`` (never a copy):

* the server started by hand ("On the CPU"): its bash block runs in the background in a
  temporary directory, with the paths and the port of :data:`SUBSTITUTIONS` put in; the
  test waits for ``/health``, then
* the front end's blocks ("The front end's contract"): the page's earlier Python blocks
  (the signed scope) and the client block run in one namespace, as the docs test runs a
  page, against that server; a request without a token is refused; the server is
  stopped (SIGINT to its process group) and the audit trail it wrote verifies;
* ``kvgov_call`` ("Erasure and maintenance") on ``llm``: "the LLM of the block above" is
  Llama on a GPU; here ``LLM(...)`` on the tiny model with the same kvgov settings.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm_cpu_env import BLOCK_SIZE, MAX_MODEL_LEN, Server, engine_env

from tests.docs.blocks import PYTHON, ROOT, Block, inside, parse, reader_env

from .conftest import SECRET

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_e2e]

DOC = ROOT / "docs" / "vllm.md"
HERE = "tests/govern/vllm/e2e/test_docs_blocks.py"
KVGOV_CLI = str(Path(sys.executable).with_name("kvgov"))
START_TIMEOUT = 300.0  # seconds for the server to answer /health


def _substitutions(tmp: Path, port: int) -> dict[str, str]:
    """What the blocks name, and what the test puts in its place (one pass, each must occur)."""
    return {
        ".bench/vllm-cpu-venv/bin/python": sys.executable,  # the venv this test runs in
        "benchmarks/": f"{ROOT}/benchmarks/",  # the docs run from the repository's root
        "/tmp/": f"{tmp}/",  # the model and the scope-token key
        "8012": str(port),
    }


def _rewrite(code: str, table: dict[str, str]) -> str:
    pattern = re.compile("|".join(re.escape(k) for k in table))
    used = {m.group(0) for m in pattern.finditer(code)}
    assert used, f"none of {sorted(table)} in the block: update the table"
    return pattern.sub(lambda m: table[m.group(0)], code)


def _marked_here() -> list[Block]:
    """The blocks of the page whose marker says they run in this module."""
    return [b for b in parse(DOC) if b.marker == "vllm" and HERE in b.reason]


def _one(blocks: list[Block], lang: str, contains: str) -> Block:
    found = [b for b in blocks if b.lang == lang and contains in b.code]
    assert len(found) == 1, f"{DOC.name}: expected one {lang} block with {contains!r}: {found}"
    return found[0]


def test_the_markers_name_the_blocks_this_module_runs() -> None:
    assert len(_marked_here()) == 3, [b.name for b in _marked_here()]


def _env() -> dict[str, str]:
    """A reader's shell (no KVGOV_* variable); no network (the tiny model is local)."""
    return {**reader_env(), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


class HandServer(Server):
    """The docs' server block, running in the background in its own process group."""

    def __init__(self, block: Block, tmp: Path) -> None:
        super().__init__(
            name=block.name,
            python=Path(sys.executable),
            model=tmp / "tiny-opt",
            log=tmp / "server.log",
            governed=True,
            cwd=tmp,
        )
        self.tmp = tmp
        self.table = _substitutions(tmp, self.port)
        self.code = _rewrite(block.code, self.table)

    def command(self) -> list[str]:
        return ["bash", "-euo", "pipefail", "-c", self.code]

    def environment(self) -> dict[str, str]:
        return _env()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HandServer]:
    block = _one(_marked_here(), "bash", "vllm.entrypoints.openai.api_server")
    s = HandServer(block, tmp_path_factory.mktemp("by-hand")).start()
    try:
        print(f"\nthe docs' server ({block.name}) answered after {s.wait(START_TIMEOUT):.0f} s")
        yield s
    finally:
        s.stop()


def _exec(block: Block, code: str, namespace: dict[str, Any], cwd: Path) -> None:
    """Run a Python block as the docs test does (its line numbers in tracebacks)."""
    with inside(cwd, _env()):
        exec(compile("\n" * block.line + code, str(block.doc), "exec"), namespace)


def _kvgov(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KVGOV_CLI, *args], cwd=cwd, env=_env(), capture_output=True, text=True, check=False
    )


def test_the_front_end_blocks_run_against_the_server_by_hand(server: HandServer) -> None:
    """The signed request of the docs is served; unsigned, refused; the trail verifies."""
    import openai

    blocks = parse(DOC)
    client_block = _one(_marked_here(), PYTHON, "client.completions.create")
    before = [
        b for b in blocks[: blocks.index(client_block)] if b.lang == PYTHON and b.marker is None
    ]
    assert before, "the page signs the scope before the client block"
    ns: dict[str, Any] = {"__name__": "docs_vllm"}
    for b in before:
        _exec(b, b.code, ns, server.tmp)
    _exec(client_block, _rewrite(client_block.code, server.table), ns, server.tmp)
    out = ns["out"]
    assert out.choices and out.choices[0].finish_reason in ("length", "stop"), out
    assert out.usage.prompt_tokens > 0 and out.usage.completion_tokens > 0, out.usage
    unsigned = {"vllm_xargs": {k: v for k, v in ns["extra_body"]["vllm_xargs"].items()
                               if k != "kvgov_scope_token"}}  # fmt: skip
    with pytest.raises(openai.PermissionDeniedError, match="scope"):
        ns["client"].completions.create(
            model=out.model, prompt="the tenant record", max_tokens=2, extra_body=unsigned
        )
    server.stop()
    assert server.proc.returncode is not None
    # the docs' sentence, in the server's directory: the trail it wrote verifies
    verify = _kvgov(server.tmp, "audit", "verify", "--url", "sqlite:///kvgov-audit.db")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    print("\n" + verify.stdout)
    events = _kvgov(server.tmp, "audit", "events", "--url", "sqlite:///kvgov-audit.db", "--json")
    assert events.returncode == 0, events.stderr
    rows = json.loads(events.stdout)
    admitted = [r for r in rows if r["type"] == "admission"]
    assert [r["tenant"] for r in admitted] == ["acme"], admitted
    assert any(r["type"] == "policy_denied" for r in rows), "the unsigned request is audited"


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The stand-in for "the LLM of the block above": the tiny model, the docs' settings."""
    import vllm_cpu_tiny_model
    from vllm import LLM

    tmp = tmp_path_factory.mktemp("llm")
    vllm_cpu_tiny_model.write(str(tmp / "tiny-opt"))
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(engine_env(True, {"KVGOV_KEY_SECRET": SECRET}))  # the engine core's
    try:
        engine = LLM(
            model=str(tmp / "tiny-opt"),
            load_format="dummy",
            dtype="float32",
            block_size=BLOCK_SIZE,
            max_model_len=MAX_MODEL_LEN,
            enforce_eager=True,
            enable_prefix_caching=True,
            scheduler_cls="kvgov.govern.vllm.GovernedScheduler",
            additional_config={
                "kvgov": {
                    "audit_url": f"sqlite:///{tmp / 'kvgov-audit.db'}",
                    "default_classification": "internal",
                    "model_revision": "2024-07-23",
                }
            },
        )
    finally:
        os.environ.clear()
        os.environ.update(saved)
    yield engine
    engine.llm_engine.engine_core.shutdown()


def test_the_maintenance_block_runs_on_an_llm(llm: Any) -> None:
    """Each call of the block returns what its comment says; the purge empties acme's blocks."""
    from vllm import SamplingParams

    scope = {"kvgov_tenant": "acme", "kvgov_classification": "internal", "kvgov_template": "sys-v3"}
    params = SamplingParams(max_tokens=4, extra_args=scope)
    (done,) = llm.generate([" ".join(["the tenant record"] * 30)], params, use_tqdm=False)
    assert done.outputs[0].finish_reason != "error", done
    block = _one(_marked_here(), PYTHON, 'call_utility("kvgov_call"')
    ns: dict[str, Any] = {"llm": llm}
    results: list[Any] = []
    for stmt in ast.parse(block.code).body:  # each call's value, in the block's order
        code = ast.get_source_segment(block.code, stmt) or ""
        if isinstance(stmt, ast.Expr):
            results.append(eval(compile(code, str(block.doc), "eval"), ns))
        else:
            exec(compile(code, str(block.doc), "exec"), ns)
    purge, invalidate, sweep, stats, state = results
    assert isinstance(purge, dict) and purge["blocks_zeroized"] > 0, purge
    assert purge["verified"] is False, "the bytes live in the workers (the docs say)"
    assert isinstance(invalidate, dict) and isinstance(sweep, int), (invalidate, sweep)
    assert isinstance(stats, dict) and "total" in stats, stats
    assert isinstance(state, dict) and "cached" in state, state
