# Generated from notebooks/02_kv_cache.ipynb, notebooks/03_continuous_batching.ipynb, notebooks/04_paged_attention.ipynb, notebooks/04a_parallel_sampling.ipynb, notebooks/05_cuda_graphs.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import torch


# notebooks/02_kv_cache.ipynb, cell 4
def kv_cache_shape(config) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) for a Llama-family or GPT-2 config."""
    if config.model_type == "gpt2":
        return config.n_layer, config.n_head, config.n_embd // config.n_head
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, config.num_key_value_heads, head_dim


# notebooks/03_continuous_batching.ipynb, cell 10
class KVCache:
    """The engine's KV storage: one (layers, slots, kv_heads, head_dim) tensor for K and one for V, cut into
    num_blocks blocks of block_size slots that the block manager hands out to sequences."""

    # notebooks/05_cuda_graphs.ipynb, cell 18
    def __init__(self, config, num_blocks: int, block_size: int, dtype=torch.float32, device="cpu"):
        layers, kv_heads, head_dim = kv_cache_shape(config)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.scratch_block = num_blocks         # the block after the last one the block manager hands out
        self.k = torch.zeros(layers, (num_blocks + 1) * block_size, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    # notebooks/04a_parallel_sampling.ipynb, cell 23
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole blocks src -> dst in every layer of K and V: one gather-and-scatter per tensor, on its device."""
        if not pairs:
            return
        device, bs = self.k.device, self.block_size
        blocks = torch.tensor(pairs, device=device)                                   # (pairs, 2): src, dst
        slots = (blocks[:, :, None] * bs + torch.arange(bs, device=device)).transpose(0, 1).reshape(2, -1)
        for cache in (self.k, self.v):                                               # (layers, slots, heads, dim)
            cache[:, slots[1]] = cache[:, slots[0]]                                  # reads all, then writes


# notebooks/04_paged_attention.ipynb, cell 66
def block_bytes(config, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of K and V that one block holds across all layers."""
    layers, kv_heads, head_dim = kv_cache_shape(config)
    return 2 * layers * block_size * kv_heads * head_dim * dtype.itemsize


# notebooks/04_paged_attention.ipynb, cell 66
def blocks_in_budget(config, block_size: int, dtype: torch.dtype, device: torch.device,
                     kv_cache_memory_bytes: int | None, gpu_memory_utilization: float) -> int:
    """How many KV blocks fit: on a GPU, in gpu_memory_utilization of its memory minus what is in use (the
    weights); elsewhere, in kv_cache_memory_bytes (vLLM's names for the two budgets)."""
    if kv_cache_memory_bytes is None and device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        kv_cache_memory_bytes = int(total * gpu_memory_utilization) - (total - free)
    if kv_cache_memory_bytes is None:
        kv_cache_memory_bytes = CPU_KV_CACHE_BYTES
    blocks = kv_cache_memory_bytes // block_bytes(config, block_size, dtype) - 1    # the scratch block
    if blocks < 1:
        raise ValueError(f"the KV cache budget of {kv_cache_memory_bytes} bytes holds no block of "
                         f"{block_bytes(config, block_size, dtype)} bytes; raise kv_cache_memory_bytes "
                         "or gpu_memory_utilization")
    return blocks


# notebooks/04_paged_attention.ipynb, cell 66
CPU_KV_CACHE_BYTES = 1 << 30   # 1 GiB: about 23,000 tokens of SmolLM2-135M in float32
