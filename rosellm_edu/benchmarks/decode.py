"""Benchmark the decode step, eager versus CUDA graphs: TPOT and throughput across batch sizes.

    python -m rosellm_edu.benchmarks.decode                                   # on a GPU: writes the chapter's data file
    python -m rosellm_edu.benchmarks.decode --batch-sizes 1,4 --steps 8       # on a CPU: eager only

Each model decodes --steps tokens for B sequences that already hold --context tokens of K/V (random values:
the speed of a step does not depend on them). A step is what the engine does for a decode batch: the
ModelRunner's decode (static buffers; a graph replay, or eager) and the greedy pick of the next tokens, whose
transfer to the host waits for the GPU, so the time per step is the TPOT a request sees, scheduler aside.
Models: "gpt2" (GPT-2 124M's shape, random weights) and "embedded" (SmolLM2-135M with its own weights).
On a machine without CUDA there are no graphs to capture: only eager runs, and the output says so. Each result
says how its steps were issued ("issued": "graph", "native" or "native, one region" where a CPU runner chose
appendix 11b's one C++ call a step, or "modules").

Beside the batch-1 TPOT it prints the weights-over-bandwidth floors (chapter 08): a decode step reads every weight
once, so no step can be faster than weight_bytes / the memory bandwidth. Two bandwidths are measured: a copy's
(chapter 08's, read + write) and a sum's (read only, as a decode step reads its weights; chapter 11). JSON keys: per
model "weight_bytes", "weight_floor_ms" (copy) and "weight_read_floor_ms"; in "machine", "bandwidth_gb_s" and
"read_bandwidth_gb_s".
"""

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from transformers import GPT2Config

from rosellm_edu import model_loader
from rosellm_edu.engine.kv_cache import KVCache
from rosellm_edu.engine.model_runner import ModelRunner
from rosellm_edu.engine.scheduler import ScheduledSeq
from rosellm_edu.layers.sampler import greedy_tokens
from rosellm_edu.benchmarks.machine import device_name
from rosellm_edu.models import model_class
from rosellm_edu.sampling_params import SamplingParams
from rosellm_edu.sequence import Sequence
from rosellm_edu.timing import CHOICES

DATA_FILE = Path(__file__).resolve().parents[2] / "notebooks" / "data" / "cuda_graph_decode.json"


def load(name: str, dtype: torch.dtype, device: torch.device, quantization: str | None = None):
    if name == "embedded":
        return model_loader.load_model(model_loader.resolve_model(), dtype, device, quantization)
    if name == "gpt2":
        config = GPT2Config()
        torch.manual_seed(0)
        if quantization == "gguf":
            raise ValueError("--quantization gguf reads the embedded model's GGUF; gpt2 has none")
        with torch.device(device):
            model = model_class(config)(config).to(dtype).eval()
        if quantization is None:
            return model
        from rosellm_edu.layers.quantization import quantize_model   # chapter 11's

        return quantize_model(model, quantization)
    raise ValueError(f"unknown model {name!r}; choose gpt2 or embedded")


def weight_bytes(model) -> int:
    """Bytes of weights a decode step reads: every parameter and stored buffer once (a quantized layer's packed
    weight and scales are buffers), but for an embedding table, of which a step reads a few rows, unless it is
    also the LM head (tied, or GPT-2's)."""
    head = model.lm_head if hasattr(model, "lm_head") else getattr(model, "wte", None)
    heads = set() if head is None else {t.data_ptr() for t in head.state_dict().values()}
    lookups = {m.weight.data_ptr() for m in model.modules() if isinstance(m, torch.nn.Embedding)} - heads
    tensors = {t.data_ptr(): t for t in [*model.parameters(), *model.buffers(recurse=True)]}
    stored = {t.data_ptr() for t in model.state_dict().values()}     # not the rotary tables, which are not weights
    return sum(t.numel() * t.element_size() for ptr, t in tensors.items() if ptr in stored and ptr not in lookups)


