# Generated from notebooks/07_serving.ipynb, notebooks/13a_structured_server.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from rosellm_edu.entrypoints.openai.constraints import add_constrained, constrained, request_constraint
from rosellm_edu.entrypoints.openai.errors import ERRORS
from rosellm_edu.entrypoints.openai.protocol import (ChatChoice, ChatChunkChoice, ChatCompletionChunk,
                                                     ChatCompletionRequest, ChatCompletionResponse, ChatLogprob,
                                                     ChatLogprobs, ChatMessageOut, DeltaFunctionCall, DeltaMessage,
                                                     DeltaToolCall, FunctionCall, ToolCall, TopLogprob, call_id,
                                                     random_id)
from rosellm_edu.entrypoints.openai.serving_engine import (Piece, ResponseState, chat_prompt_ids, check_prompt,
                                                           check_request, clamp, event_stream, in_pool, merge,
                                                           sampling_params, sse, stream_events, token_text,
                                                           whole_response)
from rosellm_edu.entrypoints.openai.tool_calls import (array_calls, check_tools, hermes_calls, template_messages,
                                                       text_before_calls, tool_choice, tool_constraints)
from rosellm_edu.outputs import Logprob, RequestOutput


# notebooks/13a_structured_server.ipynb, cell 42
router = APIRouter()   # a new one: the route below takes the place of chapter 07's


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


# notebooks/13a_structured_server.ipynb, cell 36
@dataclass
class ChoiceStream:
    """What one streamed choice has sent: its text so far, how much of it went out as content, and per call
    how many characters of its arguments."""
    text: str = ""
    content_sent: int = 0
    arguments_sent: list[int] = field(default_factory=list)


# notebooks/13a_structured_server.ipynb, cell 36
def called(finish_reason: str | None) -> str | None:
    return "tool_calls" if finish_reason == "stop" else finish_reason   # a cut answer stays "length"


# notebooks/13a_structured_server.ipynb, cell 37
class ChatAnswer:
    """A choice's text as the message it is: text, or tool calls, as tool_choice asks."""

    def __init__(self, body: ChatCompletionRequest):
        self.mode, self.tools = tool_choice(body), {t.function.name for t in body.tools or []}
        self.forced = body.tool_choice.function.name if self.mode == "function" else None
        self.streams: dict[int, ChoiceStream] = {}

    def calls(self, text: str, whole: bool) -> tuple[str | None, list[tuple[str, str]]] | None:
        """(content, [(name, arguments)]) if the text is calls (a prefix of it may be), else None: text."""
        if self.mode == "function":
            return None, [(self.forced, text.strip())]
        if self.mode == "required":
            return None, [(name, arguments) for name, arguments in array_calls(text) if name is not None]
        return hermes_calls(text, self.tools) if self.mode == "auto" and whole else None

    def message(self, piece: Piece) -> dict:
        """A whole choice's message and finish_reason ("tool_calls" when it called)."""
        found = self.calls(piece.text, whole=True)
        if found is None:
            return {"message": ChatMessageOut(content=piece.text), "finish_reason": piece.finish_reason}
        calls = [ToolCall(function=FunctionCall(name=name, arguments=arguments)) for name, arguments in found[1]]
        return {"message": ChatMessageOut(content=found[0], tool_calls=calls),
                "finish_reason": called(piece.finish_reason)}

    # notebooks/13a_structured_server.ipynb, cell 38
    def delta(self, piece: Piece) -> dict:
        """A streamed choice's chunk fields: the new text, or the calls' new parts, and finish_reason. auto holds
        back what may begin a <tool_call> and reads the calls once the answer is whole."""
        s = self.streams.setdefault(piece.index, ChoiceStream())
        s.text += piece.text
        found = self.calls(s.text, whole=piece.finish_reason is not None)
        if self.mode == "none" or (found is None and piece.finish_reason is not None):
            end = len(s.text)                         # text: all of it
        else:
            end = text_before_calls(s.text) if self.mode == "auto" else 0
        content, s.content_sent = s.text[s.content_sent:end], max(s.content_sent, end)
        calls = self.call_deltas(s, found[1] if found else [])
        delta = DeltaMessage(**({"content": content} if content else {}), **({"tool_calls": calls} if calls else {}))
        return {"delta": delta, "finish_reason": called(piece.finish_reason) if found else piece.finish_reason}

    # notebooks/13a_structured_server.ipynb, cell 38
    def call_deltas(self, s: ChoiceStream, calls: list[tuple[str, str]]) -> list[DeltaToolCall]:
        """OpenAI's stream of calls: a call's first delta has its index, id, type and name (and the arguments so
        far); each later one adds to its arguments."""
        deltas = []
        for i, (name, arguments) in enumerate(calls):
            if i == len(s.arguments_sent):
                s.arguments_sent.append(0)
                deltas.append(DeltaToolCall(index=i, id=call_id(), type="function",
                                            function=DeltaFunctionCall(name=name, arguments=arguments)))
            elif len(arguments) > s.arguments_sent[i]:
                deltas.append(DeltaToolCall(index=i, function=DeltaFunctionCall(
                    arguments=arguments[s.arguments_sent[i]:])))
            s.arguments_sent[i] = len(arguments)
        return deltas


