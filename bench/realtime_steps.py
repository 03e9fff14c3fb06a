"""The engine step that the Realtime barge-in latencies are measured against.

``direct_decode_step_ms``: an engine built in this process exactly as the benchmark's replica
builds it (``LocalCluster.replica_config``: the same checkpoint, pools and torch threads), with
``sessions`` sessions decoding together: the median time of one decode-only step at that batch,
which is what a cancel waits for at most (commands run between steps) and what the first token
of a response costs at least. It is measured right after the cluster is stopped, so nothing
else of the benchmark runs beside it.
"""

from __future__ import annotations

import statistics
import time

from bench.harness.inprocess_driver import build_engine
from replica.api import SamplingParams
from replica.config import ReplicaConfig

PROMPT_TOKENS = 24
WARMUP_STEPS = 3


def direct_decode_step_ms(config: ReplicaConfig, sessions: int, steps: int = 40) -> float:
    engine = build_engine(config)
    sids = [f"step-{i}" for i in range(sessions)]
    for i, sid in enumerate(sids):
        engine.open_session(sid)
        prompt = [(7 * i + j) % 200 + 3 for j in range(PROMPT_TOKENS)]
        engine.submit(sid, prompt, SamplingParams(max_new_tokens=steps + WARMUP_STEPS + 2))
    times = []
    while engine.has_work:
        decode_only = not engine.scheduler.waiting and not engine.scheduler.plan().prefill
        start = time.perf_counter()
        events = engine.step()
        if decode_only and events.token_count == sessions:
            times.append((time.perf_counter() - start) * 1000)
    for sid in sids:
        engine.close_session(sid)
    return statistics.median(times[WARMUP_STEPS:] or times)
