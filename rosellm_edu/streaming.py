# Generated from notebooks/03_continuous_batching.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

from rosellm_edu.outputs import RequestOutput
from rosellm_edu.sampling_params import SamplingParams


# notebooks/03_continuous_batching.ipynb, cell 42
@dataclass
class Request:
    request_id: str
    prompt: str | dict
    params: SamplingParams = field(default_factory=SamplingParams)
    arrival_time: float = 0.0     # seconds after the stream starts


# notebooks/03_continuous_batching.ipynb, cell 42
@dataclass
class Delta:
    request_id: str
    text: str                     # new text since this request's previous delta
    token_ids: list[int]          # new tokens
    finished: bool
    finish_reason: str | None     # "stop", "length", or "error"
    time: float                   # seconds after the stream started
    error: str | None = None


# notebooks/03_continuous_batching.ipynb, cell 43
class DeltaTracker:
    """What each request has been sent so far, so that its next output becomes a delta of only the new part."""

    def __init__(self):
        self.sent_tokens: dict[str, int] = {}
        self.sent_text: dict[str, int] = {}
        self.hold: dict[str, int] = {}   # characters held back: a stop string may still be forming there

    def add(self, request_id: str, params: SamplingParams) -> None:
        self.sent_tokens[request_id] = self.sent_text[request_id] = 0
        self.hold[request_id] = max(map(len, params.stop), default=1) - 1

    def next(self, out: RequestOutput) -> tuple[str, list[int]]:
        """The text and token ids of out that were not sent yet; a finished request is forgotten."""
        rid, completion = out.request_id, out.outputs[0]
        text, sent = completion.text, self.sent_text[rid]
        end = len(text) if out.finished else len(text.rstrip("\ufffd")) - self.hold[rid]
        end = max(end, sent)
        new_tokens = completion.token_ids[self.sent_tokens[rid]:]
        self.sent_tokens[rid], self.sent_text[rid] = len(completion.token_ids), end
        if out.finished:
            del self.sent_tokens[rid], self.sent_text[rid], self.hold[rid]
        return text[sent:end], new_tokens


# notebooks/03_continuous_batching.ipynb, cell 44
def stream(engine, requests: list[Request], clock=time.perf_counter) -> Iterator[Delta]:
    pending = deque(sorted(requests, key=lambda r: r.arrival_time))
    tracker = DeltaTracker()
    start = clock()
    while pending or engine.has_unfinished_requests():
        now = clock() - start
        while pending and pending[0].arrival_time <= now:
            r = pending.popleft()
            try:
                engine.add_request(r.request_id, r.prompt, r.params)
                tracker.add(r.request_id, r.params)
            except (ValueError, TypeError) as e:
                yield Delta(r.request_id, "", [], True, "error", now, error=str(e))
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[0].arrival_time - now))
            continue
        for out in engine.step():
            text, token_ids = tracker.next(out)
            yield Delta(out.request_id, text, token_ids, out.finished, out.outputs[0].finish_reason, clock() - start)
