# Generated from notebooks/00a_other_families.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import torch
from torch import nn
from transformers import PretrainedConfig

from rosellm_edu.models.llama import LlamaForCausalLM
from rosellm_edu.models.mistral import within_sliding_window


# notebooks/00a_other_families.ipynb, cell 9
class Qwen2ForCausalLM(LlamaForCausalLM):
    def __init__(self, config: PretrainedConfig):
        super().__init__(within_sliding_window(config))
        for layer in self.model.layers:           # a bias on q, k and v; none on o_proj
            qkv = layer.self_attn.qkv_proj
            qkv.bias = nn.Parameter(torch.zeros(qkv.out_features))
