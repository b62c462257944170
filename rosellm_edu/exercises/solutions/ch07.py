"""Worked solutions for chapter 07's exercises."""

import json

from rosellm_edu.sampling_params import SamplingParams


def parse_sse(text: str) -> list[dict]:
    payloads = []
    for event in text.split("\n\n"):
        for line in event.split("\n"):
            if not line.startswith("data:"):
                continue   # a blank line, or a comment line (starting with ':')
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                return payloads
            payloads.append(json.loads(data))
    return payloads


def chat_usage(tokenizer, messages: list[dict], completion_token_ids: list[int]) -> dict:
    prompt = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                           return_dict=True)["input_ids"]
    prompt_tokens, completion_tokens = len(prompt), len(completion_token_ids)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


MAPPED = ["temperature", "top_p", "top_k", "seed", "stop", "ignore_eos"]


def body_to_params(body: dict) -> SamplingParams:
    for required in ("model", "prompt"):
        if required not in body:
            raise ValueError(f"{required}: this field is required")
    for name in body:
        if name not in {"model", "prompt", "max_tokens", "n", "stream", *MAPPED}:
            raise ValueError(f"{name}: not supported by this server")
    if body.get("n", 1) != 1:
        raise ValueError("n: only n = 1 is supported")
    given = {name: body[name] for name in MAPPED if body.get(name) is not None}
    max_tokens = body.get("max_tokens")
    return SamplingParams(max_tokens=16 if max_tokens is None else max_tokens, **given)   # names a bad value


SOLUTIONS = {"check_parse_sse": parse_sse, "check_chat_usage": chat_usage, "check_body_to_params": body_to_params}
