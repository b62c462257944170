# Generated from notebooks/01_token_generation.ipynb, notebooks/04_paged_attention.ipynb, notebooks/06_fast_sampling.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import math
from dataclasses import dataclass, field


# notebooks/06_fast_sampling.ipynb, cell 41
@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    max_tokens: int | None = 16           # None: up to the context
    min_tokens: int = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    skip_special_tokens: bool = True
    n: int = 1
    logprobs: int | None = None           # alternatives returned per generated token, besides the chosen one
    prompt_logprobs: int | None = None    # the same for every prompt token
    return_sampling_mask: bool = False    # each token's kept vocabulary ids and logZ

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    # notebooks/06_fast_sampling.ipynb, cell 43
    def _validate(self):
        def fail(name, why):
            raise ValueError(f"SamplingParams.{name} {why}, got {getattr(self, name)!r}")

        if not _is_finite(self.temperature) or self.temperature < 0:
            fail("temperature", "must be a finite number >= 0 (0 means greedy)")
        if not _is_int(self.top_k):
            fail("top_k", "must be an integer (<= 0 turns top-k off)")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            fail("top_p", "must be in (0, 1]")
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            fail("min_p", "must be in [0, 1]")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            fail("max_tokens", "must be an integer >= 1, or None (up to the context)")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= (self.max_tokens or self.min_tokens):
            fail("min_tokens", "must be an integer >= 0 and at most max_tokens")
        if self.seed is not None and (not _is_int(self.seed) or not -2**63 <= self.seed < 2**64):
            fail("seed", "must be an integer in [-2**63, 2**64) or None")
        if not all(isinstance(s, str) and s for s in self.stop):
            fail("stop", "must be a non-empty string or a list of them")
        if not all(_is_int(t) for t in self.stop_token_ids):
            fail("stop_token_ids", "must be a list of integers")
        for name in ("presence_penalty", "frequency_penalty"):
            if not _is_finite(getattr(self, name)) or not -2 <= getattr(self, name) <= 2:
                fail(name, "must be in [-2, 2]")
        if not _is_finite(self.repetition_penalty) or self.repetition_penalty <= 0:
            fail("repetition_penalty", "must be a finite number > 0 (1 is off)")
        if self.logit_bias is not None and not (isinstance(self.logit_bias, dict) and all(
                _is_int(k) and _is_finite(v) for k, v in self.logit_bias.items())):
            fail("logit_bias", "must map token ids (integers) to finite numbers")
        if not _is_int(self.n) or self.n < 1:
            fail("n", "must be an integer >= 1")
        for name in ("include_stop_str_in_output", "ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                fail(name, "must be True or False")
        self._validate_outputs(fail)   # what this chapter adds

    # notebooks/06_fast_sampling.ipynb, cell 44
    def _validate_outputs(self, fail):
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 0):
                fail(name, "must be None or an integer >= 0 (alternatives returned besides the chosen token)")
        if not isinstance(self.return_sampling_mask, bool):
            fail("return_sampling_mask", "must be True or False")


# notebooks/01_token_generation.ipynb, cell 8
def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# notebooks/01_token_generation.ipynb, cell 8
def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# notebooks/01_token_generation.ipynb, cell 9
def _in_range(x, low: float, high: float) -> bool:
    """A number (not a bool, not NaN) in [low, high]; high = math.inf still refuses inf itself."""
    return _is_number(x) and math.isfinite(x) and low <= x <= high


# notebooks/06_fast_sampling.ipynb, cell 44
def _is_finite(x) -> bool:
    return _is_number(x) and math.isfinite(x)
