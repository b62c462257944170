"""Checkers for chapter 07's exercises: reading an SSE stream, a chat answer's usage, and a prediction of the
steps the engine takes to serve requests that share its batch, compared with a count on a real engine."""

from __future__ import annotations

import functools
import json

from rosellm_edu.exercises import Mismatch, checker, compare_prediction, expect_equal, tiny_model_dir


@functools.cache
def _tokenizer():
    from rosellm_edu.model_loader import load_tokenizer, resolve_model
    return load_tokenizer(resolve_model())


def _streams() -> list[tuple[str, list[dict]]]:
    """(the body of a stream, its payloads): made by the server's own `sse`, plus hand-written edge cases."""
    from rosellm_edu.entrypoints.openai.serving_engine import sse
    from rosellm_edu.entrypoints.openai.protocol import CompletionChoice, CompletionResponse, UsageInfo

    def chunk(text=None, finish=None, usage=None):
        choices = [] if text is None else [CompletionChoice(text=text, finish_reason=finish)]
        extra = {} if usage is None else {"usage": UsageInfo(prompt_tokens=5, completion_tokens=2, total_tokens=7)}
        return CompletionResponse(id="cmpl-1", created=0, model="m", choices=choices, **extra)

    events = [chunk(" Paris"), chunk(".", "length"), chunk(usage=True)]
    served = "".join(sse(e) for e in events) + "data: [DONE]\n\n"
    payloads = [json.loads(e.model_dump_json()) for e in events]
    return [
        (served, payloads),
        ("data: [DONE]\n\n", []),
        ('data:{"a": 1}\n\ndata:  {"b": [2]}\n\ndata:[DONE]\n\n', [{"a": 1}, {"b": [2]}]),   # the space is optional
        ('data: {"a": 1}\n\ndata: [DONE]\n\ndata: {"late": true}\n\n', [{"a": 1}]),       # nothing after [DONE]
        ('data: {"text": "a\\n\\nb"}\n\n: a comment line\n\ndata: [DONE]\n\n', [{"text": "a\n\nb"}]),
    ]


@checker("parse_sse")
def check_parse_sse(parse_sse) -> str:
    streams = _streams()
    for text, expected in streams:
        expect_equal(parse_sse(text), expected, f"parse_sse({text!r})")
    return f"{len(streams)} streams read, from the server's own events to [DONE] alone."


@checker("chat_usage")
def check_chat_usage(chat_usage) -> str:
    from rosellm_edu.entrypoints.openai.protocol import UsageInfo

    tokenizer = _tokenizer()
    cases = [([{"role": "user", "content": "Hi"}], [1, 2, 3]),
             ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}], [19]),
             ([{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": "Once"},
               {"role": "user", "content": "Go on."}], list(range(40, 80)))]
    for messages, completion in cases:
        prompt = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                               return_dict=True)["input_ids"]
        expected = UsageInfo(prompt_tokens=len(prompt), completion_tokens=len(completion),
                             total_tokens=len(prompt) + len(completion)).model_dump()   # what the server reports
        got = chat_usage(tokenizer, messages, completion)
        if not isinstance(got, dict):
            raise Mismatch(f"expected a dict, got {type(got).__name__}")
        for key in ("completion_tokens", "prompt_tokens", "total_tokens"):
            hint = " (the chat template's tokens count too)" if key == "prompt_tokens" else ""
            expect_equal(got.get(key), expected[key], f"{key} for {len(messages)} message(s){hint}")
    return f"usage matches the server's on {len(cases)} conversations."


MAX_NUM_SEQS = 4   # exercise 3's engine: at most this many requests in the running batch
# Exercise 3's workloads: (max_tokens of each request, the steps the engine has taken when each is added; None:
# once every earlier request has finished, as the one-at-a-time server ran them).
STEP_CASES = [([16, 4, 4, 4, 4], [None] * 5),   # the chapter's workload, scaled down, one at a time
              ([16, 4, 4, 4, 4], [0] * 5),      # all in the batch from the start
              ([16, 4, 4, 4, 4], [0, 2, 4, 6, 14]),
              ([4] * 6, [0] * 6)]


@functools.cache
def _step_engine():
    """An engine on a tiny random Llama with the book model's tokenizer: the steps do not depend on the weights,
    and a tiny model takes them in milliseconds."""
    from rosellm_edu.engine.llm_engine import LLMEngine

    engine = LLMEngine(tiny_model_dir(), dtype="float32", num_kv_blocks=64, max_num_seqs=MAX_NUM_SEQS)
    engine.model.model.fusion = "torch"   # no kernel calibration at the first step: speed is not what is counted
    return engine


def engine_steps(max_tokens: list[int], arrivals: list[int | None], tag: str) -> int:
    """The steps a real engine takes to serve the workload. An idle engine takes no steps: the next request is
    added at once (a None arrival waits for exactly that)."""
    from rosellm_edu.sampling_params import SamplingParams

    engine, pending, steps = _step_engine(), list(enumerate(zip(max_tokens, arrivals))), 0
    while pending or engine.has_unfinished_requests():
        busy = engine.has_unfinished_requests()
        while pending and (not busy or (pending[0][1][1] is not None and pending[0][1][1] <= steps)):
            i, (n, _) = pending.pop(0)
            engine.add_request(f"{tag}-{i}", "The capital of France is",
                               SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
            busy = True
        engine.step()
        steps += 1
    return steps


@functools.cache
def measured_steps() -> tuple[int, ...]:
    return tuple(engine_steps(n, at, f"case{k}") for k, (n, at) in enumerate(STEP_CASES))


def _steps_hint(max_tokens: list[int], arrivals: list, predicted) -> str:
    if predicted == sum(max_tokens) and arrivals[0] is not None:
        return "; requests in the batch share each step: one step gives every running request a token"
    if arrivals[-1] is not None and predicted == max(max_tokens):
        return ("; a request joins at the step it is added and needs max_tokens steps from there, and the batch "
                f"seats at most {MAX_NUM_SEQS}")
    return ""


@checker("Predict the engine's steps, then count them", predicts=True)
def check_engine_steps(predict) -> str:
    """predict(max_tokens, arrivals, max_num_seqs) -> the steps the engine takes, against a count on the engine."""
    predicted = [predict(list(n), list(at), MAX_NUM_SEQS) for n, at in STEP_CASES]   # the reader's numbers first
    said = []
    for (n, at), guess, measured in zip(STEP_CASES, predicted, measured_steps()):
        what = f"max_tokens {n}, arrivals {at}"
        try:
            said.append(compare_prediction(guess, measured, what, within=(0.98, 1.02), unit=" steps"))
        except Mismatch as wrong:
            raise Mismatch(f"{wrong}{_steps_hint(n, at, guess)}") from None
    return "; ".join(said)
