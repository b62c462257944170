# Generated from notebooks/01_token_generation.ipynb, notebooks/01a_logits_processors.ipynb, notebooks/02_kv_cache.ipynb, notebooks/03_continuous_batching.ipynb, notebooks/04_paged_attention.ipynb, notebooks/04a_parallel_sampling.ipynb, notebooks/05_cuda_graphs.ipynb, notebooks/06_fast_sampling.ipynb, notebooks/06a_logprobs.ipynb, notebooks/08_where_the_time_goes.ipynb, notebooks/11_weight_only_quantization.ipynb, notebooks/12_speculative_decoding.ipynb, notebooks/13_structured_output.ipynb, notebooks/13b_model_checkpoints.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import contextlib
import itertools
import logging
from pathlib import Path
from typing import Iterable

import torch

from rosellm_edu.engine.block_manager import BlockManager
from rosellm_edu.engine.kv_cache import KVCache, block_bytes, blocks_in_budget
from rosellm_edu.engine.model_runner import ModelRunner, table_rows
from rosellm_edu.engine.parallel_sampling import child_id, sample_params
from rosellm_edu.engine.scheduler import ScheduledSeq, Scheduler
from rosellm_edu.generation_config import diff_sampling_params, generation_eos_ids, read_generation_config
from rosellm_edu.layers.logits_processors import ProcessorState, apply_kept_processors
from rosellm_edu.layers.paged_attention import PagedAttention
from rosellm_edu.layers.sampler import logprob_dict, logprob_table, sample
from rosellm_edu.model_loader import load_model, load_tokenizer, resolve_model
from rosellm_edu.outputs import Logprob, RequestOutput
from rosellm_edu.sampling_params import SamplingParams
from rosellm_edu.sequence import Sequence
from rosellm_edu.spec_decode.config import SpeculativeConfig
from rosellm_edu.spec_decode.draft_model_proposer import DraftModelProposer, load_draft_model
from rosellm_edu.spec_decode.metrics import SpecDecodingStats
from rosellm_edu.spec_decode.ngram_proposer import NgramProposer
from rosellm_edu.spec_decode.rejection_sampler import accepted_count
from rosellm_edu.structured_output.backend import XgrammarBackend
from rosellm_edu.structured_output.manager import StructuredOutputManager
from rosellm_edu.timing import choose


# notebooks/01_token_generation.ipynb, cell 33
Prompt = str | dict   # a string, or {"prompt_token_ids": [...]} for callers that tokenize themselves


# notebooks/02_kv_cache.ipynb, cell 29
def matmul_dtype_choice():
    """Time one decoder-sized matmul in both dtypes on this CPU: whether bfloat16 pays depends on the CPU
    (native bfloat16 units or not), and measuring is the one way to know. Measured once per process."""
    a, b = torch.randn(256, 1024), torch.randn(1024, 1024)
    a16, b16 = a.bfloat16(), b.bfloat16()
    return choose("cpu matmul dtype", {"float32": lambda: a @ b, "bfloat16": lambda: a16 @ b16})


# notebooks/02_kv_cache.ipynb, cell 29
def bfloat16_is_faster_here() -> bool:
    return matmul_dtype_choice().name == "bfloat16"


