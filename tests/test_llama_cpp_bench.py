"""The llama.cpp comparison script's parts that run without building llama.cpp: its arguments, the servers'
command lines, what it reads from llama-cpp-python's CHANGELOG and llama-batched-bench, and the JSON it writes."""

import json
from pathlib import Path

import pytest

from rosellm_edu.benchmarks import llama_cpp
from rosellm_edu.benchmarks.mixed import workload


def test_args_split_and_default_threads():
    args = llama_cpp.parse_args(["--dtypes", "float32", "--workloads", "mixed,equal", "--threads", "3"])
    assert args.dtypes == ["float32"] and args.workloads == ["mixed", "equal"] and args.threads == 3
    assert args.engines == ["llama.cpp", "rosellm"] and args.repeats == 3
    assert llama_cpp.parse_args([]).threads >= 1


@pytest.mark.parametrize("argv, named", [(["--dtypes", "float16"], "'float16'"), (["--workloads", "long"], "'long'"),
                                         (["--engines", "vllm"], "'vllm'"), (["--repeats", "0"], "--repeats")])
def test_bad_arguments_are_named(argv, named, capsys):
    with pytest.raises(SystemExit):
        llama_cpp.parse_args(argv)
    assert named in capsys.readouterr().err


@pytest.mark.parametrize("name", ["mixed", "equal"])
def test_every_llama_server_slot_holds_its_longest_request(name):
    requests = workload(name, 64, 49152, seed=0)
    slot = llama_cpp.slot_context(requests)
    assert slot % 256 == 0 and slot > max(len(p) + n for p, n in requests)
    command = llama_cpp.llama_server_command(Path("/b"), Path("/m/x-BF16.gguf"), "bfloat16", threads=2, parallel=64,
                                             slot_ctx=slot, port=1234, max_batched_tokens=2048)
    flag = lambda f: command[command.index(f) + 1]  # noqa: E731
    # llama-server splits -c evenly among its -np slots
    assert int(flag("-c")) // int(flag("-np")) == slot and flag("-np") == "64"
    assert (flag("-t"), flag("-ctk"), flag("-ctv"), flag("--port"), flag("-m")) == ("2", "bf16", "bf16", "1234",
                                                                                     "/m/x-BF16.gguf")
    assert command[0] == "/b/llama-server" and "--no-webui" in command


def test_our_server_runs_in_the_asked_dtype_and_batch():
    command = llama_cpp.rosellm_server_command("float32", 4321, max_num_seqs=64, max_batched_tokens=2048)
    flag = lambda f: command[command.index(f) + 1]  # noqa: E731
    assert command[2:4] == ["rosellm_edu.entrypoints.cli", "serve"]
    assert (flag("--dtype"), flag("--port"), flag("--max-num-seqs"), flag("--max-num-batched-tokens")) == (
        "float32", "4321", "64", "2048")


def test_vendored_commit_is_the_versions_own():
    changelog = ("## [Unreleased]\n\n## [0.3.36]\n\n- feat: update llama.cpp to ggml-org/llama.cpp@0c1e57098\n\n"
                 "## [0.3.35]\n\n- feat: update llama.cpp to ggml-org/llama.cpp@4df29be4f\n")
    assert llama_cpp.vendored_commit(changelog, "0.3.36") == "0c1e57098"
    assert llama_cpp.vendored_commit(changelog, "0.3.35") == "4df29be4f"
    assert llama_cpp.vendored_commit(changelog, "0.3.1") == "unknown"


def test_batched_bench_rates_read_from_its_jsonl():
    line = ('{"n_kv_max": 12288, "n_batch": 2048, "n_ubatch": 512, "flash_attn": -1, "is_pp_shared": 0, '
            '"n_gpu_layers": -1, "n_threads": 2, "n_threads_batch": 2, "pp": 128, "tg": 64, "pl": 64, '
            '"n_kv": 12288, "t_pp": 4.5, "speed_pp": 1820.4, "t_tg": 4.3, "speed_tg": 952.6, "t": 8.8, '
            '"speed": 1396.3}')
    row = llama_cpp.parse_batched_bench("main: n_kv_max = 12288\n" + line + "\nllama_perf_context_print: ...\n")
    assert (row["speed_pp"], row["speed_tg"], row["pl"]) == (1820.4, 952.6, 64)
    with pytest.raises(RuntimeError, match="no jsonl result"):
        llama_cpp.parse_batched_bench("error: unable to load model")


def fake_summary(throughput: float, ttft: float, tpot: float) -> dict:
    p = lambda v: {"p50": v, "p95": v, "p99": v}  # noqa: E731
    return {"requests": 64, "completion_tokens": 4096, "duration_s": 4096 / throughput,
            "throughput_tok_s": throughput, "ttft_ms": p(ttft), "tpot_ms": p(tpot), "token_count_mismatches": 0}


def test_report_holds_the_medians_and_is_json(tmp_path):
    runs = [fake_summary(100.0, 50.0, 9.0), fake_summary(300.0, 10.0, 3.0), fake_summary(200.0, 20.0, 5.0)]
    median = llama_cpp.median_summary(runs)
    assert median == {"throughput_tok_s": 200.0, "duration_s": 4096 / 200.0, "ttft_p50_ms": 20.0, "tpot_p50_ms": 5.0}
    argv = ["--dtypes", "bfloat16", "--repeats", "3"]
    args = llama_cpp.parse_args(argv)
    results = [{"workload": "equal", "dtype": "bfloat16", "engine": "llama.cpp", "command": ["llama-server"],
                "median": median, "runs": runs}]
    out = json.loads(json.dumps(llama_cpp.report(args, argv, "0.3.36", "0c1e57098", results, None)))
    assert out["llama_cpp"] == {"llama_cpp_python": "0.3.36", "commit": "0c1e57098"}
    assert out["command"] == "python -m rosellm_edu.benchmarks.llama_cpp --dtypes bfloat16 --repeats 3"
    assert out["results"][0]["median"]["throughput_tok_s"] == 200.0 and len(out["results"][0]["runs"]) == 3
    assert out["machine"]["threads"] == args.threads and out["machine"]["device"]
    assert "200.0" in llama_cpp.table(results)


def test_missing_cmake_is_named(monkeypatch):
    monkeypatch.setattr(llama_cpp.shutil, "which", lambda name, path=None: None)
    with pytest.raises(SystemExit, match="cmake"):
        llama_cpp.require_tools()
    only_cmake = lambda name, path=None: "/usr/bin/cmake" if name == "cmake" else None  # noqa: E731
    monkeypatch.setattr(llama_cpp.shutil, "which", only_cmake)
    with pytest.raises(SystemExit, match="C compiler .* and a C\\+\\+ compiler"):
        llama_cpp.require_tools()
