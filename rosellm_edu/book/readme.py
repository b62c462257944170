"""README's measured figures, generated from the benchmarks' JSON in notebooks/data/<machine>/.

    python -m rosellm_edu.book.readme            # rewrite every figures block of README.md
    python -m rosellm_edu.book.readme --check    # exit 1 when README.md and the JSON disagree

README marks each block `<!-- figures:NAME -->` ... `<!-- /figures:NAME -->`; only the text between the two marks
is generated. Each recorded machine (a folder with its machine.json, written by `python -m
rosellm_edu.benchmarks.machine`) gets its own columns, so a reader with AMX and one without both find their case.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rosellm_edu.benchmarks.machine import DATA_DIR, DECIDING_FLAGS

README = DATA_DIR.parents[1] / "README.md"
BLOCK = re.compile(r"(<!-- figures:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /figures:(?P=name) -->)", re.S)


@dataclass
class Machine:
    key: str
    record: dict
    folder: Path

    @property
    def label(self) -> str:
        if self.record.get("kind") == "gpu":
            return self.record["device"]
        flags = "/".join(DECIDING_FLAGS[f] for f in self.record["deciding_flags"][:1]) or "no AVX2"
        return f"{self.record['device']} ({flags})"

    def data(self, name: str) -> dict | None:
        path = self.folder / f"{name}.json"
        return json.loads(path.read_text()) if path.exists() else None


def machines(data_dir: Path = DATA_DIR) -> list[Machine]:
    return [Machine(f.parent.name, json.loads(f.read_text()), f.parent)
            for f in sorted(data_dir.glob("*/machine.json"))]


def table(header: list[str], rows: list[list[str]], numeric_from: int) -> str:
    align = ["---" if i < numeric_from else "---:" for i in range(len(header))]
    lines = [header, align, *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines) + "\n"


def per_machine(found: list[tuple[Machine, dict]], columns: list[str]) -> list[str]:
    """Column headers: the metric alone with one machine, prefixed by the machine's label with several."""
    if len(found) == 1:
        return columns
    return [f"{m.label}: {c}" for m, _ in found for c in columns]


def with_data(ms: list[Machine], name: str) -> list[tuple[Machine, dict]]:
    return [(m, d) for m in ms if (d := m.data(name)) is not None]


def render_machines(ms: list[Machine]) -> str:
    rows = []
    for m in ms:
        dates = sorted({d[:10] for d in re.findall(r"\d{4}-\d{2}-\d{2}", "".join(
            p.read_text() for p in m.folder.glob("*.json") if p.name != "machine.json"))})
        features = "a GPU" if m.record.get("kind") == "gpu" else ", ".join(m.record["deciding_flags"]) or "none"
        rows.append([m.key, m.record["device"], features,
                     str(m.record["cores"]), str(m.record["threads"] or "-"), m.record["torch"],
                     f"{dates[0]} to {dates[-1]}" if len(dates) > 1 else "".join(dates)])
    return table(["folder in notebooks/data", "device", "deciding features", "cores", "threads", "torch", "measured"],
                 rows, 3)


def render_mixed(ms: list[Machine]) -> str:
    found = with_data(ms, "mixed")
    rows = []
    for dtype in ("bfloat16", "float32"):
        for engine, name in (("llm", "`LLM.generate`"), ("transformers", "transformers, batch 64")):
            row = [name, dtype]
            for _, d in found:
                r = {(x["engine"], x["dtype"]): x for x in d["results"]}
                if (engine, dtype) not in r:          # a machine where this dtype was not run
                    row += ["–", "", ""]
                    continue
                ours, hf = r[("llm", dtype)], r[("transformers", dtype)]
                x = r[(engine, dtype)]
                row.append(f"{x['throughput_tok_s']:.1f}")
                row.append(f"{ours['throughput_tok_s'] / hf['throughput_tok_s']:.2f}x" if engine == "llm" else "")
                row.append(f"{x['roofline_floor_s']:.2f} s of {x['duration_s']:.2f} s "
                           f"({x['roofline_floor_s'] / x['duration_s']:.0%})" if engine == "llm" else "")
            rows.append(row)
    header = ["engine", "dtype"] + per_machine(found, ["tokens/s", "`LLM.generate` / transformers",
                                                        "roofline floor of the run"])
    phases = []
    for m, d in found:
        for x in d["results"]:
            if x["engine"] == "llm":
                phases.append([m.label if len(found) > 1 else x["dtype"], x["dtype"],
                               f"{x['prefill_time_s']:.2f} s / {x['prefill_floor_s']:.2f} s ({x['prefill_steps']})",
                               f"{x['decode_time_s']:.2f} s / {x['decode_floor_s']:.2f} s ({x['decode_steps']})",
                               f"{x['bandwidth_gb_s']:.1f} GB/s", f"{x['matmul_gflop_s']:,.0f} GFLOP/s"])
    return (table(header, rows, 2) + "\nBy phase, the engine's time in `step()` against the floor of the same "
            "steps (steps in brackets), and the rates the floor was computed from, measured at the start of the "
            "run:\n\n" + table(["machine" if len(found) > 1 else "run", "dtype", "prefill: time / floor",
                                "decode: time / floor", "copy bandwidth", "matmul rate"], phases, 2))


