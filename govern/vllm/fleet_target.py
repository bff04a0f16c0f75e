"""The fleet's control plane in a vLLM engine: :class:`VllmTarget` and :class:`VllmFleet`.

With the setting ``fleet_url`` (``KVGOV_FLEET_URL``), the governed scheduler starts a
:class:`~kvgov.govern.fleet.FleetAgent` for its engine (docs/fleet.md). The agent's
thread does every database call; the scheduler's thread runs the orders at a step
boundary, the start of ``schedule()`` (never inside a forward pass, never waiting on
the database).

An erasure (purge, invalidate, rotate-secret) orders the workers to zero the blocks it
freed; they do it in the step that carries the ids, the very step whose ``schedule()``
ran the order. The order is complete (its result written, with a ``fleet_order`` event
``outcome: confirmed`` naming the erasure event) when that step came back
(``update_from_output``): the workers zeroed the blocks before its forward pass.

An idle engine: vLLM's engine core calls ``schedule()`` only when the scheduler has
requests, and otherwise blocks on its input queue. The scheduler counts queued orders
as work (``has_requests``), and the agent, when it queues an order, puts vLLM's
``WAKEUP`` sentinel on the engine core's input queue (what vLLM itself does to wake an
idle engine at shutdown): the busy loop wakes, sees work, and runs one step, which
carries the order and the zeroing. The engine core hands the scheduler that queue when
its busy loop starts (:func:`install_wakeup`). An engine without a busy loop (``LLM``
with multiprocessing off, a test harness) runs its orders at its next step.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kvgov.audit import AuditLog
from kvgov.policy import PolicyClient

from ..fleet import Done, FleetAgent, trusted_keys
from ..results import ErasureReport, InvalidationReport, RotationReport
from .binding import VllmGovernance
from .request_state import RequestGovernance
from .settings import BindingSettings

__all__ = ["VllmFleet", "VllmTarget", "install_wakeup", "open_fleet"]

_MARK = "_kvgov_fleet_wakeup"


class VllmTarget:
    """The vLLM binding as a fleet target.

    Args:
        binding: the engine's governance.
        live: the governance of every request vLLM still holds (the scheduler's).
    """

    kind = "vllm"

    def __init__(
        self, binding: VllmGovernance, live: Callable[[], Iterable[RequestGovernance]]
    ) -> None:
        self._binding = binding
        self._live = live
        # per erasure waiting for its zeroing: the ids not yet carried by a step that came back
        self._waiting: list[set[int]] = []

    @property
    def audit(self) -> AuditLog:
        """The engine's audit log."""
        return self._binding.gov.audit

    @property
    def policy(self) -> PolicyClient:
        """The engine's policy client."""
        return self._binding.gov.policy

    def key_id(self) -> str:
        """The cache-key secret's public name."""
        return str(self._binding.gov.deriver.key_id)

    def purge(self, tenant: str, order_id: str) -> Done:
        """``purge_tenant`` with the order id; complete once the workers zeroed the blocks."""
        binding = self._binding
        binding.drain()
        binding.flush_done()
        report = binding.gov.purge_tenant(tenant, self._live(), order_id=order_id)
        return self._after_zeroing(report)

    def invalidate(self, wanted: Mapping[str, str], order_id: str) -> Done:
        """``invalidate`` with the order id; complete once the workers zeroed the blocks."""
        self._binding.drain()
        report = self._binding.gov.invalidate(dict(wanted), self._live(), order_id=order_id)
        return self._after_zeroing(report)

    def rotate_secret(self, secret: bytes, order_id: str) -> Done:
        """``rotate_secret`` with the order id; complete once the workers zeroed the blocks."""
        self._binding.drain()
        report = self._binding.gov.rotate_secret_report(secret, self._live(), order_id=order_id)
        return self._after_zeroing(report)

    def step_returned(self, carried: Iterable[int] | None) -> None:
        """A step came back: the workers zeroed ``carried`` (its ``new_block_ids_to_zero``)."""
        if carried and self._waiting:
            ids = set(carried)
            for want in self._waiting:
                want -= ids

    def _after_zeroing(self, report: ErasureReport | InvalidationReport | RotationReport) -> Done:
        """The erasure's first :class:`Done`; its ``pending`` turns final once zeroed.

        Verified when no running request held a block of it (a held block is zeroed
        only at its release: unverified, as for kvgov's own pool) and every block it
        freed was carried by a step that came back.
        """
        binding = self._binding
        binding.drain()  # the frees the erasure made, ordered zeroed
        want = set(binding.pool.kvgov_zero)  # this boundary's step carries them all
        self._waiting.append(want)
        detail = {
            "blocks_zeroized": report.blocks_zeroized,
            "held_blocks": report.held_blocks,
            "detached_blocks": report.detached_blocks,
        }

        def pending() -> Done | None:
            if want:
                return None
            self._waiting.remove(want)
            return Done(report.event_id, report.held_blocks == 0, {"workers_zeroed": True})

        return Done(report.event_id, None, detail, pending=pending)


class VllmFleet:
    """The scheduler's side of the fleet: its agent and target, and the hooks it calls.

    Args:
        agent: the fleet agent (started by :func:`open_fleet`).
        target: the binding as the agent's target.
    """

    def __init__(self, agent: FleetAgent, target: VllmTarget) -> None:
        self.agent = agent
        self.target = target
        self._wake: Callable[[], None] | None = None
        self._wake_lock = threading.Lock()

    def boundary(self) -> None:
        """A step boundary (the start of ``schedule()``): run the queued orders."""
        self.agent.drain()

    def has_orders(self) -> bool:
        """Whether orders wait for a step boundary (so an idle engine runs a step)."""
        return self.agent.has_orders()

    def step_returned(self, carried: Iterable[int] | None) -> None:
        """A step came back (``update_from_output``): finish what its zeroing completed."""
        self.target.step_returned(carried)
        self.agent.settle()

    def set_wake(self, wake: Callable[[], None]) -> None:
        """How to wake the idle engine (called by the engine core's busy loop at start)."""
        with self._wake_lock:
            self._wake = wake
        if self.agent.has_orders():  # queued before the loop started
            wake()

    def wake(self) -> None:
        """Wake an idle engine so that it reaches a step boundary (the agent's thread)."""
        with self._wake_lock:
            wake = self._wake
        if wake is not None:
            wake()

    def stop(self) -> None:
        """Stop the agent (marks the engine stopped in the fleet)."""
        self.agent.stop()


def open_fleet(
    settings: BindingSettings,
    binding: VllmGovernance,
    live: Callable[[], Iterable[RequestGovernance]],
    versions: Mapping[str, str],
) -> VllmFleet | None:
    """Start the engine's fleet agent if ``fleet_url`` is set; None otherwise.

    Raises:
        BindingConfigError: ``fleet_url`` without a stable engine id or without the
            operators' public keys (or an unreadable, open or malformed keys file).
    """
    if settings.fleet_url is None:
        return None
    engine_id = settings.fleet_engine()
    operators = trusted_keys(settings.fleet_operator_keys())
    target = VllmTarget(binding, live)
    holder: list[VllmFleet] = []
    agent = FleetAgent(
        settings.fleet_url,
        engine_id,
        target,
        operators,
        versions=versions,
        poll_interval=settings.fleet_poll_interval,
        heartbeat_interval=max(settings.fleet_poll_interval, 1.0),
        on_order=lambda: holder[0].wake() if holder else None,
    )
    fleet = VllmFleet(agent, target)
    holder.append(fleet)
    install_wakeup()
    agent.start()
    return fleet


def install_wakeup() -> None:
    """Hand every governed scheduler its engine core's wake-up when the busy loop starts.

    Wraps ``EngineCoreProc.run_busy_loop`` (and each subclass's own): before the loop,
    a scheduler with a fleet gets a function that puts vLLM's ``WAKEUP`` sentinel on
    the engine core's input queue. Idempotent; public names of vLLM only.
    """
    from vllm.v1.engine import EngineCoreRequestType, core

    wakeup = EngineCoreRequestType.WAKEUP

    for cls in (core.EngineCoreProc, *core.EngineCoreProc.__subclasses__()):
        original = cls.__dict__.get("run_busy_loop")
        if original is None or getattr(original, _MARK, False):
            continue

        def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def run_busy_loop(self: Any, *args: Any, **kwargs: Any) -> Any:
                fleet = getattr(self.scheduler, "kvgov_fleet", None)
                if isinstance(fleet, VllmFleet):
                    queue = self.input_queue
                    fleet.set_wake(lambda: queue.put_nowait((wakeup, None)))
                return original(self, *args, **kwargs)

            setattr(run_busy_loop, _MARK, True)
            return run_busy_loop

        cls.run_busy_loop = wrap(original)
