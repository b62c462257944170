"""Benchmark the engine against transformers on a named workload.

    python -m rosellm_edu.benchmarks.mixed --workload mixed --engines llm,transformers,naive --dtypes float32,bfloat16
    python -m rosellm_edu.benchmarks.mixed --workload mixed --engines openai --url http://127.0.0.1:8000/v1

Every configuration runs in this one process on the same requests, so the ratios it prints are side by side.
`naive` is transformers' generate called one request at a time; `transformers` pads batches of requests to
their longest prompt and runs them to their longest output, at each of --hf-batch-sizes. `openai` drives any
OpenAI-compatible server at --url (ours from `rosellm-edu serve`, or vLLM, SGLang), streaming, with the same
metrics (rosellm_edu.benchmarks.client).

Beside the metrics of rosellm_edu.benchmarks.metrics, an `llm` run reports its roofline floor (chapter 08): each
step's least time on this machine, max(FLOPs / matmul throughput, bytes / memory bandwidth), both ceilings measured
at the start of the run (rosellm_edu.benchmarks.roofline), summed over the run's steps:
- `roofline_floor_s`: the floor of the whole run, `prefill_floor_s` + `decode_floor_s`;
- `prefill_floor_s`, `decode_floor_s`: the floors of the steps that compute prompt positions (prefill chunks,
  mixed with decodes or not) and of the steps in which every sequence computes one token (decode);
- `prefill_time_s`, `decode_time_s`: the time the engine spent in `step()` for each kind of step;
- `prefill_steps`, `decode_steps`: how many steps of each kind;
- `bandwidth_gb_s`, `matmul_gflop_s`: the measured ceilings.
"""

import argparse
import asyncio
import json
import platform
import time
from datetime import datetime, timezone

import torch
from tqdm.auto import tqdm

from rosellm_edu import model_loader
from rosellm_edu.benchmarks.client import run_openai
from rosellm_edu.benchmarks.machine import device_name
from rosellm_edu.benchmarks.metrics import RequestTimes, format_summary, summarize
from rosellm_edu.sampling_params import SamplingParams
from rosellm_edu.streaming import Request, stream


def workload(name: str, num_requests: int, vocab_size: int, seed: int) -> list[tuple[list[int], int]]:
    """Seeded (prompt token ids, output length) pairs; random tokens, as vLLM's random dataset."""
    gen = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(100, vocab_size, (n,), generator=gen).tolist()  # noqa: E731
    if name == "mixed":
        prompt_lens = torch.randint(16, 257, (num_requests,), generator=gen).tolist()
        output_lens = torch.randint(16, 129, (num_requests,), generator=gen).tolist()
        return [(ids(p), o) for p, o in zip(prompt_lens, output_lens)]
    if name == "equal":
        return [(ids(128), 64) for _ in range(num_requests)]
    if name == "shared-prefix":
        system = ids(512)
        return [(system + ids(int(torch.randint(16, 65, (), generator=gen))), 32) for _ in range(num_requests)]
    raise ValueError(f"unknown workload {name!r}; choose mixed, equal or shared-prefix")


def run_llm(model_dir, dtype, requests, request_rate: float, engine_kwargs: dict, sampling: dict) -> dict:
    from rosellm_edu.engine.llm_engine import LLMEngine

    engine = LLMEngine(model_dir, dtype=dtype, **engine_kwargs)
    warmup = [Request(f"warmup{i}", {"prompt_token_ids": p[:32]}, request_params(8, sampling))
              for i, (p, _) in enumerate(requests[:4])]
    for _ in stream(engine, warmup):
        pass
    steps = StepClock(engine)                                   # from here on, every step is timed and counted
    reqs = [Request(str(i), {"prompt_token_ids": p}, request_params(n, sampling), t) for i, ((p, n), t) in
            enumerate(zip(requests, arrival_times(len(requests), request_rate)))]
    times = {r.request_id: RequestTimes(r.arrival_time, prompt_tokens=len(r.prompt["prompt_token_ids"])) for r in reqs}
    start = time.perf_counter()
    with tqdm(total=len(reqs), desc=f"llm {dtype}", leave=False) as bar:
        for delta in stream(engine, reqs):
            if delta.error:
                raise RuntimeError(f"request {delta.request_id}: {delta.error}")
            times[delta.request_id].token_times += [delta.time] * len(delta.token_ids)
            if delta.finished:
                bar.update()
    summary = summarize(list(times.values()), time.perf_counter() - start)
    summary.update(steps.floors(engine.model, engine.device))
    summary["kv_cache_stats"] = engine.kv_cache_stats()
    summary["preemptions"] = engine.scheduler.num_preemptions
    return summary


