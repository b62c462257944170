# Generated from notebooks/07_serving.ipynb, notebooks/07a_server_hardening.ipynb, notebooks/07b_responses_api.ipynb, notebooks/13a_structured_server.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import re
import time
import uuid
from typing import Annotated, ClassVar, Literal, Union

from pydantic import (BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_serializer,
                      model_validator)

from rosellm_edu.sampling_params import SamplingParams


# notebooks/07_serving.ipynb, cell 44
SURROGATE = re.compile("[\ud800-\udfff]")   # half of a UTF-16 pair: JSON can carry one, no text can hold it


# notebooks/07_serving.ipynb, cell 44
def strings(value):
    """Every string inside a field's value (lists, dicts and models, recursively)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from strings(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, BaseModel):
        for _, item in value:
            yield from strings(item)


# notebooks/07_serving.ipynb, cell 45
class OpenAIBaseModel(BaseModel):
    # Fields we do not know are kept (and checked by unimplemented_fields), not refused by pydantic: clients
    # send fields a server does not implement, at their no-op values, all the time. Types are strict, as
    # OpenAI's spec gives them: `echo: 0` or `stream: "yes"` is a 400, not a guess (a float still takes 1).
    model_config = ConfigDict(extra="allow", strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_lone_surrogate(cls, value):
        """A lone surrogate ("a\\ud800b", from a client that cut a string inside an emoji) is refused here, as a
        400 naming the field, before a tokenizer meets it."""
        if any(SURROGATE.search(text) for text in strings(value)):
            raise ValueError("contains a lone UTF-16 surrogate, which is not text (was a string cut in two?)")
        return value


# notebooks/07_serving.ipynb, cell 45
class StreamOptions(OpenAIBaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False   # usage in every chunk (vLLM's extra; benchmark clients count with it)


# notebooks/07_serving.ipynb, cell 47
class SamplingRequest(OpenAIBaseModel):
    """The fields completions and chat share, and how they map onto SamplingParams."""
    model: str
    temperature: float | None = None
    top_p: float | None = None
    n: int = Field(1, ge=1)
    seed: int | None = Field(None, ge=-2**63, lt=2**64)   # what a torch.Generator takes
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None   # JSON keys are strings: token id -> bias
    # Not in OpenAI's API; extra body fields, as vLLM accepts them.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    ignore_eos: bool = False
    return_sampling_mask: bool = False
    priority: int = 0   # lower runs first, under `--scheduling-policy priority`

    def to_sampling_params(self, max_tokens: int, logprobs: int | None = None,
                           prompt_logprobs: int | None = None) -> SamplingParams:
        """Raises ValueError naming the parameter that is invalid."""
        given = {name: getattr(self, name) for name in ("temperature", "top_p", "top_k", "min_p", "seed",
                 "presence_penalty", "frequency_penalty", "repetition_penalty", "stop_token_ids")}
        extra = {"return_sampling_mask": True} if self.return_sampling_mask else {}
        return SamplingParams(max_tokens=max_tokens, stop=self.stop, ignore_eos=self.ignore_eos, n=self.n,
                              min_tokens=self.min_tokens, include_stop_str_in_output=self.include_stop_str_in_output,
                              skip_special_tokens=self.skip_special_tokens, logit_bias=self.token_bias(),
                              logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                              **{k: v for k, v in given.items() if v is not None}, **extra)

    # notebooks/07_serving.ipynb, cell 48
    def token_bias(self) -> dict[int, float] | None:
        if self.logit_bias is None:
            return None
        try:
            return {int(token): bias for token, bias in self.logit_bias.items()}
        except ValueError:
            raise ValueError("SamplingParams.logit_bias keys must be token ids (integers as strings)") from None


# notebooks/13a_structured_server.ipynb, cell 47
# Fields of OpenAI's or vLLM's API this server does not implement, and the values at which they change nothing.
# response_format is a field now; tools, tool_choice and parallel_tool_calls are chat's (completions has none).
NO_OP_VALUES: dict[str, list] = {
    "best_of": [None, 1], "suffix": [None, ""], "use_beam_search": [None, False], "length_penalty": [None, 1.0],
    "tools": [None, []], "tool_choice": [None, "none", "auto"], "parallel_tool_calls": [None, True, False],
    "functions": [None, []], "function_call": [None, "none", "auto"],
    "modalities": [None, ["text"]], "store": [None, False], "service_tier": [None, "auto", "default"],
    "metadata": [None, {}], "add_generation_prompt": [True], "add_special_tokens": [None, False],
}


# notebooks/07_serving.ipynb, cell 48
def unimplemented_fields(body: OpenAIBaseModel) -> tuple[list[str], list[str]]:
    """(fields at a no-op value: accept and log, fields that would change the answer: refuse). A field we do
    not know at all counts as no-op when it is empty (null, false, "", [], {})."""
    ignored, refused = [], []
    for name, value in (body.model_extra or {}).items():
        noop = value in NO_OP_VALUES[name] if name in NO_OP_VALUES else value in (None, False, "", [], {})
        (ignored if noop else refused).append(name)
    return ignored, refused


# notebooks/07_serving.ipynb, cell 50
NonEmpty = Field(min_length=1)   # an empty prompt, or batch, is refused: the schema says so


# notebooks/07_serving.ipynb, cell 50
Text, TokenIds = Annotated[str, NonEmpty], Annotated[list[int], NonEmpty]


# notebooks/13a_structured_server.ipynb, cell 6
class JsonSchemaFormat(OpenAIBaseModel):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict = Field(alias="schema")   # `schema` is taken: pydantic's BaseModel has a method of that name
    strict: bool | None = None              # strict or not, the answer follows the schema


# notebooks/13a_structured_server.ipynb, cell 6
class ResponseFormat(OpenAIBaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type json_schema needs json_schema: {name, schema}")
        return self


# notebooks/13a_structured_server.ipynb, cell 7
class ConstrainedRequest(OpenAIBaseModel):
    """The fields that constrain an answer: OpenAI's response_format, vLLM's structured_outputs and its older
    guided_* names. Completions and chat both take them."""
    response_format: ResponseFormat | None = None
    structured_outputs: dict | None = None   # {json | regex | choice | grammar | json_object, disable_any_whitespace}
    guided_json: str | dict | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(None, min_length=1)
    guided_grammar: str | None = None
    guided_decoding_backend: Literal["auto", "xgrammar"] | None = None   # this server has one backend

    def constraint_fields(self) -> list[tuple[str, dict]]:
        """(the field, StructuredOutputsParams' arguments) for each constraint the request gives."""
        found, fmt = [], self.response_format
        if fmt is not None and fmt.type != "text":
            found.append(("response_format.json_schema.schema", {"json": fmt.json_schema.schema_})
                         if fmt.type == "json_schema" else ("response_format", {"json_object": True}))
        if self.structured_outputs is not None:
            found.append(("structured_outputs", self.structured_outputs))
        for kind in ("json", "regex", "choice", "grammar"):
            if (value := getattr(self, f"guided_{kind}")) is not None:
                found.append((f"guided_{kind}", {kind: value}))
        return found


# notebooks/13a_structured_server.ipynb, cell 9
class CompletionRequest(SamplingRequest, ConstrainedRequest):   # ConstrainedRequest's fields
    prompt: Text | TokenIds | Annotated[list[Text], NonEmpty] | Annotated[list[TokenIds], NonEmpty]
    max_tokens: int | None = Field(16, ge=1)   # None: up to the context
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False            # the prompt comes back in front of the text, with its logprobs if asked

    def prompts(self) -> list[str | list[int]]:
        """A batch of prompts: each a string or token ids."""
        one = isinstance(self.prompt, str) or isinstance(self.prompt[0], int)
        return [self.prompt] if one else list(self.prompt)


# notebooks/13a_structured_server.ipynb, cell 4
def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"   # OpenAI's shape for a tool call's id


# notebooks/13a_structured_server.ipynb, cell 4
class FunctionCall(OpenAIBaseModel):
    name: str
    arguments: str            # the arguments as JSON text, as OpenAI sends them


# notebooks/13a_structured_server.ipynb, cell 4
class ToolCall(OpenAIBaseModel):
    id: str = Field(default_factory=call_id)
    type: Literal["function"] = "function"
    function: FunctionCall


# notebooks/13a_structured_server.ipynb, cell 5
class ChatMessage(OpenAIBaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict] | None = None   # a string, or a list of {"type": "text", "text": ...} parts
    name: str | None = None
    tool_call_id: str | None = None           # a tool's result names the call it answers
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls, sent back as history

    @field_validator("content")
    @classmethod
    def _text_parts(cls, content):
        """Text parts are joined with newlines (as vLLM does); other parts (images, audio) are refused."""
        if not isinstance(content, list):
            return content
        kinds = {part.get("type") for part in content} - {"text"}
        if kinds:
            raise ValueError(f"only text content parts are supported, got {sorted(map(str, kinds))}")
        return "\n".join(str(part.get("text", "")) for part in content)

    def for_template(self) -> dict:
        """developer is OpenAI's newer name for system; a model's chat template knows only system."""
        fields = self.model_dump(exclude_none=True, exclude=set(self.model_extra or ()))
        return {**fields, "role": "system" if self.role == "developer" else self.role,
                "content": self.content or ""}


# notebooks/13a_structured_server.ipynb, cell 16
class FunctionDefinition(OpenAIBaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")   # OpenAI's rule for a function's name
    description: str | None = None
    parameters: dict | None = None     # a JSON schema of the arguments (an object); None: no arguments
    strict: bool | None = None


# notebooks/13a_structured_server.ipynb, cell 16
class ChatTool(OpenAIBaseModel):
    type: Literal["function"]
    function: FunctionDefinition


# notebooks/13a_structured_server.ipynb, cell 16
class FunctionName(OpenAIBaseModel):
    name: str


# notebooks/13a_structured_server.ipynb, cell 16
class NamedToolChoice(OpenAIBaseModel):
    type: Literal["function"]
    function: FunctionName


# notebooks/13a_structured_server.ipynb, cell 17
class ChatCompletionRequest(SamplingRequest, ConstrainedRequest):   # ConstrainedRequest's fields
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None   # None is auto
    parallel_tool_calls: bool | None = None                                       # False: one call at most

    def sampling_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


# notebooks/07_serving.ipynb, cell 54
class OpenAIResponse(BaseModel):
    """The optional keys are sent only when the server set them: a client that did not ask for an extra
    (the sampling mask, usage in a stream) gets exactly OpenAI's shape."""
    optional_keys: ClassVar[frozenset[str]] = frozenset({"usage", "sampling_mask", "sampling_logz"})

    @model_serializer(mode="wrap")
    def _omit_unset_optional_keys(self, handler):
        return {k: v for k, v in handler(self).items() if k not in self.optional_keys or k in self.model_fields_set}


# notebooks/07_serving.ipynb, cell 54
class UsageInfo(OpenAIResponse):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


# notebooks/07_serving.ipynb, cell 54
class CompletionLogprobs(BaseModel):
    """OpenAI's legacy completions shape: parallel lists, one entry per token (prompt tokens first with echo,
    the very first of which has no logprob)."""
    text_offset: list[int] = []
    token_logprobs: list[float | None] = []
    tokens: list[str] = []
    top_logprobs: list[dict[str, float] | None] = []


# notebooks/07_serving.ipynb, cell 54
class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


# notebooks/07_serving.ipynb, cell 54
class ChatLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = []


# notebooks/07_serving.ipynb, cell 54
class ChatLogprobs(BaseModel):
    content: list[ChatLogprob] | None = None


# notebooks/07_serving.ipynb, cell 56
class MaskedChoice(OpenAIResponse):
    """A choice with the keep-sampling mask, when asked for: per token, the sorted vocabulary ids the token
    was drawn from (None if nothing was truncated), and logZ, the log of the probability mass they hold."""
    index: int = 0
    finish_reason: str | None = None
    sampling_mask: list[list[int] | None] | None = None
    sampling_logz: list[float] | None = None


# notebooks/07_serving.ipynb, cell 56
class CompletionChoice(MaskedChoice):
    text: str
    logprobs: CompletionLogprobs | None = None


# notebooks/07_serving.ipynb, cell 56
class OpenAIObject(OpenAIResponse):
    """What every response and every chunk starts with."""
    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str


# notebooks/07_serving.ipynb, cell 56
class CompletionResponse(OpenAIObject):   # a whole completion, and each chunk of a streamed one
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


# notebooks/13a_structured_server.ipynb, cell 33
class ChatMessageOut(OpenAIResponse):
    optional_keys: ClassVar[frozenset[str]] = frozenset({"tool_calls"})   # sent when there are calls
    role: Literal["assistant"] = "assistant"
    content: str | None                   # None when the answer is calls only
    tool_calls: list[ToolCall] = []


# notebooks/13a_structured_server.ipynb, cell 33
class DeltaFunctionCall(OpenAIResponse):
    optional_keys: ClassVar[frozenset[str]] = frozenset({"name"})
    name: str | None = None               # in a call's first delta only
    arguments: str = ""


# notebooks/13a_structured_server.ipynb, cell 33
class DeltaToolCall(OpenAIResponse):
    optional_keys: ClassVar[frozenset[str]] = frozenset({"id", "type"})
    index: int                            # which call of the message this delta adds to
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall


# notebooks/13a_structured_server.ipynb, cell 33
class DeltaMessage(OpenAIResponse):
    optional_keys: ClassVar[frozenset[str]] = frozenset({"role", "content", "tool_calls"})
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


# notebooks/13a_structured_server.ipynb, cell 34
class ChatChoice(MaskedChoice):        # as chapter 07's, holding the new message types
    message: ChatMessageOut
    logprobs: ChatLogprobs | None = None


# notebooks/13a_structured_server.ipynb, cell 34
class ChatChunkChoice(MaskedChoice):
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None


# notebooks/13a_structured_server.ipynb, cell 34
class ChatCompletionResponse(OpenAIObject):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: UsageInfo


# notebooks/13a_structured_server.ipynb, cell 34
class ChatCompletionChunk(OpenAIObject):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


# notebooks/07_serving.ipynb, cell 57
class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "rosellm-edu"
    root: str | None = None
    max_model_len: int | None = None   # vLLM's extra: the context length, prompt + completion


# notebooks/07_serving.ipynb, cell 57
class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# notebooks/07_serving.ipynb, cell 58
def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


# notebooks/07_serving.ipynb, cell 58
class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


# notebooks/07_serving.ipynb, cell 58
class ErrorResponse(BaseModel):
    error: ErrorInfo


# notebooks/07a_server_hardening.ipynb, cell 17
class TokenizeRequest(OpenAIBaseModel):
    """vLLM's /tokenize: a prompt, or chat messages through the chat template."""
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


# notebooks/07a_server_hardening.ipynb, cell 17
class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[int]


# notebooks/07a_server_hardening.ipynb, cell 17
class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


# notebooks/07a_server_hardening.ipynb, cell 17
class DetokenizeResponse(BaseModel):
    prompt: str


# notebooks/07b_responses_api.ipynb, cell 4
class InputMessage(OpenAIBaseModel):
    """One message of a Responses input: a role and its text, as a string or a list of text parts."""
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict]
    id: str | None = None        # an earlier answer sent back as history keeps its item id and status
    status: str | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, content):
        """A user's input_text parts, an earlier answer's output_text parts: joined as chat joins its parts."""
        if isinstance(content, str):
            return content
        kinds = {part.get("type") for part in content} - {"input_text", "output_text"}
        if kinds:
            raise ValueError(f"only input_text and output_text parts are supported, got {sorted(map(str, kinds))}")
        return "\n".join(str(part.get("text", "")) for part in content)

    def for_template(self) -> dict:
        return ChatMessage(role=self.role, content=self.content).for_template()


