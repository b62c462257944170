"""The contiguous KV cache gives the logits of a full forward pass, however the tokens are fed."""

import pytest
import torch

from rosellm_edu.kv_cache import ContiguousKVCache, kv_cache_shape
from test_models import LLAMA_CONFIGS, ours_from, small_gpt2, small_llama


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
