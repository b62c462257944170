"""Checkers for chapter 07's exercises: reading an SSE stream, a chat answer's usage, a request body into
SamplingParams."""

from __future__ import annotations

import functools
import json

from rosellm_edu.exercises import Mismatch, checker, expect_equal


@functools.cache
def _tokenizer():
    from rosellm_edu.model_loader import load_tokenizer, resolve_model
    return load_tokenizer(resolve_model())


def _streams() -> list[tuple[str, list[dict]]]:
    """(the body of a stream, its payloads): made by the server's own `sse`, plus hand-written edge cases."""
    from rosellm_edu.entrypoints.openai.api_server import sse
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


def _reference_params(body: dict):
    """The server's answer: SamplingParams, or the ValueError (pydantic's included) that refuses the body."""
    from rosellm_edu.entrypoints.openai.protocol import CompletionRequest
    try:
        request = CompletionRequest.model_validate(body)
        return request.to_sampling_params(request.max_tokens)
    except ValueError as e:
        return e


GOOD = [{"model": "m", "prompt": "Hi"},
        {"model": "m", "prompt": "Hi", "max_tokens": 8, "temperature": 0, "top_k": 40, "stop": "\n"},
        {"model": "m", "prompt": "Hi", "temperature": 0.7, "top_p": 0.9, "seed": 3, "ignore_eos": True,
         "stop": ["a", "b"], "n": 1, "stream": True},
        {"model": "m", "prompt": "Hi", "top_p": None, "temperature": None, "seed": None}]
BAD = [({"model": "m", "prompt": "Hi", "presence_penalty": 0.5}, "presence_penalty"),
       ({"model": "m", "prompt": "Hi", "n": 2}, "n"),
       ({"model": "m", "prompt": "Hi", "top_p": 1.5}, "top_p"),
       ({"model": "m", "prompt": "Hi", "max_tokens": 0}, "max_tokens"),
       ({"model": "m"}, "prompt")]


@checker("body_to_params")
def check_body_to_params(body_to_params) -> str:
    for body in GOOD:
        expect_equal(body_to_params(dict(body)), _reference_params(body), f"body_to_params({body})")
    for body, field in BAD:   # the chapter's first server refused these; the final one implements n and penalties
        try:
            got = body_to_params(dict(body))
        except ValueError as e:
            if field not in str(e):
                raise Mismatch(f"body_to_params({body}) raised ValueError({str(e)!r}), which does not name "
                               f"{field!r}") from None
            continue
        except Exception as e:
            raise Mismatch(f"body_to_params({body}) raised {type(e).__name__}: {e}; expected a ValueError "
                           f"naming {field!r}") from None
        raise Mismatch(f"body_to_params({body}) returned {got!r}; it must refuse the body with a ValueError "
                       f"naming {field!r}")
    return f"{len(GOOD)} bodies mapped as the server maps them, {len(BAD)} refused with the field named."
