"""Chapter 06 exercises: predict how many tokens top-p keeps and measure it with the keep-sampling mask, batched
top-k then top-p with per-row parameters, and the exponential race checked statistically. Each checker compares
with the package's sampler (`rosellm_edu.layers.sampler`) or with the probabilities it was given."""

from __future__ import annotations

import torch

from rosellm_edu.exercises import Mismatch, checker, compare_prediction, expect_close


TEMPERATURES = (0.5, 1.0, 2.0)


def geometric_row(vocab_size: int = 1000, step: float = 0.1) -> torch.Tensor:
    """Logits -step * i for token i: each token a little less likely than the one before. (V,)"""
    return -step * torch.arange(vocab_size, dtype=torch.float32)


@checker("How many tokens top-p keeps", predicts=True)
def check_top_p_prediction(predict) -> str:
    """predict(temperature) -> how many tokens top-p 0.9 keeps of geometric_row(), against the length of the
    keep-sampling mask the package's `sample` returns for that row."""
    from rosellm_edu.layers.sampler import sample
    from rosellm_edu.sampling_params import SamplingParams

    logits = geometric_row()[None]                                          # (1, V)
    said = []
    for t in TEMPERATURES:
        params = SamplingParams(temperature=t, top_p=0.9, return_sampling_mask=True)
        mask = sample(logits, [params], [None], torch.Generator().manual_seed(0)).sampling_masks[0]
        said.append(compare_prediction(predict(t), len(mask), f"temperature {t:g}", unit=" tokens"))
    return "; ".join(said)


def _batch_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Six rows, each with its own temperature, top_k (<= 0 or beyond V: off) and top_p (1: off)."""
    logits = torch.randn(6, 500, generator=torch.Generator().manual_seed(60)) * 2.5
    logits[0, :4] = torch.tensor([0.1, 0.2, 0.3, 0.4]).log()
    logits[0, 4:] = -torch.inf                                  # chapter 01's example: keeps {0.3, 0.4}
    temperature = torch.tensor([1.0, 0.7, 1.2, 1.0, 0.9, 1.5])
    top_k = torch.tensor([0, 20, 0, 5, 1000, 40])
    top_p = torch.tensor([0.6, 0.9, 0.8, 1.0, 0.3, 0.95])
    return logits, temperature, top_k, top_p


@checker("Batched top-k then top-p, per-row parameters")
def check_batched_top_k_top_p(fn) -> str:
    """fn(logits (B, V), temperature (B,), top_k (B,), top_p (B,)) -> probs (B, V), row by row against chapter 01's
    filter in the package (`filtered_logits` then softmax)."""
    from rosellm_edu.layers.sampler import filtered_logits
    from rosellm_edu.sampling_params import SamplingParams

    logits, temperature, top_k, top_p = _batch_case()
    got = fn(logits.clone(), temperature.clone(), top_k.clone(), top_p.clone())
    if not isinstance(got, torch.Tensor) or got.shape != logits.shape:
        raise Mismatch(f"return a tensor of shape {tuple(logits.shape)}, got "
                       f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}")
    for row in range(logits.shape[0]):
        params = SamplingParams(temperature=float(temperature[row]), top_k=int(top_k[row]),
                                top_p=float(top_p[row]))
        expected = filtered_logits(logits[row:row + 1], params).softmax(dim=-1)[0]
        kept, expected_kept = (got[row] > 0).sum().item(), (expected > 0).sum().item()
        setting = f"row {row} (temperature {params.temperature:g}, top_k {params.top_k}, top_p {params.top_p:g})"
        if kept != expected_kept:
            raise Mismatch(f"{setting}: keeps {kept} tokens, expected {expected_kept} (each row its own k and p; "
                           f"top-p on the renormalised top-k distribution; the token that crosses p stays)")
        expect_close(got[row], expected, setting, atol=1e-5)
    return f"all {logits.shape[0]} rows match chapter 01's filter, each with its own parameters"


@checker("Exponential-race sampling")
def check_exponential_race(fn) -> str:
    """fn(probs (B, K), generator) -> (B,) indices, checked statistically against probs, with fixed generators."""
    probs = torch.tensor([[0.01, 0.4, 0.02, 0.15, 0.2, 0.04, 0.1, 0.08]]) * 3   # unnormalised on purpose
    n = 40_000
    first = fn(probs.expand(n, -1).clone(), torch.Generator().manual_seed(0))
    if not isinstance(first, torch.Tensor) or first.shape != (n,):
        raise Mismatch(f"return a tensor of shape ({n},) for {n} rows, got "
                       f"{tuple(first.shape) if isinstance(first, torch.Tensor) else type(first).__name__}")
    again = fn(probs.expand(n, -1).clone(), torch.Generator().manual_seed(0))
    if not torch.equal(first, again):
        raise Mismatch("the same seed gave different draws: take every random number from `generator`")
    p = (probs / probs.sum())[0].double()
    counts = torch.bincount(first.long(), minlength=len(p)).double()
    z = (counts - n * p) / (n * p * (1 - p)).sqrt()                 # each share's distance in standard deviations
    worst = int(z.abs().argmax())
    if z.abs().max() > 5:
        raise Mismatch(f"index {worst} was drawn {counts[worst].item() / n:.4f} of the time, its probability is "
                       f"{p[worst].item():.4f} ({z[worst].item():+.1f} standard deviations): argmax(probs / Exp(1))")
    zeros = torch.tensor([[0.0, 0.5, 0.0, 0.5], [0.0, 0.0, 1.0, 0.0]]).repeat(500, 1)
    drawn = fn(zeros.clone(), torch.Generator().manual_seed(1))
    if (zeros.gather(-1, drawn.long()[:, None]) == 0).any():
        raise Mismatch("an index of probability 0 was drawn")
    return f"{n:,} draws within 5 standard deviations of the probabilities, reproducible, never a 0"
