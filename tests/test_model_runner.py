"""ModelRunner: its decode step equals its eager forward, padding never touches a real slot, and on a GPU every
bucket's CUDA graph replays the eager logits."""

import json
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import LlamaConfig

from conftest import hf_greedy
from rosellm_edu import LLM, LLMEngine, SamplingParams, model_loader
from rosellm_edu.benchmarks import decode as bench_decode
from rosellm_edu.engine import model_runner
from rosellm_edu.engine.kv_cache import KVCache
from rosellm_edu.engine.model_runner import ModelRunner, batch_size_buckets, check_triton_shapes
from rosellm_edu.engine.scheduler import ScheduledSeq
from rosellm_edu.layers.paged_attention import PagedAttention, gathered_decode_attention
from rosellm_edu.models import model_class
from rosellm_edu.sequence import Sequence

POISON = 12345.0


@given(st.integers(1, 300))
def test_buckets_hold_every_batch_size_with_less_than_8_padded_rows(max_num_seqs):
    buckets = batch_size_buckets(max_num_seqs)
    assert buckets == sorted(set(buckets)) and buckets[0] == 1 and buckets[-1] == max_num_seqs
    assert {b for b in (1, 2, 4, 8) if b <= max_num_seqs} <= set(buckets)
    assert all(b % 8 == 0 for b in buckets[:-1] if b >= 8) and all(b - a <= 8 for a, b in zip(buckets, buckets[1:]))
    for n in range(1, max_num_seqs + 1):
        padded = min(b for b in buckets if b >= n)
        assert padded - n < 8 and padded < 2 * n or padded == n


def test_bad_configurations_get_clear_errors():
    config = tiny_config()
    model = model_class(config)(config)
    with pytest.raises(ValueError, match="max_num_seqs must be a positive integer"):
        batch_size_buckets(0)
    runner = ModelRunner(model, KVCache(config, 8, 4), 4, 64)
    prefill = [ScheduledSeq(Sequence("a", None, [1, 2, 3], SamplingParams()), 0, 3)]
    assert not runner.is_decode(prefill)
    with pytest.raises(ValueError, match="power-of-two block_size, got 12"):
        check_triton_shapes(12, 64)
    with pytest.raises(ValueError, match="power-of-two head_dim, got 80"):
        check_triton_shapes(16, 80)
    check_triton_shapes(16, 64)


def test_asking_for_cuda_without_it_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="no CUDA device"):
        LLMEngine(device="cuda")


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(dtype="float32", max_num_seqs=8, block_size=4, num_kv_blocks=256)


def decode_batch(engine, n: int, seed: int):
    """Admit n prompts of different lengths, run their prefill, and return the decode batch that follows."""
    gen = torch.Generator().manual_seed(seed)
    for i in range(n):
        length = int(torch.randint(1, 40, (), generator=gen))
        engine.add_request(f"{seed}-{i}", {"prompt_token_ids": torch.randint(100, 20000, (length,), generator=gen).tolist()},
                           SamplingParams(temperature=0, max_tokens=8))
    engine.step()
    return engine.scheduler.schedule()


@pytest.mark.parametrize("n", [1, 3, 6, 8])
def test_decode_logits_equal_the_eager_forward(engine, n):
    batch = decode_batch(engine, n, seed=n)
    try:
        assert len(batch) == n and engine.runner.is_decode(batch)
        tables = engine.scheduler.block_manager.block_tables
        with torch.no_grad():
            eager = engine.runner.run_eager(batch, [tables[s.seq.request_id] for s in batch])
            ours = engine.runner.run(batch, tables)
        torch.testing.assert_close(ours, eager, atol=1e-4, rtol=1e-4)
    finally:
        for s in batch:
            engine.abort_request(s.seq.request_id)


