# Generated from notebooks/13b_model_checkpoints.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import json
from pathlib import Path


# notebooks/13b_model_checkpoints.ipynb, cell 4
# generation_config.json's name -> SamplingParams' name: the fields vLLM takes as sampling defaults
SAMPLING_DEFAULTS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                     "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


# notebooks/13b_model_checkpoints.ipynb, cell 4
GENERATION_CONFIG_MODES = ("auto", "vllm")   # or a directory holding a generation_config.json


# notebooks/13b_model_checkpoints.ipynb, cell 4
def read_generation_config(model_dir: Path, mode: str = "auto") -> dict:
    """The generation_config.json that `mode` names ("auto", "vllm": the model's own; else a directory), as a
    dict; {} when there is none."""
    folder = Path(model_dir) if mode in GENERATION_CONFIG_MODES else Path(mode)
    if mode not in GENERATION_CONFIG_MODES and not folder.is_dir():
        raise ValueError(f"generation_config must be 'auto', 'vllm' or a directory, got {mode!r}")
    file = folder / "generation_config.json"
    return json.loads(file.read_text()) if file.exists() else {}


# notebooks/13b_model_checkpoints.ipynb, cell 4
def diff_sampling_params(generation_config: dict, mode: str = "auto") -> dict:
    """The SamplingParams fields the file sets (vLLM's get_diff_sampling_param); none under mode "vllm"."""
    if mode == "vllm":
        return {}
    return {ours: generation_config[theirs] for theirs, ours in SAMPLING_DEFAULTS.items()
            if generation_config.get(theirs) is not None}


# notebooks/13b_model_checkpoints.ipynb, cell 4
def generation_eos_ids(generation_config: dict) -> set[int]:
    """The end tokens the file names: its eos_token_id, an int or a list."""
    eos = generation_config.get("eos_token_id")
    return set() if eos is None else set(eos if isinstance(eos, list) else [eos])
