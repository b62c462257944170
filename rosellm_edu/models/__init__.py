"""Our model implementations, chosen by the checkpoint config's `model_type`."""

from transformers import PretrainedConfig


def model_class(config: PretrainedConfig):
    from rosellm_edu.models.gpt2 import GPT2ForCausalLM
    from rosellm_edu.models.llama import LlamaForCausalLM

    classes = {"llama": LlamaForCausalLM, "gpt2": GPT2ForCausalLM}
    if config.model_type not in classes:
        raise ValueError(f"model_type {config.model_type!r} is not supported; rosellm_edu implements "
                         f"{sorted(classes)} (GPT-2 and the Llama family)")
    return classes[config.model_type]
