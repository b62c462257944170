import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Without a GPU, Triton kernels run in its interpreter. Triton reads the flag when a kernel is decorated, that is
# when its module is first imported, which may be by any test: so it is set here, before all of them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import transformers
from hypothesis import settings

from rosellm_edu import model_loader
from rosellm_edu.benchmarks.machine import cpu_flags
from rosellm_edu.layers.sampler import apply_top_k
from rosellm_edu.sampling_params import SamplingParams

# .ci/run sets HYPOTHESIS_PROFILE=ci: the same examples on every CI run, so that a red run is reproducible
settings.register_profile("ci", derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

transformers.logging.set_verbosity_error()

# the tests that build a kernel without AVX-512, to check its AVX2 loop on any AVX2 machine
requires_avx2 = pytest.mark.skipif("avx2" not in cpu_flags(), reason="the AVX2 build needs an AVX2 CPU")
# the tests that read the embedded GGUF file or judge quality on the embedded model's own weights
embedded_weights_only = pytest.mark.skipif("ROSELLM_EDU_TEST_MODEL" in os.environ,
                                           reason="needs the embedded model's file and weights, not a stand-in")


@pytest.fixture(scope="session")
def embedded_dir():
    # ROSELLM_EDU_TEST_MODEL: a checkpoint of SmolLM2's shape where the embedded model does not travel (the GPU
    # run of benchmarks/gpu.py); the tests that read it there compare our paths with each other, not with its text
    return Path(os.environ["ROSELLM_EDU_TEST_MODEL"]) if "ROSELLM_EDU_TEST_MODEL" in os.environ else \
        model_loader.resolve_model()


@pytest.fixture(scope="session")
def tokenizer(embedded_dir):
    return model_loader.load_tokenizer(embedded_dir)


@pytest.fixture(scope="session")
def our_model(embedded_dir):
    return model_loader.load_model(embedded_dir)


@pytest.fixture(scope="session")
def hf_model(embedded_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(embedded_dir, dtype=torch.float32).eval()


def chapter_class(notebook: str, module: str, name: str):
    """A class as the chapters before `notebook` left it, from an independent copy of the package: chapter 01's
    LLMEngine is chapter_class("02_kv_cache.ipynb", "engine.llm_engine", "LLMEngine")."""
    from rosellm_edu.book.chapter import package_as_of

    with package_as_of(notebook) as load:
        return getattr(load(module), name)


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


def scattered_kv(lens: list[int], block_size: int, kv_heads: int, head_dim: int, g: torch.Generator,
                 spare_blocks: int = 2, spare_columns: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """A float32 K/V pool for sequences of these lengths, each sequence's blocks at shuffled places and every slot no
    sequence owns NaN, so a kernel that reads past a context poisons its output. Returns kv (2, blocks, block_size,
    kv_heads, head_dim) and block tables (seqs, widest + spare_columns) int32 whose unused entries are block 0."""
    blocks_per_seq = [-(-n // block_size) for n in lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    order = torch.randperm(num_blocks, generator=g)
    tables = torch.zeros(len(lens), max(blocks_per_seq) + spare_columns, dtype=torch.int32)
    owned = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    start = 0
    for i, (n, nb) in enumerate(zip(lens, blocks_per_seq)):
        tables[i, :nb] = order[start:start + nb]
        owned[(order[start:start + nb, None] * block_size + torch.arange(block_size)).flatten()[:n]] = True
        start += nb
    kv = torch.randn(2, num_blocks * block_size, kv_heads, head_dim, generator=g)
    kv[:, ~owned] = float("nan")
    return kv.unflatten(1, (num_blocks, block_size)), tables


def top_p_clear_of_rounding(logits: torch.Tensor, params: list[SamplingParams], margin: float = 1e-5) -> bool:
    """Is every row's top_p at least `margin` away from each cumulative mass of its temperature + top-k
    distribution? Nearer than that, whether the token that crosses p is kept depends on float rounding, which
    differs between any two correct implementations (their sums run in different orders)."""
    for row, p in zip(logits, params):
        if p.greedy or p.top_p >= 1:
            continue
        probs = apply_top_k(row.double() / p.temperature, p.top_k).softmax(-1).sort(descending=True).values
        if (probs.cumsum(-1) - p.top_p).abs().min() < margin:
            return False
    return True
