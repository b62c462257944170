# Generated from notebooks/00a_other_families.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import copy
import warnings

from transformers import PretrainedConfig

from rosellm_edu.models.llama import LlamaForCausalLM


# notebooks/00a_other_families.ipynb, cell 6
def within_sliding_window(config: PretrainedConfig) -> PretrainedConfig:
    """The config, its context cut to its sliding window where the window is shorter: within the window,
    sliding-window attention is full causal attention, the only attention we have."""
    window = getattr(config, "sliding_window", None)
    if window is None or window >= config.max_position_embeddings:
        return config
    warnings.warn(f"{config.model_type}: sliding_window={window} is shorter than max_position_embeddings="
                  f"{config.max_position_embeddings}; our attention has no sliding window, so the context is cut "
                  f"to {window} tokens (a longer max_model_len is refused)")
    config = copy.deepcopy(config)
    config.max_position_embeddings = window
    return config


# notebooks/00a_other_families.ipynb, cell 6
class MistralForCausalLM(LlamaForCausalLM):
    def __init__(self, config: PretrainedConfig):
        super().__init__(within_sliding_window(config))
