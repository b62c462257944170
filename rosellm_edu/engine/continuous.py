# Generated from notebooks/03_continuous_batching.ipynb by `python -m rosellm_edu.export`.
# Edit the notebook, not this file.

import torch

from rosellm_edu.engine.batch_attention import BatchAttention
from rosellm_edu.engine.kv_pool import KVPool, ReservingAllocator
from rosellm_edu.engine.naive import EngineBase, Prompt
from rosellm_edu.engine.scheduler import ScheduledSeq, Scheduler
from rosellm_edu.outputs import RequestOutput
from rosellm_edu.sampler import sample_token
from rosellm_edu.sampling_params import SamplingParams


class ContinuousBatchingEngine(EngineBase):
    attention_cls = BatchAttention
    pool_cls = KVPool

    def __init__(self, model: str | None = None, *, num_kv_blocks: int = 512, block_size: int = 16,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 2048, **kwargs):
        super().__init__(model, **kwargs)
        for name, value in [("num_kv_blocks", num_kv_blocks), ("block_size", block_size),
                            ("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens)]:
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{type(self).__name__} {name} must be a positive integer, got {value!r}")
        self.pool = self.pool_cls(self.model.config, num_kv_blocks, block_size, self.dtype, self.device)
        self.scheduler = self.make_scheduler(max_num_seqs, max_num_batched_tokens)

    def make_scheduler(self, max_num_seqs: int, max_num_batched_tokens: int) -> Scheduler:
        allocator = ReservingAllocator(self.pool.num_blocks, self.pool.block_size)
        return Scheduler(allocator, max_num_seqs, max_num_batched_tokens, self.max_model_len)

    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None) -> None:
        if self.scheduler.find(request_id) is not None:
            raise ValueError(f"request {request_id!r} is already running")
        seq = self.make_sequence(request_id, prompt, params)
        needed = self.scheduler.allocator.blocks_needed(self.scheduler.reservation(seq))
        if needed > self.pool.num_blocks:
            raise ValueError(f"request {request_id!r} needs {needed} KV blocks (prompt + max_tokens) but the "
                             f"engine has {self.pool.num_blocks}; lower max_tokens or raise num_kv_blocks")
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> None:
        seq = self.scheduler.find(request_id)
        if seq is None:
            raise KeyError(f"no unfinished request {request_id!r}")
        self.scheduler.remove(seq)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    @torch.no_grad()
    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if not batch:
            return []
        logits = self.forward(batch)
        self.scheduler.computed(batch)
        sampling = [s.seq for s in batch if s.samples]
        outputs = []
        for seq, token in zip(sampling, self.pick_tokens(sampling, logits)):
            seq.append_token(token, self.tokenizer, self.eos_token_ids, self.max_model_len)
            if seq.finished:
                self.scheduler.remove(seq)
            outputs.append(seq.output())
        return outputs

    def forward(self, batch: list[ScheduledSeq]) -> torch.Tensor:
        """One forward pass over the batch's new tokens; logits (sampling seqs, vocab)."""
        ids, positions, last_rows, start = [], [], [], 0
        for s in batch:
            ids += s.seq.token_ids[s.num_cached:s.num_cached + s.num_new]
            positions += range(s.num_cached, s.num_cached + s.num_new)
            start += s.num_new
            if s.samples:
                last_rows.append(start - 1)
        tables = [self.scheduler.allocator.block_tables[s.seq.request_id] for s in batch]
        ctx = self.attention_cls.build(self.pool.k, self.pool.v, self.pool.block_size, tables,
                                   [s.num_cached for s in batch], [s.num_new for s in batch])
        hidden = self.model(torch.tensor(ids, device=self.device), torch.tensor(positions, device=self.device), ctx)
        return self.model.compute_logits(hidden[last_rows])

    def pick_tokens(self, seqs, logits: torch.Tensor) -> list[int]:
        if not all(seq.params.greedy for seq in seqs):
            logits = logits.cpu()                 # one transfer: the sampler's generators live on the CPU
        greedy = logits.argmax(dim=-1).tolist()  # one device->host transfer for every greedy row
        return [greedy[i] if seq.params.greedy else sample_token(logits[i], seq.params, seq.generator or self.generator)
                for i, seq in enumerate(seqs)]
