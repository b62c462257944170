# Generated from notebooks/01_token_generation.ipynb by `python -m rosellm_edu.export`.
# Edit the notebook, not this file.

from collections import deque

import torch

from rosellm_edu.model_loader import load_model, load_tokenizer, resolve_model
from rosellm_edu.outputs import RequestOutput
from rosellm_edu.sampler import sample_token
from rosellm_edu.sampling_params import SamplingParams
from rosellm_edu.sequence import Sequence, SequenceStatus

Prompt = str | dict


def as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be 'float32', 'bfloat16' or 'float16', got {dtype!r}")
    return getattr(torch, dtype)


class EngineBase:
    """What every engine shares: the model, the tokenizer, and the checks a new request must pass."""

    returns_sampling_masks = False   # chapter 06's LLMEngine is the engine that computes them

    def __init__(self, model: str | None = None, *, dtype: str | torch.dtype = "float32", seed: int = 0,
                 device: str | torch.device | None = None):
        path = resolve_model(model)
        self.dtype = as_dtype(dtype)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r} was asked for, but torch sees no CUDA device here")
        self.model = load_model(path, self.dtype, self.device)
        self.tokenizer = load_tokenizer(path)
        config = self.model.config
        self.vocab_size = config.vocab_size
        self.max_model_len = getattr(config, "max_position_embeddings", None) or config.n_positions
        eos = getattr(config, "eos_token_id", None)
        self.eos_token_ids = set(eos if isinstance(eos, list) else [eos]) | {self.tokenizer.eos_token_id}
        self.eos_token_ids.discard(None)
        self.generator = torch.Generator().manual_seed(seed)

    def tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer(prompt).input_ids
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return prompt.get("prompt"), list(prompt["prompt_token_ids"])
        raise ValueError(f"a prompt is a string or {{'prompt_token_ids': [...]}}, got {type(prompt).__name__}")

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
        if params is not None and params.return_sampling_mask and not self.returns_sampling_masks:
            raise ValueError(f"request {request_id!r}: {type(self).__name__} does not compute sampling masks "
                             "(return_sampling_mask=True); LLMEngine does")
        return Sequence(request_id, text, ids, params or SamplingParams())


class NaiveEngine(EngineBase):
    def __init__(self, model: str | None = None, **kwargs):
        super().__init__(model, **kwargs)
        self.queue: deque[Sequence] = deque()

    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None) -> None:
        if any(seq.request_id == request_id for seq in self.queue):
            raise ValueError(f"request {request_id!r} is already running")
        self.queue.append(self.make_sequence(request_id, prompt, params))

    def abort_request(self, request_id: str) -> None:
        for seq in self.queue:
            if seq.request_id == request_id:
                self.queue.remove(seq)
                self.release(seq)
                return
        raise KeyError(f"no unfinished request {request_id!r}")

    def has_unfinished_requests(self) -> bool:
        return bool(self.queue)

    @torch.no_grad()
    def step(self) -> list[RequestOutput]:
        if not self.queue:
            return []
        seq = self.queue[0]
        seq.status = SequenceStatus.RUNNING
        logits = self.next_token_logits(seq).cpu()   # the sampler's generators live on the CPU
        token = sample_token(logits, seq.params, seq.generator or self.generator)
        seq.append_token(token, self.tokenizer, self.eos_token_ids, self.max_model_len)
        if seq.finished:
            self.queue.popleft()
            self.release(seq)
        return [seq.output()]

    def next_token_logits(self, seq: Sequence) -> torch.Tensor:
        """Run the model on the whole sequence; return the last position's logits (vocab,)."""
        ids = torch.tensor(seq.token_ids, device=self.device)
        hidden = self.model(ids, torch.arange(len(ids), device=self.device))
        return self.model.compute_logits(hidden[-1])

    def release(self, seq: Sequence) -> None:
        """Free what the engine holds for a sequence that left (nothing yet; the KV cache will)."""
