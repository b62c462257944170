"""The benchmark client counts tokens, not chunks, against a server that streams the way llama.cpp's does."""

import asyncio
import json

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from rosellm_edu.benchmarks.client import TokenCounter, time_requests
from rosellm_edu.entrypoints.openai.server_thread import ServerThread
from rosellm_edu.model_loader import load_tokenizer, resolve_model

# What a llama.cpp-like server sends for one request: several tokens in one chunk (held back, then sent together),
# an empty chunk mid-stream and an empty closing chunk; its usage comes only at the end.
PIECES = [" The quick brown", " fox", "", " jumps over the", " lazy dog", ""]


def fake_server(continuous: bool) -> FastAPI:
    app = FastAPI()
    tokenizer = load_tokenizer(resolve_model(None))
    total = len(tokenizer("".join(PIECES), add_special_tokens=False).input_ids)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "fake", "object": "model", "created": 0, "owned_by": "x"}]}

    @app.post("/v1/completions")
    async def completions():
        async def events():
            text = ""
            for piece in PIECES:
                text += piece
                so_far = len(tokenizer(text, add_special_tokens=False).input_ids) if text else 0
                chunk = {"id": "c", "object": "text_completion", "created": 0, "model": "fake",
                         "choices": [{"index": 0, "text": piece, "logprobs": None,
                                      "finish_reason": "length" if not piece else None}]}
                if continuous:
                    chunk["usage"] = {"prompt_tokens": 3, "completion_tokens": so_far, "total_tokens": 3 + so_far}
                yield f"data: {json.dumps(chunk)}\n\n"
            usage = {"prompt_tokens": 3, "completion_tokens": total, "total_tokens": 3 + total}
            yield f"data: {json.dumps({'id': 'c', 'object': 'text_completion', 'created': 0, 'model': 'fake', 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    return app, total


def run_against(continuous: bool, tokenizer):
    app, total = fake_server(continuous)
    thread = ServerThread(app)
    url = thread.start()
    try:
        times, _, model, mismatches = asyncio.run(time_requests(url, [([1, 2, 3], 8)], [0.0], tokenizer=tokenizer))
    finally:
        thread.stop()
    return len(times[0].token_times), total, mismatches


def test_tokens_are_counted_from_continuous_usage_not_chunks():
    counted, total, mismatches = run_against(continuous=True, tokenizer=None)
    assert counted == total and mismatches == 0 and total != len([p for p in PIECES if p])


def test_without_usage_per_chunk_tokens_are_counted_by_re_tokenizing():
    counted, total, mismatches = run_against(continuous=False, tokenizer=load_tokenizer(resolve_model(None)))
    assert counted == total and mismatches == 0


def test_counting_chunks_is_the_last_resort_and_its_error_is_reported():
    counted, total, mismatches = run_against(continuous=False, tokenizer=None)
    assert counted == len([p for p in PIECES if p]) != total and mismatches == 1


def test_token_counter_never_goes_backwards():
    counter = TokenCounter()
    assert [counter.new_tokens(t, u) for t, u in [("a", 1), ("b", 3), ("", 3), ("c", 2)]] == [1, 2, 0, 0]
