# Generated from notebooks/12_speculative_decoding.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import torch

from rosellm_edu.engine.block_manager import BlockManager
from rosellm_edu.engine.kv_cache import KVCache
from rosellm_edu.engine.model_runner import ModelRunner
from rosellm_edu.engine.scheduler import ScheduledSeq
from rosellm_edu.layers.quantization import tile_for_rows
from rosellm_edu.layers.sampler import greedy_tokens
from rosellm_edu.model_loader import load_model, resolve_model


# notebooks/12_speculative_decoding.ipynb, cell 54
def load_draft_model(model: str | None, dtype: torch.dtype, device: torch.device, quantization: str | None = None):
    """The draft's weights: any checkpoint (None: the embedded model), quantized by load_model when asked. Its
    guesses are checked, so they need not be exact: in float32 its quantized Linears are tiled as a bfloat16
    model's are, for chapter 11's int8-dot loop where it measured fastest."""
    draft = load_model(resolve_model(model), dtype, device, quantization)
    return tile_for_rows(draft, torch.bfloat16) if dtype == torch.float32 else draft


# notebooks/12_speculative_decoding.ipynb, cell 54
def agreed(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# notebooks/12_speculative_decoding.ipynb, cell 55
class DraftModelProposer:
    """A smaller or quantized model guesses greedily, one batched pass per draft, through its own paged KV cache."""

    def __init__(self, model, kv_cache: KVCache, max_num_seqs: int, max_model_len: int):
        self.model = model
        self.blocks = BlockManager(kv_cache.num_blocks, kv_cache.block_size, enable_prefix_caching=False)
        self.runner = ModelRunner(model, kv_cache, max_num_seqs, max_model_len, enforce_eager=True)
        self.runner.decode_query_len = 2                    # a catch-up: the last draft and the target's next token
        self.fed: dict[str, tuple[int, list[int]]] = {}   # id -> (n, drafts): the cache holds n tokens, then these

    @torch.no_grad()
    def propose(self, seqs: list, ks: list[int]) -> dict[str, list[int]]:
        limit = {seq.request_id: k for seq, k in zip(seqs, ks) if k > 0}
        for request_id in [r for r in self.fed if r not in limit]:       # finished, preempted or not decoding
            self.forget(request_id)
        batch = [s for s in (self.catch_up(seq) for seq in seqs if seq.request_id in limit) if s is not None]
        drafts = {s.seq.request_id: [] for s in batch}
        while batch:
            logits = self.runner.run(batch, self.blocks.table)             # (len(batch), V)
            for s, token in zip(batch, greedy_tokens(logits).tolist()):    # one transfer per draft position
                drafts[s.seq.request_id].append(token)
            batch = [s for s in (self.feed(s, drafts, limit) for s in batch) if s is not None]
        return drafts

    # notebooks/12_speculative_decoding.ipynb, cell 56
    def catch_up(self, seq) -> ScheduledSeq | None:
        """The tokens of seq the draft cache lacks, as one chunk; its last logits give the first draft."""
        request_id = seq.request_id
        if request_id not in self.fed and self.blocks.allocate(seq) is None:
            return None                                                    # no room: no drafts this step
        n, fed = self.fed.get(request_id, (0, []))
        valid = min(n + agreed(fed, seq.token_slice(n, n + len(fed))), len(seq) - 1)   # accepted drafts stay valid
        if not self.blocks.ensure(seq, valid, len(seq)):
            self.forget(request_id)
            return None
        self.fed[request_id] = (len(seq), [])
        return ScheduledSeq(seq, valid, len(seq) - valid)

    # notebooks/12_speculative_decoding.ipynb, cell 56
    def feed(self, s: ScheduledSeq, drafts: dict[str, list[int]], limit: dict[str, int]) -> ScheduledSeq | None:
        """The next pass of one sequence: its newest draft in, the draft after it out; None when it has enough."""
        request_id, mine = s.seq.request_id, drafts[s.seq.request_id]
        if len(mine) >= limit[request_id] or not self.blocks.ensure(s.seq, s.end, s.end + 1):
            return None
        self.fed[request_id] = (len(s.seq), list(mine))
        return ScheduledSeq(s.seq, s.end, 1, list(mine))

    # notebooks/12_speculative_decoding.ipynb, cell 56
    def forget(self, request_id: str) -> None:
        self.blocks.free(request_id)
        self.fed.pop(request_id, None)
