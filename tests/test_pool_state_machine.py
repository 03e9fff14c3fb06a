"""Property-based test of the pools alone: random sequence growth and truncation in the paged KV
pool, mamba and row allocation and frees (valid and invalid), checked against a plain model.

The model (each sequence's length, the configured sizes) alone decides whether an allocation or a
growth must fit. After every step: no KV slot is owned by two sequences, every sequence's positions
map into pages it owns, the free counts equal capacity minus what the model says is held, and the
allocators' own integrity checks pass. Runs for both shapes of recurrent state (Mamba2, gated
DeltaNet); the page size (1 or 16) is drawn per example.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from replica.api import PoolExhaustedError, SlotStateError
from replica.model.config import ModelConfig
from tests.support.pool_oracle import Capacity
from tests.support.pools import STATE_MODELS, make_pools

MAX_SEQS, KV_TOKENS, TRACK = 6, 128, 1


def make_machine(state_model: ModelConfig):
    class PoolMachine(RuleBasedStateMachine):
        @initialize(page_size=st.sampled_from([1, 16]))
        def build(self, page_size):
            self.cap = Capacity(MAX_SEQS, TRACK, KV_TOKENS, page_size)
            self.pool, _, _ = make_pools(
                max_sessions=MAX_SEQS,
                kv_tokens=KV_TOKENS,
                page_size=page_size,
                track=TRACK,
                max_context=64,
                model=state_model,
            )
            self.seqs: dict = {}  # SeqSlots -> length (positions with KV slots)
            self.freed: list = []  # sequences already freed (for double-free attempts)

        def free_pages(self) -> int:
            return self.cap.kv_pages - sum(self.cap.pages(n) for n in self.seqs.values())

        @rule()
        def new_sequence(self):
            if len(self.seqs) < MAX_SEQS:
                (seq,) = self.pool.alloc_seqs(1)
                self.seqs[seq] = 0
            else:
                with pytest.raises(PoolExhaustedError):
                    self.pool.alloc_seqs(1)

        @precondition(lambda self: self.seqs)
        @rule(data=st.data(), grow=st.integers(1, 40))
        def extend(self, data, grow):
            seq = data.draw(st.sampled_from(sorted(self.seqs)))
            old = self.seqs[seq]
            new = min(old + grow, self.pool.max_context_len)
            kv = self.pool.kv_pool
            if self.cap.pages(new) - self.cap.pages(old) <= self.free_pages():
                kv.extend(self.pool.req_to_token, seq.req_pool_idx, old, new)
                self.seqs[seq] = new
            else:
                free = kv.free_tokens
                with pytest.raises(PoolExhaustedError):
                    kv.extend(self.pool.req_to_token, seq.req_pool_idx, old, new)
                assert kv.free_tokens == free

        @precondition(lambda self: self.seqs)
        @rule(data=st.data(), keep=st.floats(0, 1))
        def truncate(self, data, keep):
            seq = data.draw(st.sampled_from(sorted(self.seqs)))
            cur = self.seqs[seq]
            new = int(cur * keep)
            self.pool.kv_pool.truncate(self.pool.req_to_token, seq.req_pool_idx, new, cur)
            self.seqs[seq] = new

        @precondition(lambda self: self.seqs)
        @rule(data=st.data())
        def free_sequence(self, data):
            seq = data.draw(st.sampled_from(sorted(self.seqs)))
            self.pool.free_seq(seq, self.seqs.pop(seq))
            self.freed.append(seq)

        @precondition(lambda self: self.freed)
        @rule(data=st.data())
        def double_free_is_refused(self, data):
            seq = data.draw(st.sampled_from(self.freed))
            if seq.mamba_pool_idx in {s.mamba_pool_idx for s in self.seqs}:
                return  # its slot was handed out again: not a double free any more
            free = self.pool.mamba_pool.num_free
            with pytest.raises(SlotStateError):
                self.pool.free_mamba(seq)
            assert self.pool.mamba_pool.num_free == free

        @invariant()
        def consistent(self):
            if not hasattr(self, "pool"):
                return  # before ``build``
            p = self.cap.page_size
            assert self.pool.kv_pool.free_tokens == self.free_pages() * p
            assert self.pool.num_free == MAX_SEQS - len(self.seqs)
            assert self.pool.mamba_pool.num_free == (MAX_SEQS - len(self.seqs)) * (1 + TRACK)
            owner: dict[int, object] = {}
            for seq, n in self.seqs.items():
                slots = self.pool.req_to_token[seq.req_pool_idx, :n].long()
                assert torch.unique(slots).numel() == n
                for page in torch.unique(slots // p).tolist():
                    assert owner.setdefault(page, seq) is seq, "a KV page owned twice"
                    assert self.pool.kv_pool.page_allocator.is_allocated(page)
            self.pool.check_integrity()

        def teardown(self):
            if not hasattr(self, "pool"):
                return
            for seq, n in list(self.seqs.items()):
                self.pool.free_seq(seq, n)
            assert self.pool.kv_pool.free_tokens == KV_TOKENS
            assert self.pool.mamba_pool.num_free == MAX_SEQS * (1 + TRACK)
            assert self.pool.num_free == MAX_SEQS

    return PoolMachine


@pytest.mark.parametrize("state", sorted(STATE_MODELS))
def test_pool_state_machine(state):
    run_state_machine_as_test(make_machine(STATE_MODELS[state]))