QUANTIZATION_ROWS = [("bfloat16", None, "bfloat16", "bfloat16"),
                     ("int8 per channel, Q8_0 head", "int8", "bfloat16", "bfloat16"),
                     ("int4 in groups of 32, Q8_0 head", "int4", "bfloat16", "bfloat16"),
                     ("the GGUF's Q4_1 and Q8_0, as shipped", "gguf", "bfloat16", "bfloat16"),
                     ("float32", None, "float32", "float32"),
                     ("int4 in groups of 32, Q8_0 head", "int4", "float32", "float32")]


def quantization_medians(d: dict) -> dict:
    """(quantization, dtype) -> medians over the rounds: MB read, floors (copy, and read where measured), TPOT at
    batch 1, tokens/s at 64; and ("llama.cpp", type) -> llama.cpp's batch-1 TPOT, where the run measured it."""
    runs: dict[tuple, list[dict]] = {}
    for run in d["runs"]:
        for model in run["models"]:
            by_batch = {r["batch_size"]: r for r in model["results"]}
            runs.setdefault((model["quantization"], model["dtype"]), []).append(
                {"mb": model["weight_bytes"] / 1e6, "floor": model["weight_floor_ms"],
                 "read_floor": model.get("weight_read_floor_ms"),
                 "tpot": by_batch[1]["tpot_ms"], "tps": by_batch[64]["throughput_tok_s"],
                 "issued": by_batch[1].get("issued", "modules, before 11b")})
    for rnd in d.get("llama_cpp", []):
        for name, r in rnd.items():
            runs.setdefault(("llama.cpp", name), []).append({"tpot": r["tpot_ms"]})
    def summary(values: list) -> float | str | None:
        """The median of numbers; of how steps were issued, each way seen."""
        if isinstance(values[0], str):
            return " or ".join(sorted(set(values)))
        return statistics.median(values) if None not in values else None

    return {k: {f: summary([r[f] for r in v]) for f in v[0]} | {"rounds": len(v)} for k, v in runs.items()}


LLAMA_CPP_ROWS = [("llama.cpp: the GGUF as shipped (Q4_1, Q8_0 head)", "Q4_1"), ("llama.cpp: the GGUF in BF16", "BF16")]


def render_quantization(ms: list[Machine]) -> str:
    found = [(m, quantization_medians(d)) for m, d in with_data(ms, "quantization")]
    ratio = lambda a, b: "–" if a is None or b is None else f"{a / b:.2f}x"  # noqa: E731
    rows = []
    for weights, quant, dtype, base in QUANTIZATION_ROWS:
        row = [weights, dtype]
        for _, med in found:
            x, ref = med[(quant, dtype)], med[(None, "bfloat16")]
            row += [f"{x['mb']:.1f}", f"{x['tpot']:.2f} ms", ratio(x["tpot"], x["floor"]),
                    ratio(x["tpot"], x["read_floor"]), f"{ref['tpot'] / x['tpot']:.2f}x", x["issued"],
                    f"{x['tps']:.1f}", f"{x['tps'] / ref['tps']:.2f}x"]
        rows.append(row)
    for label, name in LLAMA_CPP_ROWS:
        if any(("llama.cpp", name) in med for _, med in found):
            row = [label, "its own"]
            for _, med in found:
                x, ref = med.get(("llama.cpp", name)), med[(None, "bfloat16")]
                row += ["–", f"{x['tpot']:.2f} ms" if x else "–", "–", "–",
                        f"{ref['tpot'] / x['tpot']:.2f}x" if x else "–", "–", "–", "–"]
            rows.append(row)
    rounds = sorted({x["rounds"] for _, med in found for x in med.values()})
    header = ["weights", "activations"] + per_machine(found, [
        "MB read per step", "TPOT, batch 1", "TPOT / copy floor", "TPOT / read floor",
        "batch 1: bfloat16's TPOT / this", "batch 1 issued by", "tokens/s, batch 64", "batch 64: this / bfloat16"])
    return table(header, rows, 2) + f"\nMedians of {' or '.join(map(str, rounds))} rounds.\n"


