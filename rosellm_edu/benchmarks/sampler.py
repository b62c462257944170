"""python -m rosellm_edu.benchmarks.sampler: chapter 01's full-sort filters vs chapter 06's batched sampler on
[B, V] logits, side by side in one run, as a table (and optionally JSON).

The logits are random normal times --logit-scale (default 5): top-p 0.9 then keeps a few dozen tokens per row,
close to a small model's real next-token distributions (chapter 06 counts them on SmolLM2)."""

import argparse
import json
import statistics
import sys
from datetime import datetime, timezone

import torch

from rosellm_edu.layers import sampler
from rosellm_edu.benchmarks.machine import describe
from rosellm_edu.sampling_params import SamplingParams
from rosellm_edu.timing import median_time

SETTINGS = {
    "greedy": SamplingParams(temperature=0),
    "top-k 40": SamplingParams(top_k=40),
    "top-k 40 + top-p 0.9": SamplingParams(top_k=40, top_p=0.9),
    "top-p 0.9": SamplingParams(top_p=0.9),
}


def full_sort(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> list[int]:
    """Chapter 01's filters on the whole batch at once: a sort of the whole vocabulary whenever top-p is on."""
    if params.greedy:
        return logits.argmax(dim=-1).tolist()
    probs = sampler.filtered_logits(logits, params).softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1).tolist()


def fast(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> list[int]:
    rows = logits.shape[0]
    return sampler.sample(logits, [params] * rows, [None] * rows, generator).token_ids


def side_by_side_ms(fns: dict, repeat: int) -> dict[str, float]:
    """Median time of each function in ms over `repeat` rounds after a warm-up, the runs interleaved so that a busy
    moment of a shared machine hits all."""
    for fn in fns.values():
        fn()                                               # warm-up
    times = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            times[name].append(1e3 * median_time(fn, repeat=1, warmup=0))
    return {name: statistics.median(ms) for name, ms in times.items()}


def run(batch_sizes: list[int], vocab_sizes: list[int], scale: float, repeat: int, device: torch.device) -> list[dict]:
    rows, generator = [], torch.Generator(device).manual_seed(0)
    for vocab in vocab_sizes:
        for batch in batch_sizes:
            logits = (torch.randn(batch, vocab, generator=torch.Generator().manual_seed(batch)) * scale).to(device)
            for name, params in SETTINGS.items():
                slow_ms, fast_ms = side_by_side_ms({"full sort": lambda: full_sort(logits, params, generator),
                                                    "fast": lambda: fast(logits, params, generator)}, repeat).values()
                rows.append(dict(vocab=vocab, batch=batch, setting=name, full_sort_ms=slow_ms, fast_ms=fast_ms,
                                 speedup=slow_ms / fast_ms))
                print(f"V={vocab:>6} B={batch:>4} {name:<22} full sort {slow_ms:9.2f} ms   fast {fast_ms:8.2f} ms   "
                      f"{slow_ms / fast_ms:6.1f}x", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,8,64,256")
    parser.add_argument("--vocab-sizes", default="49152,50257")
    parser.add_argument("--logit-scale", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds per cell; the median is reported")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", help="also write the rows, machine and date to this file")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    print(f"Machine: {describe(device)}; {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    rows = run([int(b) for b in args.batch_sizes.split(",")], [int(v) for v in args.vocab_sizes.split(",")],
               args.logit_scale, args.repeat, device)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(machine=describe(device), date=datetime.now(timezone.utc).isoformat(), rows=rows,
                           logit_scale=args.logit_scale, command=" ".join(["python -m rosellm_edu.benchmarks.sampler",
                                                                           *sys.argv[1:]])), f, indent=1)


if __name__ == "__main__":
    main()
