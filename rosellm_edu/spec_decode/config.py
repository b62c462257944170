# Generated from notebooks/12_speculative_decoding.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from dataclasses import dataclass

from rosellm_edu.model_loader import QUANTIZATION_METHODS


# notebooks/12_speculative_decoding.ipynb, cell 12
METHODS = ("ngram", "draft_model")


# notebooks/12_speculative_decoding.ipynb, cell 12
COMMON = {"method", "num_speculative_tokens", "disable_by_batch_size"}


# notebooks/12_speculative_decoding.ipynb, cell 12
KEYS = {"ngram": COMMON | {"prompt_lookup_max", "prompt_lookup_min"},
        "draft_model": COMMON | {"model", "quantization"}}


# notebooks/12_speculative_decoding.ipynb, cell 12
@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's speculative_config, checked: where drafts come from, and how many to verify per step."""
    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = 4          # ngram: the longest suffix looked up
    prompt_lookup_min: int = 1          # ngram: the shortest
    model: str | None = None            # draft_model: its checkpoint; None drafts with the target's own
    quantization: str | None = None     # draft_model: how load_model quantizes the draft's weights
    disable_by_batch_size: int | None = None   # no drafts in a step with more running sequences than this

    @classmethod
    def from_dict(cls, config: dict) -> "SpeculativeConfig":
        if not isinstance(config, dict):
            raise ValueError(f"speculative_config must be a dict, got {type(config).__name__}")
        method = config.get("method")
        if method not in METHODS:
            raise ValueError(f"speculative_config['method'] must be one of {METHODS}, got {method!r}")
        unknown = sorted(set(config) - KEYS[method])
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {unknown} for method {method!r}; "
                             f"its keys are {sorted(KEYS[method])}")
        spec = cls(**config)
        check_values(spec)
        return spec


# notebooks/12_speculative_decoding.ipynb, cell 13
def check_values(spec: SpeculativeConfig) -> None:
    """The sizes are positive integers, min <= max, and the quantization one load_model knows."""
    for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "disable_by_batch_size"):
        value = getattr(spec, name)
        if value is None and name == "disable_by_batch_size":
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"speculative_config['{name}'] must be a positive integer, got {value!r}")
    if spec.prompt_lookup_min > spec.prompt_lookup_max:
        raise ValueError(f"speculative_config['prompt_lookup_min'] ({spec.prompt_lookup_min}) must not exceed "
                         f"'prompt_lookup_max' ({spec.prompt_lookup_max})")
    if spec.quantization not in QUANTIZATION_METHODS:
        raise ValueError(f"speculative_config['quantization'] must be one of {QUANTIZATION_METHODS}, "
                         f"got {spec.quantization!r}")
