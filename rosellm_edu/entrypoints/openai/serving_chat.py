# Generated from notebooks/07_serving.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import time
from typing import AsyncIterator, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from rosellm_edu.entrypoints.openai.errors import ERRORS
from rosellm_edu.entrypoints.openai.protocol import (ChatChoice, ChatChunkChoice, ChatCompletionChunk,
                                                     ChatCompletionRequest, ChatCompletionResponse, ChatLogprob,
                                                     ChatLogprobs, ChatMessageOut, DeltaMessage, TopLogprob, random_id)
from rosellm_edu.entrypoints.openai.serving_engine import (Piece, ResponseState, add_requests, chat_prompt_ids,
                                                           check_prompt, check_request, clamp, event_stream, in_pool,
                                                           merge, sampling_params, sse, stream_events, token_text,
                                                           whole_response)
from rosellm_edu.outputs import Logprob, RequestOutput


# notebooks/07_serving.ipynb, cell 80
router = APIRouter()


# notebooks/07_serving.ipynb, cell 80
def chat_logprobs(tokenizer, piece: Piece, top: int) -> ChatLogprobs:
    """OpenAI's chat shape: per token {token, logprob, bytes, top_logprobs: the `top` most likely}."""
    def entry(token: int, e: Logprob) -> dict:
        text = token_text(tokenizer, token, e)
        return {"token": text, "logprob": clamp(e.logprob), "bytes": list(text.encode())}

    content = []
    for token, entries in zip(piece.token_ids, piece.logprobs):
        ranked = sorted((e.rank, t) for t, e in entries.items() if e.rank is not None and e.rank <= top)
        content.append(ChatLogprob(**entry(token, entries[token]),
                                   top_logprobs=[TopLogprob(**entry(t, entries[t])) for _, t in ranked]))
    return ChatLogprobs(content=content)


# notebooks/07_serving.ipynb, cell 83
async def chat_events(state: ResponseState, outputs: AsyncIterator[tuple[int, RequestOutput]],
                      make_chunk: Callable[..., ChatCompletionChunk], logprobs) -> AsyncIterator[str]:
    """A streamed chat completion's events: each choice's role first, then one delta per step."""
    def delta_chunk(piece: Piece) -> ChatCompletionChunk:
        delta = DeltaMessage(content=piece.text) if piece.text else DeltaMessage()   # OpenAI's last delta is {}
        return make_chunk([ChatChunkChoice(index=piece.index, delta=delta, finish_reason=piece.finish_reason,
                                           logprobs=logprobs(piece), **(piece.mask or {}))])

    for index in range(state.body.n):
        yield sse(make_chunk([ChatChunkChoice(index=index, delta=DeltaMessage(role="assistant", content=""))]))
    async for event in stream_events(state, outputs, delta_chunk, lambda u: make_chunk([], usage=u)):
        yield event


# notebooks/07_serving.ipynb, cell 84
@router.post("/v1/chat/completions", response_model=ChatCompletionResponse,
             responses={**ERRORS, 200: {"content": {"text/event-stream": {}}}})
async def create_chat_completion(body: ChatCompletionRequest, raw: Request) -> Response:
    check_request(raw, body)
    ids = await in_pool(raw, chat_prompt_ids, [m.for_template() for m in body.messages])
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    params = sampling_params(raw, body, check_prompt(raw, ids, max_tokens, "messages"), body.sampling_logprobs())
    request_id, created = random_id("chatcmpl"), int(time.time())
    state = ResponseState(raw, body, [(None, ids)])
    outputs = merge(await add_requests(raw, request_id, [(None, ids)], [params], body.priority))
    logprobs = lambda piece: (None if not body.logprobs else   # noqa: E731
                              chat_logprobs(raw.app.state.tokenizer, piece, body.top_logprobs or 0))

    def chunk(choices: list[ChatChunkChoice], **kw) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=request_id, created=created, model=body.model, choices=choices, **kw)

    if body.stream:
        return event_stream(raw, request_id, 1, chat_events(state, outputs, chunk, logprobs))
    pieces = await whole_response(raw, state, outputs)
    if pieces is None:
        return Response(status_code=499)
    choices = [ChatChoice(index=p.index, message=ChatMessageOut(content=p.text), finish_reason=p.finish_reason,
                          logprobs=logprobs(p), **(p.mask or {})) for p in pieces]
    return JSONResponse(ChatCompletionResponse(id=request_id, created=created, model=body.model, choices=choices,
                                               usage=state.usage()).model_dump())
