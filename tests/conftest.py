import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Without a GPU, Triton kernels run in its interpreter. Triton reads the flag when a kernel is decorated, that is
# when its module is first imported, which may be by any test: so it is set here, before all of them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import transformers

from rosellm_edu import model_loader

transformers.logging.set_verbosity_error()


@pytest.fixture(scope="session")
def embedded_dir():
    return model_loader.resolve_model()


@pytest.fixture(scope="session")
def tokenizer(embedded_dir):
    return model_loader.load_tokenizer(embedded_dir)


@pytest.fixture(scope="session")
def our_model(embedded_dir):
    return model_loader.load_model(embedded_dir)


@pytest.fixture(scope="session")
def hf_model(embedded_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(embedded_dir, dtype=torch.float32).eval()


def hf_greedy(hf_model, prompt_ids: list[int], n: int) -> list[int]:
    """transformers' own greedy continuation, EOS disabled so that exactly n tokens come out."""
    out = hf_model.generate(torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False,
                            eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def assert_attention_matches_causal(attention_cls, tables: list[list[int]], cached: list[int], new: list[int]):
    """Build attention_cls's context over a pool holding each sequence's cached K/V (all other slots random
    garbage that must not be read), attend to the new tokens, compare with per-sequence causal attention."""
    from rosellm_edu.layers.attention import causal_attention

    torch.manual_seed(0)
    kv_heads, heads, d, block_size, num_blocks = 2, 6, 8, 4, 16
    k_pool = 100 * torch.randn(1, num_blocks * block_size, kv_heads, d)
    v_pool = 100 * torch.randn(1, num_blocks * block_size, kv_heads, d)
    full_k = [torch.randn(c + n, kv_heads, d) for c, n in zip(cached, new)]
    full_v = [torch.randn(c + n, kv_heads, d) for c, n in zip(cached, new)]
    for table, c, k, v in zip(tables, cached, full_k, full_v):
        for i in range(c):
            slot = table[i // block_size] * block_size + i % block_size
            k_pool[0, slot], v_pool[0, slot] = k[i], v[i]
    q = [torch.randn(n, heads, d) for n in new]
    ctx = attention_cls.build(k_pool, v_pool, block_size, tables, cached, new)
    out = ctx.attend(0, torch.cat(q), torch.cat([k[c:] for k, c in zip(full_k, cached)]),
                     torch.cat([v[c:] for v, c in zip(full_v, cached)]))
    expected = torch.cat([causal_attention(qi, ki, vi) for qi, ki, vi in zip(q, full_k, full_v)])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
