"""Checkers for chapter 13's exercises: a packed bitmask applied to logits (against xgrammar's kernel), a prediction
of a batch bitmask's bytes, checked on xgrammar's allocation, and the allowed tokens of a choice grammar."""

from __future__ import annotations

import functools

import torch

from rosellm_edu.exercises import Mismatch, checker, compare_prediction, expect_close, expect_equal


@checker("apply_bitmask")
def check_apply_bitmask(apply_bitmask) -> str:
    import xgrammar as xgr

    gen = torch.Generator().manual_seed(0)
    cases = [(1, 64), (3, 100), (4, 49152), (2, 50257)]
    for rows, vocab in cases:
        logits = torch.randn(rows, vocab, generator=gen)
        words = -(-vocab // 32)
        bitmask = torch.randint(-2**31, 2**31 - 1, (rows, words), generator=gen, dtype=torch.int64).to(torch.int32)
        expected = logits.clone()
        xgr.apply_token_bitmask_inplace(expected, bitmask, backend="torch_native")
        got = logits.clone()
        apply_bitmask(got, bitmask)                     # in place: a returned tensor is not looked at
        expect_close(got, expected, f"apply_bitmask on {rows} rows of {vocab} tokens, in place", atol=0, rtol=0)
    return f"{len(cases)} batches, vocabularies of 64 to 50,257 tokens, each bit where xgrammar puts it."


@checker("bitmask_bytes", predicts=True)
def check_bitmask_bytes(bitmask_bytes) -> str:
    import xgrammar as xgr

    cases = [(1, 49152), (64, 49152), (64, 151936), (256, 128256)]
    for rows, vocab in cases:
        measured = xgr.allocate_token_bitmask(rows, vocab)
        said = compare_prediction(bitmask_bytes(rows, vocab), measured.nbytes, f"bitmask_bytes({rows}, {vocab})",
                                  within=(0.99, 1.01), unit=" bytes")
    return f"{len(cases)} batches and vocabularies; the last, {said}."


@functools.cache
def _token_texts() -> tuple[str, ...]:
    from rosellm_edu.model_loader import load_tokenizer, resolve_model

    tokenizer = load_tokenizer(resolve_model())
    return tuple(tokenizer.decode([i]) for i in range(len(tokenizer)))


@checker("choice_allowed")
def check_choice_allowed(choice_allowed) -> str:
    texts = list(_token_texts())
    choices = ["Jupiter", "Mars", "Mercury", "yes, of course"]
    prefixes = ["", "M", "Mar", "Jupiter", "yes, ", "Merc"]
    for prefix in prefixes:
        expected = [i for i, t in enumerate(texts)
                    if t and any(c.startswith(prefix + t) for c in choices)]
        got = choice_allowed(prefix, choices, texts)
        if not isinstance(got, list):
            raise Mismatch(f"choice_allowed({prefix!r}, ...) must return a list of token ids, got {type(got).__name__}")
        expect_equal(sorted(got), expected, f"choice_allowed({prefix!r}, {choices})")
    return f"{len(prefixes)} prefixes over the {len(texts):,}-token vocabulary."
