# Generated from notebooks/07_serving.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import time
import uuid
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer

from rosellm_edu.sampling_params import SamplingParams


# notebooks/07_serving.ipynb, cell 30
class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")   # an unsupported field gets a 400 that names it, not silence


# notebooks/07_serving.ipynb, cell 30
class StreamOptions(OpenAIBaseModel):
    include_usage: bool = False


# notebooks/07_serving.ipynb, cell 32
class SamplingRequest(OpenAIBaseModel):
    """The fields completions and chat share, and how they map onto SamplingParams."""
    model: str
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Not in OpenAI's API; extra body fields, as vLLM accepts them.
    top_k: int | None = None
    ignore_eos: bool = False
    return_sampling_mask: bool = False

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n = 1 is supported")
        return n

    def to_sampling_params(self, max_tokens: int) -> SamplingParams:
        """Raises ValueError naming the parameter that is invalid."""
        given = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}
        extra = {"return_sampling_mask": True} if self.return_sampling_mask else {}
        return SamplingParams(max_tokens=max_tokens, stop=self.stop, ignore_eos=self.ignore_eos,
                              **{k: v for k, v in given.items() if v is not None}, **extra)


# notebooks/07_serving.ipynb, cell 34
class CompletionRequest(SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, logprobs):
        if logprobs is not None:
            raise ValueError("logprobs are not supported by this server")
        return logprobs

    def engine_prompt(self) -> str | dict:
        """One prompt: a string, or token ids as the engine takes them."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ValueError(f"prompt: one prompt per request is supported, got {len(prompt)}")
            prompt = prompt[0]
        return prompt if isinstance(prompt, str) else {"prompt_token_ids": prompt}


# notebooks/07_serving.ipynb, cell 34
class ChatMessage(OpenAIBaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


# notebooks/07_serving.ipynb, cell 34
class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, logprobs: bool) -> bool:
        if logprobs:
            raise ValueError("logprobs are not supported by this server")
        return logprobs


# notebooks/07_serving.ipynb, cell 37
def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


# notebooks/07_serving.ipynb, cell 37
class OpenAIResponse(BaseModel):
    """The optional keys are sent only when the server set them: a client that did not ask for an extra
    (the sampling mask, usage in a stream) gets exactly OpenAI's shape."""
    optional_keys: ClassVar[frozenset[str]] = frozenset({"usage", "sampling_mask", "sampling_logz"})

    @model_serializer(mode="wrap")
    def _omit_unset_optional_keys(self, handler):
        return {k: v for k, v in handler(self).items() if k not in self.optional_keys or k in self.model_fields_set}


# notebooks/07_serving.ipynb, cell 37
class UsageInfo(OpenAIResponse):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


# notebooks/07_serving.ipynb, cell 37
class MaskedChoice(OpenAIResponse):
    """A choice with the keep-sampling mask, when asked for: per token, the sorted vocabulary ids the token
    was drawn from (None if nothing was truncated), and logZ, the log of the probability mass they hold."""
    index: int = 0
    logprobs: None = None
    finish_reason: str | None = None
    sampling_mask: list[list[int]] | None = None
    sampling_logz: list[float] | None = None


# notebooks/07_serving.ipynb, cell 37
class CompletionChoice(MaskedChoice):
    text: str


# notebooks/07_serving.ipynb, cell 39
class OpenAIObject(OpenAIResponse):
    """What every response and every chunk starts with."""
    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str


# notebooks/07_serving.ipynb, cell 39
class CompletionResponse(OpenAIObject):   # a whole completion, and each chunk of a streamed one
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


# notebooks/07_serving.ipynb, cell 39
class ChatMessageOut(OpenAIResponse):
    role: Literal["assistant"] = "assistant"
    content: str


# notebooks/07_serving.ipynb, cell 39
class DeltaMessage(OpenAIResponse):
    optional_keys: ClassVar[frozenset[str]] = frozenset({"role", "content"})
    role: Literal["assistant"] | None = None
    content: str | None = None


# notebooks/07_serving.ipynb, cell 39
class ChatChoice(MaskedChoice):
    message: ChatMessageOut


# notebooks/07_serving.ipynb, cell 39
class ChatChunkChoice(MaskedChoice):
    delta: DeltaMessage


# notebooks/07_serving.ipynb, cell 40
class ChatCompletionResponse(OpenAIObject):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: UsageInfo


# notebooks/07_serving.ipynb, cell 40
class ChatCompletionChunk(OpenAIObject):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


# notebooks/07_serving.ipynb, cell 40
class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "rosellm-edu"


# notebooks/07_serving.ipynb, cell 40
class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# notebooks/07_serving.ipynb, cell 40
class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


# notebooks/07_serving.ipynb, cell 40
class ErrorResponse(BaseModel):
    error: ErrorInfo
