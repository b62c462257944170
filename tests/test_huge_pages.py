import copy
import sys
from pathlib import Path

import pytest
import torch

from rosellm_edu import model_loader
from rosellm_edu.huge_pages import HUGE_PAGE, place_in_huge_pages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
huge_pages_offered = pytest.mark.skipif(not sys.platform.startswith("linux") or not THP.exists()
                                        or "[never]" in THP.read_text(), reason="no transparent huge pages here")


def tensors(model):
    return list(model.parameters()) + list(model.buffers())


@huge_pages_offered
def test_the_weights_move_into_one_aligned_buffer_with_their_values_and_ties(embedded_dir):
    model = model_loader.load_model(embedded_dir, torch.bfloat16)
    plain = copy.deepcopy(model)                      # a deep copy's tensors are ordinary allocations again
    assert place_in_huge_pages(plain)
    assert plain.lm_head.weight is plain.model.embed_tokens.weight                    # still one tensor
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors(plain))
    unique = {t.data_ptr() for t in tensors(plain)}
    total = sum(-(-t.numel() * t.element_size() // 64) * 64 for t in {t.data_ptr(): t for t in tensors(plain)}.values())
    assert spans[0][0] % HUGE_PAGE == 0 and spans[-1][1] - spans[0][0] <= total, "not one buffer, in order"
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]) if a[0] != b[0]) and len(unique) > 1, "tensors overlap"
    for (name, a), b in zip(model.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(a, b), name
    ids = torch.tensor([1, 2, 3, 4])
    with torch.no_grad():
        assert torch.equal(model.compute_logits(model(ids, torch.arange(4))),
                           plain.compute_logits(plain(ids, torch.arange(4))))


@huge_pages_offered
@pytest.mark.parametrize("quantization", [None, "int4"])
def test_load_model_places_a_cpu_models_weights_quantized_or_not(embedded_dir, quantization):
    model = model_loader.load_model(embedded_dir, torch.bfloat16, quantization=quantization)
    starts = sorted(t.data_ptr() for t in tensors(model))
    assert starts[0] % HUGE_PAGE == 0
    nbytes = sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in tensors(model)}.values())
    assert starts[-1] - starts[0] < nbytes + 64 * len(starts), "the weights are not one buffer"
