"""n > 1: the samples of one request share the prompt's KV blocks through reference counts, with copy-on-write
for the half-full last block; same tokens as separate requests, every block back at the end."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import hf_greedy
from test_block_manager import check_invariants
from rosellm_edu import LLM, LLMEngine, SamplingParams
from rosellm_edu.engine.block_manager import BlockManager
from rosellm_edu.sequence import Sequence

PROMPT = "The history of the printing press begins in"


@pytest.fixture(scope="module")
def llm():
    return LLM(dtype="float32", block_size=4)


def prompt_ids(llm, length: int) -> list[int]:
    ids = llm.get_tokenizer()("Once upon a time, in a small village by the sea, there lived an old fisherman "
                              "who told stories every evening.").input_ids
    return ids[:length]


def run_to_end(engine) -> dict:
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id not in finished, "a request reported after it finished"
            if out.finished:
                finished[out.request_id] = out
    return finished


def all_free(engine) -> bool:
    stats = engine.kv_cache_stats()
    return stats["free_blocks"] == stats["total_blocks"]


def test_greedy_samples_are_identical_and_equal_n1_and_transformers(llm, hf_model):
    greedy = dict(temperature=0, max_tokens=10, ignore_eos=True)
    forked, alone = llm.generate([PROMPT, PROMPT], [SamplingParams(**greedy, n=3), SamplingParams(**greedy)],
                                 use_tqdm=False)
    assert forked.finished and [c.index for c in forked.outputs] == [0, 1, 2]
    expected = hf_greedy(hf_model, forked.prompt_token_ids, 10)
    assert alone.outputs[0].token_ids == expected
    for c in forked.outputs:
        assert c.token_ids == expected and c.finish_reason == "length"
        assert c.text == alone.outputs[0].text


@pytest.mark.parametrize("n, seed", [(3, 11), (2, 0)])
def test_seeded_sample_i_equals_a_separate_request_with_seed_plus_i(llm, n, seed):
    params = dict(temperature=1.0, top_p=0.95, max_tokens=12, ignore_eos=True)
    forked = llm.generate(PROMPT, SamplingParams(**params, n=n, seed=seed), use_tqdm=False)[0]
    separate = [llm.generate(PROMPT, SamplingParams(**params, seed=seed + i), use_tqdm=False)[0].outputs[0]
                for i in range(n)]
    assert [c.token_ids for c in forked.outputs] == [s.token_ids for s in separate]
    assert len({tuple(c.token_ids) for c in forked.outputs}) == n      # different seeds, different samples


def test_prompt_blocks_are_shared_and_the_partial_block_copied_on_write(llm):
    engine = LLMEngine(dtype="float32", block_size=4, num_kv_blocks=32)
    ids = prompt_ids(llm, 10)                          # blocks of 4: two full, one half-full (positions 8, 9)
    engine.add_request("r", {"prompt_token_ids": ids}, SamplingParams(seed=3, max_tokens=6, n=3, ignore_eos=True))
    bm, kv = engine.scheduler.block_manager, engine.kv_cache
    engine.step()                                      # prefill once, fork, first token of each sample
    samples = engine.scheduler.parents["r"].samples
    tables = [list(bm.block_tables[s.request_id]) for s in samples]
    assert len(samples) == 3 and tables[0] == tables[1] == tables[2] and len(tables[0]) == 3
    assert [bm.blocks[b].ref_count for b in tables[0]] == [3, 3, 3]
    assert bm.stats()["free_blocks"] == 32 - 3        # one prompt's blocks, not three
    partial = tables[0][2]
    engine.step()                                      # each sample writes position 10: copy-on-write
    tables = [bm.block_tables[s.request_id] for s in samples]
    for i in range(2):                                 # the full blocks stay shared
        assert tables[0][i] == tables[1][i] == tables[2][i] and bm.blocks[tables[0][i]].ref_count == 3
    lasts = [t[2] for t in tables]
    assert len(set(lasts)) == 3 and partial in lasts   # two copies; the last user kept the original
    assert all(bm.blocks[b].ref_count == 1 for b in lasts)
    prompt_slots = [[b * 4 + 0, b * 4 + 1] for b in lasts]   # positions 8 and 9 of each sample
    for slots in prompt_slots[1:]:
        assert torch.equal(kv.k[:, slots], kv.k[:, prompt_slots[0]])
        assert torch.equal(kv.v[:, slots], kv.v[:, prompt_slots[0]])
    assert kv.k[:, prompt_slots[0]].abs().sum() > 0     # the prompt's K really is there
    run_to_end(engine)
    assert all_free(engine) and not engine.scheduler.parents


def test_every_block_is_free_after_finish_and_after_abort(llm):
    engine = LLMEngine(dtype="float32", block_size=4, num_kv_blocks=64)
    params = SamplingParams(temperature=0.7, seed=1, max_tokens=7, n=4, ignore_eos=True)
    engine.add_request("a", PROMPT, params)
    engine.add_request("b", PROMPT + " Europe", SamplingParams(max_tokens=3))
    finished = run_to_end(engine)
    assert set(finished) == {"a", "b"} and len(finished["a"].outputs) == 4
    assert all(len(c.token_ids) == 7 for c in finished["a"].outputs)
    assert all_free(engine) and not engine.scheduler.parents
    for steps in (0, 1, 3):                            # aborted before the fork, right after it, while decoding
        engine.add_request("a", PROMPT, params)
        engine.add_request("b", PROMPT, SamplingParams(max_tokens=20, ignore_eos=True))
        for _ in range(steps):
            assert all(o.request_id in ("a", "b") for o in engine.step())
        engine.abort_request("a")
        assert set(engine.scheduler.requests) == {"b"} and not engine.scheduler.parents
        engine.abort_request(["b", "a", "unknown"])    # finished, aborted or unknown ids are ignored
        assert not engine.has_unfinished_requests() and all_free(engine)


def test_request_id_of_a_running_sample_is_refused_until_all_finish(llm):
    engine = LLMEngine(dtype="float32", block_size=4, num_kv_blocks=64, max_num_seqs=4)
    engine.add_request("a", PROMPT, SamplingParams(max_tokens=5, n=2))
    with pytest.raises(ValueError, match="already running"):
        engine.add_request("a", PROMPT)
    with pytest.raises(ValueError, match="max_num_seqs"):
        engine.add_request("c", PROMPT, SamplingParams(n=5))
    run_to_end(engine)
    engine.add_request("a", PROMPT, SamplingParams(max_tokens=2))
    assert run_to_end(engine)["a"].finished


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_preempted_samples_recompute_the_same_tokens(llm, prefix_caching):
    ids = prompt_ids(llm, 10)
    requests = {"g": SamplingParams(temperature=0, max_tokens=12, n=3, ignore_eos=True),
                "s": SamplingParams(temperature=1.0, seed=7, max_tokens=12, n=2, ignore_eos=True),
                "one": SamplingParams(temperature=1.0, seed=2, max_tokens=9, ignore_eos=True)}

    def tokens(engine):
        for rid, params in requests.items():
            engine.add_request(rid, {"prompt_token_ids": ids[: 7 + len(rid)]}, params)
        return {rid: [c.token_ids for c in out.outputs] for rid, out in run_to_end(engine).items()}

    roomy = LLMEngine(dtype="float32", block_size=4, num_kv_blocks=128, enable_prefix_caching=prefix_caching)
    tiny = LLMEngine(dtype="float32", block_size=4, num_kv_blocks=9, enable_prefix_caching=prefix_caching)
    assert tokens(tiny) == tokens(roomy)
    assert tiny.scheduler.num_preemptions > 0 and roomy.scheduler.num_preemptions == 0
    assert all_free(tiny) and not tiny.scheduler.parents


@pytest.mark.parametrize("n", [0, -1, 1.5, True, "2"])
def test_n_must_be_a_positive_integer(n):
    with pytest.raises(ValueError, match=r"SamplingParams\.n"):
        SamplingParams(n=n)


# The block manager alone: a model of the KV memory (the token each slot holds) checks that every sequence, through
# its table, reads back its own tokens, whatever the forks, copies, growth, prefix hits and frees did.
op = st.tuples(st.sampled_from(["add", "fork", "grow", "free"]), st.integers(0, 1000),
               st.lists(st.integers(0, 3), min_size=1, max_size=14))


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(op, min_size=1, max_size=40), num_blocks=st.integers(4, 24), block_size=st.sampled_from([1, 2, 4]),
       prefix_caching=st.booleans())
def test_forks_and_copy_on_write_keep_every_sequence_reading_its_own_tokens(ops, num_blocks, block_size,
                                                                           prefix_caching):
    bm = BlockManager(num_blocks, block_size, prefix_caching)
    memory = [[None] * block_size for _ in range(num_blocks)]     # the token whose K/V each slot holds
    seqs: dict[str, Sequence] = {}

    def write(seq, start):
        table = bm.block_tables[seq.request_id]
        for p in range(start, len(seq)):
            memory[table[p // block_size]][p % block_size] = seq.token_at(p)

    for i, (kind, pick, tokens) in enumerate(ops):
        live = sorted(seqs)
        target = seqs[live[pick % len(live)]] if live else None
        if kind == "add":
            seq = Sequence(str(i), None, tokens, SamplingParams())
            computed = bm.allocate(seq)
            if computed is not None:
                seqs[seq.request_id] = seq
                write(seq, computed)
                bm.commit(seq, len(seq))
        elif kind == "fork" and target is not None:
            child = Sequence(str(i), None, list(target.prompt_token_ids), SamplingParams(),
                             output_token_ids=list(target.output_token_ids))
            bm.fork(target.request_id, child.request_id)
            seqs[child.request_id] = child
        elif kind == "grow" and target is not None:
            before, table = len(target), list(bm.block_tables[target.request_id])
            target.output_token_ids.append(tokens[0])
            if bm.ensure(target, before, len(target)):
                for src, dst in bm.take_copies():
                    assert bm.blocks[src].ref_count >= 1 and bm.blocks[dst].ref_count == 1
                    memory[dst] = list(memory[src])
                new_table = bm.block_tables[target.request_id]
                assert all(bm.blocks[b].ref_count == 1 for b in new_table[before // block_size:])
                assert new_table[:before // block_size] == table[:before // block_size]
                write(target, before)
                bm.commit(target, len(target))
            else:
                assert bm.block_tables[target.request_id] == table and not bm.copies
                target.output_token_ids.pop()
        elif kind == "free" and target is not None:
            bm.free(target.request_id)
            del seqs[target.request_id]
        check_invariants(bm)
        for seq in seqs.values():
            table = bm.block_tables[seq.request_id]
            assert [memory[table[p // block_size]][p % block_size] for p in range(len(seq))] == seq.token_ids
    for rid in list(seqs):
        bm.free(rid)
    assert len(bm.free_blocks) == num_blocks and all(b.ref_count == 0 for b in bm.blocks)
