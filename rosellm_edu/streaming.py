# Generated from notebooks/03_continuous_batching.ipynb by `python -m rosellm_edu.export`.
# Edit the notebook, not this file.

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

from rosellm_edu.sampling_params import SamplingParams


@dataclass
class Request:
    request_id: str
    prompt: str | dict
    params: SamplingParams = field(default_factory=SamplingParams)
    arrival_time: float = 0.0     # seconds after the stream starts


@dataclass
class Delta:
    request_id: str
    text: str                     # new text since this request's previous delta
    token_ids: list[int]          # new tokens
    finished: bool
    finish_reason: str | None     # "stop", "length", or "error"
    time: float                   # seconds after the stream started
    error: str | None = None


def stream(engine, requests: list[Request], clock=time.perf_counter) -> Iterator[Delta]:
    pending = deque(sorted(requests, key=lambda r: r.arrival_time))
    sent_tokens: dict[str, int] = {}
    sent_text: dict[str, int] = {}
    hold = {r.request_id: max(map(len, r.params.stop), default=1) - 1 for r in requests}
    start = clock()
    while pending or engine.has_unfinished_requests():
        now = clock() - start
        while pending and pending[0].arrival_time <= now:
            r = pending.popleft()
            try:
                engine.add_request(r.request_id, r.prompt, r.params)
                sent_tokens[r.request_id] = sent_text[r.request_id] = 0
            except (ValueError, TypeError) as e:
                yield Delta(r.request_id, "", [], True, "error", now, error=str(e))
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[0].arrival_time - now))
            continue
        for out in engine.step():
            rid, completion = out.request_id, out.outputs[0]
            text = completion.text
            end = len(text) if out.finished else len(text.rstrip("\ufffd")) - hold[rid]
            end = max(end, sent_text[rid])
            yield Delta(rid, text[sent_text[rid]:end], completion.token_ids[sent_tokens[rid]:], out.finished,
                        completion.finish_reason, clock() - start)
            sent_tokens[rid], sent_text[rid] = len(completion.token_ids), end