def render_speculative(ms: list[Machine]) -> str:
    found = with_data(ms, "speculative")
    keys = []
    for _, d in found:
        for part in d.values():
            keys += [(r["workload"], r["batch_size"], r["method"], part["args"]["num_speculative_tokens"],
                      part["args"]["quantization"]) for r in part["rows"] if r["method"] != "none"]
    rows = []
    for workload, batch, method, k, quant in dict.fromkeys(keys):
        name = f"{method}, k = {k}" if method == "ngram" else f"{quant or ''} self-draft, k = {k}".strip()
        row = [workload, str(batch), name]
        for _, d in found:
            r = next((r for part in d.values() for r in part["rows"] if (r["workload"], r["batch_size"],
                      r["method"]) == (workload, batch, method)), None)
            row += ["", "", "", ""] if r is None else [
                f"{r['tokens_per_s']:.1f}", f"{r['speedup']:.2f}x", f"{r['acceptance_rate']:.0%}",
                f"{r['mean_accepted_length']:.2f}"]
        rows.append(row)
    header = ["workload", "batch", "method"] + per_machine(found, [
        "tokens/s", "speed-up", "acceptance", "mean accepted length"])
    return table(header, rows, 1)


SAMPLER_SETTINGS = ["greedy", "top-k 40", "top-k 40 + top-p 0.9", "top-p 0.9"]


def render_sampler(ms: list[Machine]) -> str:
    found = with_data(ms, "sampler")
    rows = []
    vocab = 49152
    for batch in sorted({r["batch"] for _, d in found for r in d["rows"]}):
        row = [str(batch)]
        for _, d in found:
            by = {(r["vocab"], r["batch"], r["setting"]): r for r in d["rows"]}
            for s in SAMPLER_SETTINGS:
                r = by.get((vocab, batch, s))
                row.append("" if r is None else
                           f"{r['full_sort_ms']:.3g} / {r['fast_ms']:.3g} ({r['full_sort_ms'] / r['fast_ms']:.1f}x)")
        rows.append(row)
    return table(["B"] + per_machine(found, SAMPLER_SETTINGS), rows, 1)


def render_llama_cpp(ms: list[Machine]) -> str:
    found = with_data(ms, "llama_cpp")
    keys = list(dict.fromkeys((r["workload"], r["dtype"]) for _, d in found for r in d["results"]))
    rows = []
    for workload, dtype in keys:
        row = [workload, dtype]
        for _, d in found:
            r = {x["engine"]: x["median"] for x in d["results"] if (x["workload"], x["dtype"]) == (workload, dtype)}
            peer, ours = r.get("llama.cpp"), r.get("rosellm")
            row += ["", "", "", ""] if not (peer and ours) else [
                f"{peer['throughput_tok_s']:.1f}", f"{ours['throughput_tok_s']:.1f}",
                f"{peer['ttft_p50_ms'] / 1e3:.1f} s / {ours['ttft_p50_ms'] / 1e3:.1f} s",
                f"{peer['tpot_p50_ms']:.0f} ms / {ours['tpot_p50_ms']:.0f} ms"]
        rows.append(row)
    header = ["workload", "dtype"] + per_machine(found, [
        "llama.cpp tokens/s", "`rosellm-edu serve` tokens/s", "TTFT p50 llama.cpp / ours", "TPOT p50 llama.cpp / ours"])
    text = table(header, rows, 2)
    for m, d in found:
        b = d.get("batched_bench")
        if b:
            where = f" on {m.label}" if len(found) > 1 else ""
            text += (f"\n`llama-batched-bench` on the {b['dtype']} file{where} (128-token prompts, 64 parallel, 64 "
                     f"generated): prompts at {b['prompt_tokens_s']:.1f} tokens/s, generation at "
                     f"{b['generation_tokens_s']:.1f} tokens/s.\n")
    return text