# notebooks/07b_responses_api.ipynb, cell 4
# A string is one user message, a list holds messages. The branch is picked by the value's kind, so that an error
# names one place (input.messages.0.role) rather than both branches of a union.
ResponsesInput = Annotated[Union[Annotated[str, Field(min_length=1), Tag("text")],
                                 Annotated[list[InputMessage], Field(min_length=1), Tag("messages")]],
                           Discriminator(lambda value: "text" if isinstance(value, str) else "messages")]


# notebooks/07b_responses_api.ipynb, cell 6
NOT_OFFERED: dict[str, tuple[list, str]] = {   # field -> (the values that ask for nothing, why others are refused)
    "store": ([None, False], "this server stores no responses"),
    "background": ([None, False], "a background response must be stored, and this server stores none"),
    "previous_response_id": ([None], "this server stores no responses: send the conversation so far as input"),
    "conversation": ([None], "this server stores no conversations: send the conversation so far as input"),
    "tools": ([None, []], "function tools are served by /v1/chat/completions; there are no built-in tools"),
    "tool_choice": ([None, "none", "auto"], "tools are served by /v1/chat/completions"),
    "reasoning": ([None, {}], "this server's models take no reasoning settings"),
    "include": ([None, []], "this server adds nothing to its output items"),
    "text": ([None, {}, {"format": {"type": "text"}}], "structured output is served by chat's response_format"),
    "top_logprobs": ([None, 0], "logprobs are served by /v1/chat/completions"),
    "truncation": ([None, "disabled"], "a prompt too long for the context is refused, never cut"),
}


