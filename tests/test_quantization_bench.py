"""benchmarks/quantization.py's report, as README renders it: medians over rounds, the read floor where a run
measured it, llama.cpp's batch-1 rows where it ran."""

from rosellm_edu.benchmarks.quantization import MODELS, decode_command
from rosellm_edu.book.readme import quantization_medians


def report(tpots: list[float], read_floor: bool, llama: list[float] | None) -> dict:
    runs = [{"models": [{"quantization": q, "dtype": dtype, "weight_bytes": 96_000_000, "weight_floor_ms": 3.0,
                         **({"weight_read_floor_ms": 2.0} if read_floor else {}),
                         "results": [{"batch_size": 1, "tpot_ms": t}, {"batch_size": 64, "throughput_tok_s": 64e3 / t}]}]}
            for t in tpots for dtype, q in MODELS]
    return {"runs": runs, "llama_cpp": [{"Q4_1": {"tpot_ms": x}} for x in llama or []]}


def test_medians_over_rounds_with_the_read_floor_and_llama_cpp():
    med = quantization_medians(report([5.0, 9.0, 6.0], True, [4.0, 8.0, 5.0]))
    assert med[("int4", "bfloat16")]["tpot"] == 6.0 and med[("int4", "bfloat16")]["read_floor"] == 2.0
    assert med[("llama.cpp", "Q4_1")] == {"tpot": 5.0, "rounds": 3}


def test_a_run_without_the_read_floor_or_llama_cpp_leaves_them_out():
    med = quantization_medians(report([5.0], False, None))
    assert med[("int4", "bfloat16")]["read_floor"] is None and ("llama.cpp", "Q4_1") not in med


def test_each_model_runs_the_decode_benchmark_with_its_own_options(tmp_path):
    for dtype, quantization in MODELS:
        command = decode_command(dtype, quantization, tmp_path / "x.json")
        assert command[command.index("--dtype") + 1] == dtype
        assert ("--quantization" in command) == (quantization is not None)


def test_how_batch_1_steps_were_issued_is_read_from_the_runs():
    old = quantization_medians(report([5.0], True, None))
    assert old[("int4", "bfloat16")]["issued"] == "modules, before 11b"     # runs that did not record it
    new = report([5.0, 6.0], True, None)
    for i, run in enumerate(new["runs"]):
        for model in run["models"]:
            model["results"][0]["issued"] = "native" if model["quantization"] and i // len(MODELS) else "modules"
    med = quantization_medians(new)
    assert med[("int4", "bfloat16")]["issued"] == "modules or native" and med[(None, "bfloat16")]["issued"] == "modules"
