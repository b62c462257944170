from dataclasses import dataclass


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None     # "stop", "length", or None while running
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    sampling_mask: list[list[int]] | None = None  # chapter 06: per token, the sorted ids it was drawn from
    sampling_logz: list[float] | None = None      # chapter 06: per token, log of the softmax mass kept


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
