# Generated from notebooks/04_paged_attention.ipynb by `python -m rosellm_edu.export`.
# Edit the notebook, not this file.

from rosellm_edu.engine.block_manager import BlockManager
from rosellm_edu.engine.scheduler import ScheduledSeq, Scheduler
from rosellm_edu.sequence import Sequence, SequenceStatus


class PagedScheduler(Scheduler):
    """Blocks on demand: a prompt's blocks at admission, then one block at a time; preempts when they run out."""

    allocator: BlockManager

    def __init__(self, allocator: BlockManager, *args):
        super().__init__(allocator, *args)
        self.num_preemptions = 0

    def schedule(self) -> list[ScheduledSeq]:
        budget, batch, preemptions = self.max_num_batched_tokens, [], self.num_preemptions
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            cached = self.num_cached[seq.request_id]
            n = min(len(seq) - cached, budget)
            if self.make_room(seq, cached + n):
                batch.append(ScheduledSeq(seq, cached, n))
                budget -= n
                i += 1
        while self.num_preemptions == preemptions and self.waiting and budget > 0 \
                and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            cached = self.allocator.allocate(seq)
            if cached is None:
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self.num_cached[seq.request_id] = cached
            n = min(len(seq) - cached, budget)
            batch.append(ScheduledSeq(seq, cached, n))
            budget -= n
        return batch

    def make_room(self, seq: Sequence, num_tokens: int) -> bool:
        """Preempt the newest running sequences until seq has blocks for num_tokens; False if seq itself went."""
        while not self.allocator.ensure(seq, num_tokens):
            victim = self.running[-1]
            self.preempt(victim)
            if victim is seq:
                return False
        return True

    def preempt(self, seq: Sequence) -> None:
        """Free seq's blocks and send it back to the front of the queue; its prefill re-runs later."""
        self.running.remove(seq)
        self.num_cached.pop(seq.request_id)
        self.allocator.free(seq.request_id)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def computed(self, batch: list[ScheduledSeq]) -> None:
        super().computed(batch)
        for s in batch:
            self.allocator.commit(s.seq, s.num_cached + s.num_new)
