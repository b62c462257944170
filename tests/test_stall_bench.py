"""The stall benchmark (rosellm_edu.benchmarks.stalls) in its quick mode, against this checkout's server: the
report's shape, and every stream finished beside every offender. Timings are the benchmark's to report, never a
test's to assert."""

import json

import pytest

from rosellm_edu.benchmarks import stalls


def test_unknown_scenario_is_refused():
    with pytest.raises(SystemExit):
        stalls.parse_args(["--scenarios", "echo_logprobs,nope"])
    assert stalls.parse_args(["--quick"]).scenarios == list(stalls.SCENARIOS)


def test_quick_run_reports_every_scenario(tmp_path):
    out = tmp_path / "stalls.json"
    report = stalls.main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert {"machine", "threads", "torch", "date", "command", "checkouts"} <= report.keys()
    assert list(report["checkouts"]) == ["after"]   # no --before: this checkout only
    assert list(report["scenarios"]) == list(stalls.SCENARIOS)
    size = stalls.QUICK
    for name, scenario in report["scenarios"].items():
        result = scenario["checkouts"]["after"]
        if "skipped" in result:   # a scenario whose server flag this checkout lacks
            assert stalls.SCENARIOS[name][1] and "--" in result["skipped"]
            continue
        for run in (result["baseline"], result["with_offender"]):
            assert run["stream_errors"] == []
            assert run["streams_finished"] == size.streams
            assert len(run["stream_seconds"]) == size.streams and run["worst_gap_s"] > 0
        offenders = result["with_offender"]["offender"]
        assert result["baseline"]["offender"] == [] and len(offenders) >= 1
        assert all(o["status"] in (200, 400) for o in offenders), offenders
        assert all(o["status"] == 200 or o["error"] for o in offenders)
        has_probe = name in ("big_prompts", "n_large", "n_large_priority")
        for run in (result["baseline"], result["with_offender"]):
            assert (run["probe"] is not None and run["probe"]["status"] == 200) if has_probe else run["probe"] is None
        if result["refused"] is not None:   # a limit: the full-size offender refused in OpenAI's shape
            assert result["refused"]["status"] == 400 and result["refused"]["error"]