def render_stalls(ms: list[Machine]) -> str:
    """benchmarks/stalls.py's before/after: per scenario the streams' worst gap and a 1-token request's latency
    beside the offender (alone in brackets), and whether the full-size offender was refused."""
    text = ""
    for m, d in with_data(ms, "stalls"):
        sides = list(d["checkouts"])
        rows = []
        for name, scenario in d["scenarios"].items():
            row = [name.replace("_", " ")]
            for key in ("worst_gap_s", "probe"):
                for side in sides:
                    r = scenario["checkouts"][side]
                    row.append("skipped" if "skipped" in r else stall_cell(r, key))
            for side in sides:
                r = scenario["checkouts"][side]
                refused = r.get("refused")
                row.append("" if "skipped" in r else f"{refused['status']}" if refused else "accepted")
            rows.append(row)
        header = (["scenario"] + [f"worst gap {side} (s)" for side in sides]
                  + [f"1-token request {side} (s)" for side in sides] + [f"full size {side}" for side in sides])
        commits = ", ".join(f"{side} `{c['commit']}`" for side, c in d["checkouts"].items())
        text += (f"{m.label}, {d['threads']} threads, torch {d['torch']}, {d['date'][:10]} ({commits}):\n\n"
                 + table(header, rows, 1) + f"\nReproduce: `{d['command']}`\n")
    return text


def stall_cell(r: dict, key: str) -> str:
    """'beside (alone)' for the worst gap or the 1-token request's seconds; '-' where the scenario has none."""
    def value(run: dict) -> float | None:
        return run["worst_gap_s"] if key == "worst_gap_s" else (run["probe"] or {}).get("seconds")
    beside, alone = value(r["with_offender"]), value(r["baseline"])
    return "-" if beside is None else f"{beside:.2f} ({alone:.2f})" if alone is not None else f"{beside:.2f}"


def render_structured(ms: list[Machine]) -> str:
    found = with_data(ms, "structured")
    batches = sorted({r["batch"] for _, d in found for r in d["steps"]})
    rows = []
    for batch in batches:
        row = [str(batch)]
        for _, d in found:
            r = next((r for r in d["steps"] if r["batch"] == batch), None)
            row += ["", "", ""] if r is None else [f"{r['step_ms']:.1f} ms", f"{r['bitmask_ms']:.3f} ms",
                                                   f"{r['bitmask_ms'] / r['step_ms']:.2%}"]
        rows.append(row)
    text = table(["constrained rows"] + per_machine(found, ["decode step", "bitmask fill + apply", "share"]), rows, 1)
    for m, d in found:
        mixed, valid = d["mixed_tokens_per_s"], d["valid"]
        where = f"On {m.label}: s" if len(found) > 1 else "S"
        text += (f"\n{where}ixteen requests, a quarter constrained, {mixed['quarter_constrained']:.1f} tokens/s against "
                 f"{mixed['unconstrained']:.1f} with none constrained; valid answers {valid['prompt_only']:.0%} with the "
                 f"schema asked for in the prompt only, {valid['constrained']:.0%} constrained ({d['machine']}).\n")
    return text


