# Generated from notebooks/02_kv_cache.ipynb by `python -m rosellm_edu.export`.
# Edit the notebook, not this file.

import torch

from rosellm_edu.engine.naive import NaiveEngine
from rosellm_edu.kv_cache import ContiguousKVCache
from rosellm_edu.sequence import Sequence


class CachedEngine(NaiveEngine):
    def __init__(self, model: str | None = None, **kwargs):
        super().__init__(model, **kwargs)
        self.caches: dict[str, ContiguousKVCache] = {}

    def next_token_logits(self, seq: Sequence) -> torch.Tensor:
        cache = self.caches.get(seq.request_id)
        if cache is None:  # prefill: the whole prompt in one forward pass
            max_len = min(len(seq) + seq.params.max_tokens, self.max_model_len)
            cache = self.caches[seq.request_id] = ContiguousKVCache(self.model.config, max_len, self.dtype,
                                                                    self.device)
            new_tokens = torch.tensor(seq.token_ids, device=self.device)
        else:              # decode: only the token sampled last step
            new_tokens = torch.tensor(seq.token_ids[-1:], device=self.device)
        hidden = cache.extend(self.model, new_tokens)
        return self.model.compute_logits(hidden[-1])

    def release(self, seq: Sequence) -> None:
        self.caches.pop(seq.request_id, None)
