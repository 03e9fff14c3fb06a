"""``TurnOutputs``: what running turns produce, and how each turn ends.

A turn that finishes (stop token, max_new_tokens) or is interrupted (barge-in) is committed; a
turn that is cancelled or fails rolls the session back to its turn snapshot (track buffers >= 1) or
commits what it folded in (0).

It takes each sampled token into its turn (text through the turn's ``TurnText``; the end at the
model's EOS, a stop id or stop string of the request, or ``max_new_tokens``), ends turns
(``commit``: the session keeps what the turn produced; ``fail``: the session rolls back to its
turn snapshot), and collects the ``TurnEvent``s produced since the last ``take``, each addressed
to its session's gateway.
A turn's text exists from ``start`` (its input is folded in) until
it ends; every way a turn ends goes through here, so it does not outlive its turn. Owned by the
engine and used on its thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from replica.api import FinishReason, StatusCode, TurnEvent
from replica.engine.scheduler import Scheduler, input_left
from replica.engine.turn_batch import TurnBatch
from replica.engine.turn_text import TurnText
from replica.model import Tokenizer
from replica.sessions.request import Req
from replica.sessions.table import SessionRecord, SessionTable

log = logging.getLogger(__name__)


class TurnOutputs:
    def __init__(self, tokenizer: Tokenizer, scheduler: Scheduler, sessions: SessionTable) -> None:
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.sessions = sessions
        self._decoding: TurnBatch | None = None  # the decode batch of the last step
        self._text: dict[int, TurnText] = {}  # by turn id
        self._events: list[TurnEvent] = []  # produced since the last ``take``

    def run(
        self, reqs: list[Req], forward: Callable[[], torch.Tensor], after_prefill: bool
    ) -> None:
        """Run ``forward`` for the running turns ``reqs`` (one logits row each) and take each
        row's next token. A failed forward fails the turns in it; a row that cannot be sampled
        or taken fails only its own turn (INTERNAL); the other turns go on. The decode batch's
        ``TurnBatch`` is kept while its turns are the same."""
        try:
            logits = forward()
        except Exception as exc:  # noqa: BLE001 - a failed forward must not lose the slots
            log.exception("forward failed for turns %s", [r.rid for r in reqs])
            for req in reqs:
                self.fail(req, StatusCode.INTERNAL, f"model forward failed: {exc}")
            return
        if after_prefill:  # sample only for turns whose input is now all folded in
            rows = [i for i, req in enumerate(reqs) if not input_left(req)]
            for i in rows:
                if reqs[i].sampling.max_new_tokens == 0:
                    self.commit(reqs[i], FinishReason.LENGTH)
                else:
                    self.start(reqs[i])
            rows = [i for i in rows if reqs[i].sampling.max_new_tokens]
            if not rows:
                return
            logits, reqs = logits[rows], [reqs[i] for i in rows]
            batch = self._batch(reqs, logits.device)
        else:
            batch = self._decoding
            if batch is None or not batch.same(reqs):
                batch = self._decoding = self._batch(reqs, logits.device)
        tokens, ends, errors = batch.sample(logits)
        for b, (req, token, end, gateway) in enumerate(zip(reqs, tokens, ends, batch.gateways)):
            try:
                if not end:  # the common case: the turn goes on
                    self._stream(req, token, gateway)
                    continue
                if b in errors:
                    raise errors[b]
                self.accept(req, token)
            except Exception as exc:  # noqa: BLE001 - fails this turn only, never the step
                if req not in self.scheduler.running:
                    raise  # the turn had ended: nothing of it is left to fail
                log.warning("turn %d of session %s failed: %s", req.rid, req.session_id, exc)
                self.fail(req, StatusCode.INTERNAL, f"sampling the next token failed: {exc}")

    def _batch(self, reqs: list[Req], device: torch.device) -> TurnBatch:
        gateways = [self.sessions.get(req.session_id).gateway_id for req in reqs]
        return TurnBatch(reqs, gateways, device)

    def start(self, req: Req) -> None:
        """The turn's input is folded in: it samples from now on; the state is cached at this
        boundary."""
        self._text[req.rid] = TurnText(self.tokenizer, req.sampling.stop)
        self.sessions.input_folded(req)

    def _stream(self, req: Req, token: int, gateway: str) -> None:
        """Take a token that ends the turn by no id and not by length (``TurnBatch`` checked
        that): only a stop string it completes can end it."""
        req.output_ids.append(token)
        piece, stopped = self._text[req.rid].push(token)
        if stopped:
            self.commit(req, FinishReason.STOP, (token,), piece)
            return
        event = TurnEvent(req.session_id, req.rid, (token,), piece, None, 0, None, None, gateway)
        self._events.append(event)

    def accept(self, req: Req, token: int) -> None:
        """Take the token sampled for a running turn; ends the turn (STOP) at the model's EOS
        (committed, its text not streamed), at a stop id or at the token that completes a stop
        string (the string and what follows it not streamed), else (LENGTH) at
        ``max_new_tokens``."""
        text = self._text.get(req.rid)
        if text is None:
            text = self._text[req.rid] = TurnText(self.tokenizer, req.sampling.stop)
        req.output_ids.append(token)
        if token in req.sampling.eos_token_ids:
            self.commit(req, FinishReason.STOP, (token,))
            return
        piece, stopped = text.push(token)
        if stopped or token in req.sampling.stop_token_ids:
            self.commit(req, FinishReason.STOP, (token,), piece)
        elif len(req.output_ids) >= req.sampling.max_new_tokens:
            self.commit(req, FinishReason.LENGTH, (token,), piece)
        else:
            self.emit(self.sessions.get(req.session_id), req, token_ids=(token,), text=piece)

    def commit(
        self, req: Req, reason: FinishReason, tokens: tuple[int, ...] = (), text: str = ""
    ) -> None:
        """End a running turn, keeping what it produced (finished or interrupted)."""
        self.scheduler.finish(req)
        slot = self.sessions.save_from_req(req)
        self.report_end(req, reason, slot, tokens, text + self._forget(req))

    def fail(self, req: Req, code: StatusCode, why: str) -> None:
        """End a running turn with an error; the session rolls back (atomic turns)."""
        self.scheduler.finish(req)
        slot = self.sessions.rollback(req)
        self._forget(req)
        self.emit(slot, req, committed_tokens=slot.committed_tokens, error_code=code, error=why)

    def report_end(
        self,
        req: Req,
        reason: FinishReason,
        slot: SessionRecord,
        tokens: tuple[int, ...] = (),
        text: str = "",
    ) -> None:
        """The last event of a turn that ended with ``reason``."""
        self.emit(
            slot,
            req,
            token_ids=tokens,
            text=text,
            finish_reason=reason,
            committed_tokens=slot.committed_tokens,
        )

    def emit(self, slot: SessionRecord, req: Req, **fields) -> None:
        """An event of ``req``'s turn, addressed to its session's gateway. ``slot`` is the
        session's record, passed in because a session closed during its turn is already gone
        from the table when the turn's last event is emitted."""
        self._events.append(
            TurnEvent(req.session_id, req.rid, gateway_id=slot.gateway_id, **fields)
        )

    def take(self) -> list[TurnEvent]:
        events, self._events = self._events, []
        return events

    def _forget(self, req: Req) -> str:
        """Drop the turn's text; returns the text it still held back."""
        text = self._text.pop(req.rid, None)
        return text.finish() if text else ""
