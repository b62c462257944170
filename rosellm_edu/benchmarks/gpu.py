"""python -m rosellm_edu.benchmarks.gpu --out DIR: the book's GPU claims, checked and timed in one
run of a few minutes on one GPU, from the source tree, with what a bare GPU machine has (torch, Triton,
transformers). No checkpoint travels: every model is a random-weight model of a named shape, built by
transformers (the reference) and saved for our engine to load; speed does not depend on the weights' values.

Parts, each written to DIR/gpu_<part>.json with the GPU, driver, versions, date and command, as it finishes:
  correctness  graph replay = eager logits for every bucket; greedy tokens = transformers'; the batched sampler's
               chi-square on the GPU; the host syncs of one engine decode step (torch's sync debug mode)
  decode       eager against graph TPOT across batch sizes, GPT-2's shape (chapter 05's plot)
  engine       GPT-2's shape: 64 requests x 512 tokens, and batch-1 TPOT
  llama        a Qwen3-0.6B-shaped Llama: nano-vllm's workload (scaled), and against transformers'
               continuous batching (generate_batch) on one workload
  sampler      top-k 40 + top-p 0.9 against chapter 01's full sort (chapter 06)
  profile      a decode step of the Llama shape at batch 256 under torch.profiler: its kernels' time
  splits       split-k decode attention with its split count from the table's width or from the contexts
  tests        the test files with CUDA paths (chapter 09's kernels compiled on the GPU), through pytest
  cpu          the C++ kernels' test files on this machine's CPU, 2 threads a worker: its AVX-512, VNNI or AMX
               paths, which a 2-core AVX2 machine never runs

--smoke runs every part at toy sizes on whatever device is here (a CPU: no graphs), to check the script itself.
"""

import argparse
import dataclasses
import gc
import json
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from datetime import datetime, timezone
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

from rosellm_edu.benchmarks import decode, sampler as sampler_bench
from rosellm_edu.benchmarks.machine import device_name

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
PARTS = ("correctness", "decode", "engine", "llama", "sampler", "profile", "splits", "tests", "cpu")


def shapes(smoke: bool) -> dict:
    """Configs of the shapes the run measures (toy ones with --smoke)."""
    if smoke:
        return {"gpt2": GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=256, vocab_size=50257),
                "llama": LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=16, vocab_size=151936,
                                     max_position_embeddings=512, tie_word_embeddings=True)}
    return {"gpt2": GPT2Config(),                                   # 124M: 12 layers, 768 wide, 1024 positions
            "llama": LlamaConfig(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,   # Qwen3-0.6B's
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                                 max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6,
                                 tie_word_embeddings=True)}


def header(device: torch.device) -> dict:
    import transformers
    info = {"device": device_name(device), "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "platform": platform.platform(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python -m rosellm_edu.benchmarks.gpu", *sys.argv[1:]])}
    if device.type == "cuda":
        import triton
        props = torch.cuda.get_device_properties(device)
        info |= {"triton": triton.__version__, "sms": props.multi_processor_count,
                 "memory_gib": round(props.total_memory / 2**30, 1), "driver": nvidia_smi("driver_version")}
    return info


def nvidia_smi(field: str) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def checkpoint(config, dtype: torch.dtype, folder: Path, tokenizer: Path, device: torch.device) -> Path:
    """A random-weight checkpoint of `config`, built by transformers and saved with the tokenizer."""
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer / name, folder / name)
    del model
    return folder


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


def random_prompts(n: int, low: int, high: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(low, high))] for _ in range(n)]


# ---- correctness ----------------------------------------------------------------------------------------------

