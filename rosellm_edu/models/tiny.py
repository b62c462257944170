"""Tiny random checkpoints of a model family, saved as a hub checkpoint ships: safetensors shards with their
index, the book model's tokenizer beside them, and a generation_config.json. The appendix on other families and
its tests compare our implementation with transformers' on them."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, PretrainedConfig

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def save_tiny_checkpoint(config: PretrainedConfig, path: str | Path, seed: int = 0, max_shard_size: str = "200KB",
                         generation_config: dict | None = None) -> Path:
    """transformers' own model of `config` with random weights (seeded), saved sharded into `path`."""
    from rosellm_edu.model_loader import resolve_model

    path = Path(path)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        hf_model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        for p in hf_model.parameters():    # norms and biases start at 1 and 0: make them random too
            if p.dim() == 1:
                p.data.normal_(1.0 if p.abs().sum() == p.numel() else 0.0, 0.1)
    hf_model.generation_config = GenerationConfig(**(generation_config or {}))
    hf_model.save_pretrained(path, max_shard_size=max_shard_size)
    for name in TOKENIZER_FILES:
        shutil.copy(Path(resolve_model()) / name, path)
    return path


def logits_difference(path: str | Path, lengths=(1, 7, 33), seed: int = 0) -> tuple[float, bool]:
    """Our model and transformers' on the checkpoint in `path`, in float32, on random prompts of each length:
    (the largest |difference| of their logits, whether their argmax agrees at every position)."""
    from rosellm_edu import model_loader

    ours = model_loader.load_model(Path(path), torch.float32)
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(seed)
    worst, agree = 0.0, True
    for n in lengths:
        ids = torch.randint(0, ours.config.vocab_size, (n,), generator=g)
        with torch.no_grad():
            a = ours.compute_logits(ours(ids, torch.arange(n)))        # (n, vocab)
            b = theirs(ids[None]).logits[0]
        worst = max(worst, (a - b).abs().max().item())
        agree &= bool(torch.equal(a.argmax(-1), b.argmax(-1)))
    return worst, agree
