# Generated from notebooks/01_token_generation.ipynb, notebooks/04a_parallel_sampling.ipynb, notebooks/06_fast_sampling.ipynb, notebooks/13_structured_output.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import json as json_module
import math
from dataclasses import dataclass, field


# notebooks/13_structured_output.ipynb, cell 18
STRUCTURED_KINDS = {"json": ((str, dict), "a JSON schema (a dict or its text)"), "regex": (str, "a string"),
                    "choice": (list, "a non-empty list of strings"), "grammar": (str, "an EBNF string"),
                    "json_object": (bool, "True")}   # kind -> (its type, how to say it)


# notebooks/13_structured_output.ipynb, cell 18
@dataclass
class StructuredOutputsParams:
    """One constraint on a request's output, under vLLM's names: exactly one of STRUCTURED_KINDS."""
    json: str | dict | None = None          # a JSON schema, as a dict or its text
    regex: str | None = None
    choice: list[str] | None = None         # exactly one of these strings
    grammar: str | None = None              # EBNF (GBNF) text, root rule `root`
    json_object: bool | None = None         # any JSON object
    disable_any_whitespace: bool = False    # JSON written compactly, no free whitespace

    def __post_init__(self):
        given = [k for k in STRUCTURED_KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"StructuredOutputsParams takes exactly one of {', '.join(STRUCTURED_KINDS)}, got "
                             f"{', '.join(given) or 'none'}")
        kind, value = given[0], getattr(self, given[0])
        expected, said = STRUCTURED_KINDS[kind]
        if not isinstance(value, expected) or (kind == "choice" and not (value and all(
                isinstance(c, str) for c in value))):
            raise ValueError(f"StructuredOutputsParams.{kind} must be {said}, got {value!r}")

    @property
    def kind(self) -> str:
        return next(k for k in STRUCTURED_KINDS if getattr(self, k) not in (None, False))

    def key(self) -> tuple:
        """Equal for equal constraints: the cache of compiled grammars is keyed by it."""
        value = getattr(self, self.kind)
        text = json_module.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)
        return self.kind, text, self.disable_any_whitespace


# notebooks/13_structured_output.ipynb, cell 20
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
    n: int = 1                            # completions of the prompt, sharing its KV blocks
    logprobs: int | None = None           # alternatives returned per generated token, besides the chosen one
    prompt_logprobs: int | None = None    # the same for every prompt token
    return_sampling_mask: bool = False    # each token's kept vocabulary ids and log Z
    structured_outputs: StructuredOutputsParams | None = None   # a grammar the output must follow

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    # notebooks/13_structured_output.ipynb, cell 21
    def _validate(self):
        check_sampling(self)
        check_penalties(self)
        check_samples(self)
        check_outputs(self)
        if not isinstance(self.structured_outputs, (StructuredOutputsParams, type(None))):
            _fail(self, "structured_outputs", "must be a StructuredOutputsParams or None")


# notebooks/01_token_generation.ipynb, cell 8
def check_sampling(p: SamplingParams) -> None:
    """Each field in its range, or a ValueError that names it."""
    if not _in_range(p.temperature, 0, math.inf):
        _fail(p, "temperature", "must be a finite number >= 0 (0 means greedy)")
    if not _is_int(p.top_k):
        _fail(p, "top_k", "must be an integer (<= 0 turns top-k off)")
    if not _is_number(p.top_p) or not 0 < p.top_p <= 1:
        _fail(p, "top_p", "must be in (0, 1]")
    if not _in_range(p.min_p, 0, 1):
        _fail(p, "min_p", "must be in [0, 1] (0 turns min-p off)")
    if p.max_tokens is not None and (not _is_int(p.max_tokens) or p.max_tokens < 1):
        _fail(p, "max_tokens", "must be an integer >= 1, or None (up to the context)")
    if not _is_int(p.min_tokens) or not 0 <= p.min_tokens <= (p.max_tokens or math.inf):
        _fail(p, "min_tokens", "must be an integer in [0, max_tokens]")
    if p.seed is not None and (not _is_int(p.seed) or not -2**63 <= p.seed < 2**64):
        _fail(p, "seed", "must be an integer in [-2**63, 2**64) or None")
    if not all(isinstance(s, str) and s for s in p.stop):
        _fail(p, "stop", "must be a non-empty string or a list of them")
    if not all(_is_int(t) for t in p.stop_token_ids):
        _fail(p, "stop_token_ids", "must be a list of integers")
    for name in ("include_stop_str_in_output", "ignore_eos", "skip_special_tokens"):
        if not isinstance(getattr(p, name), bool):
            _fail(p, name, "must be True or False")


# notebooks/01_token_generation.ipynb, cell 8
def _fail(p: SamplingParams, name: str, why: str):
    raise ValueError(f"SamplingParams.{name} {why}, got {getattr(p, name)!r}")


# notebooks/01_token_generation.ipynb, cell 9
def check_penalties(p: SamplingParams) -> None:
    if not _in_range(p.presence_penalty, -2, 2):
        _fail(p, "presence_penalty", "must be in [-2, 2] (0 turns it off)")
    if not _in_range(p.frequency_penalty, -2, 2):
        _fail(p, "frequency_penalty", "must be in [-2, 2] (0 turns it off)")
    if not _in_range(p.repetition_penalty, 0, math.inf) or p.repetition_penalty == 0:
        _fail(p, "repetition_penalty", "must be a finite number > 0 (1 turns it off)")
    bias = p.logit_bias
    if bias is not None and not (isinstance(bias, dict) and all(
            _is_int(t) and t >= 0 and _in_range(b, -100, 100) for t, b in bias.items())):
        _fail(p, "logit_bias", "must map token ids (integers >= 0) to numbers in [-100, 100]")


# notebooks/01_token_generation.ipynb, cell 9
def _in_range(x, low: float, high: float) -> bool:
    """A number (not a bool, not NaN) in [low, high]; high = math.inf still refuses inf itself."""
    return _is_number(x) and math.isfinite(x) and low <= x <= high


# notebooks/01_token_generation.ipynb, cell 9
def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# notebooks/01_token_generation.ipynb, cell 9
def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# notebooks/04a_parallel_sampling.ipynb, cell 6
def check_samples(p: SamplingParams) -> None:
    if not _is_int(p.n) or p.n < 1:
        _fail(p, "n", "must be an integer >= 1")
    if p.seed is not None and p.seed + p.n > 2**64:                              # sample i uses seed + i
        _fail(p, "seed", "leaves no room for the n samples' seeds (seed + n - 1 must be below 2**64)")


# notebooks/06_fast_sampling.ipynb, cell 45
def check_outputs(p: SamplingParams) -> None:
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(p, name)
        if value is not None and (not _is_int(value) or value < 0):
            _fail(p, name, "must be None or an integer >= 0 (alternatives returned besides the chosen token)")
    if not isinstance(p.return_sampling_mask, bool):
        _fail(p, "return_sampling_mask", "must be True or False")
