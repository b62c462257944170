# Generated from notebooks/03_continuous_batching.ipynb, notebooks/04_paged_attention.ipynb, notebooks/04a_parallel_sampling.ipynb, notebooks/06a_logprobs.ipynb, notebooks/12_speculative_decoding.ipynb, notebooks/13_structured_output.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import bisect
import itertools
from collections import deque
from dataclasses import dataclass, field

from rosellm_edu.engine.block_manager import BlockManager
from rosellm_edu.engine.parallel_sampling import ParentRequest
from rosellm_edu.sequence import Sequence, SequenceStatus


# notebooks/12_speculative_decoding.ipynb, cell 22
@dataclass
class ScheduledSeq:
    seq: Sequence
    num_computed: int   # positions whose K/V are already in the cache
    num_new: int        # positions this step computes
    draft_token_ids: list[int] = field(default_factory=list)   # guesses after the sequence's end, to verify

    @property
    def end(self) -> int:
        return self.num_computed + self.num_new

    @property
    def samples(self) -> bool:
        """Does this step reach the end of the sequence and its drafts, so that its logits give new tokens?"""
        return self.end == len(self.seq) + len(self.draft_token_ids)

    @property
    def logit_positions(self) -> range:
        """The positions whose logits are sampled: the last real token's, and each draft's."""
        return range(max(self.num_computed, len(self.seq) - 1), self.end) if self.samples else range(0)

    def token_ids(self) -> list[int]:
        """The tokens at the positions this step computes: the sequence's own, then its drafts."""
        n = len(self.seq)
        return (self.seq.token_slice(self.num_computed, min(self.end, n))
                + self.draft_token_ids[max(0, self.num_computed - n):max(0, self.end - n)])


