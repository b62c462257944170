# Generated from notebooks/07_serving.ipynb, notebooks/07a_server_hardening.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import time
import uuid
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer

from rosellm_edu.sampling_params import SamplingParams


# notebooks/07_serving.ipynb, cell 39
class OpenAIBaseModel(BaseModel):
    # Fields we do not know are kept (and checked by unimplemented_fields), not refused by pydantic: clients
    # send fields a server does not implement, at their no-op values, all the time.
    model_config = ConfigDict(extra="allow")


# notebooks/07_serving.ipynb, cell 39
class StreamOptions(OpenAIBaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False   # usage in every chunk (vLLM's extra; benchmark clients count with it)


# notebooks/07_serving.ipynb, cell 41
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

    # notebooks/07_serving.ipynb, cell 42
    def token_bias(self) -> dict[int, float] | None:
        if self.logit_bias is None:
            return None
        try:
            return {int(token): bias for token, bias in self.logit_bias.items()}
        except ValueError:
            raise ValueError("SamplingParams.logit_bias keys must be token ids (integers as strings)") from None


# notebooks/07_serving.ipynb, cell 42
# Fields of OpenAI's or vLLM's API this server does not implement, and the values at which they change nothing.
NO_OP_VALUES: dict[str, list] = {
    "best_of": [None, 1], "suffix": [None, ""], "use_beam_search": [None, False], "length_penalty": [None, 1.0],
    "tools": [None, []], "tool_choice": [None, "none", "auto"], "parallel_tool_calls": [None, True, False],
    "functions": [None, []], "function_call": [None, "none", "auto"], "response_format": [None, {"type": "text"}],
    "modalities": [None, ["text"]], "store": [None, False], "service_tier": [None, "auto", "default"],
    "metadata": [None, {}], "add_generation_prompt": [True], "add_special_tokens": [None, False],
}


# notebooks/07_serving.ipynb, cell 42
def unimplemented_fields(body: OpenAIBaseModel) -> tuple[list[str], list[str]]:
    """(fields at a no-op value: accept and log, fields that would change the answer: refuse). A field we do
    not know at all counts as no-op when it is empty (null, false, "", [], {})."""
    ignored, refused = [], []
    for name, value in (body.model_extra or {}).items():
        noop = value in NO_OP_VALUES[name] if name in NO_OP_VALUES else value in (None, False, "", [], {})
        (ignored if noop else refused).append(name)
    return ignored, refused


# notebooks/07_serving.ipynb, cell 44
class CompletionRequest(SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]] = Field(min_length=1)
    max_tokens: int | None = 16   # None: up to the context
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False            # the prompt comes back in front of the text, with its logprobs if asked

    def prompts(self) -> list[str | list[int]]:
        """A batch of prompts: each a string or token ids."""
        one = isinstance(self.prompt, str) or isinstance(self.prompt[0], int)
        return [self.prompt] if one else list(self.prompt)


# notebooks/07_serving.ipynb, cell 44
class ChatMessage(OpenAIBaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict] | None = None   # a string, or a list of {"type": "text", "text": ...} parts
    name: str | None = None
    tool_call_id: str | None = None

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


# notebooks/07_serving.ipynb, cell 45
class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    def sampling_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


# notebooks/07_serving.ipynb, cell 48
class OpenAIResponse(BaseModel):
    """The optional keys are sent only when the server set them: a client that did not ask for an extra
    (the sampling mask, usage in a stream) gets exactly OpenAI's shape."""
    optional_keys: ClassVar[frozenset[str]] = frozenset({"usage", "sampling_mask", "sampling_logz"})

    @model_serializer(mode="wrap")
    def _omit_unset_optional_keys(self, handler):
        return {k: v for k, v in handler(self).items() if k not in self.optional_keys or k in self.model_fields_set}


# notebooks/07_serving.ipynb, cell 48
class UsageInfo(OpenAIResponse):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


# notebooks/07_serving.ipynb, cell 48
class CompletionLogprobs(BaseModel):
    """OpenAI's legacy completions shape: parallel lists, one entry per token (prompt tokens first with echo,
    the very first of which has no logprob)."""
    text_offset: list[int] = []
    token_logprobs: list[float | None] = []
    tokens: list[str] = []
    top_logprobs: list[dict[str, float] | None] = []


# notebooks/07_serving.ipynb, cell 48
class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


# notebooks/07_serving.ipynb, cell 48
class ChatLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = []


# notebooks/07_serving.ipynb, cell 48
class ChatLogprobs(BaseModel):
    content: list[ChatLogprob] | None = None


# notebooks/07_serving.ipynb, cell 50
class MaskedChoice(OpenAIResponse):
    """A choice with the keep-sampling mask, when asked for: per token, the sorted vocabulary ids the token
    was drawn from (None if nothing was truncated), and logZ, the log of the probability mass they hold."""
    index: int = 0
    finish_reason: str | None = None
    sampling_mask: list[list[int] | None] | None = None
    sampling_logz: list[float] | None = None


# notebooks/07_serving.ipynb, cell 50
class CompletionChoice(MaskedChoice):
    text: str
    logprobs: CompletionLogprobs | None = None


# notebooks/07_serving.ipynb, cell 50
class OpenAIObject(OpenAIResponse):
    """What every response and every chunk starts with."""
    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str


# notebooks/07_serving.ipynb, cell 50
class CompletionResponse(OpenAIObject):   # a whole completion, and each chunk of a streamed one
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


# notebooks/07_serving.ipynb, cell 50
class ChatMessageOut(OpenAIResponse):
    role: Literal["assistant"] = "assistant"
    content: str


# notebooks/07_serving.ipynb, cell 50
class DeltaMessage(OpenAIResponse):
    optional_keys: ClassVar[frozenset[str]] = frozenset({"role", "content"})
    role: Literal["assistant"] | None = None
    content: str | None = None


# notebooks/07_serving.ipynb, cell 51
class ChatChoice(MaskedChoice):
    message: ChatMessageOut
    logprobs: ChatLogprobs | None = None


# notebooks/07_serving.ipynb, cell 51
class ChatChunkChoice(MaskedChoice):
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None


# notebooks/07_serving.ipynb, cell 51
class ChatCompletionResponse(OpenAIObject):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: UsageInfo


# notebooks/07_serving.ipynb, cell 51
class ChatCompletionChunk(OpenAIObject):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


# notebooks/07_serving.ipynb, cell 51
class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "rosellm-edu"
    root: str | None = None
    max_model_len: int | None = None   # vLLM's extra: the context length, prompt + completion


# notebooks/07_serving.ipynb, cell 51
class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# notebooks/07_serving.ipynb, cell 52
def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


# notebooks/07_serving.ipynb, cell 52
class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


# notebooks/07_serving.ipynb, cell 52
class ErrorResponse(BaseModel):
    error: ErrorInfo


# notebooks/07a_server_hardening.ipynb, cell 14
class TokenizeRequest(OpenAIBaseModel):
    """vLLM's /tokenize: a prompt, or chat messages through the chat template."""
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


# notebooks/07a_server_hardening.ipynb, cell 14
class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[int]


# notebooks/07a_server_hardening.ipynb, cell 14
class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


# notebooks/07a_server_hardening.ipynb, cell 14
class DetokenizeResponse(BaseModel):
    prompt: str
