"""Chapter 09's prefill path on a CPU: the kernel or the gather, chosen by measurement once per process and offset
bucket (timing.choose); both paths give the same answers, so whichever wins, the engine's output is the same."""

import pytest
import torch

from conftest import assert_attention_matches_causal, scattered_kv
from rosellm_edu import timing
from rosellm_edu.kernels import cpu_attention
from rosellm_edu.layers import paged_attention
from rosellm_edu.layers.paged_attention import PagedAttention, gathered_prefill_attention, measured_prefill_attention

if cpu_attention.extension() is None:
    pytest.skip("the C++ kernel could not be built here (no compiler?)", allow_module_level=True)


@pytest.fixture
def fresh_choices(monkeypatch):
    """An empty per-process cache, and a list of the keys measured (each with one quick round)."""
    choices, measured = {}, []
    monkeypatch.setattr(timing, "CHOICES", choices)
    monkeypatch.setattr(paged_attention, "CHOICES", choices)

    def quick_choose(key, candidates, **_):
        measured.append(key)
        return timing.choose(key, candidates, repeat=1, warmup=0)
    monkeypatch.setattr(paged_attention, "choose", quick_choose)
    return measured


def prefill_batch(computed, new, dtype=torch.float32, seed=0):
    """The varlen contract's arguments for sequences with computed[i] cached and new[i] new positions."""
    g = torch.Generator().manual_seed(seed)
    kv, tables = scattered_kv([c + n for c, n in zip(computed, new)], 16, 3, 64, g)
    kv = kv.nan_to_num(0.0).to(dtype)
    cu = torch.tensor([0] + new, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    q = torch.randn(int(cu[-1]), 9, 64, generator=g).to(dtype)
    lens = torch.tensor([c + n for c, n in zip(computed, new)], dtype=torch.int32)
    return q, kv[0], kv[1], tables, lens, cu, 64 ** -0.5


def test_the_choice_is_measured_once_per_dtype_and_offset_bucket(fresh_choices):
    for computed in ([0, 0], [100, 3], [600, 0], [900, 40]):        # offset buckets 0, 0, 512, 512
        measured_prefill_attention(*prefill_batch(computed, [20, 7]))
    measured_prefill_attention(*prefill_batch([0], [9], torch.bfloat16))
    assert len(fresh_choices) == 3 and len(set(fresh_choices)) == 3
    assert [k.split("offset ")[1] for k in fresh_choices] == ["0", "512", "0"]
    first = paged_attention.prefill_choice(torch.float32, 9, 16, 3, 64, 511)
    assert first is timing.CHOICES[fresh_choices[0]] and first.name in ("kernel", "gather")
    assert len(fresh_choices) == 3                                  # asked again: no new measurement


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_the_kernel_and_the_gather_agree(dtype, tol):
    args = prefill_batch([0, 37, 300, 1030], [25, 1, 64, 9], dtype, seed=1)
    kernel = cpu_attention.paged_prefill_attention_cpu(*args)
    gather = gathered_prefill_attention(*args)
    torch.testing.assert_close(kernel.float(), gather.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("path", ["kernel", "gather"])
def test_the_engine_attends_correctly_through_either_choice(monkeypatch, fresh_choices, path):
    forced = lambda *_: timing.Choice(path, {"kernel": 1.0, "gather": 1.0})  # noqa: E731
    monkeypatch.setattr(paged_attention, "prefill_choice", forced)
    assert_attention_matches_causal(PagedAttention, [[3, 7, 1, 12], [0, 2, 13], [9, 4, 5, 6]], [5, 0, 9], [1, 7, 4])
    assert fresh_choices == []                                      # forced: nothing measured
