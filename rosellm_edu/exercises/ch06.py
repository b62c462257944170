"""Chapter 06 exercises: the keep-sampling mask of one row, batched top-k then top-p with per-row parameters, and
the exponential race checked statistically. Each checker compares with the package's sampler
(`rosellm_edu.layers.sampler`) or with the probabilities it was given."""

from __future__ import annotations

import math

import torch

from rosellm_edu.exercises import Mismatch, checker, expect_close


def _mask_cases() -> list[tuple[str, torch.Tensor, float, int, float]]:
    """(name, logits (V,), temperature, top_k, top_p); every case truncates something."""
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(6)) * 3
    toy = torch.tensor([0.1, 0.2, 0.3, 0.4]).log()
    return [("probabilities [0.1, 0.2, 0.3, 0.4], top-p 0.6", toy, 1.0, 0, 0.6),
            ("top-k 50 + top-p 0.9 at temperature 0.7", logits, 0.7, 50, 0.9),
            ("top-k 10 alone at temperature 1.3", logits, 1.3, 10, 1.0),
            ("top-p 0.5 alone", logits, 1.0, 0, 0.5),
            ("top-k 1", logits, 1.0, 1, 1.0),
            ("top-p 0.01 (only the most likely token)", logits, 0.8, 0, 0.01)]


@checker("Keep-sampling mask of one row")
def check_sampling_mask(fn) -> str:
    """fn(logits (V,), temperature, top_k, top_p) -> (sorted kept ids, log Z), against the package's `sample`."""
    from rosellm_edu.layers.sampler import sample
    from rosellm_edu.sampling_params import SamplingParams

    for name, logits, t, k, p in _mask_cases():
        params = SamplingParams(temperature=t, top_k=k, top_p=p, return_sampling_mask=True)
        out = sample(logits[None], [params], [None], torch.Generator().manual_seed(0))
        expected, expected_logz = out.sampling_masks[0], out.sampling_logz[0]
        got = fn(logits.clone(), t, k, p)
        if not isinstance(got, tuple) or len(got) != 2:
            raise Mismatch(f"{name}: return a tuple (mask, log_z), got {type(got).__name__}")
        mask, logz = got
        mask = [int(i) for i in mask]
        if mask != expected:
            missing, extra = sorted(set(expected) - set(mask)), sorted(set(mask) - set(expected))
            if not missing and not extra:
                raise Mismatch(f"{name}: the right ids, but not sorted: {mask}")
            raise Mismatch(f"{name}: mask {mask[:12]}{'...' if len(mask) > 12 else ''} misses ids {missing[:8]} "
                           f"and has extra ids {extra[:8]} (top-k first, renormalise, then top-p keeping the token "
                           f"that crosses p)")
        if not math.isclose(float(logz), expected_logz, abs_tol=1e-4):
            raise Mismatch(f"{name}: log Z {float(logz):.6f}, expected {expected_logz:.6f} (the log of the softmax "
                           f"mass, after temperature, that the kept ids hold)")
    return f"masks and log Z agree with the package's sampler on {len(_mask_cases())} rows"


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
