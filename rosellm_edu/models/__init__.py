"""Our model implementations, chosen by the checkpoint config's `model_type`."""

import importlib

from transformers import PretrainedConfig

# model_type -> (module of rosellm_edu.models, class): chapter 00's two, and appendix 00a's other families
FAMILIES = {"llama": ("llama", "LlamaForCausalLM"), "gpt2": ("gpt2", "GPT2ForCausalLM"),
            "mistral": ("mistral", "MistralForCausalLM"), "qwen2": ("qwen2", "Qwen2ForCausalLM"),
            "qwen3": ("qwen3", "Qwen3ForCausalLM"), "phi3": ("phi3", "Phi3ForCausalLM"),
            "qwen3_moe": ("qwen3_moe", "Qwen3MoeForCausalLM")}


def model_class(config: PretrainedConfig):
    if config.model_type not in FAMILIES:
        raise ValueError(f"model_type {config.model_type!r} is not supported; rosellm_edu implements "
                         f"{sorted(FAMILIES)} (GPT-2, Llama, Mistral, Qwen2, Qwen3, Phi-3 and Qwen3-MoE)")
    module, name = FAMILIES[config.model_type]
    return getattr(importlib.import_module(f"rosellm_edu.models.{module}"), name)
