"""Block manager and scheduler under random request streams, without a model (hypothesis); prefix keys."""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

import pytest

from rosellm_edu.engine.block_manager import BlockManager, chain_hash
from rosellm_edu.engine.scheduler import Scheduler
from rosellm_edu.sampling_params import SamplingParams
from rosellm_edu.sequence import Sequence


def check_invariants(bm: BlockManager) -> None:
    owners = Counter(b for table in bm.block_tables.values() for b in table)
    for table in bm.block_tables.values():
        assert len(set(table)) == len(table), "a block appears twice in one table"
    for block in bm.blocks:
        assert block.ref_count >= 0
        assert block.ref_count == owners[block.block_id], "reference count differs from the tables using it"
        assert (block.ref_count == 0) == (block.block_id in bm.free_blocks)
    for h, b in bm.cached.items():
        assert bm.blocks[b].hash == h


request = st.tuples(
    st.lists(st.integers(0, 5), min_size=1, max_size=40),   # prompt from a small vocabulary: prefixes repeat
    st.integers(1, 12),                                    # max_tokens
    st.integers(0, 8),                                     # the step it arrives at
    st.one_of(st.none(), st.integers(0, 30)),              # the step it is aborted at, if any
)


@settings(max_examples=150, deadline=None)
@given(requests=st.lists(request, min_size=1, max_size=12), num_blocks=st.integers(10, 40),
       block_size=st.sampled_from([1, 2, 4, 8]), max_num_seqs=st.integers(1, 6),
       max_num_batched_tokens=st.integers(1, 64), prefix_caching=st.booleans(), shared=st.lists(st.integers(0, 5)))
def test_random_streams_keep_blocks_consistent_and_finish_every_request(
        requests, num_blocks, block_size, max_num_seqs, max_num_batched_tokens, prefix_caching, shared):
    bm = BlockManager(num_blocks, block_size, prefix_caching)
    scheduler = Scheduler(bm, max_num_seqs, max_num_batched_tokens)
    seqs, ended = {}, {}
    pending = sorted(enumerate(requests), key=lambda r: r[1][2])
    step = 0
    while pending or scheduler.has_unfinished():
        while pending and pending[0][1][2] <= step:
            i, (prompt, max_tokens, _, _) = pending.pop(0)
            seq = Sequence(str(i), None, shared + prompt, SamplingParams(max_tokens=max_tokens))
            if bm.blocks_needed(len(seq) + max_tokens) > num_blocks:
                ended[seq.request_id] = "refused"              # what LLMEngine.add_request refuses
                continue
            seqs[seq.request_id] = seq
            scheduler.add(seq)
        for rid, (_, _, _, abort_at) in enumerate(requests):
            seq = seqs.get(str(rid))
            if abort_at == step and seq is not None and str(rid) not in ended:
                scheduler.remove(seq)
                ended[str(rid)] = "aborted"
        batch = scheduler.schedule()
        assert batch or not scheduler.has_unfinished(), "a step scheduled nothing"
        check_invariants(bm)
        scheduler.computed(batch)
        for s in batch:
            if s.samples:
                s.seq.output_token_ids.append(len(s.seq) % 6)
                if len(s.seq.output_token_ids) == s.seq.params.max_tokens:
                    s.seq.finish("length")
                    scheduler.remove(s.seq)
                    ended[s.seq.request_id] = "finished"
        check_invariants(bm)
        step += 1
        assert step < 5_000, "the scheduler stalled"
    assert len(ended) == len(requests)
    assert all(len(seqs[r].output_token_ids) == seqs[r].params.max_tokens for r, why in ended.items()
               if why == "finished")
    assert len(bm.free_blocks) == num_blocks and not bm.block_tables and not scheduler.preempted
    assert bm.stats()["cached_blocks"] == len(bm.cached)


def test_a_shared_prefix_is_reused_and_evicted_least_recently_used():
    bm = BlockManager(num_blocks=6, block_size=2)
    a = Sequence("a", None, [1, 2, 3, 4, 5], SamplingParams())
    assert bm.allocate(a) == 0
    bm.commit(a, 5)
    b = Sequence("b", None, [1, 2, 3, 4, 9], SamplingParams())
    assert bm.allocate(b) == 4                              # two full blocks shared
    assert bm.block_tables["b"][:2] == bm.block_tables["a"][:2]
    assert [bm.blocks[x].ref_count for x in bm.block_tables["a"]] == [2, 2, 1]
    bm.free("a"), bm.free("b")
    assert bm.stats()["cached_blocks"] == 2 and len(bm.free_blocks) == 6
    c = Sequence("c", None, [7] * 11, SamplingParams())     # needs all six blocks: evicts the cached ones
    assert bm.allocate(c) == 0 and not bm.cached
    assert bm.allocate(Sequence("d", None, [1], SamplingParams())) is None


def test_a_preempted_sequence_finding_its_own_blocks_is_not_a_prefix_hit():
    # Two prompts with nothing in common, in a pool too small for both to grow: one is preempted and, readmitted,
    # finds its own blocks in the cache. That is recomputation saved, not a prefix shared with another request.
    bm = BlockManager(num_blocks=6, block_size=4)
    scheduler = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=64)
    seqs = [Sequence(str(i), None, [10 * i + t for t in range(9)], SamplingParams(max_tokens=6)) for i in range(2)]
    for seq in seqs:
        scheduler.add(seq)
    while scheduler.has_unfinished():
        batch = scheduler.schedule()
        scheduler.computed(batch)
        for s in batch:
            if s.samples:
                s.seq.output_token_ids.append(99)
                if len(s.seq.output_token_ids) == s.seq.params.max_tokens:
                    s.seq.finish("length")
                    scheduler.remove(s.seq)
    stats = bm.stats()
    assert scheduler.num_preemptions > 0
    assert stats["prefix_hit_rate"] == 0 and bm.queried_tokens == 18      # each prompt counted once, no hit
    assert stats["resumed_hit_rate"] > 0                                   # its own blocks, counted apart
    assert not scheduler.preempted


def test_prefix_keys_are_sha256_chains_of_the_token_bytes():
    import hashlib

    import numpy as np

    first = chain_hash(None, (1, 2))
    assert first == hashlib.sha256(np.array([1, 2], dtype=np.int64).tobytes()).digest()
    assert chain_hash(first, (3, 4)) == hashlib.sha256(first + np.array([3, 4], dtype=np.int64).tobytes()).digest()
    assert chain_hash(None, (-1,)) != chain_hash(None, (-2,))
    assert chain_hash(None, (1, 2)) != chain_hash(chain_hash(None, (1,)), (2,))


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_an_equal_prefix_under_another_parent_is_not_a_hit(prefix_caching):
    bm = BlockManager(num_blocks=8, block_size=2, enable_prefix_caching=prefix_caching)
    a = Sequence("a", None, [1, 2, 3, 4, 5], SamplingParams())
    bm.allocate(a)
    bm.commit(a, 5)
    b = Sequence("b", None, [9, 9, 3, 4, 5], SamplingParams())   # the same second block after another first one
    assert bm.allocate(b) == 0