def graph_equals_eager(model, max_num_seqs: int, context: int) -> list[dict]:
    """Logits of a graph replay against the eager runner's, for every bucket and a padded size between buckets."""
    from rosellm_edu.engine.kv_cache import KVCache
    from rosellm_edu.engine.model_runner import ModelRunner
    from rosellm_edu.engine.scheduler import ScheduledSeq

    param = next(model.parameters())
    length, bs = context + 1, 16
    pool = KVCache(model.config, max_num_seqs * -(-length // bs), bs, param.dtype, param.device)
    pool.k.normal_(), pool.v.normal_()
    max_len = getattr(model.config, "max_position_embeddings", None) or model.config.n_positions
    graphed = ModelRunner(model, pool, max_num_seqs, max_len)
    eager = ModelRunner(model, pool, max_num_seqs, max_len, enforce_eager=True)
    sizes = sorted(set(graphed.buckets) | {b - 1 for b in graphed.buckets if b > 2})
    gen, rows = torch.Generator().manual_seed(0), []
    for n in sizes:
        seqs, tables = decode.decode_batch(n, context, length, bs, model.config.vocab_size, gen)
        batch = [ScheduledSeq(s, len(s) - 1, 1) for s in seqs]
        with torch.no_grad():
            want, got = eager.run(batch, tables), graphed.run(batch, tables)
        rows.append({"batch": n, "graphs": bool(graphed.graphs), "relative_error": relative_error(got, want),
                     "same_argmax": bool(torch.equal(got.argmax(-1), want.argmax(-1)))})
    return rows


def greedy_equals_transformers(folder: Path, device: torch.device, prompts: list[list[int]], max_tokens: int) -> dict:
    """Greedy tokens of our engine (float32, graphs on) against transformers' generate on the same checkpoint."""
    from rosellm_edu import LLM, SamplingParams

    llm = LLM(str(folder), dtype="float32", device=str(device), max_num_seqs=8, max_num_batched_tokens=1024,
              kv_cache_memory_bytes=1 << 30 if device.type == "cpu" else None, gpu_memory_utilization=0.3)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    ours = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                        use_tqdm=False)]
    del llm
    free(device)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()
    theirs = []
    for p in prompts:
        out = hf.generate(torch.tensor([p], device=device), max_new_tokens=max_tokens, do_sample=False,
                          eos_token_id=None, pad_token_id=0, min_new_tokens=max_tokens)
        theirs.append(out[0, len(p):].tolist())
    del hf
    free(device)
    first_diff = [next((i for i, (a, b) in enumerate(zip(o, t)) if a != b), None) for o, t in zip(ours, theirs)]
    return {"prompts": len(prompts), "max_tokens": max_tokens, "equal": sum(d is None for d in first_diff),
            "first_difference": first_diff}


def sampler_chi_square(device: torch.device) -> list[dict]:
    """The batched sampler's draws on the device against chapter 01's filtered distribution (chi-square)."""
    from scipy.stats import chisquare

    from rosellm_edu.layers.sampler import filtered_logits, sample
    from rosellm_edu.sampling_params import SamplingParams

    logits = torch.randn(16, generator=torch.Generator().manual_seed(3)) * 2
    n, rows = 20000, []
    for params in [SamplingParams(temperature=0.8), SamplingParams(top_k=5), SamplingParams(top_p=0.8),
                   SamplingParams(top_k=6, top_p=0.7, temperature=1.3)]:
        out = sample(logits.to(device).expand(n, -1), [params] * n, [None] * n,
                     torch.Generator(device).manual_seed(0))
        expected = filtered_logits(logits[None], params).softmax(-1)[0].double()
        counts = torch.bincount(torch.tensor(out.token_ids), minlength=16).double()
        support = expected > 0
        pvalue = chisquare(counts[support], n * expected[support] / expected[support].sum()).pvalue
        rows.append({"params": repr(params), "pvalue": float(pvalue), "outside_support": int(counts[~support].sum())})
    return rows