def render_gpu(ms: list[Machine]) -> str:
    """benchmarks/gpu.py's run: the engine's figures on the GPU, beside what peers report (their hardware named)
    and transformers measured in the same run."""
    text = ""
    for m in ms:
        engine, llama, sampler, checks, tests = (m.data(f"gpu_{part}") for part in ("engine", "llama", "sampler",
                                                                                          "correctness", "tests"))
        if not (engine and llama and sampler and checks and tests):
            continue
        fixed, h = llama["fixed_length"], engine["header"]
        theirs = fixed["transformers_generate_batch"]
        top = {(r["vocab"], r["batch"], r["setting"]): r for r in sampler["rows"]}[(151936, 256, "top-k 40 + top-p 0.9")]
        greedy = checks["greedy_vs_transformers"]
        rows = [
            ["GPT-2's shape (124M), 64 requests x 512 tokens, sampling at temperature 1",
             f"{engine['batch64_sampling']['tokens_per_s']:,.0f} tokens/s",
             "roseinfer's post: 14,114 tokens/s, 4.58 ms per output token (its own GPU)"],
            ["the same, greedy", f"{engine['batch64_greedy']['tokens_per_s']:,.0f} tokens/s", ""],
            ["GPT-2's shape, one request alone: time per output token",
             f"{engine['batch1']['tpot_ms']:.2f} ms", ""],
            ["a Qwen3-0.6B-shaped model, nano-vllm's workload (256 requests, 100-1,024 tokens in and out, "
             "temperature 0.6)", f"{llama['nano_vllm_workload']['tokens_per_s']:,.0f} tokens/s",
             "nano-vllm: 8,670; vLLM: 9,530 (their README, an A100 at 4,096 tokens of context)"],
            [f"the same model, 256 requests x {fixed['max_tokens']} tokens: ours / transformers' `generate_batch`",
             f"{fixed['ours']['tokens_per_s']:,.0f} / {theirs['tokens_per_s']:,.0f} tokens/s "
             f"({fixed['ours_over_transformers']:.1f}x)", "same run"],
            ["batched sampler, B = 256, V = 151,936, top-k 40 + top-p 0.9: full sort / ours",
             f"{top['full_sort_ms']:.2f} / {top['fast_ms']:.2f} ms ({top['speedup']:.1f}x)", "same run"],
            ["times a decode step waits for the GPU (sync debug mode)",
             f"{checks['sync_audit']['syncs_per_step']:.0f}", "one is the sampled tokens' transfer"],
            ["greedy tokens equal to transformers' on the GPU (float32, 32 tokens)",
             ", ".join(f"{k}: {v['equal']}/{v['prompts']}" for k, v in greedy.items()), "same run"],
            ["the test files with CUDA paths (pytest)", *tests["summary"], "same run"],
        ]
        host = m.data("gpu_cpu")
        if host:
            flags = ", ".join(name for flag, name in DECIDING_FLAGS.items() if flag in host["flags"])
            rows.append([f"the C++ kernels' test files on the host CPU ({host['cpu']}: {flags}), 2 threads a worker "
                         "(pytest)",
                         *host["summary"], "random weights: the tests that need the embedded model's own are skipped"])
        text += (("\n" if text else "") + f"{h['device']}, driver {h.get('driver')}, torch {h['torch']}, CUDA {h['cuda']}, "
                 f"{h['date'][:10]}; random weights of each named shape, bfloat16, CUDA graphs on:\n\n"
                 + table(["what", "measured", "for comparison"], rows, 1)
                 + f"\nRecorded with `{h['command']}` (`--tokenizer`, `--smollm2-config`: the embedded model's files, "
                 "which are the defaults where the package is set up).\n")
        later: dict[tuple[str, str], list[str]] = {}
        for part, d in (("correctness", checks), ("tests", tests), ("cpu", host)):
            if d and d["header"]["command"] != h["command"]:
                later.setdefault((d["header"]["command"], d["header"]["date"][:10]), []).append(part)
        text += "".join(f"The rows of the {' and '.join(parts)} part{'s' if len(parts) > 1 else ''} are from a later "
                        f"run, {date}: `{command}`.\n" for (command, date), parts in later.items())
    return text


RENDERERS: dict[str, Callable[[list[Machine]], str]] = {
    "machines": render_machines, "mixed": render_mixed, "quantization": render_quantization,
    "speculative": render_speculative, "sampler": render_sampler, "llama-cpp": render_llama_cpp,
    "stalls": render_stalls, "gpu": render_gpu, "structured": render_structured}


def render(text: str, ms: list[Machine]) -> str:
    """README's text with every figures block generated anew; an unknown block name is an error."""
    def block(match: re.Match) -> str:
        name = match["name"]
        if name not in RENDERERS:
            raise ValueError(f"README.md: unknown figures block {name!r}; known: {', '.join(RENDERERS)}")
        return match[1] + RENDERERS[name](ms) + match[4]
    return BLOCK.sub(block, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when README.md differs from the JSON")
    args = parser.parse_args(argv)
    text = README.read_text()
    new = render(text, machines())
    if new == text:
        return 0
    if args.check:
        print("README.md's figures differ from notebooks/data: run python -m rosellm_edu.book.readme", file=sys.stderr)
        return 1
    README.write_text(new)
    print("rewrote README.md's figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
