"""Speculative decoding against plain decoding, on the same requests in the same run (chapter 12).

    python -m rosellm_edu.benchmarks.speculative --methods ngram,draft_model --batch-sizes 1,8 --json spec.json
    python -m rosellm_edu.benchmarks.speculative --batch-sizes 1,8 --disable-by-batch-size 4

Two workloads: `repetitive` (rewrite or summarise a given text: the output copies long runs of the prompt, where
prompt lookup shines) and `free` (open-ended generation, where only a draft model can guess). Greedy, EOS ignored,
so every engine emits the same number of tokens; the script reports the share of requests whose output equals plain
decoding's (all of them in float32; in bfloat16 a chunk's sums run in another order than a decode's, and a near-tie
can flip). For each (workload, batch size, method): completion tokens/s, speed-up over plain decoding, acceptance
rate and mean accepted length (tokens a speculating sequence gains per step). Times are medians of `rounds` rounds
after a warm-up, each round serving the requests with every engine in turn. With --disable-by-batch-size N, each
method also runs, at batch sizes above N, as "METHOD off>N": the same engine with vLLM's disable_by_batch_size=N.
"""

from __future__ import annotations

import argparse
import json
import time

import statistics

from rosellm_edu.benchmarks.machine import machine_line
from rosellm_edu.llm import LLM
from rosellm_edu.sampling_params import SamplingParams

TEXT = ("The river town woke slowly. Fishermen pulled their boats onto the grey sand, the baker opened his shutters, "
        "and the old bell in the square rang seven times. Children ran past the market stalls, where farmers laid "
        "out apples, cheese and bread. By noon the square was full of voices, and by evening it was quiet again.")
REPETITIVE = [f"Rewrite the following text, changing nothing but the word '{w}' to '{v}'.\n\n{TEXT}\n\nRewritten text:\n"
              for w, v in [("town", "village"), ("boats", "nets"), ("apples", "pears"), ("baker", "butcher")]] + \
             [f"Copy this paragraph exactly, then stop.\n\n{TEXT}\n\nCopy:\n",
              f"Summarise the text, quoting its sentences.\n\n{TEXT}\n\nSummary:\n",
              f"Fix the punctuation of this text and return it whole.\n\n{TEXT.replace(',', '')}\n\nFixed text:\n",
              f"Translate this text into plain English, keeping every sentence.\n\n{TEXT}\n\nText:\n"]
FREE = ["Write a short story about a lighthouse keeper.", "Explain how a bicycle works.",
        "Describe your favourite season and why.", "Give advice to someone learning to cook.",
        "What makes a good teacher?", "Tell me about the history of bread.", "Why is the sky blue?",
        "Write a letter to a friend who moved away."]
WORKLOADS = {"repetitive": REPETITIVE, "free": FREE}


def speculative_config(method: str, k: int, quantization: str | None, disable: int | None = None) -> dict | None:
    if method == "none":
        return None
    if method == "ngram":
        config = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    else:
        config = {"method": "draft_model", "model": None, "num_speculative_tokens": k, "quantization": quantization}
    return config if disable is None else {**config, "disable_by_batch_size": disable}


def engines(methods: list[str], k: int, quantization: str | None, dtype: str, model: str | None,
            disable: int | None) -> dict[str, LLM]:
    """name -> engine: plain decoding ("none") first, each method, and each method with disable_by_batch_size
    ("METHOD off>N")."""
    def build(method, off=None):
        return LLM(model, dtype=dtype, speculative_config=speculative_config(method, k, quantization, off))

    methods = [m for m in methods if m != "none"]
    out = {m: build(m) for m in ["none"] + methods}
    if disable is not None:
        out |= {f"{m} off>{disable}": build(m, disable) for m in methods}
    return out