def sync_audit(folder: Path, device: torch.device, steps: int = 3) -> dict:
    """Host syncs of engine decode steps, greedy and sampling rows mixed, found by torch's sync debug mode."""
    from rosellm_edu import SamplingParams
    from rosellm_edu.engine.llm_engine import LLMEngine

    engine = LLMEngine(str(folder), dtype="bfloat16", device=str(device), max_num_seqs=8, gpu_memory_utilization=0.3)
    mixed = [SamplingParams(temperature=0, max_tokens=64, ignore_eos=True),
             SamplingParams(temperature=0.7, top_k=40, top_p=0.9, max_tokens=64, ignore_eos=True)]
    for i, prompt in enumerate(random_prompts(4, 8, 24, 49152, 1)):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, mixed[i % 2])
    for _ in range(3):                                  # prefill and the first decode steps, unaudited
        engine.step()
    sites: dict[str, int] = {}

    def record(message, category, filename, lineno, file=None, line=None):
        ours = [f for f in traceback.extract_stack() if "rosellm_edu" in f.filename and "benchmarks" not in f.filename]
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(ours[-3:]))
        sites[where] = sites.get(where, 0) + 1

    if device.type == "cuda":
        torch.cuda.synchronize()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            torch.cuda.set_sync_debug_mode("warn")
            try:
                for _ in range(steps):
                    engine.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
    del engine
    free(device)
    return {"steps": steps, "syncs": sum(sites.values()), "syncs_per_step": sum(sites.values()) / steps,
            "sites": sites}


def part_correctness(args, device, models) -> dict:
    from rosellm_edu.model_loader import load_model

    out = {}
    for name, dtype in [("gpt2", torch.float32), ("llama", torch.bfloat16)]:
        model = load_model(models[name], dtype, device)
        out[f"graph_vs_eager_{name}_{str(dtype)[6:]}"] = graph_equals_eager(model, 16 if args.smoke else 64, 100)
        del model
        free(device)
    prompts = random_prompts(4 if args.smoke else 8, 4, 40, 49152, 2)
    out["greedy_vs_transformers"] = {name: greedy_equals_transformers(models[name], device, prompts,
                                                                      8 if args.smoke else 32)
                                     for name in ("gpt2", "llama")}
    out["sampler_chi_square"] = sampler_chi_square(device)
    out["sync_audit"] = sync_audit(models["gpt2"], device)
    return out


# ---- speed ------------------------------------------------------------------------------------------------------

def part_decode(args, device, models) -> dict:
    """Chapter 05's plot: decode.measure's eager and graph TPOT, in decode's JSON layout."""
    from rosellm_edu.model_loader import load_model

    model = load_model(models["gpt2"], torch.bfloat16, device)
    sizes = [1, 2, 4] if args.smoke else [1, 2, 4, 8, 16, 32, 64, 128, 256]
    bandwidth = decode_bandwidth(device)
    with torch.no_grad():
        results = decode.measure(model, sizes, 64 if args.smoke else 256, 4 if args.smoke else 48,
                                 2 if args.smoke else 8, 16)
    weights = decode.weight_bytes(model)
    del model
    free(device)
    return {"machine": {"device": device_name(device), "torch": torch.__version__, "bandwidth_gb_s": bandwidth / 1e9,
                        "cuda_graphs": "captured" if device.type == "cuda" else "unavailable: no CUDA device"},
            "models": [{"model": "gpt2", "dtype": "bfloat16", "quantization": None, "weight_bytes": weights,
                        "weight_floor_ms": 1e3 * weights / bandwidth, "results": results}]}


def decode_bandwidth(device: torch.device) -> float:
    from rosellm_edu.benchmarks.roofline import memory_bandwidth
    return memory_bandwidth(1 << 30 if device.type == "cuda" else 256 << 20, device=device)   # far past the L2


