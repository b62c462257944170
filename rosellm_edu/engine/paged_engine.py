# Generated from notebooks/04_paged_attention.ipynb by `python -m rosellm_edu.export`.
# Edit the notebook, not this file.

from rosellm_edu.engine.block_manager import BlockManager
from rosellm_edu.engine.continuous import ContinuousBatchingEngine
from rosellm_edu.engine.paged_attention import PagedAttention
from rosellm_edu.engine.paged_scheduler import PagedScheduler


class PagedEngine(ContinuousBatchingEngine):
    """Continuous batching over a paged KV cache with prefix caching and preemption."""

    attention_cls = PagedAttention

    def __init__(self, model: str | None = None, *, num_kv_blocks: int = 2048, enable_prefix_caching: bool = True,
                 **kwargs):
        self.enable_prefix_caching = enable_prefix_caching
        super().__init__(model, num_kv_blocks=num_kv_blocks, **kwargs)

    def make_scheduler(self, max_num_seqs: int, max_num_batched_tokens: int) -> PagedScheduler:
        blocks = BlockManager(self.pool.num_blocks, self.pool.block_size, self.enable_prefix_caching)
        return PagedScheduler(blocks, max_num_seqs, max_num_batched_tokens, self.max_model_len)

    def kv_cache_stats(self) -> dict:
        """total_blocks, free_blocks, cached_blocks (free but holding a reusable prefix), prefix_hit_rate."""
        return self.scheduler.allocator.stats()
