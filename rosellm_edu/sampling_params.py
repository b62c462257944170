# Generated from notebooks/01_token_generation.ipynb, notebooks/06_fast_sampling.ipynb by `python -m rosellm_edu.book.export`.
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
    max_tokens: int = 16
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    return_sampling_mask: bool = False   # each token's kept vocabulary ids and logZ

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

        if not _is_number(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            fail("temperature", "must be a finite number >= 0 (0 means greedy)")
        if not _is_int(self.top_k):
            fail("top_k", "must be an integer (<= 0 turns top-k off)")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            fail("top_p", "must be in (0, 1]")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            fail("max_tokens", "must be an integer >= 1")
        if self.seed is not None and not _is_int(self.seed):
            fail("seed", "must be an integer or None")
        if not all(isinstance(s, str) and s for s in self.stop):
            fail("stop", "must be a non-empty string or a list of them")
        if not all(_is_int(t) for t in self.stop_token_ids):
            fail("stop_token_ids", "must be a list of integers")
        if not isinstance(self.return_sampling_mask, bool):
            fail("return_sampling_mask", "must be True or False")


# notebooks/01_token_generation.ipynb, cell 8
def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# notebooks/01_token_generation.ipynb, cell 8
def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
