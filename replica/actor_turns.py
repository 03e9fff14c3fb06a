"""``TurnCalls``: the part of ``ReplicaActor`` that serves turns and their token streams.

A turn costs one actor call to submit (``submit_turns`` takes every turn a gateway has waiting
for this replica); its events reach the gateway that submitted it through that gateway's
long-lived ``stream_outputs`` call (``replica.gateway_outputs``), so no Ray round trip is spent
per token. When a gateway's stream ends (it stopped or died), the sessions its Converse streams
held open are released (reason ``stream_ended``): those streams ended with it.

A mixin: it uses the actor's ``engine``, ``tokenizer``, ``outputs``, ``call_faults``, ``_call``,
``_ensure_started``, ``_spawn`` and ``_note_released``.
"""

from __future__ import annotations

import asyncio
import logging

import ray

from replica.api import ActorError, SamplingParams, StatusCode, TurnArgs
from replica.batch_calls import submit_batch
from replica.gateway_outputs import STREAM_BACKPRESSURE, release_streams_of

log = logging.getLogger(__name__)


class TurnCalls:
    async def submit_turns(
        self, gateway_id: str, turns: list[TurnArgs]
    ) -> list[int | ActorError] | ActorError:
        """Queue turns, each ``(session_id, text, token_ids, sampling)`` (text or tokens);
        each result is its turn id or its refusal. Their events go to ``gateway_id``'s stream.
        Text is tokenised on a worker thread: a long text must not hold up the actor's event
        loop, which answers health probes and pushes snapshots."""
        self.call_faults.trip("submit_turns")
        if any(text is not None for _, text, _, _ in turns):
            inputs = await asyncio.to_thread(self._turn_inputs, turns)
        else:
            inputs = self._turn_inputs(turns)
        return await self._call(submit_batch, self.engine, gateway_id, inputs)

    def _turn_inputs(self, turns: list[TurnArgs]) -> list:
        inputs = []
        for session_id, text, token_ids, sampling in turns:
            if text is not None and token_ids is not None:
                why = "give either text or tokens, not both"
                inputs.append(ActorError(StatusCode.INVALID_ARGUMENT, why))
                continue
            ids = self.tokenizer.encode(text) if text is not None else list(token_ids or [])
            inputs.append((session_id, ids, sampling))
        return inputs

    async def submit_turn(
        self,
        gateway_id: str,
        session_id: str,
        text: str | None,
        token_ids: list[int] | None,
        sampling: SamplingParams,
    ) -> int | ActorError:
        """``submit_turns`` of one turn: its turn id."""
        results = await self.submit_turns(gateway_id, [(session_id, text, token_ids, sampling)])
        return results if isinstance(results, ActorError) else results[0]

    async def hold_sessions(self, session_ids: list[str], lease_s: float) -> list[str] | ActorError:
        """Suspend the idle timeout of these sessions for ``lease_s`` seconds: their Converse
        streams are open (the gateway renews this well within ``lease_s``). Returns those not
        open here (they moved to another replica, or ended)."""

        def hold() -> list[str]:
            self.engine.leases.hold(session_ids, lease_s)
            return [sid for sid in session_ids if sid not in self.engine.sessions.sessions]

        return await self._call(hold)

    async def interrupt(self, session_id: str) -> bool | ActorError:
        return await self._call(self.engine.interrupt, session_id)

    async def cancel(
        self, session_id: str, why: str = "cancelled by the client", turn_id: int | None = None
    ) -> bool | ActorError:
        return await self._call(self.engine.cancel, session_id, why, turn_id)

    @ray.method(_generator_backpressure_num_objects=STREAM_BACKPRESSURE)
    async def stream_outputs(self, gateway_id: str):
        """Long-lived stream of what the engine produced for ``gateway_id`` (lists of
        ``replica.api.DeliveryEntry``); an item waits while the gateway has not taken the
        previous ones, and carries everything produced meanwhile."""
        await self._ensure_started()
        async for batch in self.outputs.stream(gateway_id):
            yield batch

    def _gateway_gone(self, gateway_id: str) -> None:
        self._spawn(self._release_streams_of(gateway_id))

    async def _release_streams_of(self, gateway_id: str) -> None:
        released = await self._call(release_streams_of, self.engine, gateway_id)
        if isinstance(released, list) and released:
            log.info("gateway %s is gone: released its %d streams", gateway_id, len(released))
            self._note_released(released)
