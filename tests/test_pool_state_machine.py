"""Property-based test of the pools alone: random sequence growth and truncation in the paged KV
pool, forks that share a sequence's whole pages, mamba and row allocation and frees (valid and
invalid), checked against a plain model.

The model keeps, for each sequence, the model page of each of its positions (a fork copies the
parent's whole pages and gets a new one for its last partial page; growing into a partial page
that another sequence shares gives it a new one: copy-on-write) and a tag per position written
into the K buffer. It alone decides whether an allocation or a growth must fit. After every step:
each sequence's positions map into the real pages the model says (one real page per model page,
shared exactly where the model shares), every page's reference count is its number of holders,
the K buffer holds each sequence's own tags (a shared page was never overwritten), the free
counts equal capacity minus the model's distinct pages, and the allocators' own integrity checks
pass. Runs for both shapes of recurrent state (Mamba2, gated
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
            self.seqs: dict = {}  # SeqSlots -> model page of each position (list)
            self.tags: dict = {}  # SeqSlots -> the tag written at each position (list)
            self.freed: list = []  # sequences already freed (for double-free attempts)
            self.next_page = 0
            self.next_tag = 1.0

        def page(self) -> int:
            self.next_page += 1
            return self.next_page

        def held(self) -> set:
            return {page for pages in self.seqs.values() for page in pages}

        def free_pages(self) -> int:
            return self.cap.kv_pages - len(self.held())

        def holders(self, page) -> int:
            return sum(page in set(pages) for pages in self.seqs.values())

        def write_tags(self, seq, old, new):
            slots = self.pool.req_to_token[seq.req_pool_idx, old:new].long()
            tags = [self.next_tag + i for i in range(new - old)]
            self.next_tag += new - old
            self.pool.kv_pool.k_all[0, slots, 0, 0] = torch.tensor(tags)
            self.tags[seq] = self.tags[seq][:old] + tags

        @rule()
        def new_sequence(self):
            if len(self.seqs) < MAX_SEQS:
                (seq,) = self.pool.alloc_seqs(1)
                self.seqs[seq], self.tags[seq] = [], []
            else:
                with pytest.raises(PoolExhaustedError):
                    self.pool.alloc_seqs(1)

        @precondition(lambda self: self.seqs)
        @rule(data=st.data(), grow=st.integers(1, 40))
        def extend(self, data, grow):
            seq = data.draw(st.sampled_from(sorted(self.seqs)))
            pages, p = self.seqs[seq], self.cap.page_size
            old = len(pages)
            new = min(old + grow, self.pool.max_context_len)
            if new == old:
                return
            kv = self.pool.kv_pool
            cow = old % p != 0 and self.holders(pages[-1]) > 1
            need = self.cap.pages(new) - self.cap.pages(old) + int(cow)
            if need <= self.free_pages():
                kv.extend(self.pool.req_to_token, seq.req_pool_idx, old, new)
                if cow:  # its partial last page is its own now
                    own = self.page()
                    pages[old - old % p :] = [own] * (old % p)
                for pos in range(old, new):
                    pages.append(pages[-1] if pos % p else self.page())
                self.write_tags(seq, old, new)
            else:
                free = kv.free_tokens
                with pytest.raises(PoolExhaustedError):
                    kv.extend(self.pool.req_to_token, seq.req_pool_idx, old, new)
                assert kv.free_tokens == free

        @precondition(lambda self: self.seqs)
        @rule(data=st.data(), keep=st.floats(0, 1))
        def truncate(self, data, keep):
            seq = data.draw(st.sampled_from(sorted(self.seqs)))
            cur = len(self.seqs[seq])
            new = int(cur * keep)
            self.pool.kv_pool.truncate(self.pool.req_to_token, seq.req_pool_idx, new, cur)
            # whole pages beyond ``new`` go; the page holding position new-1 stays whole
            self.seqs[seq] = self.seqs[seq][:new]
            self.tags[seq] = self.tags[seq][:new]

        @precondition(lambda self: self.seqs)
        @rule(data=st.data())
        def fork(self, data):
            parent = data.draw(st.sampled_from(sorted(self.seqs)))
            pages, p = self.seqs[parent], self.cap.page_size
            n = len(pages)
            partial = n % p != 0
            if len(self.seqs) >= MAX_SEQS or int(partial) > self.free_pages():
                return  # no room for a child (an open's refusal is tested above)
            (child,) = self.pool.alloc_seqs(1)
            copy = self.pool.kv_pool.share_prefix(
                self.pool.req_to_token, parent.req_pool_idx, child.req_pool_idx, n
            )
            assert (copy is not None) == partial
            if copy is not None:  # the caller copies the partial page's contents
                src, dst = copy
                k = self.pool.kv_pool.k_all
                k[:, dst * p : dst * p + p] = k[:, src * p : src * p + p]
            whole = n - n % p
            self.seqs[child] = pages[:whole] + [self.page()] * (n - whole)
            self.tags[child] = list(self.tags[parent])

        @precondition(lambda self: self.seqs)
        @rule(data=st.data())
        def free_sequence(self, data):
            seq = data.draw(st.sampled_from(sorted(self.seqs)))
            self.pool.free_seq(seq, len(self.seqs.pop(seq)))
            self.tags.pop(seq)
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

        @rule(page=st.integers(0, KV_TOKENS - 1))
        def release_of_a_free_page_is_refused(self, page):
            alloc = self.pool.kv_pool.page_allocator
            page %= alloc.size
            if alloc.is_allocated(page):
                return
            for misuse in (alloc.free, alloc.share):
                with pytest.raises(SlotStateError):
                    misuse([page])
            assert alloc.refcount(page) == 0

        @invariant()
        def consistent(self):
            if not hasattr(self, "pool"):
                return  # before ``build``
            p = self.cap.page_size
            kv = self.pool.kv_pool
            assert kv.free_tokens == self.free_pages() * p
            assert self.pool.num_free == MAX_SEQS - len(self.seqs)
            assert self.pool.mamba_pool.num_free == (MAX_SEQS - len(self.seqs)) * (1 + TRACK)
            real_of: dict[int, int] = {}  # model page -> real page
            model_of: dict[int, int] = {}
            for seq, pages in self.seqs.items():
                n = len(pages)
                slots = self.pool.req_to_token[seq.req_pool_idx, :n].long()
                assert torch.unique(slots).numel() == n
                for real, model in zip((slots // p).tolist(), pages):
                    assert real_of.setdefault(model, real) == real
                    assert model_of.setdefault(real, model) == model, "pages shared wrongly"
                assert kv.k_all[0, slots, 0, 0].tolist() == self.tags[seq]
            for model, real in real_of.items():
                assert kv.page_allocator.refcount(real) == self.holders(model)
            shared = sum(self.holders(m) - 1 for m in real_of)
            assert kv.page_allocator.shared_refs == shared
            self.pool.check_integrity()

        def teardown(self):
            if not hasattr(self, "pool"):
                return
            for seq, pages in list(self.seqs.items()):
                self.pool.free_seq(seq, len(pages))
            assert self.pool.kv_pool.free_tokens == KV_TOKENS
            assert self.pool.kv_pool.page_allocator.shared_refs == 0
            assert self.pool.mamba_pool.num_free == MAX_SEQS * (1 + TRACK)
            assert self.pool.num_free == MAX_SEQS
            self.pool.check_integrity()

    return PoolMachine


@pytest.mark.parametrize("state", sorted(STATE_MODELS))
def test_pool_state_machine(state):
    run_state_machine_as_test(make_machine(STATE_MODELS[state]))
