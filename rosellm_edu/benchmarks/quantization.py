"""Chapter 11's figures: batch-1 TPOT and batch-64 throughput for each weight format, beside llama.cpp's batch-1
TPOT on the same machine, in interleaved rounds.

    python -m rosellm_edu.benchmarks.quantization --rounds 3    # writes notebooks/data/<machine>/quantization.json

Each round runs the six models of README's table, one `python -m rosellm_edu.benchmarks.decode` process each (so
every process measures its own start-up choices, as the engine does), then llama.cpp's llama-batched-bench at one
sequence (-npl 1, a 128-token prompt, 64 new tokens) on the embedded GGUF as it ships (Q4_1 layers, Q8_0 head) and
on its BF16 conversion, with the same threads. llama.cpp is built once by rosellm_edu.benchmarks.llama_cpp; with
--no-llama-cpp only our engine runs.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch

from rosellm_edu import model_loader
from rosellm_edu.benchmarks.machine import record_dir

MODELS = [("bfloat16", None), ("bfloat16", "int8"), ("bfloat16", "int4"), ("bfloat16", "gguf"), ("float32", None),
          ("float32", "int4")]                           # (activations, quantization): README's six rows
LLAMA_CPP = {"Q4_1": None, "BF16": "bfloat16"}          # llama.cpp's GGUF: as shipped, or converted to this dtype


def decode_command(dtype: str, quantization: str | None, out: Path) -> list[str]:
    return [sys.executable, "-m", "rosellm_edu.benchmarks.decode", "--models", "embedded", "--batch-sizes", "1,64",
            "--context", "128", "--steps", "16", "--warmup", "4", "--dtype", dtype, "--out", str(out),
            *(["--quantization", quantization] if quantization else [])]


def llama_cpp_batch_1(ggufs: dict[str, Path], bin_dir: Path, threads: int) -> dict[str, dict]:
    """llama.cpp's TPOT at one sequence, per GGUF type: 1 / its generation rate."""
    from rosellm_edu.benchmarks.llama_cpp import batched_bench

    out = {}
    for name, gguf in ggufs.items():
        bench = batched_bench(bin_dir, gguf, threads, prompt=128, parallel=1, generated=64)
        out[name] = {"tpot_ms": 1e3 / bench["generation_tokens_s"], "command": bench["command"]}
        print(f"  llama.cpp {name}, batch 1: TPOT {out[name]['tpot_ms']:.2f} ms", flush=True)
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m rosellm_edu.benchmarks.quantization",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-llama-cpp", action="store_true")
    parser.add_argument("--out", default=None, help="default: notebooks/data/<this machine>/quantization.json")
    args = parser.parse_args(argv)
    out_file = Path(args.out) if args.out else record_dir() / "quantization.json"   # record_dir writes machine.json
    ggufs, bin_dir = {}, None
    if not args.no_llama_cpp:
        from rosellm_edu.benchmarks.llama_cpp import build_llama_cpp, convert

        bin_dir = build_llama_cpp()
        ggufs = {name: model_loader.embedded_gguf() if dtype is None else
                 convert(bin_dir, model_loader.embedded_gguf(), dtype) for name, dtype in LLAMA_CPP.items()}
    report = {"command": " ".join(["python -m rosellm_edu.benchmarks.quantization", *(argv or sys.argv[1:])]),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "runs": [], "llama_cpp": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for dtype, quantization in MODELS:
                print(f"round {r + 1}/{args.rounds}: {dtype}, quantization {quantization}", flush=True)
                out = Path(tmp) / f"r{r}_{dtype}_{quantization}.json"
                subprocess.run(decode_command(dtype, quantization, out), check=True)
                report["runs"].append(json.loads(out.read_text()))
            if ggufs:
                report["llama_cpp"].append(llama_cpp_batch_1(ggufs, bin_dir, torch.get_num_threads()))
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(report, indent=2) + "\n")
    print("wrote", out_file)
    return report


if __name__ == "__main__":
    main()
