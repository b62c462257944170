"""Drive an OpenAI-compatible server (ours, vLLM, SGLang, llama.cpp) with a benchmark workload and time every token.

    python -m rosellm_edu.benchmarks.mixed --engines openai --url http://127.0.0.1:8000/v1 --workload mixed

Each request is a streamed `/v1/completions` call with token-id prompts and `ignore_eos`, so every server
generates exactly the workload's lengths. A streamed chunk is not a token: a server may send an empty closing
chunk, hold a token back (half a UTF-8 character, a possible stop string) and send it with the next, or send
several tokens per chunk by design. So tokens are counted from what the server says:
- `stream_options.continuous_usage_stats` (vLLM, SGLang, ours): every chunk carries the completion tokens so
  far, and a chunk's tokens are the difference;
- otherwise, by re-tokenizing the text received so far with the model's tokenizer, when one is given;
- otherwise, one token per non-empty chunk, the last resort.
A chunk's tokens all get the chunk's arrival time. The usage the server reports at the end is compared with the
count, and the number of requests where the two differ is in the summary (`token_count_mismatches`).
"""

import asyncio
import time

import openai

from rosellm_edu.benchmarks.metrics import RequestTimes, summarize


async def run_openai(url: str, requests: list[tuple[list[int], int]], arrivals: list[float],
                     model: str | None = None, tokenizer=None, **sampling) -> dict:
    """The summary of rosellm_edu.benchmarks.metrics for one run of the workload against the server at url."""
    times, duration, model, mismatches = await time_requests(url, requests, arrivals, model, tokenizer=tokenizer,
                                                             **sampling)
    return {**summarize(times, duration), "url": url, "model": model, "token_count_mismatches": mismatches}


async def time_requests(url: str, requests: list[tuple[list[int], int]], arrivals: list[float],
                        model: str | None = None, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                        api_key: str = "EMPTY", timeout: float = 600.0,
                        tokenizer=None) -> tuple[list[RequestTimes], float, str, int]:
    """Send (prompt token ids, output length) requests at `arrivals` (seconds after the start); return each
    request's token times, the run's duration, the model asked for, and the requests whose token count differs
    from the completion tokens the server reported."""
    sampling = {"temperature": temperature, "top_p": top_p,
                "extra_body": {"ignore_eos": True, **({"top_k": top_k} if top_k > 0 else {})}}
    async with openai.AsyncOpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=timeout) as client:
        model = model or (await client.models.list()).data[0].id
        start = time.perf_counter()
        results = await asyncio.gather(*[timed_request(client, model, prompt, n, arrival, start, sampling, tokenizer)
                                         for (prompt, n), arrival in zip(requests, arrivals)])
        duration = time.perf_counter() - start
    mismatches = sum(used is not None and len(times.token_times) != used for times, used in results)
    return [times for times, _ in results], duration, model, mismatches


class TokenCounter:
    """How many tokens a chunk brought: from the server's running usage, else by re-tokenizing, else 1."""

    def __init__(self, tokenizer=None):
        self.tokenizer, self.text, self.counted = tokenizer, "", 0

    def new_tokens(self, text: str, usage_so_far: int | None) -> int:
        self.text += text
        if usage_so_far is not None:
            total = usage_so_far
        elif self.tokenizer is not None:
            total = len(self.tokenizer(self.text, add_special_tokens=False).input_ids) if self.text else 0
        else:
            total = self.counted + (1 if text else 0)
        new, self.counted = max(total - self.counted, 0), max(total, self.counted)
        return new


async def timed_request(client: openai.AsyncOpenAI, model: str, prompt: list[int], max_tokens: int,
                        arrival: float, start: float, sampling: dict, tokenizer=None,
                        times: RequestTimes | None = None) -> tuple[RequestTimes, int | None]:
    """The arrival time of each token (seconds after start), and the completion tokens the server reports.
    `times`, where given, is the record filled as tokens arrive, for a caller that watches the stream's progress."""
    await asyncio.sleep(max(0.0, arrival - (time.perf_counter() - start)))
    times = times if times is not None else RequestTimes(arrival, prompt_tokens=len(prompt))
    used, counter = None, TokenCounter(tokenizer)
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, stream=True,
                                             stream_options={"include_usage": True, "continuous_usage_stats": True},
                                             **sampling)
    async for chunk in stream:
        now = time.perf_counter() - start
        if chunk.usage:
            used = chunk.usage.completion_tokens
        if chunk.choices:
            so_far = chunk.usage.completion_tokens if chunk.usage else None
            times.token_times += [now] * counter.new_tokens(chunk.choices[0].text or "", so_far)
    return times, used
