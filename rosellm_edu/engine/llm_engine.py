# Generated from notebooks/06_fast_sampling.ipynb by `python -m rosellm_edu.export`.
# Edit the notebook, not this file.

import torch

from rosellm_edu.batch_sampler import sample
from rosellm_edu.engine.paged_engine import PagedEngine
from rosellm_edu.sequence import Sequence


class LLMEngine(PagedEngine):
    """The engine `LLM` runs: chapter 04's paged engine, picking tokens with chapter 06's batched sampler."""

    def pick_tokens(self, seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        """Every sampling row at once, one device->host transfer; records masks for the requests that ask."""
        out = sample(logits, [seq.params for seq in seqs], [seq.generator for seq in seqs], self.generator)
        for seq, mask, logz in zip(seqs, out.sampling_masks, out.sampling_logz):
            if seq.params.return_sampling_mask:
                seq.record_sampling_mask(mask, logz)
        return out.token_ids