def arrival_times(num_requests: int, request_rate: float) -> list[float]:
    """Seeded Poisson arrivals, in seconds after the start; all at 0 for an infinite rate (offline)."""
    if request_rate == float("inf"):
        return [0.0] * num_requests
    gen = torch.Generator().manual_seed(1)
    return torch.empty(num_requests).exponential_(request_rate, generator=gen).cumsum(0).tolist()


class StepClock:
    """Wraps engine.step: records each step's batch shape (positions cached, positions new, per sequence) and
    its duration, so that the run's roofline floor and the engine's time can be split by kind of step."""

    def __init__(self, engine):
        self.steps: list[tuple[list[int], list[int], float]] = []
        schedule, step = engine.scheduler.schedule, engine.step
        batch = []

        def scheduled(*args):                 # chapter 12's schedule takes the step's drafts
            batch[:] = schedule(*args)
            return batch

        def timed_step():
            batch.clear()
            start = time.perf_counter()
            out = step()
            if batch:
                self.steps.append(([s.num_computed for s in batch], [s.num_new for s in batch],
                                   time.perf_counter() - start))
            return out

        engine.scheduler.schedule, engine.step = scheduled, timed_step

    def floors(self, model, device: torch.device) -> dict:
        """The run's roofline floor, per kind of step, beside the time the engine took for each kind."""
        from rosellm_edu.benchmarks.roofline import ModelCost, matmul_shapes, matmul_throughput, memory_bandwidth

        dtype = next(model.parameters()).dtype
        cost, bandwidth = ModelCost.of(model), memory_bandwidth(device=device)
        throughput = max(matmul_throughput(matmul_shapes(model, rows), dtype, device) for rows in (64, 2048))
        out = {"bandwidth_gb_s": bandwidth / 1e9, "matmul_gflop_s": throughput / 1e9}
        for kind in ("prefill", "decode"):
            mine = [(c, n, t) for c, n, t in self.steps if (kind == "decode") == all(x == 1 for x in n)]
            out[f"{kind}_floor_s"] = sum(cost.step_floor(c, n, throughput, bandwidth) for c, n, _ in mine)
            out[f"{kind}_time_s"] = sum(t for _, _, t in mine)
            out[f"{kind}_steps"] = len(mine)
        out["roofline_floor_s"] = out["prefill_floor_s"] + out["decode_floor_s"]
        return out


def format_floors(summary: dict) -> str:
    floor = summary["roofline_floor_s"]
    return (f"Roofline floor: {floor:.2f} s ({floor / summary['duration_s']:.0%} of the run; "
            f"{summary['bandwidth_gb_s']:.1f} GB/s, {summary['matmul_gflop_s']:.0f} GFLOP/s): prefill "
            f"{summary['prefill_floor_s']:.2f} s of the engine's {summary['prefill_time_s']:.2f} s in "
            f"{summary['prefill_steps']} steps, decode {summary['decode_floor_s']:.2f} s of its "
            f"{summary['decode_time_s']:.2f} s in {summary['decode_steps']} steps")


def request_params(max_tokens: int, sampling: dict) -> SamplingParams:
    """Exactly max_tokens tokens (EOS ignored), with the benchmark's temperature / top_k / top_p."""
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling)