# notebooks/13a_structured_server.ipynb, cell 39
async def chat_events(state: ResponseState, outputs: AsyncIterator[tuple[int, RequestOutput]],
                      make_chunk: Callable[..., ChatCompletionChunk], logprobs,
                      answer: ChatAnswer) -> AsyncIterator[str]:
    """A streamed chat completion's events: each choice's role first, then one delta per step."""
    def delta_chunk(piece: Piece) -> ChatCompletionChunk:
        return make_chunk([ChatChunkChoice(index=piece.index, **answer.delta(piece),   # text or calls
                                           logprobs=logprobs(piece), **(piece.mask or {}))])

    for index in range(state.body.n):
        yield sse(make_chunk([ChatChunkChoice(index=index, delta=DeltaMessage(role="assistant", content=""))]))
    async for event in stream_events(state, outputs, delta_chunk, lambda u: make_chunk([], usage=u)):
        yield event


# notebooks/13a_structured_server.ipynb, cell 43
@router.post("/v1/chat/completions", response_model=ChatCompletionResponse,
             responses={**ERRORS, 200: {"content": {"text/event-stream": {}}}})
async def create_chat_completion(body: ChatCompletionRequest, raw: Request) -> Response:
    check_request(raw, body)
    check_tools(body)
    constraint = request_constraint(body, tool_constraints(body))
    ids = await in_pool(raw, chat_prompt_ids, template_messages(body))         # the tools in the prompt
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    params = sampling_params(raw, body, check_prompt(raw, ids, max_tokens, "messages"), body.sampling_logprobs())
    request_id, created = random_id("chatcmpl"), int(time.time())
    state, answer = ResponseState(raw, body, [(None, ids)]), ChatAnswer(body)   # text or tool calls
    outputs = merge(await add_constrained(raw, request_id, [(None, ids)], [constrained(params, constraint)],
                                          body.priority, constraint))
    logprobs = lambda piece: (None if not body.logprobs else   # noqa: E731
                              chat_logprobs(raw.app.state.tokenizer, piece, body.top_logprobs or 0))

    def chunk(choices: list[ChatChunkChoice], **kw) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=request_id, created=created, model=body.model, choices=choices, **kw)

    if body.stream:
        return event_stream(raw, request_id, 1, chat_events(state, outputs, chunk, logprobs, answer))
    pieces = await whole_response(raw, state, outputs)
    if pieces is None:
        return Response(status_code=499)
    choices = [ChatChoice(index=p.index, **answer.message(p), logprobs=logprobs(p), **(p.mask or {})) for p in pieces]
    return JSONResponse(ChatCompletionResponse(id=request_id, created=created, model=body.model, choices=choices,
                                               usage=state.usage()).model_dump())