def decode_batch(num_seqs: int, context: int, length: int, block_size: int, vocab_size: int, gen):
    """num_seqs sequences holding `context` tokens, each with its own blocks for `length` tokens."""
    blocks = -(-length // block_size)
    seqs = [Sequence(str(i), None, torch.randint(vocab_size, (context,), generator=gen).tolist(), SamplingParams())
            for i in range(num_seqs)]
    return seqs, {s.request_id: list(range(i * blocks, (i + 1) * blocks)) for i, s in enumerate(seqs)}


def time_steps(runner: ModelRunner, seqs, tables, steps: int, warmup: int) -> list[float]:
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        batch = [ScheduledSeq(s, len(s) - 1, 1) for s in seqs]
        tokens = greedy_tokens(runner.run(batch, tables)).tolist()            # as the sampler; waits for the device
        for s, t in zip(seqs, tokens):
            s.output_token_ids.append(t)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def issued(runner: ModelRunner, batch_size: int) -> str:
    """How the runner issued its decode steps of batch_size rows: "graph" (CUDA), "native" or "native, one region"
    (appendix 11b's one C++ call a step, where the runner measured it faster) or "modules" (the model's forward)."""
    if runner.graphs:
        return "graph"
    plan = getattr(runner, "native_plan", None)
    choice = CHOICES.get(plan.key) if plan is not None and batch_size <= plan.max_rows else None
    return "modules" if choice is None else choice.name


def measure(model, batch_sizes: list[int], context: int, steps: int, warmup: int, block_size: int) -> list[dict]:
    """Eager and (on a GPU) graph decode of `model` at every batch size, on one KV pool."""
    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    length = context + warmup + steps
    max_len = getattr(model.config, "max_position_embeddings", None) or model.config.n_positions
    if length > max_len:
        raise ValueError(f"--context + --warmup + --steps = {length} exceeds the model's {max_len} positions")
    max_bs = max(batch_sizes)
    pool = KVCache(model.config, max_bs * -(-length // block_size), block_size, dtype, device)
    torch.manual_seed(0)
    pool.k.normal_(), pool.v.normal_()                 # not zeros: a real cache holds real numbers
    gen = torch.Generator().manual_seed(0)
    modes = {"eager": ModelRunner(model, pool, max_bs, max_len, enforce_eager=True)}
    if device.type == "cuda":
        modes["graph"] = ModelRunner(model, pool, max_bs, max_len)
    results = []
    for mode, runner in modes.items():
        for bs in batch_sizes:
            seqs, tables = decode_batch(bs, context, length, block_size, model.config.vocab_size, gen)
            tpot = statistics.median(time_steps(runner, seqs, tables, steps, warmup))
            way = issued(runner, bs)
            results.append({"mode": mode, "batch_size": bs, "tpot_ms": 1e3 * tpot, "throughput_tok_s": bs / tpot,
                            "issued": way})
            print(f"  {mode:>5} batch {bs:4d}: TPOT {1e3 * tpot:8.2f} ms, {bs / tpot:10.1f} tokens/s "
                  f"(steps issued by {way})", flush=True)
    return results


def machine(device: torch.device) -> dict:
    return {"device": device_name(device), "device_type": device.type, "torch": torch.__version__, "cuda": torch.version.cuda,
            "platform": platform.platform(), "threads": torch.get_num_threads(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "cuda_graphs": "captured" if device.type == "cuda" else "unavailable: no CUDA device",
            "command": " ".join(["python -m rosellm_edu.benchmarks.decode", *sys.argv[1:]])}


def main(argv=None) -> dict:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(prog="python -m rosellm_edu.benchmarks.decode", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2,embedded", help="comma list of gpt2, embedded")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64" if cuda else "1,4")
    parser.add_argument("--context", type=int, default=256, help="tokens each sequence holds before decoding")
    parser.add_argument("--steps", type=int, default=64 if cuda else 8, help="timed decode steps")
    parser.add_argument("--warmup", type=int, default=8 if cuda else 2)
    parser.add_argument("--dtype", default="bfloat16" if cuda else "float32", choices=["float32", "bfloat16"])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--quantization", default=None, choices=[m for m in model_loader.QUANTIZATION_METHODS if m],
                        help="chapter 11's weights")
    parser.add_argument("--out", default=str(DATA_FILE) if cuda else None,
                        help=f"write the results as JSON (default on a GPU: {DATA_FILE.relative_to(DATA_FILE.parents[2])})")
    args = parser.parse_args(argv)

    from rosellm_edu.benchmarks.roofline import memory_bandwidth, memory_read_bandwidth

    device = torch.device("cuda" if cuda else "cpu")
    report = {"machine": machine(device), "args": vars(args), "models": []}
    bandwidth, read_bandwidth = memory_bandwidth(device=device), memory_read_bandwidth(device=device)
    report["machine"]["bandwidth_gb_s"] = bandwidth / 1e9
    report["machine"]["read_bandwidth_gb_s"] = read_bandwidth / 1e9
    print(f"Machine: {report['machine']['device']}, torch {torch.__version__}, CUDA graphs "
          f"{report['machine']['cuda_graphs']}, memory bandwidth {bandwidth / 1e9:.1f} GB/s (copy), "
          f"{read_bandwidth / 1e9:.1f} GB/s (read)")
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    for name in args.models.split(","):
        model = load(name, getattr(torch, args.dtype), device, args.quantization)
        print(f"{name} ({weight_bytes(model) / 1e6:.0f} MB of weights, {args.dtype}, quantization {args.quantization}):")
        with torch.no_grad():
            results = measure(model, batch_sizes, args.context, args.steps, args.warmup, args.block_size)
        floor_ms, read_floor_ms = (1e3 * weight_bytes(model) / b for b in (bandwidth, read_bandwidth))
        for r in (r for r in results if r["batch_size"] == 1):
            print(f"  {r['mode']:>5} batch 1: TPOT {r['tpot_ms']:.2f} ms, weights-over-bandwidth floor "
                  f"{floor_ms:.2f} ms copy ({r['tpot_ms'] / floor_ms:.1f}x), {read_floor_ms:.2f} ms read "
                  f"({r['tpot_ms'] / read_floor_ms:.1f}x)")
        report["models"].append({"model": name, "dtype": args.dtype, "quantization": args.quantization,
                                 "weight_bytes": weight_bytes(model), "weight_floor_ms": floor_ms,
                                 "weight_read_floor_ms": read_floor_ms, "results": results})
        del model
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print("wrote", args.out)
    return report


if __name__ == "__main__":
    main()