def timed_generate(llm: LLM, prompts: list[str], batch_size: int, max_tokens: int) -> tuple[float, list]:
    """Seconds to serve the prompts batch_size at a time, and their token ids."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outputs, start = [], time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        outputs += llm.generate(prompts[i:i + batch_size], params, use_tqdm=False)
    return time.perf_counter() - start, [o.outputs[0].token_ids for o in outputs]


def timed_rounds(llms: dict[str, LLM], prompts: list[str], batch_size: int, max_tokens: int,
                 rounds: int) -> dict[str, tuple[float, list]]:
    """name -> (median seconds over `rounds` rounds, each serving the prompts with every engine in turn after a
    warm-up, the token ids), each engine's speculation counters covering these rounds only."""
    from rosellm_edu.spec_decode.metrics import SpecDecodingStats    # chapter 12's; its prompts load before it

    for llm in llms.values():                                       # warm-up: kernels, allocations
        timed_generate(llm, prompts, batch_size, 8)
        llm.llm_engine.spec_decoding_stats = SpecDecodingStats()
    times, ids = {name: [] for name in llms}, {}
    for _ in range(rounds):
        for name, llm in llms.items():
            seconds, ids[name] = timed_generate(llm, prompts, batch_size, max_tokens)
            times[name].append(seconds)
    return {name: (statistics.median(times[name]), ids[name]) for name in llms}


def measure(methods: list[str], batch_sizes: list[int], workloads: list[str], max_tokens: int, k: int,
            quantization: str | None = None, dtype: str = "auto", model: str | None = None,
            disable_by_batch_size: int | None = None, rounds: int = 3) -> list[dict]:
    """One row per (workload, batch size, method), plain decoding ("none") first, on the same requests."""
    llms = engines(methods, k, quantization, dtype, model, disable_by_batch_size)
    rows = []
    for workload in workloads:
        for batch_size in batch_sizes:
            prompts = (WORKLOADS[workload] * batch_size)[:max(batch_size, len(WORKLOADS[workload]))]
            running = {name: llm for name, llm in llms.items()
                       if "off>" not in name or batch_size > disable_by_batch_size}
            results = timed_rounds(running, prompts, batch_size, max_tokens, rounds)
            plain_seconds, plain_ids = results["none"]
            for name, (seconds, ids) in results.items():
                stats = running[name].llm_engine.spec_stats()
                rows.append({"workload": workload, "batch_size": batch_size, "method": name, "seconds": seconds,
                             "tokens_per_s": len(prompts) * max_tokens / seconds, "speedup": plain_seconds / seconds,
                             "acceptance_rate": stats["acceptance_rate"],
                             "mean_accepted_length": stats["mean_accepted_length"],
                             "same_output": sum(a == b for a, b in zip(ids, plain_ids)) / len(ids)})
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'workload':<11}{'batch':>6}  {'method':<14}{'tokens/s':>11}{'speed-up':>10}{'accepted':>10}"
             f"{'mean len':>10}  same output as plain"]
    for r in rows:
        lines.append(f"{r['workload']:<11}{r['batch_size']:>6}  {r['method']:<14}{r['tokens_per_s']:>5.1f} tok/s"
                     f"{r['speedup']:>9.2f}x{r['acceptance_rate']:>10.0%}{r['mean_accepted_length']:>10.2f}  "
                     f"{r['same_output']:.0%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="ngram", help="comma-separated: ngram, draft_model")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--workloads", default="repetitive,free")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--quantization", default=None, help="the draft's: int8, int4 or gguf (chapter 11)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--model", default=None)
    parser.add_argument("--disable-by-batch-size", type=int, default=None,
                        help="also run each method with this disable_by_batch_size, at batch sizes above it")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds; each row reports their median")
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args(argv)
    rows = measure(args.methods.split(","), [int(b) for b in args.batch_sizes.split(",")], args.workloads.split(","),
                   args.max_tokens, args.num_speculative_tokens, args.quantization, args.dtype, args.model,
                   args.disable_by_batch_size, args.rounds)
    print(machine_line())
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_line(), "args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
