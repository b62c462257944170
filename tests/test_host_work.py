"""Chapter 08's host-work fixes keep the engine's behaviour: the BlockTable rows equal the block manager's lists
through allocation, growth, forks, copy-on-write and frees; PagedAttention.build from tensor rows equals chapter
07's build from lists; outputs share without changing what they say; stop strings straddling the new text are
found; and the whole engine answers as chapter 07's did."""

import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rosellm_edu.book.chapter import package_as_of
from rosellm_edu.engine.block_manager import BlockManager
from rosellm_edu.engine.llm_engine import LLMEngine
from rosellm_edu.layers.paged_attention import PagedAttention
from rosellm_edu.sampling_params import SamplingParams
from rosellm_edu.sequence import Sequence

CHAPTER_08 = "08_where_the_time_goes.ipynb"


def seq(request_id: str, length: int) -> Sequence:
    return Sequence(request_id, None, [(7 * i + len(request_id)) % 50 for i in range(length)], SamplingParams())


def assert_rows_match(bm: BlockManager) -> None:
    for rid, table in bm.block_tables.items():
        row = bm.table.ids[bm.table.row[rid]]
        assert row[:len(table)].tolist() == table, rid
        assert not row[len(table):].any(), f"{rid}: stale ids past its table"
        assert bm.table.rows([rid], len(table)).tolist() == [table]
    assert set(bm.table.row) == set(bm.block_tables)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "grow", "fork", "free"]), st.integers(0, 7), st.integers(1, 40)),
                max_size=40))
def test_block_table_rows_equal_the_lists(ops):
    bm = BlockManager(num_blocks=48, block_size=4)
    seqs, computed, n = {}, {}, 0
    for op, pick, size in ops:
        live = sorted(seqs)
        if op == "add" or not live:
            s = seq(f"s{n}", size)
            n += 1
            got = bm.allocate(s)
            if got is not None:
                seqs[s.request_id], computed[s.request_id] = s, len(s)
                bm.commit(s, len(s))
        else:
            rid = live[pick % len(live)]
            s = seqs[rid]
            if op == "grow":   # decode a few tokens: writes from the computed positions (copy-on-write if shared)
                s.output_token_ids += [1] * (size % 9)
                if bm.ensure(s, computed[rid], len(s)):
                    computed[rid] = len(s)
                    bm.commit(s, len(s))
            elif op == "fork" and len(bm.table.row) < 100:
                child = Sequence(f"{rid}.{n}", None, s.prompt_token_ids, SamplingParams(),
                                 output_token_ids=list(s.output_token_ids))
                n += 1
                bm.fork(rid, child.request_id)
                seqs[child.request_id], computed[child.request_id] = child, computed[rid]
            else:
                bm.free(rid)
                del seqs[rid], computed[rid]
        assert_rows_match(bm)


def test_block_table_grows_in_rows_and_width():
    bm = BlockManager(num_blocks=2000, block_size=2)
    for i in range(70):                                  # more sequences than the first 64 rows
        assert bm.allocate(seq(f"r{i}", 2 + i)) is not None   # up to 36 blocks: wider than the first 32 columns
    assert_rows_match(bm)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 12)), min_size=1, max_size=6))
def test_build_from_rows_equals_chapter_07s_build_from_lists(shapes):
    block_size, gen = 4, torch.Generator().manual_seed(len(shapes))
    order = torch.randperm(200, generator=gen).tolist()
    tables = [[order.pop() for _ in range(-(-(c + n) // block_size))] for c, n in shapes]
    computed, new = [c for c, _ in shapes], [n for _, n in shapes]
    k, v = torch.zeros(1, 200 * block_size, 2, 8), torch.zeros(1, 200 * block_size, 2, 8)
    with package_as_of(CHAPTER_08) as load:
        before = load("layers.paged_attention").PagedAttention.build(k, v, block_size, tables, computed, new)
    width = max(map(len, tables))
    rows = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    for after in (PagedAttention.build(k, v, block_size, rows, computed, new),
                  PagedAttention.build(k, v, block_size, tables, computed, new)):
        assert torch.equal(after.slot_mapping, before.slot_mapping)
        for old, ours in ((before.decode, after.decode), (before.prefill, after.prefill)):
            assert (old is None) == (ours is None)
            if old is not None:
                for field in ("query_index", "query_valid", "block_tables", "context_lens", "query_lens"):
                    assert torch.equal(getattr(ours, field), getattr(old, field)), field


@given(st.integers(1, 20), st.integers(0, 20), st.integers(0, 40), st.integers(0, 40))
def test_token_slice_equals_slicing_token_ids(prompt_len, output_len, start, end):
    s = Sequence("r", None, list(range(prompt_len)), SamplingParams(), output_token_ids=list(range(100, 100 + output_len)))
    assert s.token_slice(start, end) == s.token_ids[start:end]


def test_stop_string_straddling_the_new_text_is_found(tokenizer):
    text = "The cat sat on the mat, and then the dog came home."
    ids = tokenizer(text).input_ids
    for stop in ["mat, and", "t on t", "e dog c", "home."]:
        s = Sequence("r", None, [1], SamplingParams(stop=[stop], max_tokens=100))
        for token in ids:
            s.append_token(token, tokenizer, set(), 1000)
            if s.finished:
                break
        assert (s.text, s.finish_reason, s.stop_reason) == (text[:text.index(stop)], "stop", stop), stop


def test_finished_outputs_say_what_the_copies_said(tokenizer):
    s = Sequence("r", "Hi", [1, 2, 3], SamplingParams(max_tokens=3, logprobs=None))
    for token in tokenizer(" one two three").input_ids:
        s.append_token(token, tokenizer, set(), 1000)
    out = s.output()
    assert out.finished and out.prompt_token_ids == [1, 2, 3]
    assert out.outputs[0].token_ids == s.output_token_ids and out.outputs[0].finish_reason == "length"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, embedded_dir):
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny")
    config = LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(embedded_dir / name, path)
    return path


def answers(engine_class, path) -> tuple[dict, int]:
    engine = engine_class(path, dtype="float32", num_kv_blocks=30, block_size=4, max_num_seqs=5,
                          max_num_batched_tokens=24)
    gen = torch.Generator().manual_seed(0)
    shared = torch.randint(100, 5000, (21,), generator=gen).tolist()
    params = [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
              SamplingParams(seed=3, max_tokens=12, n=2, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=4, max_tokens=20, stop=["a", "e"], logprobs=2, prompt_logprobs=1)]
    for i in range(8):
        tail = torch.randint(100, 5000, (3 + 5 * i,), generator=gen).tolist()
        engine.add_request(str(i), {"prompt_token_ids": shared + tail if i % 2 else tail}, params[i % 3])
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    said = {r: ([(c.token_ids, c.text, c.finish_reason, c.cumulative_logprob) for c in o.outputs],
                o.prompt_logprobs is not None and [None if d is None else sorted(d) for d in o.prompt_logprobs])
            for r, o in done.items()}
    return said, engine.scheduler.num_preemptions


def test_the_engine_answers_as_chapter_07s_did(tiny_dir):
    with package_as_of(CHAPTER_08) as load:
        before = load("engine.llm_engine").LLMEngine
    old, new = answers(before, tiny_dir), answers(LLMEngine, tiny_dir)
    assert old[1] > 0, "the workload was meant to preempt"
    assert new == old
