# Generated from notebooks/01_token_generation.ipynb, notebooks/06_fast_sampling.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from dataclasses import dataclass


# notebooks/06_fast_sampling.ipynb, cell 47
@dataclass
class Logprob:
    """One token's log-probability under the model's raw distribution, and its rank there (1 = most likely)."""
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# notebooks/06_fast_sampling.ipynb, cell 47
@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None     # "stop", "length", or None while running
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    sampling_mask: list[list[int]] | None = None  # per token, the sorted ids it was drawn from
    sampling_logz: list[float] | None = None      # per token, log of the softmax mass kept
    cumulative_logprob: float | None = None        # sum of the generated tokens' logprobs, when asked
    logprobs: list[dict[int, Logprob]] | None = None  # per generated token, {id: Logprob}, when asked


# notebooks/06_fast_sampling.ipynb, cell 47
@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # per prompt token, the first None