def timed_generate(llm, prompts: list[list[int]], params, repeat: int) -> dict:
    """Median over `repeat` runs (after one warm-up run) of the whole generate: output tokens per second."""
    inputs = [{"prompt_token_ids": p} for p in prompts]
    warm = [dataclasses.replace(p, max_tokens=8) for p in (params if isinstance(params, list) else [params] * len(inputs))[:16]]
    llm.generate(inputs[:16], warm, use_tqdm=False)                    # warm-up: Triton compiles, caches fill
    runs = []
    for _ in range(repeat):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        outs = llm.generate(inputs, params, use_tqdm=False)
        runs.append((time.perf_counter() - start, sum(len(o.outputs[0].token_ids) for o in outs)))
    seconds, tokens = sorted(runs)[len(runs) // 2]
    return {"requests": len(prompts), "output_tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "runs_s": [r[0] for r in runs]}


def batch1_tpot(engine, prompt: list[int], max_tokens: int) -> dict:
    """One request alone: time to the first token, then the median gap between the next ones."""
    from rosellm_edu import SamplingParams

    engine.add_request("tpot", {"prompt_token_ids": prompt},
                       SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    stamps = [time.perf_counter()]
    while engine.has_unfinished_requests():
        engine.step()
        stamps.append(time.perf_counter())
    gaps = [b - a for a, b in zip(stamps[1:], stamps[2:])]
    return {"ttft_ms": 1e3 * (stamps[1] - stamps[0]), "tpot_ms": 1e3 * statistics.median(gaps), "tokens": max_tokens}


def part_engine(args, device, models) -> dict:
    """GPT-2's shape through the whole engine: the roseinfer post's workload (64 requests x 512 new tokens,
    no stop at EOS) and one request alone."""
    from rosellm_edu import LLM, SamplingParams

    tokens = 32 if args.smoke else 512
    llm = LLM(str(models["gpt2"]), dtype="bfloat16", device=str(device), max_num_seqs=64,
              kv_cache_memory_bytes=1 << 30 if device.type == "cpu" else None)
    out = {}
    for name, params in [("sampling", SamplingParams(max_tokens=tokens, ignore_eos=True)),
                         ("greedy", SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))]:
        out[f"batch64_{name}"] = timed_generate(llm, [[1, 2, 3, 4]] * 64, params, 1 if args.smoke else 3)
        print(f"  gpt2 64 x {tokens} ({name}): {out[f'batch64_{name}']['tokens_per_s']:.0f} tokens/s", flush=True)
    runs = [batch1_tpot(llm.llm_engine, [1, 2, 3, 4], 16 if args.smoke else 256) for _ in range(3)]
    out["batch1"] = sorted(runs, key=lambda r: r["tpot_ms"])[1]
    print(f"  gpt2 batch 1: TPOT {out['batch1']['tpot_ms']:.3f} ms", flush=True)
    del llm
    free(device)
    return out


FIXED_TOKENS = 256   # output tokens per request of the workload both engines run (generate_batch takes one length)


def nano_vllm_workload(num_seqs: int, low: int, high: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """nano-vllm's bench.py, scaled: random prompts and output lengths, each uniform in [low, high]."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(49152) for _ in range(rng.randint(low, high))] for _ in range(num_seqs)]
    return prompts, [rng.randint(low, high) for _ in range(num_seqs)]


def ours_on(folder: Path, device, prompts, lengths, smoke: bool) -> tuple[dict, dict]:
    """Our engine on nano-vllm's workload (temperature 0.6, no stop at EOS) and on the fixed-length one."""
    from rosellm_edu import LLM, SamplingParams

    llm = LLM(str(folder), dtype="bfloat16", device=str(device), max_num_seqs=256, max_num_batched_tokens=16384,
              kv_cache_memory_bytes=1 << 30 if device.type == "cpu" else None)
    varied = [SamplingParams(temperature=0.6, max_tokens=n, ignore_eos=True) for n in lengths]
    nano = timed_generate(llm, prompts, varied, 1)
    fixed = timed_generate(llm, prompts, SamplingParams(temperature=0.6, max_tokens=FIXED_TOKENS, ignore_eos=True), 1)
    del llm
    free(device)
    return nano, fixed


def transformers_on(folder: Path, device, prompts, max_new_tokens: int) -> dict:
    """transformers' own continuous batching (generate_batch) on the fixed-length workload, after one warm-up."""
    from transformers import GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="sdpa")
    model = model.to(device).eval()
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=True, temperature=0.6, top_k=0, top_p=1.0,
                              eos_token_id=-1, pad_token_id=0)
    model.generate_batch(inputs=prompts[:8], generation_config=config, progress_bar=False)       # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    outs = model.generate_batch(inputs=prompts, generation_config=config, progress_bar=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.generated_tokens) for o in outs.values())
    del model
    free(device)
    return {"requests": len(prompts), "output_tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def part_llama(args, device, models) -> dict:
    num, low, high = (8, 4, 24) if args.smoke else (256, 100, 1024)
    prompts, lengths = nano_vllm_workload(num, low, high)
    nano, fixed = ours_on(models["llama"], device, prompts, lengths, args.smoke)
    print(f"  llama, nano-vllm's workload: {nano['tokens_per_s']:.0f} tokens/s; fixed {FIXED_TOKENS} tokens: "
          f"{fixed['tokens_per_s']:.0f} tokens/s", flush=True)
    out = {"workload": {"requests": num, "prompt_tokens": [low, high], "output_tokens": [low, high],
                        "temperature": 0.6, "ignore_eos": True}, "nano_vllm_workload": nano,
           "fixed_length": {"max_tokens": FIXED_TOKENS, "ours": fixed}}
    try:
        theirs = transformers_on(models["llama"], device, prompts, FIXED_TOKENS)
        out["fixed_length"]["transformers_generate_batch"] = theirs
        out["fixed_length"]["ours_over_transformers"] = fixed["tokens_per_s"] / theirs["tokens_per_s"]
        print(f"  transformers generate_batch: {theirs['tokens_per_s']:.0f} tokens/s "
              f"(ours {out['fixed_length']['ours_over_transformers']:.2f}x)", flush=True)
    except Exception as e:  # an older transformers without generate_batch, or one that fails: recorded, not fatal
        out["fixed_length"]["transformers_generate_batch"] = {"error": f"{type(e).__name__}: {e}",
                                                              "traceback": traceback.format_exc()[-3000:]}
    return out


def part_sampler(args, device, models) -> dict:
    batches, vocabs = ([4], [50257]) if args.smoke else ([1, 64, 256], [50257, 151936])
    rows = sampler_bench.run(batches, vocabs, 5.0, 3 if args.smoke else 7, device)
    return {"rows": rows, "logit_scale": 5.0}


def run_pytest(args, models, files: list[str], *options: str, **env: str) -> dict:
    """pytest over `files` in a subprocess; the tests that read the embedded model read a SmolLM2-shaped
    random-weight checkpoint (ROSELLM_EDU_TEST_MODEL) since the embedded model does not travel."""
    import os

    env = dict(os.environ, ROSELLM_EDU_TEST_MODEL=str(models["smollm2"]), HF_HUB_OFFLINE="1", **env)
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *options,
                          *files], capture_output=True, text=True, env=env, timeout=args.tests_timeout)
    return {"files": files, "returncode": run.returncode, "seconds": time.perf_counter() - start,
            "summary": run.stdout.strip().splitlines()[-1:], "output_tail": (run.stdout + run.stderr)[-6000:]}


