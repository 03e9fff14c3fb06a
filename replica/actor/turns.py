"""``TurnCalls``: the replica actor's calls about turns and the leases of Converse streams.

A turn costs one actor call to submit (``submit_turns`` takes every turn a gateway has waiting
for this replica); its events reach the gateway that submitted it through that gateway's
long-lived output stream (``replica.actor.output_streams``), so no Ray round trip is spent per
token. Each call runs on the engine thread between steps (``EngineHost.call``); refusals come
back as ``ActorError`` values.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from replica.actor.batch_calls import NOT_FED, submit_batch
from replica.actor.engine_host import EngineHost
from replica.api import (
    ActorError,
    ChatInput,
    ChatPrompt,
    ForkedTurn,
    InvalidRequestError,
    RenderedTurn,
    SamplingParams,
    StatusCode,
    TurnArgs,
)
from replica.failpoints import CallFaults

if TYPE_CHECKING:
    from replica.engine.engine import Engine
    from replica.generation.chat_prompts import ChatPrompts
    from replica.model import Tokenizer

TurnResult = int | ForkedTurn | RenderedTurn | ActorError


class TurnCalls:
    def __init__(
        self,
        engine: Engine,
        host: EngineHost,
        tokenizer: Tokenizer,
        chat_prompts: ChatPrompts,
        call_faults: CallFaults,
    ) -> None:
        self.engine = engine
        self.host = host
        self.tokenizer = tokenizer
        self.chat_prompts = chat_prompts
        self.call_faults = call_faults

    async def submit_turns(
        self, gateway_id: str, turns: list[TurnArgs]
    ) -> list[TurnResult] | ActorError:
        """Queue turns, each ``(session_id, text, token_ids, sampling[, (child_id, lease_s)])``
        (text, a ``ChatInput`` or tokens); each result is its turn id or its refusal. A turn
        given a fork's ``(child_id, lease_s)`` forks its session first, in the same engine
        command (the fork is the state before the turn; ``batch_calls.fork_then_submit``), and
        its result is a ``ForkedTurn``; a ``ChatInput`` turn's is a ``RenderedTurn`` holding
        that. Their events go to ``gateway_id``'s stream. Text is tokenised (a chat rendered) on
        a worker thread: a long text must not hold up the actor's event loop, which answers
        health probes and pushes snapshots."""
        self.call_faults.trip("submit_turns")
        if any(turn[1] is not None for turn in turns):
            inputs, prompts = await asyncio.to_thread(self._turn_inputs, turns)
        else:
            inputs, prompts = self._turn_inputs(turns)
        results = await self.host.call(submit_batch, self.engine, gateway_id, inputs)
        if isinstance(results, ActorError) or not any(prompts):
            return results
        return [rendered(result, prompt) for result, prompt in zip(results, prompts, strict=True)]

    def _turn_inputs(self, turns: list[TurnArgs]) -> tuple[list, list[ChatPrompt | None]]:
        """The engine's input of each turn (or its refusal), and the prompt of each chat turn."""
        inputs, prompts = [], []
        for session_id, text, token_ids, sampling, *fork in turns:
            prompt = None
            if text is not None and token_ids is not None:
                why = "give either text or tokens, not both"
                inputs.append(ActorError(StatusCode.INVALID_ARGUMENT, why))
            elif isinstance(text, ChatInput):
                prompt, ids = self._render(text)
                if isinstance(ids, ActorError):
                    inputs.append(ids)
                else:  # it goes only on the state it names (``submit_batch``)
                    held = len(text.prior_ids or ())
                    inputs.append((session_id, ids, sampling, fork[0] if fork else None, held))
            else:
                ids = self.tokenizer.encode(text) if text is not None else list(token_ids or [])
                inputs.append((session_id, ids, sampling, *fork))
            prompts.append(prompt)
        return inputs, prompts

    def _render(self, chat: ChatInput) -> tuple[ChatPrompt | None, list[int] | ActorError]:
        """A chat turn's prompt and the ids it feeds; NOT_FED when it does not continue its
        ``prior_ids``, the refusal when the template refuses the conversation."""
        try:
            prompt = self.chat_prompts.prompt(chat.messages, chat.prior_ids)
        except InvalidRequestError as exc:
            return None, exc.to_actor_error()
        if chat.prior_ids and prompt.reused_tokens != len(chat.prior_ids):
            return prompt, NOT_FED
        return prompt, prompt.token_ids

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

        return await self.host.call(hold)

    async def interrupt(self, session_id: str) -> bool | ActorError:
        return await self.host.call(self.engine.interrupt, session_id)

    async def cancel(
        self, session_id: str, why: str = "cancelled by the client", turn_id: int | None = None
    ) -> bool | ActorError:
        return await self.host.call(self.engine.cancel, session_id, why, turn_id)


def rendered(result: TurnResult, prompt: ChatPrompt | None) -> TurnResult:
    """A turn's result as its caller gets it: a chat turn's (``prompt``) in a ``RenderedTurn``
    (turn None: it was not fed), a refusal as it is."""
    if prompt is None or (isinstance(result, ActorError) and result is not NOT_FED):
        return result
    return RenderedTurn(prompt, None if result is NOT_FED else result)
