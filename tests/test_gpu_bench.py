"""benchmarks/gpu.py at toy sizes on this machine: the checks it runs on a GPU hold here too, and each part
writes its JSON with the header a recorded run needs."""

import json

from rosellm_edu.benchmarks import gpu


def test_the_gpu_run_checks_and_records_at_toy_sizes(tmp_path):
    gpu.main(["--out", str(tmp_path), "--smoke", "--parts", "correctness,sampler"])
    checks = json.loads((tmp_path / "gpu_correctness.json").read_text())
    assert checks["status"] == "ok" and {"device", "torch", "date", "command"} <= set(checks["header"])
    for shape, result in checks["greedy_vs_transformers"].items():
        assert result["equal"] == result["prompts"], (shape, result)
    assert all(r["pvalue"] > 1e-3 and r["outside_support"] == 0 for r in checks["sampler_chi_square"])
    assert all(r["same_argmax"] for key, rows in checks.items() if key.startswith("graph_vs_eager") for r in rows)
    sampler = json.loads((tmp_path / "gpu_sampler.json").read_text())
    assert sampler["status"] == "ok" and sampler["rows"]