def part_tests(args, device, models) -> dict:
    """pytest over the files whose CUDA paths a CPU cannot run."""
    files = ["tests/test_triton_kernels.py", "tests/test_paged_decode_kernels.py",
             "tests/test_logits_processors.py::test_no_device_to_host_sync_on_a_gpu",
             "tests/test_model_runner.py::test_graph_replay_equals_eager_decode_for_every_bucket",
             "tests/test_model_runner.py::test_a_decode_step_waits_for_the_gpu_once"]
    return run_pytest(args, models, files)


def part_cpu(args, device, models) -> dict:
    """pytest over the C++ kernels' files on the host CPU, each compiled with -march=native for it; workers in
    parallel where pytest-xdist is installed, each with 2 threads as a reader's laptop has. The Triton kernels'
    cases are left to the tests part, on the GPU."""
    import importlib.util
    import os

    from rosellm_edu.benchmarks.machine import machine_record

    files = ["tests/test_build_cpp.py", "tests/test_paged_decode_kernels.py", "tests/test_cpu_attention_kernels.py",
             "tests/test_fused_pointwise.py", "tests/test_int8_dot.py", "tests/test_quantization.py",
             "tests/test_quantization_formats.py", "tests/test_native_decode.py"]
    workers = min(8, max(1, (os.cpu_count() or 2) // 2)) if importlib.util.find_spec("xdist") else 1
    options = ("-n", str(workers)) if workers > 1 else ()
    run = run_pytest(args, models, files, "-k", "not triton", *options, OMP_NUM_THREADS="2", CUDA_VISIBLE_DEVICES="",
                     TORCH_EXTENSIONS_DIR=tempfile.mkdtemp(prefix="rosellm_cpu_ext_"))
    cpu = machine_record()
    return {"cpu": cpu["device"], "flags": cpu["deciding_flags"], "cores": cpu["cores"], "workers": workers, **run}


def part_profile(args, device, models) -> dict:
    """Where a decode step of the Llama shape goes: 256 sequences of about 600 tokens of context (the middle of
    nano-vllm's workload), ten steps under torch.profiler; the GPU kernels' time by name, and the step's wall time."""
    from torch.profiler import ProfilerActivity, profile

    from rosellm_edu import SamplingParams
    from rosellm_edu.engine.llm_engine import LLMEngine

    num, context = (8, 24) if args.smoke else (256, 600)
    engine = LLMEngine(str(models["llama"]), dtype="bfloat16", device=str(device), max_num_seqs=256,
                       max_num_batched_tokens=16384, kv_cache_memory_bytes=1 << 30 if device.type == "cpu" else None)
    for i, prompt in enumerate(random_prompts(num, context, context, 49152, 3)):
        engine.add_request(str(i), {"prompt_token_ids": prompt},
                           SamplingParams(temperature=0.6, max_tokens=64, ignore_eos=True))
    while any(engine.scheduler.num_computed[s.request_id] < len(s) - 1 for s in engine.scheduler.running) \
            or engine.scheduler.waiting:
        engine.step()                                     # the prefills
    for _ in range(3):
        engine.step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(10):
            engine.step()
        wall = (time.perf_counter() - start) / 10
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"] if device.type == "cuda" else []
    gpu_us = sum(e.self_device_time_total for e in kernels) / 10
    top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:15]
    del engine
    free(device)
    return {"sequences": num, "context": context, "step_ms": 1e3 * wall, "gpu_busy_ms": gpu_us / 1e3,
            "kernels": [{"name": e.key[:120], "ms_per_step": e.self_device_time_total / 10 / 1e3,
                         "calls_per_step": e.count / 10} for e in top]}


def part_splits(args, device, models) -> dict:
    """Chapter 09's split-k decode attention, its split count chosen from the table's full width (as a graph
    captured for every context sees it) against one chosen from the contexts actually served."""
    from rosellm_edu.kernels.triton_paged_prefill import paged_decode_attention_split_k

    if device.type != "cuda":
        return {"skipped": "no CUDA device"}
    from triton.testing import do_bench

    rows, block_size, width, heads, kv_heads, dim = [], 16, 256, 16, 8, 128      # the Llama shape, 4096 positions
    for seqs in (1, 8, 64):
        for context in (256, 2048):
            blocks = seqs * width
            k = torch.randn(blocks, block_size, kv_heads, dim, device=device, dtype=torch.bfloat16)
            v = torch.randn_like(k)
            tables = torch.randperm(blocks, device=device, dtype=torch.int32).view(seqs, width)
            lens = torch.full((seqs,), context, device=device, dtype=torch.int32)
            q = torch.randn(seqs, heads, dim, device=device, dtype=torch.bfloat16)
            run = lambda ctx: paged_decode_attention_split_k(q, k, v, tables, lens, dim ** -0.5, max_context_len=ctx)  # noqa: E731
            full, sized = do_bench(lambda: run(None), return_mode="median"), do_bench(lambda: run(context),
                                                                                      return_mode="median")
            rows.append({"seqs": seqs, "context": context, "full_width_us": 1e3 * full, "sized_us": 1e3 * sized})
            print(f"  split-k seqs {seqs:3d} context {context:5d}: full width {1e3 * full:7.1f} us, "
                  f"sized {1e3 * sized:7.1f} us", flush=True)
    return {"block_size": block_size, "table_width": width, "rows": rows}


# ---- the run ----------------------------------------------------------------------------------------------------

RUNNERS = {"correctness": part_correctness, "decode": part_decode, "engine": part_engine, "llama": part_llama,
           "sampler": part_sampler, "profile": part_profile, "splits": part_splits, "tests": part_tests,
           "cpu": part_cpu}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rosellm_edu.benchmarks.gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for gpu_<part>.json")
    parser.add_argument("--tokenizer", help="folder holding tokenizer.json and tokenizer_config.json (default: the "
                        "embedded model's, where it is installed)")
    parser.add_argument("--smollm2-config", help="SmolLM2-135M's config.json, for the model-runner tests' shape "
                        "(default: the embedded model's, where it is installed)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    parser.add_argument("--budget-s", type=float, default=420, help="start no part after this many seconds")
    parser.add_argument("--tests-timeout", type=float, default=120)
    parser.add_argument("--smoke", action="store_true", help="toy sizes, on any device: checks the script")
    args = parser.parse_args(argv)
    if args.tokenizer is None or args.smollm2_config is None:   # on a machine with the package set up
        from rosellm_edu.model_loader import resolve_model
        embedded = resolve_model()
        args.tokenizer = args.tokenizer or str(embedded)
        args.smollm2_config = args.smollm2_config or str(embedded / "config.json")
    start = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = header(device)
    print(json.dumps(info), flush=True)
    work = Path(tempfile.mkdtemp(prefix="rosellm_gpu_"))      # outside --out: checkpoints are not results
    models = {name: checkpoint(config, torch.float32, work / name, Path(args.tokenizer), device)
              for name, config in shapes(args.smoke).items()}
    if args.smollm2_config:
        from transformers import AutoConfig
        models["smollm2"] = checkpoint(AutoConfig.from_pretrained(Path(args.smollm2_config).parent), torch.float32,
                                       work / "smollm2", Path(args.tokenizer), device)
    print(f"checkpoints ready at {time.perf_counter() - start:.0f} s", flush=True)
    summary = {}
    for part in args.parts.split(","):
        if time.perf_counter() - start > args.budget_s:
            summary[part] = "skipped: over budget"
            continue
        t0 = time.perf_counter()
        print(f"== {part}", flush=True)
        try:
            body = RUNNERS[part](args, device, models)
            status = "ok" if body.get("returncode", 0) == 0 else "failed"   # the tests part: pytest's exit code
        except Exception as e:   # one part's failure is recorded and the others still run
            body, status = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}, "error"
            print(body["traceback"], flush=True)
        free(device)
        seconds = time.perf_counter() - t0
        (out / f"gpu_{part}.json").write_text(json.dumps({"header": info, "seconds": seconds, "status": status,
                                                          **body}, indent=1, default=str) + "\n")
        summary[part] = f"{status} in {seconds:.0f} s"
        print(f"== {part}: {summary[part]}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