# notebooks/03_continuous_batching.ipynb, cell 21
class Scheduler:
    """Picks each step's batch under a token budget: running sequences first (decodes and prefill chunks), then
    waiting ones while blocks and seats remain."""

    # notebooks/06a_logprobs.ipynb, cell 31
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 policy: str = "fcfs", prompt_logprobs_chunk: int = 512):
        if policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', got {policy!r}")
        self.block_manager, self.policy = block_manager, policy
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.prompt_logprobs_chunk = prompt_logprobs_chunk     # the most prompt positions with logprobs per step
        self.rank: dict[str, tuple[int, int]] = {}   # request id -> (priority, arrival): lower runs first
        self.arrivals = itertools.count()
        self.waiting = deque() if policy == "fcfs" else PriorityQueue(lambda seq: self.rank[seq.request_id])
        self.running: list[Sequence] = []
        self.requests: dict[str, Sequence] = {}    # every unfinished sequence, by request id
        self.num_computed: dict[str, int] = {}
        self.num_preemptions = 0
        self.preempted: set[str] = set()           # unfinished sequences preempted at least once
        self.parents: dict[str, ParentRequest] = {}  # each sample of a request with n > 1 -> its request

    # notebooks/04a_parallel_sampling.ipynb, cell 28
    def add(self, seq: Sequence, priority: int = 0) -> None:
        self.rank[seq.request_id] = (priority, next(self.arrivals))
        self.waiting.append(seq)
        self.requests[seq.request_id] = seq
        if seq.params.n > 1:
            self.parents[seq.request_id] = ParentRequest(seq.request_id, seq.params.n, [seq])

    def find(self, request_id: str) -> Sequence | None:
        return self.requests.get(request_id)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    # notebooks/13_structured_output.ipynb, cell 37
    def schedule(self, drafts: dict[str, list[int]] | None = None) -> list[ScheduledSeq]:
        """drafts[request_id], guesses after a decoding sequence's end, go with it when blocks and budget allow."""
        drafts = drafts or {}
        self.make_way()                                                                       # "priority" only
        budget, batch, preemptions = self.max_num_batched_tokens, [], self.num_preemptions
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            computed = self.num_computed[seq.request_id]
            scheduled = self.with_drafts(seq, computed, drafts.get(seq.request_id, []), budget)
            if scheduled is None:
                n = self.num_new(seq, computed, budget)
                if not self.make_room(seq, computed, computed + n):                               # seq itself went
                    continue
                scheduled = ScheduledSeq(seq, computed, n)
            batch.append(scheduled)
            budget -= scheduled.num_new
            i += 1
        while self.num_preemptions == preemptions and budget > 0:
            seq = self.next_waiting()                                  # the first whose grammar is ready
            if seq is None or len(self.running) + self.seats(seq) > self.max_num_seqs:
                break
            computed = self.block_manager.allocate(seq, resumed=seq.request_id in self.preempted)
            if computed is None:
                break
            self.waiting.remove(seq)                                   # not always the first
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self.num_computed[seq.request_id] = computed
            n = self.num_new(seq, computed, budget)
            batch.append(ScheduledSeq(seq, computed, n))
            budget -= n
        return batch

    # notebooks/12_speculative_decoding.ipynb, cell 26
    def computed(self, batch: list[ScheduledSeq]) -> None:
        for s in batch:
            done = s.end - len(s.draft_token_ids)        # drafts are counted when accepted
            self.num_computed[s.seq.request_id] = done
            self.block_manager.commit(s.seq, done)

    # notebooks/04a_parallel_sampling.ipynb, cell 38
    def remove(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out and free its KV blocks."""
        if seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
        else:
            self.running.remove(seq)
        del self.requests[seq.request_id]
        self.num_computed.pop(seq.request_id, None)
        self.preempted.discard(seq.request_id)
        self.rank.pop(seq.request_id)
        self.block_manager.free(seq.request_id)
        parent = self.parents.get(seq.request_id)
        if parent is not None and not any(s.request_id in self.requests for s in parent.samples):  # its last sample
            for s in parent.samples:
                del self.parents[s.request_id]

    # notebooks/04a_parallel_sampling.ipynb, cell 32
    def make_room(self, seq: Sequence, num_computed: int, num_tokens: int) -> bool:
        """Preempt running sequences (the newest, or the lowest ranked under "priority") until seq has blocks for
        num_tokens, and its own copy of any shared block it writes from num_computed on; False if seq itself went."""
        while not self.block_manager.ensure(seq, num_computed, num_tokens):
            victim = self.victim()
            self.preempt(victim)
            if victim is seq:
                return False
        return True

    # notebooks/04_paged_attention.ipynb, cell 28
    def preempt(self, seq: Sequence) -> None:
        """Free seq's blocks and send it back to the front of the queue; its prefill re-runs later."""
        self.running.remove(seq)
        self.num_computed.pop(seq.request_id)
        self.block_manager.free(seq.request_id)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        self.preempted.add(seq.request_id)

    # notebooks/04a_parallel_sampling.ipynb, cell 30
    def fork(self, seq: Sequence, child: Sequence) -> None:
        """Seat child beside seq, sharing seq's blocks and its computed positions; it samples in this same step."""
        self.block_manager.fork(seq.request_id, child.request_id)
        child.status = SequenceStatus.RUNNING
        self.running.append(child)
        self.requests[child.request_id] = child
        self.num_computed[child.request_id] = self.num_computed[seq.request_id]
        self.rank[child.request_id] = self.rank[seq.request_id]
        parent = self.parents[seq.request_id]
        parent.samples.append(child)
        self.parents[child.request_id] = parent

    # notebooks/04a_parallel_sampling.ipynb, cell 30
    def seats(self, seq: Sequence) -> int:
        """Running seats seq takes when admitted: all n for a request not forked yet."""
        parent = self.parents.get(seq.request_id)
        return 1 if parent is None or parent.forked else parent.n

    # notebooks/04a_parallel_sampling.ipynb, cell 35
    def victim(self) -> Sequence:
        """Whom to preempt: the newest running sequence; under "priority", the lowest ranked (the newest of those)."""
        if self.policy == "fcfs":
            return self.running[-1]
        return max(reversed(self.running), key=lambda s: self.rank[s.request_id])

    # notebooks/04a_parallel_sampling.ipynb, cell 35
    def make_way(self) -> None:
        """Under "priority": while the first waiting sequence lacks seats or blocks for its prompt, preempt the lowest
        ranked running sequence, as long as it ranks below the waiting one."""
        if self.policy != "priority" or not self.waiting:
            return
        seq = self.waiting[0]
        while self.running and not self.fits(seq):
            victim = self.victim()
            if self.rank[victim.request_id] <= self.rank[seq.request_id]:
                return
            self.preempt(victim)

    # notebooks/04a_parallel_sampling.ipynb, cell 35
    def fits(self, seq: Sequence) -> bool:
        """Seats for seq's samples and free blocks for its whole prompt (prefix-cache hits not counted)."""
        blocks = self.block_manager.blocks_needed(len(seq)) <= len(self.block_manager.free_blocks)
        return blocks and len(self.running) + self.seats(seq) <= self.max_num_seqs

    # notebooks/04a_parallel_sampling.ipynb, cell 39
    def abort(self, request_id: str) -> None:
        """Take out an unfinished request: every sample of one with n > 1. Unknown or finished: nothing to do."""
        parent = self.parents.get(request_id)
        for seq in parent.samples if parent else [self.requests.get(request_id)]:
            if seq is not None and self.requests.get(seq.request_id) is seq:
                self.remove(seq)

    # notebooks/06a_logprobs.ipynb, cell 28
    def num_new(self, seq: Sequence, computed: int, budget: int) -> int:
        """Positions seq computes this step: the rest of it, within the budget; while seq owes prompt logprobs, at most
        prompt_logprobs_chunk of them."""
        n = min(len(seq) - computed, budget)
        if seq.prompt_logprobs is not None and computed < len(seq.prompt_token_ids) - 1:
            n = min(n, self.prompt_logprobs_chunk)
        return n

    # notebooks/12_speculative_decoding.ipynb, cell 24
    def with_drafts(self, seq: Sequence, computed: int, drafts: list[int], budget: int) -> ScheduledSeq | None:
        """seq's decode with its drafts, if it decodes, has drafts, and the budget and free blocks hold them without
        preempting anyone; None otherwise (it then decodes as before)."""
        drafts = drafts[:budget - 1]
        if not drafts or computed != len(seq) - 1:
            return None
        if not self.block_manager.ensure(seq, computed, len(seq) + len(drafts)):   # changes nothing when it fails
            return None
        return ScheduledSeq(seq, computed, 1 + len(drafts), drafts)

    # notebooks/12_speculative_decoding.ipynb, cell 26
    def accept(self, seq: Sequence, num_accepted: int) -> None:
        """seq appended num_accepted drafts (and one token after them): their K/V are the sequence's now. The rejected
        drafts' slots are written again by the next step; blocks that only they used are given back."""
        self.num_computed[seq.request_id] += num_accepted
        self.block_manager.commit(seq, self.num_computed[seq.request_id])     # full blocks of accepted tokens only
        self.block_manager.trim(seq.request_id, len(seq))

    # notebooks/13_structured_output.ipynb, cell 38
    def next_waiting(self) -> Sequence | None:
        """The first waiting sequence whose grammar, if it has one, is compiled: the others do not wait behind it."""
        return next((s for s in self.waiting if s.grammar is None or s.grammar.ready), None)


# notebooks/04a_parallel_sampling.ipynb, cell 34
class PriorityQueue:
    """The waiting queue under "priority", kept in key order. A preempted sequence goes back to its place, not to
    the front: appendleft is append."""

    def __init__(self, key):
        self.key, self.items = key, []

    def append(self, seq: Sequence) -> None:
        bisect.insort(self.items, seq, key=self.key)           # after those of an equal key

    appendleft = append

    def popleft(self) -> Sequence:
        return self.items.pop(0)

    def remove(self, seq: Sequence) -> None:
        self.items.remove(seq)

    def __getitem__(self, i: int) -> Sequence:
        return self.items[i]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(self.items)
