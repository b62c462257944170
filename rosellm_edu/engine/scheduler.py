# Generated from notebooks/03_continuous_batching.ipynb by `python -m rosellm_edu.export`.
# Edit the notebook, not this file.

from collections import deque
from dataclasses import dataclass

from rosellm_edu.engine.kv_pool import ReservingAllocator
from rosellm_edu.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_cached: int   # positions whose K/V are already in the pool
    num_new: int      # positions this step computes

    @property
    def samples(self) -> bool:
        """Does this step reach the end of the sequence, so that its last logits give a new token?"""
        return self.num_cached + self.num_new == len(self.seq)


class Scheduler:
    def __init__(self, allocator: ReservingAllocator, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int):
        self.allocator = allocator
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_cached: dict[str, int] = {}

    def reservation(self, seq: Sequence) -> int:
        return min(len(seq) + seq.params.max_tokens - len(seq.output_token_ids), self.max_model_len)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def find(self, request_id: str) -> Sequence | None:
        return next((s for s in [*self.running, *self.waiting] if s.request_id == request_id), None)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledSeq]:
        budget, batch = self.max_num_batched_tokens, []
        for seq in self.running:
            if budget == 0:
                break
            cached = self.num_cached[seq.request_id]
            n = min(len(seq) - cached, budget)
            batch.append(ScheduledSeq(seq, cached, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self.allocator.can_admit(self.reservation(seq)):
                break
            self.waiting.popleft()
            self.allocator.admit(seq.request_id, self.reservation(seq))
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self.num_cached[seq.request_id] = 0
            n = min(len(seq), budget)
            batch.append(ScheduledSeq(seq, 0, n))
            budget -= n
        return batch

    def computed(self, batch: list[ScheduledSeq]) -> None:
        for s in batch:
            self.num_cached[s.seq.request_id] = s.num_cached + s.num_new

    def remove(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out and free its KV blocks."""
        if seq in self.running:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self.num_cached.pop(seq.request_id, None)
        self.allocator.free(seq.request_id)
