"""Checkers for chapter 08's exercises: a decode step's FLOPs from a config, a prediction of the bytes a decode step
moves, checked against the tensors it touches, and the stop-string check over the new text only."""

from __future__ import annotations

import random

from rosellm_edu.exercises import Mismatch, checker, compare_prediction, expect_equal


def _configs():
    from transformers import LlamaConfig

    return [LlamaConfig(vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1),
            LlamaConfig(vocab_size=120, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2),
            LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                        num_attention_heads=9, num_key_value_heads=3, head_dim=64)]


def _reference_flops(config, context_lens: list[int]) -> int:
    """The package's count (benchmarks.roofline.ModelCost) on a model built from the config."""
    import torch

    from rosellm_edu.benchmarks.roofline import ModelCost
    from rosellm_edu.models import model_class

    with torch.device("meta"):                     # shapes only: no memory for the weights
        model = model_class(config)(config)
    return ModelCost.of(model).step_flops(list(context_lens), [1] * len(context_lens))


@checker("decode_flops")
def check_decode_flops(decode_flops) -> str:
    cases = [(0, [3]), (1, [0, 5, 17]), (2, [128] * 4), (2, [1, 4095])]
    for i, contexts in cases:
        config = _configs()[i]
        what = (f"decode_flops(layers={config.num_hidden_layers}, hidden={config.hidden_size}, "
                f"heads={config.num_attention_heads}/{config.num_key_value_heads}, context_lens={contexts})")
        expect_equal(decode_flops(config, contexts), _reference_flops(config, contexts), what)
    return f"{len(cases)} decode steps counted as the package counts them, SmolLM2's shape included."


def _measured_step_bytes(batch: int, context: int) -> int:
    """The bytes of the tensors a bfloat16 decode step of the embedded SmolLM2 touches, summed from the tensors
    themselves (on the meta device: shapes and dtypes, no memory): every weight once (the LM head is the
    embedding, one tensor), and per sequence the K/V of its `context` positions and the new one, read, plus the
    new position's K/V, written."""
    import torch

    from rosellm_edu.engine.kv_cache import KVCache
    from rosellm_edu.model_loader import load_config, resolve_model
    from rosellm_edu.models import model_class

    config = load_config(resolve_model())
    with torch.device("meta"):
        model = model_class(config)(config).to(torch.bfloat16)
    weights = sum(p.nbytes for p in model.parameters())             # parameters() yields a tied tensor once
    cache = KVCache(config, num_blocks=1, block_size=1, dtype=torch.bfloat16, device="meta")   # 2 slots
    per_position = (cache.k.nbytes + cache.v.nbytes) // cache.k.shape[1]
    return weights + per_position * batch * (context + 2)


@checker("step_bytes", predicts=True)
def check_step_bytes(step_bytes) -> str:
    cases = [(1, 128), (32, 128), (32, 2048)]
    for batch, context in cases:
        said = compare_prediction(step_bytes(batch, context), _measured_step_bytes(batch, context),
                                  f"step_bytes(batch={batch}, context={context})", within=(0.9, 1.1), unit=" B")
    return f"{len(cases)} decode steps; the last, {said}."


def _full_scan(text: str, searched: int, stops: list[str]):
    """The earliest stop string anywhere in text that ends after position `searched`."""
    hits = []
    for stop in stops:
        start = 0
        while (i := text.find(stop, start)) >= 0:
            if i + len(stop) > searched:
                hits.append((i, stop))
                break
            start = i + 1
    return min(hits, key=lambda h: h[0]) if hits else None


def _stop_cases():
    rng = random.Random(0)
    cases = [("say STOP now", 6, ["STOP"]), ("STOP then more", 10, ["STOP"]), ("abc", 0, ["x"]),
             ("the end. The End.", 9, ["End", "end."]), ("aaaa", 2, ["aa"]), ("xyz", 3, ["z"]), ("", 0, ["a"])]
    for _ in range(300):
        text = "".join(rng.choice("ab ") for _ in range(rng.randint(0, 30)))
        stops = ["".join(rng.choice("ab ") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        cases.append((text, rng.randint(0, len(text)), stops))
    return cases


@checker("find_stop")
def check_find_stop(find_stop) -> str:
    cases = _stop_cases()
    for text, searched, stops in cases:
        expected, got = _full_scan(text, searched, stops), find_stop(text, searched, stops)
        what = f"find_stop({text!r}, {searched}, {stops})"
        if expected is None or got is None:
            expect_equal(got, expected, what)
            continue
        if not (isinstance(got, tuple) and len(got) == 2 and got[0] == expected[0] and got[1] in stops
                and text.startswith(got[1], got[0])):
            raise Mismatch(f"{what}: got {got!r}, expected the stop string at index {expected[0]}, e.g. {expected!r}")
    return f"{len(cases)} texts checked against a scan of the whole text, straddling stop strings included."
