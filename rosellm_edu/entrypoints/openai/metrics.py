# Generated from notebooks/07a_server_hardening.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


# notebooks/07a_server_hardening.ipynb, cell 13
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


# notebooks/07a_server_hardening.ipynb, cell 13
class ServerMetrics:
    """What /metrics exposes, in vLLM's names (vllm: -> rosellm:), in a registry of the app's own."""

    def __init__(self):
        self.registry = r = CollectorRegistry()
        gauge = lambda name, doc: Gauge(f"rosellm:{name}", doc, registry=r)   # noqa: E731
        self.running = gauge("num_requests_running", "Sequences in the running batch")
        self.waiting = gauge("num_requests_waiting", "Sequences waiting to be admitted")
        self.kv_blocks_used = gauge("kv_cache_blocks_used", "KV blocks held by sequences")
        self.kv_usage = gauge("kv_cache_usage_perc", "Share of the KV blocks in use, 0 to 1")
        self.prefix_hit_rate = gauge("prefix_cache_hit_rate", "Share of new prompts' tokens found cached")
        histogram = lambda name, doc: Histogram(f"rosellm:{name}", doc, buckets=LATENCY_BUCKETS,  # noqa: E731
                                                registry=r)
        self.ttft = histogram("time_to_first_token_seconds", "Request arrival to its first token")
        self.tpot = histogram("time_per_output_token_seconds", "Mean gap between a request's later tokens")
        self.e2e = histogram("e2e_request_latency_seconds", "Request arrival to its last token")
        self.prompt_tokens = Counter("rosellm:prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("rosellm:generation_tokens", "Generated tokens", registry=r)

    def engine_stats(self, stats: dict) -> None:
        used = stats["total_blocks"] - stats["free_blocks"]
        self.running.set(stats["running"])
        self.waiting.set(stats["waiting"])
        self.kv_blocks_used.set(used)
        self.kv_usage.set(used / stats["total_blocks"])
        self.prefix_hit_rate.set(stats["prefix_hit_rate"])


# notebooks/07a_server_hardening.ipynb, cell 15
router = APIRouter()


# notebooks/07a_server_hardening.ipynb, cell 15
@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def show_metrics(raw: Request) -> Response:
    """Prometheus' text format. The engine's numbers are the snapshot its thread published after its last step:
    never waiting on the engine, /metrics answers even while a step hangs."""
    state = raw.app.state
    state.metrics.engine_stats(state.engine.stats)
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
