"""Worked solutions for chapter 07's exercises."""

import json


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


def predict_steps(max_tokens: list[int], arrivals: list[int | None], max_num_seqs: int) -> int:
    """Step by step: a waiting request takes a free seat; every seated request gets one token per step, its first
    from the step that prefills it; an idle engine takes the next request at once, without a step."""
    waiting, running, steps = list(zip(max_tokens, arrivals)), [], 0
    while waiting or running:
        while waiting and len(running) < max_num_seqs and (
                not running or (waiting[0][1] is not None and waiting[0][1] <= steps)):
            running.append(waiting.pop(0)[0])
        steps += 1
        running = [left - 1 for left in running if left > 1]
    return steps


SOLUTIONS = {"check_parse_sse": parse_sse, "check_chat_usage": chat_usage, "check_engine_steps": predict_steps}
