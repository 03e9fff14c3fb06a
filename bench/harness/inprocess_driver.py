"""The session workloads on an ``Engine`` on this thread: no Ray, no gRPC, no event loop, the
floor the other paths are measured against. Turns are submitted between steps and the engine is
stepped until they finish.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import torch

from bench.harness.window import LifecycleSamples, Window
from bench.harness.workload import PROMPT, Lifecycle, TokenRounds
from replica.api import SamplingParams
from replica.config import ReplicaConfig
from replica.engine.engine import Engine
from replica.model import load


def build_engine(config: ReplicaConfig, device: str = "cpu") -> Engine:
    """An engine as a replica builds it: ``config``'s model on ``device``, its pools there too;
    ``config.threads`` (when set) becomes this process's torch thread count."""
    if config.threads:
        torch.set_num_threads(config.threads)
    _, model, tokenizer = load(
        config.model_name, device=device, dtype=config.weights_dtype, revision=config.revision
    )
    pools = dataclasses.replace(config.pools, device=device)
    return Engine(dataclasses.replace(config, pools=pools), model, tokenizer, "in-process")


class InProcessDriver:
    """Runs the workloads on ``engine``, which nothing else may step meanwhile."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._ids = itertools.count()

    def open(self) -> str:
        session_id = f"inproc-{next(self._ids)}"
        self.engine.open_session(session_id)
        return session_id

    def submit(self, session_id: str, new_tokens: int) -> None:
        self.engine.submit(session_id, PROMPT, SamplingParams(max_new_tokens=new_tokens))

    def lifecycles(
        self, concurrency: int, seconds: float, warmup: float, new_tokens: int
    ) -> LifecycleSamples:
        """The closed loop of the other drivers on one thread: ``concurrency`` sessions open and
        submit between steps; a session whose turn ended is closed and the next one begins."""
        engine = self.engine
        window = Window(concurrency, seconds, warmup)
        active: dict[str, list] = {}  # session -> [start, opened, tokens so far, first]

        def begin(first: bool) -> None:
            t0 = time.perf_counter()
            session_id = self.open()
            t1 = time.perf_counter()
            self.submit(session_id, new_tokens)
            active[session_id] = [t0, t1, 0, first]

        for _ in range(concurrency):
            begin(True)
        while active:
            if not engine.has_work:
                raise RuntimeError("engine idle with turns outstanding")
            out = engine.step()
            for session_id in out.session_ids:  # a row: one token of a turn that goes on
                entry = active.get(session_id)
                if entry is not None:
                    entry[2] += 1
            for event in out.events:  # ends (and errors)
                entry = active.get(event.session_id)
                if entry is None:
                    continue
                if event.error_code is not None:
                    raise RuntimeError(f"{event.error_code}: {event.error}")
                entry[2] += len(event.token_ids)
                if event.finished:
                    t2 = time.perf_counter()
                    engine.close_session(event.session_id)
                    del active[event.session_id]
                    t0, t1, tokens, first = entry
                    window.add(Lifecycle(t0, t1, t2, time.perf_counter(), tokens), first)
                    if window.running():
                        begin(False)
        return window.samples

    def token_rounds(self, sessions: int, new_tokens: int, rounds: int) -> TokenRounds:
        """``sessions`` open sessions, ``rounds`` turns on all at once, stepped to the end."""
        ids = [self.open() for _ in range(sessions)]
        result = TokenRounds()
        try:
            for _ in range(rounds):
                t0 = time.perf_counter()
                for session_id in ids:
                    self.submit(session_id, new_tokens)
                tokens = 0
                while self.engine.has_work:
                    tokens += self.engine.step().token_count
                result.rounds.append((tokens, time.perf_counter() - t0))
        finally:
            for session_id in ids:
                self.engine.close_session(session_id)
        return result
