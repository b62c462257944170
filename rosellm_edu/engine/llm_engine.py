# Generated from notebooks/06_fast_sampling.ipynb by `python -m rosellm_edu.export`.
# Edit the notebook, not this file.

import torch

from rosellm_edu.batch_sampler import sample
from rosellm_edu.engine.model_runner import KVPoolWithScratch, ModelRunner
from rosellm_edu.engine.naive import Prompt
from rosellm_edu.engine.paged_engine import PagedEngine
from rosellm_edu.engine.scheduler import ScheduledSeq
from rosellm_edu.sampling_params import SamplingParams
from rosellm_edu.sequence import Sequence


class LLMEngine(PagedEngine):
    """The engine `LLM` runs: chapter 04's paged engine, decoding through chapter 05's ModelRunner and picking
    tokens with chapter 06's batched sampler."""

    pool_cls = KVPoolWithScratch
    returns_sampling_masks = True

    def __init__(self, model: str | None = None, *, enforce_eager: bool = False, **kwargs):
        super().__init__(model, **kwargs)
        self.runner = ModelRunner(self.model, self.pool, self.scheduler.max_num_seqs, self.max_model_len,
                                  enforce_eager=enforce_eager)
        # the sampler draws its noise where the logits are, so the generators live there too
        self.generator = torch.Generator(self.device).manual_seed(self.generator.initial_seed())

    def make_sequence(self, request_id: str, prompt: Prompt, params: SamplingParams | None) -> Sequence:
        seq = super().make_sequence(request_id, prompt, params)
        if seq.generator is not None:
            seq.generator = torch.Generator(self.device).manual_seed(seq.params.seed)
        return seq

    def forward(self, batch: list[ScheduledSeq]) -> torch.Tensor:
        if self.runner.can_run(batch):
            return self.runner.execute(batch, self.scheduler.allocator.block_tables)
        return super().forward(batch)

    def pick_tokens(self, seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        """Every sampling row at once, one device->host transfer; records masks for the requests that ask."""
        out = sample(logits, [seq.params for seq in seqs], [seq.generator for seq in seqs], self.generator)
        for seq, mask, logz in zip(seqs, out.sampling_masks, out.sampling_logz):
            if seq.params.return_sampling_mask:
                seq.record_sampling_mask(mask, logz)
        return out.token_ids
