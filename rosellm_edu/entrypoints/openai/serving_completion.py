# Generated from notebooks/07_serving.ipynb, notebooks/13a_structured_server.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from rosellm_edu.entrypoints.openai.constraints import add_constrained, constrained, request_constraint
from rosellm_edu.entrypoints.openai.errors import ERRORS
from rosellm_edu.entrypoints.openai.protocol import (CompletionChoice, CompletionLogprobs, CompletionRequest,
                                                     CompletionResponse, random_id)
from rosellm_edu.entrypoints.openai.serving_engine import (Piece, ResponseState, check_prompt, check_request, clamp,
                                                           encode_prompts, event_stream, in_pool, merge,
                                                           sampling_params, stream_events, token_text, whole_response)


# notebooks/13a_structured_server.ipynb, cell 44
router = APIRouter()   # a new one: the route below takes the place of chapter 07's


# notebooks/07_serving.ipynb, cell 79
def completion_logprobs(tokenizer, piece: Piece) -> CompletionLogprobs:
    """OpenAI's legacy shape: per token its text, logprob, top alternatives ({text: logprob}) and offset."""
    out, offset = CompletionLogprobs(), piece.offset
    for token, entries in zip(piece.token_ids, piece.logprobs):
        text = token_text(tokenizer, token, entries and entries.get(token))
        out.tokens.append(text)
        out.text_offset.append(offset)
        offset += len(text)
        out.token_logprobs.append(None if entries is None else clamp(entries[token].logprob))
        out.top_logprobs.append(None if entries is None else
                                {token_text(tokenizer, t, e): clamp(e.logprob) for t, e in entries.items()})
    return out


# notebooks/13a_structured_server.ipynb, cell 45
@router.post("/v1/completions", response_model=CompletionResponse,
             responses={**ERRORS, 200: {"content": {"text/event-stream": {}}}})
async def create_completion(body: CompletionRequest, raw: Request) -> Response:
    check_request(raw, body)
    constraint = request_constraint(body)
    batch = body.prompts()
    prompts = await in_pool(raw, encode_prompts, batch, body.echo)
    echo_logprobs = body.logprobs if body.echo else None
    params = [constrained(sampling_params(raw, body, check_prompt(raw, ids, body.max_tokens, "prompt"), body.logprobs,
                                          echo_logprobs), constraint) for _, ids in prompts]   # constrained
    request_id, created = random_id("cmpl"), int(time.time())
    state = ResponseState(raw, body, prompts, echo=body.echo)
    outputs = merge(await add_constrained(raw, request_id, prompts, params, body.priority, constraint))

    def choice(piece: Piece) -> CompletionChoice:
        logprobs = None if body.logprobs is None else completion_logprobs(raw.app.state.tokenizer, piece)
        return CompletionChoice(index=piece.index, text=piece.text, logprobs=logprobs,
                                finish_reason=piece.finish_reason, **(piece.mask or {}))

    def response(choices: list[CompletionChoice], **kw) -> CompletionResponse:
        return CompletionResponse(id=request_id, created=created, model=body.model, choices=choices, **kw)

    if body.stream:
        return event_stream(raw, request_id, len(batch), stream_events(
            state, outputs, lambda piece: response([choice(piece)]), lambda u: response([], usage=u)))
    pieces = await whole_response(raw, state, outputs)
    if pieces is None:
        return Response(status_code=499)   # nobody is listening
    return JSONResponse(response([choice(p) for p in pieces], usage=state.usage()).model_dump())