# notebooks/02_kv_cache.ipynb, cell 29
def as_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """"auto": bfloat16 on a GPU, and on a CPU where its bfloat16 matmul beats float32; float32 otherwise."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        faster = device.type == "cuda" or (device.type == "cpu" and bfloat16_is_faster_here())
        return torch.bfloat16 if faster else torch.float32
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be 'auto', 'float32', 'bfloat16' or 'float16', got {dtype!r}")
    return getattr(torch, dtype)


# notebooks/01_token_generation.ipynb, cell 34
class LLMEngine:
    """Requests in, outputs out, one step at a time: add_request(), then step() until
    has_unfinished_requests() is False."""

    # notebooks/13b_model_checkpoints.ipynb, cell 8
    def __init__(self, model: str | None = None, *, dtype: str | torch.dtype = "auto", seed: int = 0,
                 device: str | torch.device | None = None, block_size: int = 16, num_kv_blocks: int | None = None,
                 kv_cache_memory_bytes: int | None = None, gpu_memory_utilization: float = 0.9,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 2048, enable_prefix_caching: bool = True,
                 enforce_eager: bool = False, max_model_len: int | None = None, quantization: str | None = None,
                 scheduling_policy: str = "fcfs", prompt_logprobs_chunk: int = 512, speculative_config: dict | None = None,
                 max_grammar_bytes: int = 65536, generation_config: str = "auto"):
        check_sizes(block_size=block_size, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                    num_kv_blocks=num_kv_blocks, max_model_len=max_model_len, prompt_logprobs_chunk=prompt_logprobs_chunk,
                    max_grammar_bytes=max_grammar_bytes)
        spec = None if speculative_config is None else SpeculativeConfig.from_dict(speculative_config)   # before loading
        self.load(model, dtype, device, quantization)
        self.set_generation_config(resolve_model(model), generation_config)
        if max_model_len is not None:   # a shorter context than the model's, as vLLM's max_model_len
            if max_model_len > self.max_model_len:
                raise ValueError(f"LLMEngine max_model_len={max_model_len} is longer than the model's context "
                                 f"({self.max_model_len} tokens)")
            self.max_model_len = max_model_len
        config = self.model.config
        draft = None if spec is None or spec.method == "ngram" else self.load_draft(spec, model)   # weights first
        kv_bytes = self.kv_bytes(kv_cache_memory_bytes, gpu_memory_utilization, max_num_batched_tokens, max_num_seqs,
                                 block_size)
        if draft is not None and kv_bytes is not None:   # the draft's cache has as many blocks: split the bytes
            target, drafted = block_bytes(config, block_size, self.dtype), block_bytes(draft.config, block_size, self.dtype)
            kv_bytes = kv_bytes * target // (target + drafted)
        num_blocks = num_kv_blocks or blocks_in_budget(config, block_size, self.dtype, self.device, kv_bytes,
                                                       gpu_memory_utilization)
        self.kv_cache = KVCache(config, num_blocks, block_size, self.dtype, self.device)
        self.scheduler = Scheduler(BlockManager(num_blocks, block_size, enable_prefix_caching), max_num_seqs,
                                   max_num_batched_tokens, scheduling_policy, prompt_logprobs_chunk)
        self.runner = ModelRunner(self.model, self.kv_cache, max_num_seqs, self.max_model_len, enforce_eager=enforce_eager)
        self.generator = torch.Generator(self.device).manual_seed(seed)   # the sampler's, where the logits are
        self.speculative_config, self.spec_decoding_stats = spec, SpecDecodingStats()
        self.proposer = None if spec is None else self.make_proposer(spec, draft)
        self.structured = StructuredOutputManager(
            lambda: XgrammarBackend(self.tokenizer, self.vocab_size, sorted(self.eos_token_ids)), max_grammar_bytes)

    # notebooks/11_weight_only_quantization.ipynb, cell 97
    def load(self, model: str | None, dtype: str | torch.dtype, device: str | torch.device | None,
             quantization: str | None = None) -> None:
        """The model (its Linears quantized, or read from the GGUF as they ship) and tokenizer, and what the engine
        needs to know of them."""
        path = resolve_model(model)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r} was asked for, but torch sees no CUDA device here")
        self.dtype = as_dtype(dtype, self.device)
        self.model = load_model(path, self.dtype, self.device, quantization)
        self.tokenizer = load_tokenizer(path)
        config = self.model.config
        self.vocab_size = config.vocab_size
        self.max_model_len = getattr(config, "max_position_embeddings", None) or config.n_positions
        eos = getattr(config, "eos_token_id", None)
        self.eos_token_ids = set(eos if isinstance(eos, list) else [eos]) | {self.tokenizer.eos_token_id}
        self.eos_token_ids.discard(None)

    # notebooks/01_token_generation.ipynb, cell 36
    def tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer(prompt).input_ids
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return prompt.get("prompt"), list(prompt["prompt_token_ids"])
        raise ValueError(f"a prompt is a string or {{'prompt_token_ids': [...]}}, got {type(prompt).__name__}")

    # notebooks/13_structured_output.ipynb, cell 40
    def make_sequence(self, request_id: str, prompt: Prompt, params: SamplingParams | None) -> Sequence:
        """Tokenize and check a request; a bad one raises ValueError naming what is wrong."""
        text, ids = self.tokenize(prompt)
        if not ids:
            raise ValueError(f"request {request_id!r}: the prompt is empty")
        if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in ids):
            raise ValueError(f"request {request_id!r}: prompt token ids must be integers in [0, {self.vocab_size})")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"request {request_id!r}: the prompt has {len(ids)} tokens but the model's context "
                             f"holds {self.max_model_len}, leaving no room to generate")
        params = params or SamplingParams()
        self.check_params(request_id, params)
        seeded = None if params.seed is None else torch.Generator(self.device).manual_seed(params.seed)
        seq = Sequence(request_id, text, ids, params, generator=seeded)
        seq.processors = ProcessorState.build(params, ids, self.vocab_size, self.device)   # once (appendix 01a)
        if params.structured_outputs is not None:
            try:
                seq.grammar = self.structured.request(params.structured_outputs)
            except ValueError as e:
                raise ValueError(f"request {request_id!r}: SamplingParams.{e}") from None
        return seq

    # notebooks/04a_parallel_sampling.ipynb, cell 46
    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None,
                    priority: int = 0) -> None:
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"request {request_id!r}: priority must be an integer, got {priority!r}")
        if self.scheduler.find(request_id) is not None or request_id in self.scheduler.parents:     # or its samples still run
            raise ValueError(f"request {request_id!r} is already running")
        seq = self.make_sequence(request_id, prompt, params)
        # A sequence that cannot fit alone in the whole cache would preempt itself forever.
        longest = min(len(seq) + (seq.params.max_tokens or self.max_model_len), self.max_model_len)  # None: the context
        needed = self.scheduler.block_manager.blocks_needed(longest)
        if needed > self.kv_cache.num_blocks:
            raise ValueError(f"request {request_id!r} needs {needed} KV blocks at its longest (prompt + max_tokens) "
                             f"but the cache has {self.kv_cache.num_blocks}; lower max_tokens or give the cache "
                             "more memory")
        if seq.params.n > self.scheduler.max_num_seqs:
            raise ValueError(f"request {request_id!r} asks for n={seq.params.n} samples but the engine runs at most "
                             f"max_num_seqs={self.scheduler.max_num_seqs} sequences at once")
        self.scheduler.add(seq, priority)

    # notebooks/04a_parallel_sampling.ipynb, cell 46
    def abort_request(self, request_id: str | Iterable[str]) -> None:
        """Abort one request or several, all n samples of each; an unknown or finished id is ignored, as vLLM
        does: a caller racing the engine (a client leaving as its request finishes) must not crash it."""
        for rid in [request_id] if isinstance(request_id, str) else request_id:
            self.scheduler.abort(rid)

    # notebooks/03_continuous_batching.ipynb, cell 34
    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # notebooks/13_structured_output.ipynb, cell 43
    @torch.no_grad()
    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule(self.propose())                         # drafts to verify
        if not batch:
            self.structured.wait_for_grammars(self.scheduler.waiting)          # still compiling
            return []
        self.kv_cache.copy_blocks(self.scheduler.block_manager.take_copies())  # copy-on-write, before any write
        logits = self.forward(batch)                                            # (sampled positions, vocab)
        self.scheduler.computed(batch)
        sampling = [s for s in batch if s.samples]
        seqs, rows = self.fork_samples([s.seq for s in sampling])               # n > 1
        drafts = [sampling[r].draft_token_ids if seq is sampling[r].seq else [] for seq, r in zip(seqs, rows)]
        first = [0] + list(itertools.accumulate(len(s.logit_positions) for s in sampling))
        index = [first[r] + j for r, d in zip(rows, drafts) for j in range(1 + len(d))]
        if len(seqs) > len(sampling):                                           # a fork reads its parent's row
            logits = logits[torch.tensor(index, device=logits.device)]          # (rows, vocab)
        for seq, draft, picked in zip(seqs, drafts, self.pick_tokens(seqs, logits, drafts)):
            appended = self.append_tokens(seq, picked)
            self.spec_decoding_stats.observe(len(draft), len(picked) - 1)
            if draft and not seq.finished:
                self.scheduler.accept(seq, appended - 1)
        outputs = self.request_outputs(seqs)                                    # one per request
        for seq in seqs:
            if seq.finished:
                self.scheduler.remove(seq)
        return outputs

    # notebooks/12_speculative_decoding.ipynb, cell 47
    def forward(self, batch: list[ScheduledSeq]) -> torch.Tensor:
        """Logits (sampled positions, vocab) of one step; records the prompt logprobs this step's chunks owe."""
        owed = [prompt_logprob_positions(s) for s in batch]
        table = self.scheduler.block_manager.table                     # the tensor rows, not the lists
        with self.device_context():
            if not any(owed):
                return self.runner.run(batch, table)
            logits = self.runner.run_eager(batch, table_rows(table, batch, self.kv_cache.block_size), owed)
        sampled = sum(len(s.logit_positions) for s in batch)              # 1 + drafts per speculating row
        self.record_prompt_logprobs(batch, owed, logits[sampled:])
        return logits[:sampled]

    # notebooks/13_structured_output.ipynb, cell 44
    def pick_tokens(self, seqs: list[Sequence], logits: torch.Tensor, drafts: list[list[int]]) -> list[list[tuple]]:
        """For each sequence, from its 1 + len(drafts) rows of logits: the accepted drafts and one token after them, each
        as (token, mask, logZ, logprobs). All rows in one sampler call, one device->host transfer."""
        row_seqs = [seq for seq, d in zip(seqs, drafts) for _ in range(1 + len(d))]
        drafted = [d[:j] for d in drafts for j in range(1 + len(d))]                 # the drafts before each row
        params = [seq.params for seq in row_seqs]
        processed = apply_kept_processors(logits, params, [s.processors for s in row_seqs],
                                          [s.output_token_ids for s in row_seqs], self.eos_token_ids, drafted)
        if any(seq.grammar is not None for seq in seqs):                            # the grammars' bitmask
            processed = processed.clone() if processed is logits else processed     # logprobs read the model's own
            self.structured.apply_bitmask(processed, seqs, drafts)
        out = sample(processed, params, [s.generator for s in row_seqs], self.generator, raw_logits=logits)
        picked, row = [], 0
        for draft in drafts:
            n = 1 + accepted_count(out.token_ids[row:row + len(draft)], draft)
            picked.append([(out.token_ids[r], out.sampling_masks[r], out.sampling_logz[r], out.logprobs[r])
                           for r in range(row, row + n)])
            row += 1 + len(draft)
        return picked

    # notebooks/04_paged_attention.ipynb, cell 75
    def kv_cache_stats(self) -> dict:
        """total_blocks, free_blocks, cached_blocks (free but holding a reusable prefix), prefix_hit_rate (new
        requests' prompt tokens found cached) and resumed_hit_rate (the same for preempted sequences readmitted)."""
        return self.scheduler.block_manager.stats()

    # notebooks/04a_parallel_sampling.ipynb, cell 43
    def fork_samples(self, sampling: list[Sequence]) -> tuple[list[Sequence], list[int]]:
        """The sequences that sample this step, each followed by the samples it forks, and each one's logits row."""
        seqs, rows = [], []
        for row, seq in enumerate(sampling):
            family = [seq] + self.fork(seq)
            seqs += family
            rows += [row] * len(family)
        return seqs, rows

    # notebooks/04a_parallel_sampling.ipynb, cell 43
    def fork(self, seq: Sequence) -> list[Sequence]:
        """Samples 1..n-1 of seq's request, the first time seq samples; [] for every other sequence and step."""
        parent = self.scheduler.parents.get(seq.request_id)
        if parent is None or parent.forked:
            return []
        prompt = {"prompt": seq.prompt, "prompt_token_ids": seq.prompt_token_ids}   # tokenized once, at add_request
        children = [self.make_sequence(child_id(seq.request_id, i), prompt, sample_params(seq.params, i))
                    for i in range(1, parent.n)]
        for child in children:
            self.scheduler.fork(seq, child)
        return children

    # notebooks/04a_parallel_sampling.ipynb, cell 43
    def request_outputs(self, seqs: list[Sequence]) -> list[RequestOutput]:
        """One RequestOutput per request that sampled: a request with n > 1 reports all its samples in one."""
        outputs = {}
        for seq in seqs:
            parent = self.scheduler.parents.get(seq.request_id)
            key = parent.request_id if parent else seq.request_id
            if key not in outputs:
                outputs[key] = parent.output() if parent else seq.output()
        return list(outputs.values())

    # notebooks/05_cuda_graphs.ipynb, cell 38
    def kv_bytes(self, kv_cache_memory_bytes: int | None, gpu_memory_utilization: float, max_num_batched_tokens: int,
                 max_num_seqs: int, block_size: int) -> int | None:
        """The KV cache's bytes: as given; on a GPU without them, gpu_memory_utilization of its memory less what is
        in use and what the largest step allocates on top; elsewhere None (chapter 04's CPU default)."""
        if self.device.type != "cuda":
            return kv_cache_memory_bytes
        step = self.profile_step(max_num_batched_tokens, max_num_seqs, block_size)   # also compiles the kernels
        if kv_cache_memory_bytes is not None:
            return kv_cache_memory_bytes
        free, total = torch.cuda.mem_get_info(self.device)
        return int(total * gpu_memory_utilization) - (total - free) - step

    # notebooks/05_cuda_graphs.ipynb, cell 40
    @torch.no_grad()
    def profile_step(self, num_tokens: int, num_rows: int, block_size: int) -> int:
        """Peak bytes a forward over num_tokens new tokens (sequences of at most the context) and the float32 softmax
        of num_rows rows of logits allocate beyond what stays, run on a scratch cache; 0 where nothing measures it."""
        lengths = [min(self.max_model_len - 1, num_tokens - s) for s in range(0, num_tokens, self.max_model_len - 1)]
        widths = [-(-n // block_size) for n in lengths]
        tables = [list(range(sum(widths[:i]), sum(widths[:i + 1]))) for i in range(len(widths))]
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device) if cuda else 0
        scratch = KVCache(self.model.config, sum(widths), block_size, self.dtype, self.device)
        with self.device_context():
            ctx = PagedAttention.build(scratch.k, scratch.v, block_size, tables, [0] * len(lengths), lengths)
            positions = torch.cat([torch.arange(n) for n in lengths]).to(self.device)            # (num_tokens,)
            hidden = self.model(torch.zeros_like(positions), positions, ctx)                     # (num_tokens, d)
            self.model.compute_logits(hidden[:num_rows]).float().softmax(dim=-1)               # (rows, vocab)
        if not cuda:
            return 0
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - before - 2 * scratch.k.nbytes
        del scratch, ctx, hidden
        torch.cuda.empty_cache()
        return max(peak, 0)

    # notebooks/05_cuda_graphs.ipynb, cell 43
    def device_context(self):
        """Make the engine's GPU the current one (graph capture and Triton launch on the current device)."""
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    # notebooks/06a_logprobs.ipynb, cell 19
    def with_text(self, logprobs: dict[int, Logprob]) -> dict[int, Logprob]:
        """Each entry's decoded_token: its id decoded alone."""
        return self.with_texts([logprobs])[0]

    # notebooks/06a_logprobs.ipynb, cell 19
    def with_texts(self, tables: list[dict[int, Logprob]]) -> list[dict[int, Logprob]]:
        """with_text for many tables at once: one batch_decode of their distinct ids."""
        ids = list({t for table in tables for t in table})
        texts = dict(zip(ids, self.tokenizer.batch_decode([[t] for t in ids])))
        for table in tables:
            for t, entry in table.items():
                entry.decoded_token = texts[t]
        return tables

    # notebooks/06a_logprobs.ipynb, cell 22
    def check_params(self, request_id: str, params: SamplingParams) -> None:
        """What SamplingParams cannot check alone: token ids inside this model's vocabulary, logprobs under the cap."""
        for name, ids in [("logit_bias", list(params.logit_bias or {})), ("stop_token_ids", params.stop_token_ids)]:
            if not all(0 <= t < self.vocab_size for t in ids):
                raise ValueError(f"request {request_id!r}: SamplingParams.{name} holds token ids outside "
                                 f"[0, {self.vocab_size}), got {sorted(t for t in ids if not 0 <= t < self.vocab_size)}")
        for name in ("logprobs", "prompt_logprobs"):
            if (getattr(params, name) or 0) > MAX_LOGPROBS:
                raise ValueError(f"request {request_id!r}: SamplingParams.{name} must be at most {MAX_LOGPROBS}, "
                                 f"got {getattr(params, name)}")

    # notebooks/06a_logprobs.ipynb, cell 35
    def record_prompt_logprobs(self, batch: list[ScheduledSeq], owed: list[range], logits: torch.Tensor) -> None:
        """logits (positions owed, V), in batch order: the table in slices of prompt_logprobs_chunk rows, so that no
        (positions, V) log-softmax is ever whole; one batch_decode for the step's texts."""
        targets = [s.seq.prompt_token_ids[p + 1] for s, span in zip(batch, owed) for p in span]
        num_top = max(s.seq.params.prompt_logprobs for s, span in zip(batch, owed) if span)
        chunk, ids = self.scheduler.prompt_logprobs_chunk, torch.tensor(targets, device=logits.device)
        table = [row for i in range(0, len(targets), chunk)                                  # (positions, 2 + 2 * top)
                 for row in logprob_table(logits[i:i + chunk], ids[i:i + chunk], num_top).tolist()]
        entries, done = [], 0                                      # (sequence, {id: Logprob}) per position
        for s, span in zip(batch, owed):
            for row, t in zip(table[done:done + len(span)], targets[done:done + len(span)]):
                entries.append((s.seq, logprob_dict(row, t, s.seq.params.prompt_logprobs)))
            done += len(span)
        self.with_texts([logprobs for _, logprobs in entries])
        for seq, logprobs in entries:
            seq.prompt_logprobs.append(logprobs)

    # notebooks/12_speculative_decoding.ipynb, cell 58
    def make_proposer(self, spec: SpeculativeConfig, draft):
        """The proposer speculative_config names; a draft model shares the target's device, dtype and block size,
        and its cache has as many blocks as the target's. The runner learns that a verifying row, a token and k
        drafts, decodes as 1 + k rows."""
        self.runner.decode_query_len = 1 + spec.num_speculative_tokens
        if spec.method == "ngram":
            return NgramProposer(spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)
        cache = KVCache(draft.config, self.kv_cache.num_blocks, self.kv_cache.block_size, self.dtype, self.device)
        return DraftModelProposer(draft, cache, self.scheduler.max_num_seqs, self.max_model_len)

    # notebooks/12_speculative_decoding.ipynb, cell 39
    def propose(self) -> dict[str, list[int]]:
        """request id -> drafts, for the running sequences that decode this step; {} without speculation, or when
        more sequences run than speculative_config's disable_by_batch_size (the batch fills the machine already)."""
        if self.proposer is None:
            return {}
        scheduler, spec = self.scheduler, self.speculative_config
        if spec.disable_by_batch_size is not None and len(scheduler.running) > spec.disable_by_batch_size:
            return {}
        k = spec.num_speculative_tokens
        decoding = [s for s in scheduler.running if scheduler.num_computed[s.request_id] == len(s) - 1]
        return self.proposer.propose(decoding, [min(k, self.tokens_left(s) - 1) for s in decoding])

    # notebooks/12_speculative_decoding.ipynb, cell 39
    def tokens_left(self, seq: Sequence) -> int:
        """The most tokens seq may still emit: up to max_tokens and to the end of the context."""
        room = self.max_model_len - len(seq)
        return room if seq.params.max_tokens is None else min(room, seq.params.max_tokens - len(seq.output_token_ids))

    # notebooks/12_speculative_decoding.ipynb, cell 39
    def spec_stats(self) -> dict:
        """Acceptance rate and mean accepted length since the engine started (vLLM's spec decoding metrics)."""
        return self.spec_decoding_stats.as_dict()

    # notebooks/13_structured_output.ipynb, cell 46
    def append_tokens(self, seq: Sequence, picked: list[tuple]) -> int:
        """Append the picked tokens, with their masks and logprobs, until one finishes the sequence; how many went in.
        A sequence with a grammar moves its matcher by each token, and finishes when the grammar does."""
        for appended, (token, mask, logz, logprobs) in enumerate(picked, 1):
            if seq.grammar is not None and not seq.grammar.accept(token):         # only if the mask left nothing
                seq.finish("stop")
                return appended - 1
            if seq.params.return_sampling_mask:
                seq.record_sampling_mask(mask, logz)
            if logprobs is not None:
                seq.record_logprobs(self.with_text(logprobs), token)
            seq.append_token(token, self.tokenizer, self.eos_token_ids, self.max_model_len)
            if seq.grammar is not None and seq.grammar.terminated and not seq.finished:   # (ignore_eos)
                seq.finish("stop", token)
            if seq.finished:                                     # EOS, a stop or max_tokens inside an accepted run
                break
        return appended

    # notebooks/12_speculative_decoding.ipynb, cell 58
    def load_draft(self, spec: SpeculativeConfig, model: str | None):
        """The draft model, loaded before the KV cache is sized (its weights use the GPU's memory too)."""
        draft = load_draft_model(spec.model or model, self.dtype, self.device, spec.quantization)
        if draft.config.vocab_size != self.vocab_size:
            raise ValueError(f"speculative_config['model']: the draft's vocabulary has {draft.config.vocab_size} "
                             f"tokens, the target's {self.vocab_size}; a draft must share the target's tokenizer")
        return draft

    # notebooks/13b_model_checkpoints.ipynb, cell 9
    def set_generation_config(self, model_dir: Path, mode: str) -> None:
        """The model's generation_config.json: its end tokens join eos_token_ids (in every mode, as in vLLM); its
        sampling defaults are kept for get_diff_sampling_param, unless mode is "vllm"."""
        generation_config = read_generation_config(model_dir, mode)
        self.eos_token_ids |= generation_eos_ids(generation_config)
        self.diff_sampling_param = diff_sampling_params(generation_config, mode)
        if self.diff_sampling_param:
            logger.warning("default sampling parameters from the model's generation_config.json: %s (pass "
                           "generation_config='vllm' to keep ours)", self.diff_sampling_param)

    # notebooks/13b_model_checkpoints.ipynb, cell 9
    def get_diff_sampling_param(self) -> dict:
        """The SamplingParams fields the model's generation_config.json sets, for requests that leave them unset."""
        return dict(self.diff_sampling_param)


# notebooks/03_continuous_batching.ipynb, cell 28
def check_sizes(**sizes: int | None) -> None:
    """The engine's sizes are positive integers; None leaves one for the engine to derive."""
    for name, value in sizes.items():
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"LLMEngine {name} must be a positive integer, got {value!r}")


# notebooks/06a_logprobs.ipynb, cell 18
MAX_LOGPROBS = 20   # the most alternatives a request may ask for, per token (vLLM's default max_logprobs)


# notebooks/06a_logprobs.ipynb, cell 26
def prompt_logprob_positions(s: ScheduledSeq) -> range:
    """The positions this step computes whose logits give a prompt logprob still owed (position p gives prompt
    token p + 1's); empty when the request did not ask."""
    recorded = s.seq.prompt_logprobs
    if recorded is None:
        return range(0)
    first = max(s.num_computed, len(recorded) - 1)      # recorded[i] is token i's: positions < len - 1 are done
    return range(first, min(s.num_computed + s.num_new, len(s.seq.prompt_token_ids) - 1))


# notebooks/13b_model_checkpoints.ipynb, cell 9
logger = logging.getLogger("rosellm_edu.engine")
