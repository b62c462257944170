# Generated from notebooks/03_continuous_batching.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from dataclasses import dataclass, field

import numpy as np


# notebooks/03_continuous_batching.ipynb, cell 46
@dataclass
class RequestTimes:
    arrival: float
    token_times: list[float] = field(default_factory=list)  # one entry per output token
    prompt_tokens: int = 0

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival

    @property
    def e2e(self) -> float:
        return self.token_times[-1] - self.arrival

    @property
    def tpot(self) -> float | None:
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else None

    @property
    def itl(self) -> list[float]:
        return np.diff(self.token_times).tolist()


# notebooks/03_continuous_batching.ipynb, cell 46
def percentiles_ms(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p95": float("nan"), "p99": float("nan")}
    p50, p95, p99 = np.percentile(np.array(values) * 1000, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99)}


# notebooks/03_continuous_batching.ipynb, cell 47
def summarize(requests: list[RequestTimes], duration: float) -> dict:
    done = [r for r in requests if r.token_times]
    completion = sum(len(r.token_times) for r in done)
    return {
        "requests": len(done),
        "prompt_tokens": sum(r.prompt_tokens for r in done),
        "completion_tokens": completion,
        "duration_s": duration,
        "throughput_tok_s": completion / duration,
        "request_throughput": len(done) / duration,
        "ttft_ms": percentiles_ms([r.ttft for r in done]),
        "tpot_ms": percentiles_ms([r.tpot for r in done if r.tpot is not None]),
        "itl_ms": percentiles_ms([gap for r in done for gap in r.itl]),
        "e2e_ms": percentiles_ms([r.e2e for r in done]),
    }


# notebooks/03_continuous_batching.ipynb, cell 47
def format_summary(summary: dict, title: str = "summary") -> str:
    lines = [f"=== {title} ===",
             f"Requests: {summary['requests']}",
             f"Prompt tokens: {summary['prompt_tokens']}",
             f"Completion tokens: {summary['completion_tokens']}",
             f"Duration: {summary['duration_s']:.2f} s",
             f"Throughput(completion): {summary['throughput_tok_s']:.1f} tokens/s"]
    for key, name in [("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "Latency")]:
        if key in summary:
            p = summary[key]
            lines.append(f"{name} p50/p95/p99: {p['p50']:.2f}/{p['p95']:.2f}/{p['p99']:.2f} ms")
    return "\n".join(lines)
