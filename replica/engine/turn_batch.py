"""``TurnBatch``: the running turns of one sampled batch, as tensors: their sampling parameters,
the ids that end them (stop ids and the model's EOS), how many tokens each may still make, and
the index of the token each samples next; and as lists, what their rows of a ``StepOutputs``
carry (session, turn and gateway ids) and each turn's ``output_ids``.

Built when the batch changes (a turn joins, ends, is interrupted: ``same`` says whether it
did) and advanced by one token per row at each ``sample``, so a decode step whose turns go on
costs the same Python work whatever the batch size. Owned by ``TurnOutputs``, on the engine
thread.
"""

from __future__ import annotations

import torch

from replica.engine.sampling import RowSampling, SamplingError, sample, seed_halves
from replica.sessions.request import Req


class TurnBatch:
    def __init__(self, reqs: list[Req], gateways: list[str], device: torch.device) -> None:
        """``gateways[b]``: where the events of ``reqs[b]``'s turn go (fixed while it runs)."""
        self.reqs = list(reqs)
        self.gateways = gateways
        self.session_ids = [req.session_id for req in reqs]
        self.turn_ids = [req.rid for req in reqs]
        self.outputs = [req.output_ids for req in reqs]  # each turn's list, appended to in place
        params = [req.sampling for req in reqs]
        greedy = [p.greedy for p in params]
        top_k = [p.top_k or 0 for p in params]
        top_p = [1.0 if p.top_p is None else p.top_p for p in params]
        self.rows = RowSampling(
            greedy=torch.tensor(greedy, device=device),
            temperature=torch.tensor(
                [1.0 if g else p.temperature for g, p in zip(greedy, params)],
                dtype=torch.float32,
                device=device,
            ),
            top_p=torch.tensor(top_p, dtype=torch.float32, device=device),
            top_k=torch.tensor(top_k, dtype=torch.long, device=device),
            seeds=torch.tensor([seed_halves(p.seed) for p in params], device=device).view(-1, 2),
            all_greedy=all(greedy),
            filtered=any(
                not g and (k > 0 or 0.0 < p < 1.0) for g, k, p in zip(greedy, top_k, top_p)
            ),
        )
        self.counters = torch.tensor([len(r.output_ids) for r in reqs], device=device)
        self.max_new = torch.tensor([p.max_new_tokens for p in params], device=device)
        ends = [(*p.stop_token_ids, *p.eos_token_ids) for p in params]
        width = max(map(len, ends), default=0)
        self.end_ids = None
        if width:
            padded = [(*ids, *(-1,) * (width - len(ids))) for ids in ends]
            self.end_ids = torch.tensor(padded, dtype=torch.long, device=device)

    def same(self, reqs: list[Req]) -> bool:
        """Whether ``reqs`` are this batch's turns, in order (identity, compared in C)."""
        return self.reqs == reqs

    def sample(self, logits: torch.Tensor) -> tuple[list[int], list[bool], dict[int, Exception]]:
        """Each row's next token, whether it may end its turn (an end id, its last token, or
        no token: then its error), and the rows that got no token with why; advances every row
        by one token."""
        tokens, good = sample(logits, self.rows, self.counters)
        self.counters = self.counters + 1
        ends = (self.counters >= self.max_new) | ~good
        if self.end_ids is not None:
            ends |= (tokens[:, None] == self.end_ids).any(dim=-1)
        # one transfer from the device for the whole batch
        tokens, ends, good = torch.stack([tokens, ends.long(), good.long()]).tolist()
        errors: dict[int, Exception] = {}
        if 0 in good:
            for b, ok in enumerate(good):
                if not ok:
                    errors[b] = self._why(logits[b], self.reqs[b])
        return tokens, ends, errors

    @staticmethod
    def _why(row: torch.Tensor, req: Req) -> SamplingError:
        if not bool(torch.isfinite(row).all()):
            return SamplingError("the model produced non-finite logits for this turn")
        return SamplingError(
            f"temperature {req.sampling.temperature} gave non-finite probabilities"
        )
