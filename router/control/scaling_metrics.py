"""The autoscaler's metrics, on the /metrics of ``serve``: what it goes by and each step it took,
copied from the controller's ``ScalingReport`` (``show``) about every second.

- ``session_router_replicas_desired`` gauge: the replicas the cluster should have now
  (``--replicas`` without autoscaling; what the autoscaler chose with it);
- ``session_router_free_session_room`` gauge: the new sessions the healthy replicas can still
  take (GPU and host), as the autoscaler last counted them;
- ``session_router_scaling_steps_total{direction,reason}`` counter: replicas added (``up``,
  reason ``free_room_low``) and removed (``down``, reason ``idle``, or ``light_load`` when its
  sessions were migrated to the others first).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from router.control.api import ScalingReport


class ScalingMetrics:
    def __init__(self, registry: CollectorRegistry, desired: int) -> None:
        self.desired = Gauge(
            "session_router_replicas_desired",
            "Replicas the cluster should have now (the autoscaler's target).",
            registry=registry,
        )
        self.room = Gauge(
            "session_router_free_session_room",
            "New sessions the healthy replicas can still take, GPU and host.",
            registry=registry,
        )
        self.steps = Counter(
            "session_router_scaling_steps",
            "Replicas the autoscaler added (up) or removed (down), by reason.",
            ["direction", "reason"],
            registry=registry,
        )
        self.desired.set(desired)
        self._shown: dict[tuple[str, str], int] = {}  # steps counted so far, by label pair

    def show(self, report: ScalingReport) -> None:
        """The report's figures; its steps are totals, so only what is new is counted."""
        self.room.set(report.room)
        self.desired.set(report.desired)
        for (direction, reason), total in report.steps.items():
            new = total - self._shown.get((direction, reason), 0)
            if new > 0:
                self.steps.labels(direction=direction, reason=reason).inc(new)
                self._shown[direction, reason] = total
