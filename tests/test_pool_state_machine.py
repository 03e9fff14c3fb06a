"""Property-based test of the pools alone: random sequence growth and truncation in the paged KV
pool, mamba and row allocation and frees (valid and invalid), checked against a plain model.

After every step: no KV slot is owned by two sequences, every sequence's positions map into
pages it owns, the free counts equal capacity minus what the model says is held, and the
allocators' own integrity checks pass. Runs for page sizes 1 and 16, and for both shapes of
recurrent state (Mamba2, gated DeltaNet).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from replica.api import PoolExhaustedError, SlotStateError
from replica.pools.kv_pool import pages_for
from tests.support.pools import STATE_MODELS, make_pools


def make_machine(page_size: int, model):
    class PoolMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.pool, _, _ = make_pools(
                max_sessions=6,
                kv_tokens=128,
                page_size=page_size,
                track=1,
                max_context=64,
                model=model,
            )
            self.seqs: dict = {}  # SeqSlots -> length (positions with KV slots)
            self.freed: list = []  # sequences already freed (for double-free attempts)

        @rule()
        def new_sequence(self):
            if self.pool.can_alloc(1):
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
            if kv.can_extend(old, new):
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
            p = self.pool.kv_pool.page_size
            held_pages = sum(pages_for(n, p) for n in self.seqs.values())
            assert self.pool.kv_pool.free_tokens == self.pool.kv_pool.token_slots - held_pages * p
            assert self.pool.num_free == self.pool.rows - len(self.seqs)
            assert self.pool.mamba_pool.num_free == self.pool.mamba_pool.slots - 2 * len(self.seqs)
            owner: dict[int, object] = {}
            for seq, n in self.seqs.items():
                slots = self.pool.req_to_token[seq.req_pool_idx, :n].long()
                assert torch.unique(slots).numel() == n
                for page in torch.unique(slots // p).tolist():
                    assert owner.setdefault(page, seq) is seq, "a KV page owned twice"
                    assert self.pool.kv_pool.page_allocator.is_allocated(page)
            self.pool.check_integrity()

        def teardown(self):
            for seq, n in list(self.seqs.items()):
                self.pool.free_seq(seq, n)
            assert self.pool.kv_pool.free_tokens == self.pool.kv_pool.token_slots
            assert self.pool.mamba_pool.num_free == self.pool.mamba_pool.slots
            assert self.pool.num_free == self.pool.rows

    return PoolMachine


@pytest.mark.parametrize("state", sorted(STATE_MODELS))
@pytest.mark.parametrize("page_size", [1, 16])
def test_pool_state_machine(page_size, state):
    machine = make_machine(page_size, STATE_MODELS[state])
    machine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
    machine.TestCase().runTest()
