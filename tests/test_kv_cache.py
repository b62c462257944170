"""Chapter 02's contiguous KV cache gives the logits of a full forward pass, however the tokens are fed; the
package's pool is sized from a memory budget."""

import pytest
import torch

from conftest import chapter_class
from rosellm_edu.engine.kv_cache import KVCache, block_bytes, blocks_in_budget, kv_cache_shape
from test_models import LLAMA_CONFIGS, ours_from, small_gpt2, small_llama

ContiguousKVCache = chapter_class("03_continuous_batching.ipynb", "engine.kv_cache", "KVCache")


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("chunks", [[40], [39, 1], [10, 1, 1, 28], [1] * 40])
def test_cached_forward_equals_full_forward(family, chunks):
    hf = small_llama(**LLAMA_CONFIGS["gqa-tied"]) if family == "llama" else small_gpt2()
    model = ours_from(hf)
    ids = torch.randint(0, 120, (40,))
    with torch.no_grad():
        full = model.compute_logits(model(ids, torch.arange(40)))
        cache = ContiguousKVCache(model.config, max_len=48)
        parts, start = [], 0
        for n in chunks:
            parts.append(model.compute_logits(cache.extend(model, ids[start:start + n])))
            start += n
    assert cache.length == 40
    torch.testing.assert_close(torch.cat(parts), full, atol=1e-5, rtol=1e-4)


def test_cache_refuses_to_overflow():
    model = ours_from(small_llama(**LLAMA_CONFIGS["gqa-tied"]))
    cache = ContiguousKVCache(model.config, max_len=8)
    with torch.no_grad():
        cache.extend(model, torch.arange(6))
        with pytest.raises(ValueError, match="holds 8 positions"):
            cache.extend(model, torch.arange(3))
    assert cache.length == 6


def test_kv_cache_shape_follows_the_config(our_model):
    assert kv_cache_shape(our_model.config) == (30, 3, 64)
    gpt2 = small_gpt2().config
    assert kv_cache_shape(gpt2) == (gpt2.n_layer, gpt2.n_head, gpt2.n_embd // gpt2.n_head)


def test_blocks_in_budget_fills_the_budget_with_whole_blocks(our_model):
    config, per_block = our_model.config, block_bytes(our_model.config, 16, torch.float32)
    assert per_block == 2 * 30 * 16 * 3 * 64 * 4
    budget = 10 * per_block + per_block // 2
    assert blocks_in_budget(config, 16, torch.float32, torch.device("cpu"), budget, 0.9) == 9   # + the scratch block
    assert blocks_in_budget(config, 16, torch.bfloat16, torch.device("cpu"), budget, 0.9) == 20
    with pytest.raises(ValueError, match="holds no block"):
        blocks_in_budget(config, 16, torch.float32, torch.device("cpu"), per_block, 0.9)


def test_the_pool_keeps_one_scratch_block_beyond_the_allocator(our_model):
    cache = KVCache(our_model.config, 5, 4)
    assert cache.scratch_block == 5 and cache.k.shape == (30, 6 * 4, 3, 64) and cache.v.shape == cache.k.shape