def tiny_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def random_decode_batch(n: int, num_blocks: int, block_size: int, vocab_size: int, gen):
    """n sequences of random lengths, each on its own shuffled blocks; one new token each."""
    order = torch.randperm(num_blocks, generator=gen).tolist()
    batch, tables = [], {}
    for i in range(n):
        length = int(torch.randint(1, 6 * block_size, (), generator=gen))
        seq = Sequence(str(i), None, torch.randint(vocab_size, (length,), generator=gen).tolist(), SamplingParams())
        tables[seq.request_id] = [order.pop() for _ in range(-(-length // block_size))]
        batch.append(ScheduledSeq(seq, length - 1, 1))
    return batch, tables


def eager_reference(model, pool, batch, tables):
    """The eager path for a decode batch."""
    ctx = PagedAttention.build(pool.k, pool.v, pool.block_size, [tables[s.seq.request_id] for s in batch],
                               [s.num_computed for s in batch], [1] * len(batch))
    ids = torch.tensor([s.seq.token_ids[-1] for s in batch], device=pool.k.device)
    hidden = model(ids, torch.tensor([s.num_computed for s in batch], device=pool.k.device), ctx)
    return model.compute_logits(hidden)


@pytest.mark.parametrize("attention", ["device kernel", "gather fallback", "triton kernel"])
@pytest.mark.parametrize("n, rows", [(1, 8), (3, 4), (5, 8), (7, 8)])
def test_padded_rows_write_only_the_scratch_block(n, rows, attention, monkeypatch):
    if attention == "gather fallback":                   # as on a CPU where chapter 04's C++ kernel cannot build
        monkeypatch.setattr(model_runner, "decode_kernel", lambda device: gathered_decode_attention)
    if attention == "triton kernel":                     # the GPU's kernel on these very buffers (interpreted here)
        kernel = pytest.importorskip("rosellm_edu.kernels.triton_paged_attention").paged_decode_attention
        monkeypatch.setattr(model_runner, "decode_kernel", lambda device: kernel)
    torch.manual_seed(n)
    gen = torch.Generator().manual_seed(n)
    config = tiny_config()
    model = model_class(config)(config).eval()
    pool = KVCache(config, 48, 4)
    runner = ModelRunner(model, pool, 8, config.max_position_embeddings, enforce_eager=True)
    assert n < runner.padded_size(n) <= rows or n == 1
    batch, tables = random_decode_batch(n, pool.num_blocks, pool.block_size, config.vocab_size, gen)
    owned = torch.zeros(pool.k.shape[1], dtype=torch.bool)
    for s in batch:
        table = tables[s.seq.request_id]
        owned[[table[p // 4] * 4 + p % 4 for p in range(s.num_computed)]] = True
    pool.k.normal_(), pool.v.normal_()
    pool.k[:, ~owned], pool.v[:, ~owned] = POISON, POISON          # nobody's K/V: must be neither read nor written
    with torch.no_grad():
        expected = eager_reference(model, pool, batch, tables)
        pool.k[:, ~owned], pool.v[:, ~owned] = POISON, POISON
        before_k, before_v = pool.k.clone(), pool.v.clone()
        width = runner.prepare_decode(batch, [tables[s.seq.request_id] for s in batch], rows)
        logits = runner.run_decode(rows, width)
    torch.testing.assert_close(logits[:n], expected, atol=1e-4, rtol=1e-4)
    assert torch.isfinite(logits).all()                                  # padded rows too
    written = ((pool.k != before_k) | (pool.v != before_v)).flatten(2).any(-1).any(0).nonzero().flatten().tolist()
    new_slots = {tables[s.seq.request_id][s.num_computed // 4] * 4 + s.num_computed % 4 for s in batch}
    scratch = set(range(pool.scratch_block * 4, pool.scratch_block * 4 + 4))
    assert set(written) - scratch == new_slots
    assert set(written) & scratch                                        # the padded rows did write somewhere


def test_greedy_tokens_equal_transformers_through_the_runner(hf_model, tokenizer):
    prompts = ["The capital of France is", "def quicksort(xs):", "A long prompt about the history of computing. " * 5,
               "Hi", "Name three prime numbers:"]
    lengths = [9, 4, 12, 7, 10]
    llm = LLM(dtype="float32", max_num_seqs=3, block_size=4, num_kv_blocks=128)
    outs = llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths],
                        use_tqdm=False)
    for out, n in zip(outs, lengths):
        assert out.outputs[0].token_ids == hf_greedy(hf_model, out.prompt_token_ids, n)


def test_bench_decode_runs_eagerly_without_cuda(tmp_path, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("on a GPU the benchmark captures graphs; this checks the CPU fallback")
    out = tmp_path / "decode.json"
    report = bench_decode.main(["--models", "embedded", "--batch-sizes", "1,3", "--context", "8", "--steps", "2",
                                "--warmup", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    assert report["machine"]["cuda_graphs"].startswith("unavailable")
    results = report["models"][0]["results"]
    assert [(r["mode"], r["batch_size"]) for r in results] == [("eager", 1), ("eager", 3)]
    assert all(r["tpot_ms"] > 0 and r["throughput_tok_s"] > 0 for r in results)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_graph_replay_equals_eager_decode_for_every_bucket(embedded_dir):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = model_loader.load_model(embedded_dir, torch.float32, "cuda")
    pool = KVCache(model.config, 512, 16, torch.float32, "cuda")
    pool.k.normal_(), pool.v.normal_()
    max_len = model.config.max_position_embeddings
    graphed = ModelRunner(model, pool, 16, max_len)
    eager = ModelRunner(model, pool, 16, max_len, enforce_eager=True)
    assert sorted(graphed.graphs) == graphed.buckets == [1, 2, 4, 8, 16] and not eager.graphs
    for n in range(1, 17):                              # every bucket, and every size padded up to one
        batch, tables = random_decode_batch(n, pool.num_blocks, pool.block_size, model.config.vocab_size, gen)
        with torch.no_grad():
            reference = eager_reference(model, pool, batch, tables)
            eager_logits = eager.run(batch, tables)
            graph_logits = graphed.run(batch, tables)
        torch.testing.assert_close(graph_logits, eager_logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(graph_logits, reference, atol=1e-3, rtol=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host syncs are a GPU matter")
def test_a_decode_step_waits_for_the_gpu_once(embedded_dir):
    """Only the transfer of the sampled tokens may wait for the GPU: torch's sync debug mode reports every wait.
    Greedy and sampling rows side by side, so that the sampler picks rows and builds its per-row parameters."""
    engine = LLMEngine(str(embedded_dir), device="cuda", dtype="bfloat16", max_num_seqs=8, gpu_memory_utilization=0.3)
    kinds = [SamplingParams(temperature=0, max_tokens=32, ignore_eos=True),
             SamplingParams(temperature=0.7, top_k=40, top_p=0.9, max_tokens=32, ignore_eos=True)]
    for i in range(4):
        engine.add_request(str(i), {"prompt_token_ids": list(range(5 + i, 20 + 2 * i))}, kinds[i % 2])
    for _ in range(3):                      # the prefill, then decode steps
        engine.step()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(4):
                engine.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    waits = [f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]
    assert len(waits) == 4, waits


def test_the_profile_step_runs_the_largest_step_on_a_scratch_cache(embedded_dir, monkeypatch):
    """Chapter 05's start-up measurement runs max_num_batched_tokens tokens as sequences that fit the context,
    all prefilling, on a cache of its own: the engine's cache is left as it was."""
    engine = LLMEngine(str(embedded_dir), dtype="float32", max_model_len=64, num_kv_blocks=8)
    seen, forward = {}, engine.model.forward

    def spy(ids, positions, ctx):
        seen.update(positions=positions.clone(), ctx=ctx)
        return forward(ids, positions, ctx)

    monkeypatch.setattr(engine.model, "forward", spy)
    before = engine.kv_cache.k.clone()
    assert engine.profile_step(150, 4, 16) == 0                     # nothing measures memory on a CPU
    assert torch.equal(seen["positions"], torch.cat([torch.arange(63), torch.arange(63), torch.arange(24)]))
    assert seen["ctx"].decode is None and seen["ctx"].prefill.query_lens.tolist() == [63, 63, 24]
    assert seen["ctx"].k_pool is not engine.kv_cache.k and torch.equal(engine.kv_cache.k, before)
