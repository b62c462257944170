"""Chapter 01 exercises: a prediction of the work the naive generation loop does, measured on the engine as
chapter 01 leaves it; a top-p filter that keeps the token crossing p, against `apply_top_p` in
`rosellm_edu.layers.sampler`; and the stop-string cut of the generation loop, against `Sequence._cut_stop_string`
in `rosellm_edu.sequence`."""

from __future__ import annotations

import torch

from rosellm_edu.exercises import Mismatch, checker, compare_prediction, expect_close

TOY = [0.1, 0.2, 0.3, 0.4]  # the chapter's example distribution


def _filter_cases() -> list[tuple[str, torch.Tensor, float]]:
    """(name, logits (vocab,), top_p) for the top-p checker."""
    toy = torch.tensor(TOY).log()
    shuffled = torch.tensor([0.3, 0.1, 0.4, 0.2]).log()          # the most likely tokens are not at the end
    logits = torch.randn(200, generator=torch.Generator().manual_seed(1)) * 2.5
    return [(f"probabilities {TOY}, top_p=0.6", toy, 0.6),
            ("probabilities [0.3, 0.1, 0.4, 0.2], top_p=0.6", shuffled, 0.6),
            ("200 random logits, top_p=0.9", logits, 0.9),
            ("200 random logits, top_p=0.5", logits, 0.5),
            ("200 random logits, top_p=0.001 (only the most likely token)", logits, 0.001),
            ("200 random logits, top_p=1.0 (off)", logits, 1.0)]


def _compare_filtered(got, expected: torch.Tensor, name: str) -> None:
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
        if got_kept == set(by_prob[:-1]):
            hint = (f"; you dropped the token that crosses top_p: keep it (probabilities {TOY} with top_p=0.6 "
                    f"keep {{0.3, 0.4}})")
        elif by_prob[0] not in got_kept:
            hint = "; the most likely token must always stay: sort the probabilities, largest first, before the cumsum"
        raise Mismatch(f"{name}: you keep {len(got_kept)} tokens, expected {len(want_kept)}; missing "
                       f"{sorted(want_kept - got_kept)[:8]}, extra {sorted(got_kept - want_kept)[:8]}{hint}")
    expect_close(got.masked_fill(removed, 0), expected.masked_fill(removed, 0),
                 f"{name}: the kept logits (leave them unchanged)")


@checker("Top-p filter")
def check_top_p(fn) -> str:
    """fn(logits (vocab,), p) -> logits with all but the nucleus set to -inf, against `apply_top_p`."""
    from rosellm_edu.layers.sampler import apply_top_p

    cases = _filter_cases()
    for name, logits, p in cases:
        _compare_filtered(fn(logits.clone(), p), apply_top_p(logits, p), name)
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


POSITIONS_CASES = [(5, 24), (40, 8)]   # (prompt tokens, new tokens): a short prompt, then a long one


class _Counter(torch.nn.Module):
    """Stands in for the model: the engine's loop is what is measured, so a forward pass only records how many
    token positions the engine hands it, and returns random logits (vocab,) from a tiny embedding."""

    def __init__(self, config):
        super().__init__()
        self.config, self.positions = config, 0
        self.embed = torch.nn.Embedding(config.vocab_size, 8)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:   # (tokens,) -> (tokens, 8)
        self.positions += ids.numel()
        return self.embed(ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.embed.weight.T


def _positions_computed(cases: list[tuple[int, int]]) -> list[int]:
    """For each (prompt tokens, new tokens): generate on the engine as chapter 01 leaves it (no KV cache) and count
    the token positions it hands the model, step after step."""
    from rosellm_edu.book.chapter import package_as_of
    from rosellm_edu.model_loader import load_config

    with package_as_of("02_kv_cache.ipynb") as load:   # the package as chapter 01 and appendix 01a leave it
        engine_module = load("engine.llm_engine")
        engine_module.load_model = lambda path, dtype, device: _Counter(load_config(path))
        engine = engine_module.LLMEngine(dtype="float32", device="cpu")
        SamplingParams = load("sampling_params").SamplingParams
        counts = []
        for prompt_tokens, new_tokens in cases:
            engine.model.positions = 0
            params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
            engine.add_request("count", {"prompt_token_ids": list(range(100, 100 + prompt_tokens))}, params)
            while engine.has_unfinished_requests():
                engine.step()
            counts.append(engine.model.positions)
    return counts


@checker("Predict the work of the naive loop", predicts=True)
def check_positions_computed(predict_positions) -> str:
    """predict_positions(prompt_tokens, new_tokens) -> the token positions the model runs over to generate
    new_tokens, against a count on the engine of chapter 01."""
    predictions = [predict_positions(p, n) for p, n in POSITIONS_CASES]   # before any measuring
    measured = _positions_computed(POSITIONS_CASES)
    said = [compare_prediction(predicted, count, f"a {p}-token prompt, {n} new tokens", within=(0.9, 1.1),
                               unit=" positions")
            for (p, n), predicted, count in zip(POSITIONS_CASES, predictions, measured)]
    return "; ".join(said)
