"""Chapter 01 exercises: a top-k filter, a top-p filter that keeps the token crossing p, and the stop-string cut
of the generation loop. Each checker compares with the package's own code: `apply_top_k` and `apply_top_p` in
`rosellm_edu.layers.sampler`, and `Sequence._cut_stop_string` in `rosellm_edu.sequence`."""

from __future__ import annotations

import torch

from rosellm_edu.exercises import Mismatch, checker, expect_close

TOY = [0.1, 0.2, 0.3, 0.4]  # the chapter's example distribution


def _filter_cases(knob: str) -> list[tuple[str, torch.Tensor, float]]:
    """(name, logits (vocab,), value of the knob) for top_k or top_p."""
    toy = torch.tensor(TOY).log()
    shuffled = torch.tensor([0.3, 0.1, 0.4, 0.2]).log()          # the most likely tokens are not at the end
    logits = torch.randn(200, generator=torch.Generator().manual_seed(1)) * 2.5
    if knob == "top_k":
        return [(f"probabilities {TOY}, top_k=2", toy, 2),
                ("probabilities [0.3, 0.1, 0.4, 0.2], top_k=2", shuffled, 2),
                ("200 random logits, top_k=1", logits, 1),
                ("200 random logits, top_k=17", logits, 17),
                ("200 random logits, top_k=0 (off)", logits, 0),
                ("200 random logits, top_k=500 (beyond the vocabulary)", logits, 500)]
    return [(f"probabilities {TOY}, top_p=0.6", toy, 0.6),
            ("probabilities [0.3, 0.1, 0.4, 0.2], top_p=0.6", shuffled, 0.6),
            ("200 random logits, top_p=0.9", logits, 0.9),
            ("200 random logits, top_p=0.5", logits, 0.5),
            ("200 random logits, top_p=0.001 (only the most likely token)", logits, 0.001),
            ("200 random logits, top_p=1.0 (off)", logits, 1.0)]


def _compare_filtered(got, expected: torch.Tensor, name: str, knob: str) -> None:
    """The reader's filtered logits against the package's: the same tokens kept, their logits unchanged, -inf
    elsewhere."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise Mismatch(f"{name}: return logits of shape {tuple(expected.shape)} (the same as the input), got {shape}")
    removed = ~torch.isfinite(expected)
    if removed.any() and (got[removed] == 0).all():
        raise Mismatch(f"{name}: removed tokens hold 0; set them to -inf (a logit of 0 still gets probability "
                       f"after the softmax)")
    got_kept = set(torch.isfinite(got).nonzero().flatten().tolist())
    want_kept = set((~removed).nonzero().flatten().tolist())
    if got_kept != want_kept:
        by_prob = sorted(want_kept, key=lambda i: -float(expected[i]))
        hint = ""
        if knob == "top_p" and got_kept == set(by_prob[:-1]):
            hint = (f"; you dropped the token that crosses top_p: keep it (probabilities {TOY} with top_p=0.6 "
                    f"keep {{0.3, 0.4}})")
        elif knob == "top_p" and by_prob[0] not in got_kept:
            hint = "; the most likely token must always stay: sort the probabilities, largest first, before the cumsum"
        elif knob == "top_k" and len(got_kept) != len(want_kept):
            hint = " (top_k <= 0 or >= the vocabulary keeps every token)" if len(want_kept) == len(expected) else ""
        raise Mismatch(f"{name}: you keep {len(got_kept)} tokens, expected {len(want_kept)}; missing "
                       f"{sorted(want_kept - got_kept)[:8]}, extra {sorted(got_kept - want_kept)[:8]}{hint}")
    expect_close(got.masked_fill(removed, 0), expected.masked_fill(removed, 0),
                 f"{name}: the kept logits (leave them unchanged)")


@checker("Top-k filter")
def check_top_k(fn) -> str:
    """fn(logits (vocab,), k) -> logits with all but the k largest set to -inf, against `apply_top_k`."""
    from rosellm_edu.layers.sampler import apply_top_k

    cases = _filter_cases("top_k")
    for name, logits, k in cases:
        _compare_filtered(fn(logits.clone(), k), apply_top_k(logits, k), name, "top_k")
    return f"your top-k keeps the same tokens as the package's apply_top_k on {len(cases)} cases"


@checker("Top-p filter")
def check_top_p(fn) -> str:
    """fn(logits (vocab,), p) -> logits with all but the nucleus set to -inf, against `apply_top_p`."""
    from rosellm_edu.layers.sampler import apply_top_p

    cases = _filter_cases("top_p")
    for name, logits, p in cases:
        _compare_filtered(fn(logits.clone(), p), apply_top_p(logits, p), name, "top_p")
    return f"your top-p keeps the same tokens as the package's apply_top_p on {len(cases)} cases"


STOP_CASES = [  # (text, stop strings)
    ("1. Red\n2. Blue\n3. Green", ["2."]),
    ("1. Red\n2. Blue\n3. Green", ["Green", "Blue"]),      # the one listed first appears later in the text
    ("1. Red\n2. Blue\n3. Green", ["Purple"]),
    ("1. Red\n2. Blue\n3. Green", []),
    ("The end. The end.", ["end"]),                          # it appears twice: the first one counts
    ("###\nAnswer", ["###"]),                                # at the very start: nothing is left
]


def _reference_cut(text: str, stops: list[str]) -> tuple[str, str | None]:
    """What a Sequence does with this text and these stop strings (rosellm_edu.sequence)."""
    from rosellm_edu.sampling_params import SamplingParams
    from rosellm_edu.sequence import Sequence

    seq = Sequence("exercise", None, [0], SamplingParams(stop=list(stops)))
    seq.text = text
    return (seq.text, seq.stop_reason) if seq._cut_stop_string() else (text, None)


@checker("Stop strings")
def check_cut_at_stop(fn) -> str:
    """fn(text, stops) -> (text cut where the earliest stop string begins, that stop string), or (text, None)."""
    for text, stops in STOP_CASES:
        expected = _reference_cut(text, stops)
        got = fn(text, list(stops))
        name = f"text {text!r}, stops {stops}"
        if not isinstance(got, tuple) or len(got) != 2:
            raise Mismatch(f"{name}: return a tuple (text, stop string or None), got {got!r}")
        if got == expected:
            continue
        cut, stop = got
        if stop in stops and stop != expected[1] and expected[1] is not None:
            raise Mismatch(f"{name}: you stopped at {stop!r}, but {expected[1]!r} appears earlier in the text; "
                           f"the earliest occurrence ends the request, whatever the order of `stops`")
        if stop == expected[1] and cut == expected[0] + stop:
            raise Mismatch(f"{name}: you kept the stop string in the text, {cut!r}; cut it off: expected "
                           f"{expected[0]!r}")
        raise Mismatch(f"{name}: got {got!r}, expected {expected!r}")
    return f"your stop-string cut agrees with the package's Sequence on {len(STOP_CASES)} texts"