def run_transformers(model_dir, dtype, requests, batch_size: int, sampling: dict) -> dict:
    """Padded batches in arrival order; each request keeps only its own output length."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    draw = dict(do_sample=False) if sampling["temperature"] == 0 else dict(   # transformers' top_k 0 is off
        do_sample=True, temperature=sampling["temperature"], top_k=max(sampling["top_k"], 0), top_p=sampling["top_p"])

    def generate(batch):
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in batch])           # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
        new = max(n for _, n in batch)
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                           eos_token_id=None, pad_token_id=0, **draw)

    generate(requests[:2])                                                           # warm-up
    times = []
    start = time.perf_counter()
    for i in tqdm(range(0, len(requests), batch_size), desc=f"transformers b={batch_size} {dtype}", leave=False):
        batch = requests[i:i + batch_size]
        generate(batch)
        done = time.perf_counter() - start
        for p, n in batch:  # no streaming: every token of the batch arrives when generate returns
            times.append(RequestTimes(0.0, [done] * n, len(p)))
    summary = summarize(times, time.perf_counter() - start)
    for key in ("ttft_ms", "tpot_ms", "itl_ms"):
        del summary[key]
    summary["batch_size"] = batch_size
    return summary


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rosellm_edu.benchmarks.mixed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model directory or hub id (default: the embedded SmolLM2)")
    parser.add_argument("--workload", default="mixed", choices=["mixed", "equal", "shared-prefix"])
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engines", default="llm", help="comma list of llm, transformers, naive, openai")
    parser.add_argument("--url", help="openai engine: the base URL of an OpenAI-compatible API, "
                                      "e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--served-model-name", help="openai engine: the model to ask for (default: the server's first)")
    parser.add_argument("--dtypes", default="float32", help="comma list of float32, bfloat16")
    parser.add_argument("--hf-batch-sizes", default="8,16,32,64", help="batch sizes tried for transformers")
    parser.add_argument("--request-rate", type=float, default=float("inf"),
                        help="requests per second, Poisson arrivals (inf: all at once, offline)")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--num-kv-blocks", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--json", help="write every result to this file")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (the default) is greedy")
    parser.add_argument("--top-k", type=int, default=0, help="<= 0: off")
    parser.add_argument("--top-p", type=float, default=1.0, help="1: off")
    args = parser.parse_args(argv)

    model_dir = model_loader.resolve_model(args.model)
    vocab_size = model_loader.load_config(model_dir).vocab_size
    requests = workload(args.workload, args.num_requests, vocab_size, args.seed)
    engine_kwargs = dict(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                         num_kv_blocks=args.num_kv_blocks, block_size=args.block_size,
                         enable_prefix_caching=not args.no_prefix_caching)
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    SamplingParams(**sampling)                                  # a bad setting fails here, naming the field
    results = []
    for dtype in args.dtypes.split(","):
        for engine in args.engines.split(","):
            if engine == "openai" and dtype != args.dtypes.split(",")[0]:
                continue   # a server runs in its own dtype: one run, whatever --dtypes says
            if engine == "llm":
                runs = [run_llm(model_dir, dtype, requests, args.request_rate, engine_kwargs, sampling)]
            elif engine == "transformers":
                runs = [run_transformers(model_dir, dtype, requests, int(b), sampling)
                        for b in args.hf_batch_sizes.split(",")]
            elif engine == "naive":
                runs = [run_transformers(model_dir, dtype, requests, 1, sampling)]
            elif engine == "openai":   # the server chooses its own dtype
                if not args.url:
                    raise SystemExit("--engines openai needs --url, e.g. --url http://127.0.0.1:8000/v1")
                arrivals = arrival_times(len(requests), args.request_rate)
                tokenizer = model_loader.load_tokenizer(model_dir)   # counts tokens if the server's usage cannot
                runs = [asyncio.run(run_openai(args.url, requests, arrivals, args.served_model_name,
                                               tokenizer=tokenizer, **sampling))]
            else:
                raise SystemExit(f"unknown engine {engine!r}; choose llm, transformers, naive or openai")
            for summary in runs:
                title = f"{engine} {dtype if engine != 'openai' else '(the server chooses its dtype)'}" + (f" batch={summary['batch_size']}" if engine == "transformers" else "")
                print(format_summary(summary, title), flush=True)
                if "roofline_floor_s" in summary:
                    print(format_floors(summary))
            best = max(runs, key=lambda s: s["throughput_tok_s"])
            label = "server's own" if engine == "openai" else dtype   # we cannot know a remote server's dtype
            results.append({"engine": engine, "dtype": label, **best, "all_runs": runs})

    print("\n=== side by side (best run of each) ===")
    for dtype in dict.fromkeys(r["dtype"] for r in results):
        ours = next((r for r in results if r["engine"] == "llm" and r["dtype"] == dtype), None)
        for r in (r for r in results if r["dtype"] == dtype):
            ratio = f"  llm is {ours['throughput_tok_s'] / r['throughput_tok_s']:.1f}x" if ours and r is not ours else ""
            extra = f" (batch {r['batch_size']})" if r["engine"] == "transformers" else ""
            print(f"{r['engine']:>12} {dtype:>12}: {r['throughput_tok_s']:8.1f} tokens/s{extra}{ratio}")
    if args.json:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        machine = {"platform": platform.platform(), "processor": device_name(device), "torch": torch.__version__,
                   "threads": torch.get_num_threads(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "machine": machine, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
