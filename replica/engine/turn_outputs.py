"""``TurnOutputs``: what running turns produce, and how each turn ends.

A turn that finishes (stop token, max_new_tokens) or is interrupted (barge-in) is committed; a
turn that is cancelled or fails rolls the session back to its turn snapshot (track buffers >= 1) or
commits what it folded in (0).

It takes each sampled token into its turn (text through the engine's ``StepText``, batched over
the step's turns; the end at the model's EOS, a stop id or stop string of the request, or
``max_new_tokens``), ends turns (``commit``: the session keeps what the turn produced; ``fail``:
the session rolls back to its turn snapshot), and collects what was produced since the last
``take`` in one ``StepOutputs``: a row for each turn that goes on (the step's turns that go on
cost the same Python calls whatever their number), a ``TurnEvent`` for each turn that ends, each
addressed to its session's gateway. A turn's text exists from ``start`` (its input is folded in)
until it ends; every way a turn ends goes through here, so it does not outlive its turn. Owned by
the engine and used on its thread only.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

import torch

from replica.api import FinishReason, StatusCode, TurnEvent
from replica.engine.scheduler import Scheduler, input_left
from replica.engine.step_outputs import StepOutputs
from replica.engine.step_text import step_text
from replica.engine.stop_strings import StopStrings
from replica.engine.turn_batch import TurnBatch
from replica.model import Tokenizer
from replica.sessions.request import Req
from replica.sessions.table import SessionRecord, SessionTable

log = logging.getLogger(__name__)


class TurnOutputs:
    def __init__(
        self, tokenizer: Tokenizer, scheduler: Scheduler, sessions: SessionTable, vocab_size: int
    ) -> None:
        """``vocab_size``: the model's (the ids it may sample)."""
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.sessions = sessions
        self.text = step_text(tokenizer, vocab_size)
        self._decoding: TurnBatch | None = None  # the decode batch of the last step
        self._stops: dict[int, StopStrings] = {}  # by turn id: the running turns with stop strings
        self._out = StepOutputs()  # produced since the last ``take``

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
        if 1 not in ends:  # the common case: every turn goes on
            self._go_on(batch.reqs, batch.session_ids, batch.turn_ids, batch.gateways, tokens)
            return
        go = [b for b, end in enumerate(ends) if not end]
        for b, end in enumerate(ends):
            if end:
                self._end(batch.reqs[b], tokens[b], errors.get(b))
        if go:
            self._go_on(
                [batch.reqs[b] for b in go],
                [batch.session_ids[b] for b in go],
                [batch.turn_ids[b] for b in go],
                [batch.gateways[b] for b in go],
                [tokens[b] for b in go],
            )

    def _end(self, req: Req, token: int, error: Exception | None) -> None:
        """A row ``TurnBatch`` says may end its turn: take its token (``accept``), or fail the
        turn when it got none."""
        try:
            if error is not None:
                raise error
            self.accept(req, token)
        except Exception as exc:  # noqa: BLE001 - fails this turn only, never the step
            if req not in self.scheduler.running:
                raise  # the turn had ended: nothing of it is left to fail
            log.warning("turn %d of session %s failed: %s", req.rid, req.session_id, exc)
            self.fail(req, StatusCode.INTERNAL, f"sampling the next token failed: {exc}")

    def _go_on(
        self,
        reqs: list[Req],
        session_ids: list[str],
        turn_ids: list[int],
        gateways: list[str],
        tokens: list[int],
    ) -> None:
        """Take tokens that end their turns by no id and not by length (``TurnBatch`` checked
        that), one row each: appended to the turns, their text made for the whole batch at once;
        only a stop string a token completes can end its turn."""
        deque(map(list.append, [req.output_ids for req in reqs], tokens), maxlen=0)
        texts = self.text.pieces(turn_ids, tokens)
        ended: list[int] = []
        if None in texts:  # a turn whose text could not be made
            ended = [i for i, text in enumerate(texts) if text is None]
            for i in ended:
                why = self.text.failed.pop(turn_ids[i])
                log.warning("turn %d of session %s failed: %s", turn_ids[i], session_ids[i], why)
                self.fail(reqs[i], StatusCode.INTERNAL, f"sampling the next token failed: {why}")
        if self._stops:  # only the turns with stop strings are looked at one by one
            for i in [i for i, rid in enumerate(turn_ids) if rid in self._stops]:
                if texts[i] is None:
                    continue
                texts[i], stopped = self._stops[turn_ids[i]].feed(texts[i])
                if stopped:
                    self.commit(reqs[i], FinishReason.STOP, (tokens[i],), texts[i])
                    ended.append(i)
        if ended:
            gone = set(ended)
            keep = [i for i in range(len(reqs)) if i not in gone]
            session_ids = [session_ids[i] for i in keep]
            turn_ids = [turn_ids[i] for i in keep]
            gateways = [gateways[i] for i in keep]
            tokens = [tokens[i] for i in keep]
            texts = [texts[i] for i in keep]
        self._out.add_rows(session_ids, turn_ids, gateways, tokens, texts)

    def _batch(self, reqs: list[Req], device: torch.device) -> TurnBatch:
        gateways = [self.sessions.get(req.session_id).gateway_id for req in reqs]
        return TurnBatch(reqs, gateways, device)

    def start(self, req: Req) -> None:
        """The turn's input is folded in: it samples from now on; the state is cached at this
        boundary."""
        if req.sampling.stop:
            self._stops[req.rid] = StopStrings(req.sampling.stop)
        self.sessions.input_folded(req)

    def accept(self, req: Req, token: int) -> None:
        """Take the token sampled for a running turn; ends the turn (STOP) at the model's EOS
        (committed, its text not streamed), at a stop id or at the token that completes a stop
        string (the string and what follows it not streamed), else (LENGTH) at
        ``max_new_tokens``."""
        stops = self._stops.get(req.rid)
        if stops is None and req.sampling.stop:
            stops = self._stops[req.rid] = StopStrings(req.sampling.stop)
        req.output_ids.append(token)
        if token in req.sampling.eos_token_ids:
            self.commit(req, FinishReason.STOP, (token,))
            return
        piece, stopped = self.text.push(req.rid, token), False
        if stops is not None:
            piece, stopped = stops.feed(piece)
        if stopped or token in req.sampling.stop_token_ids:
            self.commit(req, FinishReason.STOP, (token,), piece)
        elif len(req.output_ids) >= req.sampling.max_new_tokens:
            self.commit(req, FinishReason.LENGTH, (token,), piece)
        else:
            gateway = self.sessions.get(req.session_id).gateway_id
            self._out.add_rows([req.session_id], [req.rid], [gateway], [token], [piece])

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
        self._out.events.append(
            TurnEvent(req.session_id, req.rid, gateway_id=slot.gateway_id, **fields)
        )

    def take(self) -> StepOutputs:
        out, self._out = self._out, StepOutputs()
        return out

    def _forget(self, req: Req) -> str:
        """Drop the turn's text; returns the text it still held back (up to a stop string)."""
        tail = self.text.finish(req.rid)
        stops = self._stops.pop(req.rid, None)
        if stops is None:
            return tail
        text, _ = stops.feed(tail)
        return text + stops.flush()
