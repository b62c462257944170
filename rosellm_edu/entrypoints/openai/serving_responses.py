# Generated from notebooks/07b_responses_api.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import itertools
import uuid
from typing import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from rosellm_edu.engine.async_llm_engine import EngineDeadError, RequestFailedError
from rosellm_edu.entrypoints.openai.errors import ERRORS, OpenAIError
from rosellm_edu.entrypoints.openai.protocol import (IncompleteDetails, OutputMessage, OutputText, ResponseError,
                                                     ResponseEvent, ResponseUsage, ResponsesRequest, ResponsesResponse)
from rosellm_edu.entrypoints.openai.serving_engine import (Piece, ResponseState, add_requests, chat_prompt_ids,
                                                           check_prompt, check_request, event_stream, in_pool, merge,
                                                           sampling_params, sse, whole_response)
from rosellm_edu.outputs import RequestOutput


# notebooks/07b_responses_api.ipynb, cell 16
router = APIRouter()


# notebooks/07b_responses_api.ipynb, cell 16
def finished_response(start: ResponsesResponse, item_id: str, text: Piece, state: ResponseState) -> ResponsesResponse:
    """The response once its text is whole: completed, or incomplete when the token limit cut it."""
    cut = text.finish_reason == "length"
    message = OutputMessage(id=item_id, status="incomplete" if cut else "completed",
                            content=[OutputText(text=text.text)])
    u = state.usage()
    usage = ResponseUsage(input_tokens=u.prompt_tokens, output_tokens=u.completion_tokens, total_tokens=u.total_tokens)
    return start.model_copy(update={"status": message.status, "output": [message], "usage": usage,
                                    "incomplete_details": IncompleteDetails() if cut else None})


# notebooks/07b_responses_api.ipynb, cell 17
@router.post("/v1/responses", response_model=ResponsesResponse,
             responses={**ERRORS, 200: {"content": {"text/event-stream": {}}}})
async def create_response(body: ResponsesRequest, raw: Request) -> Response:
    check_request(raw, body)   # the model, unknown fields, the limits, priority
    if (refused := body.not_offered()) is not None:
        raise OpenAIError(400, f"{refused[0]}: not supported by this server ({refused[1]})", refused[0])
    ids = await in_pool(raw, chat_prompt_ids, [m.for_template() for m in body.messages])
    room = check_prompt(raw, ids, None, "input")   # what the context leaves after the prompt
    if body.max_output_tokens is not None and body.max_output_tokens > room:
        raise OpenAIError(400, f"max_output_tokens: the context leaves {room} tokens after the input's {len(ids)}, "
                          f"and you asked for {body.max_output_tokens}", "max_output_tokens")
    params = sampling_params(raw, body, body.max_output_tokens or room)
    response_id, item_id = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}"
    state = ResponseState(raw, body, [(None, ids)])
    outputs = merge(await add_requests(raw, response_id, [(None, ids)], [params], body.priority))
    start = ResponsesResponse(id=response_id, status="in_progress", model=body.model, **body.model_dump(
        include={"instructions", "max_output_tokens", "temperature", "top_p", "metadata", "user"}))
    if body.stream:
        return event_stream(raw, response_id, 1, response_events(state, outputs, start, item_id))
    pieces = await whole_response(raw, state, outputs)
    if pieces is None:
        return Response(status_code=499)   # nobody is listening
    return JSONResponse(finished_response(start, item_id, pieces[0], state).model_dump())


# notebooks/07b_responses_api.ipynb, cell 19
async def response_events(state: ResponseState, outputs: AsyncIterator[tuple[int, RequestOutput]],
                          start: ResponsesResponse, item_id: str) -> AsyncIterator[str]:
    """The typed events of a response with one message: it opens, one delta per step, it closes."""
    numbers = itertools.count()

    def event(type: str, **fields) -> str:
        return f"event: {type}\n" + sse(ResponseEvent(type=type, sequence_number=next(numbers), **fields))

    at = {"item_id": item_id, "output_index": 0, "content_index": 0}
    yield event("response.created", response=start)
    yield event("response.in_progress", response=start)
    yield event("response.output_item.added", output_index=0, item=OutputMessage(id=item_id, status="in_progress",
                                                                                 content=[]))
    yield event("response.content_part.added", **at, part=OutputText(text=""))
    text = Piece(0, "", [], None)
    try:
        async for i, out in outputs:
            for piece in state.pieces(i, out):
                text += piece
                if piece.text:
                    yield event("response.output_text.delta", **at, delta=piece.text, logprobs=[])
        state.finished()
    except (RequestFailedError, EngineDeadError) as e:   # the stream is open: say so in it, then end it
        failed = ResponseError(code="server_error", message=str(e))
        yield event("response.failed", response=start.model_copy(update={"status": "failed", "error": failed}))
        return
    done = finished_response(start, item_id, text, state)
    yield event("response.output_text.done", **at, text=text.text, logprobs=[])
    yield event("response.content_part.done", **at, part=done.output[0].content[0])
    yield event("response.output_item.done", output_index=0, item=done.output[0])
    yield event("response.completed" if done.status == "completed" else "response.incomplete", response=done)