# notebooks/07b_responses_api.ipynb, cell 7
class ResponsesRequest(OpenAIBaseModel):
    """The text path of OpenAI's Responses API, and the fields of NOT_OFFERED."""
    n: ClassVar[int] = 1                          # one answer, as ResponseState reads a body
    return_sampling_mask: ClassVar[bool] = False
    model: str
    input: ResponsesInput
    instructions: str | None = None               # a system message ahead of the input
    max_output_tokens: int | None = Field(None, ge=1)   # None: all the room the context leaves
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    user: str | None = None
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool | None = None       # without tools, either value asks for nothing
    store: bool | None = None
    background: bool | None = None
    previous_response_id: str | None = None
    conversation: str | dict | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    reasoning: dict | None = None
    include: list[str] | None = None
    text: dict | None = None
    top_logprobs: int | None = None
    truncation: str | None = None
    priority: int = 0                             # vLLM's extra: lower runs first, under --scheduling-policy priority

    @property
    def messages(self) -> list[InputMessage]:
        """instructions as a system message first, then the input (a string is one user message)."""
        given = [InputMessage(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        return ([InputMessage(role="system", content=self.instructions)] if self.instructions else []) + given

    # notebooks/07b_responses_api.ipynb, cell 8
    def not_offered(self) -> tuple[str, str] | None:
        """The first field set to something this server does not offer, and why."""
        return next(((name, why) for name, (no_op, why) in NOT_OFFERED.items() if getattr(self, name) not in no_op),
                    None)

    # notebooks/07b_responses_api.ipynb, cell 8
    def to_sampling_params(self, max_tokens: int, *_) -> SamplingParams:
        """Raises ValueError naming the parameter that is invalid."""
        given = {"temperature": self.temperature, "top_p": self.top_p}
        return SamplingParams(max_tokens=max_tokens, **{k: v for k, v in given.items() if v is not None})


# notebooks/07b_responses_api.ipynb, cell 12
class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list = []
    logprobs: list = []


# notebooks/07b_responses_api.ipynb, cell 12
class OutputMessage(BaseModel):
    """The one output item of a text answer: an assistant message."""
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


# notebooks/07b_responses_api.ipynb, cell 12
class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"] = "max_output_tokens"


# notebooks/07b_responses_api.ipynb, cell 12
class ResponseError(BaseModel):
    code: str
    message: str


# notebooks/07b_responses_api.ipynb, cell 13
class InputTokensDetails(BaseModel):
    cached_tokens: int = 0      # not counted per request here (vLLM also sends 0 unless asked)


# notebooks/07b_responses_api.ipynb, cell 13
class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


# notebooks/07b_responses_api.ipynb, cell 13
class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


# notebooks/07b_responses_api.ipynb, cell 14
class ResponsesResponse(BaseModel):
    """A response: the request's settings echoed, its status, its output items and usage."""
    id: str
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    model: str
    output: list[OutputMessage] = []
    usage: ResponseUsage | None = None
    incomplete_details: IncompleteDetails | None = None
    error: ResponseError | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    previous_response_id: None = None
    store: bool = False
    parallel_tool_calls: bool = False
    tool_choice: Literal["none"] = "none"
    tools: list = []


# notebooks/07b_responses_api.ipynb, cell 14
class ResponseEvent(BaseModel):
    """One event of a streamed response: its type, its place in the stream, the fields of its type."""
    model_config = ConfigDict(extra="allow")
    type: str
    sequence_number: int
