"""``FrontDoor``: what the HTTP endpoints of one gateway share — its keys, the turns they run
through the gateway, the served model's name, the stored responses, the metrics."""

from __future__ import annotations

from typing import Any

from router.gateway.gateway import Gateway
from router.http.chat import Completions
from router.http.errors import ApiError
from router.http.metrics import HttpMetrics
from router.http.realtime import Realtime
from router.http.responses import Responses
from router.http.turns import Turns

FALLBACK_NAME = "session-router"


class FrontDoor:
    def __init__(
        self,
        gateway: Gateway,
        metrics: HttpMetrics,
        model_name: str | None,
        store: Any,
        open_wait_s: float,
        response_ttl_s: float,
    ) -> None:
        """``model_name``: what clients call the model (None: the replicas' ``--model``);
        ``store``: the cluster's response store (``router.control.response_store``)."""
        self.keys = gateway.keys
        self.metrics = metrics
        self.turns = Turns(gateway, open_wait_s)
        self.model_name = model_name
        self.completions = Completions(self.turns, metrics, lambda: self.model_name)
        self.responses = Responses(
            self.turns, metrics, lambda: self.model_name, store, response_ttl_s
        )
        self.realtime = Realtime(self.keys, self.turns, metrics.realtime, lambda: self.model_name)

    async def start(self) -> None:
        """Learn the served model's name from a replica, unless it was given."""
        if self.model_name is None:
            try:
                self.model_name = (await self.turns.model_card()).name
            except ApiError:
                self.model_name = FALLBACK_NAME

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [await self._model()]}

    async def model(self, name: str) -> dict[str, Any]:
        if name != self.model_name:
            why = f"the model {name!r} is not served here"
            raise ApiError(404, why, "model", "model_not_found")
        return await self._model()

    async def _model(self) -> dict[str, Any]:
        card = await self.turns.model_card()
        return {
            "id": self.model_name,
            "object": "model",
            "created": card.created,
            "owned_by": "session-router",
            "max_model_len": card.max_context,
        }
