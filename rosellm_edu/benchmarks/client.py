"""Drive an OpenAI-compatible server (ours, vLLM, SGLang) with a benchmark workload and time every chunk.

    python -m rosellm_edu.benchmarks.mixed --engines openai --url http://127.0.0.1:8000/v1 --workload mixed

Each request is a streamed `/v1/completions` call with token-id prompts and `ignore_eos`, so every server
generates exactly the workload's lengths. One streamed chunk is counted as one token, which holds for our server
and for vLLM and SGLang at their default stream interval; the usage the server reports at the end is compared,
and the number of requests where the two differ is in the summary.
"""

import asyncio
import time

import openai

from rosellm_edu.benchmarks.metrics import RequestTimes, summarize


async def run_openai(url: str, requests: list[tuple[list[int], int]], arrivals: list[float],
                     model: str | None = None, **sampling) -> dict:
    """The summary of rosellm_edu.benchmarks.metrics for one run of the workload against the server at url."""
    times, duration, model, mismatches = await time_requests(url, requests, arrivals, model, **sampling)
    return {**summarize(times, duration), "url": url, "model": model, "chunk_count_mismatches": mismatches}


async def time_requests(url: str, requests: list[tuple[list[int], int]], arrivals: list[float],
                        model: str | None = None, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                        api_key: str = "EMPTY", timeout: float = 600.0) -> tuple[list[RequestTimes], float, str, int]:
    """Send (prompt token ids, output length) requests at `arrivals` (seconds after the start); return each
    request's chunk times, the run's duration, the model asked for, and the requests whose chunk count differs
    from the completion tokens the server reported."""
    sampling = {"temperature": temperature, "top_p": top_p,
                "extra_body": {"ignore_eos": True, **({"top_k": top_k} if top_k > 0 else {})}}
    async with openai.AsyncOpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=timeout) as client:
        model = model or (await client.models.list()).data[0].id
        start = time.perf_counter()
        results = await asyncio.gather(*[timed_request(client, model, prompt, n, arrival, start, sampling)
                                         for (prompt, n), arrival in zip(requests, arrivals)])
        duration = time.perf_counter() - start
    mismatches = sum(len(times.token_times) != used for times, used in results)
    return [times for times, _ in results], duration, model, mismatches


async def timed_request(client: openai.AsyncOpenAI, model: str, prompt: list[int], max_tokens: int,
                        arrival: float, start: float, sampling: dict) -> tuple[RequestTimes, int]:
    """The arrival time of each chunk (seconds after start), and the completion tokens the server reports."""
    await asyncio.sleep(max(0.0, arrival - (time.perf_counter() - start)))
    times, used = RequestTimes(arrival, prompt_tokens=len(prompt)), 0
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, stream=True,
                                             stream_options={"include_usage": True}, **sampling)
    async for chunk in stream:
        if chunk.choices:
            times.token_times.append(time.perf_counter() - start)
        if chunk.usage:
            used = chunk.usage.completion_tokens
    return times, used
