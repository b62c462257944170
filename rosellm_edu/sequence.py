# Generated from notebooks/01_token_generation.ipynb, notebooks/06_fast_sampling.ipynb, notebooks/06a_logprobs.ipynb, notebooks/08_where_the_time_goes.ipynb, notebooks/13_structured_output.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from dataclasses import dataclass, field
from enum import Enum

import torch
from tokenizers.decoders import DecodeStream

from rosellm_edu.layers.logits_processors import ProcessorState
from rosellm_edu.outputs import CompletionOutput, Logprob, RequestOutput
from rosellm_edu.sampling_params import SamplingParams


# notebooks/01_token_generation.ipynb, cell 26
class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


# notebooks/01_token_generation.ipynb, cell 26
@dataclass
class Sequence:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)
    text: str = ""
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    generator: torch.Generator | None = None   # the request's own, when it has a seed

    # notebooks/13_structured_output.ipynb, cell 35
    def __post_init__(self):
        self.detokenizer: DecodeStream | None = None   # grows the text token by token, from the first one on
        self.held = range(0)                               # positions whose bytes the stream still holds
        self.processors: ProcessorState | None = None      # the engine's, when the request uses a processor
        self.grammar: StructuredOutputRequest | None = None   # the engine's, when the request has a grammar
        asked = self.params.return_sampling_mask
        self.sampling_mask: list[list[int]] | None = [] if asked else None   # kept ids per token, when asked
        self.sampling_logz: list[float] | None = [] if asked else None
        self.logprobs: list[dict[int, Logprob]] | None = None if self.params.logprobs is None else []
        self.cumulative_logprob: float | None = None if self.params.logprobs is None else 0.0
        self.prompt_logprobs: list[dict[int, Logprob] | None] | None = (
            None if self.params.prompt_logprobs is None else [None])   # the first prompt token has none

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def __len__(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    # notebooks/01_token_generation.ipynb, cell 28
    def token_at(self, position: int) -> int:
        """token_ids[position] without building the whole list."""
        prompt_len = len(self.prompt_token_ids)
        return self.prompt_token_ids[position] if position < prompt_len else self.output_token_ids[position - prompt_len]

    # notebooks/01_token_generation.ipynb, cell 28
    @property
    def finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    # notebooks/01_token_generation.ipynb, cell 28
    def finish(self, reason: str, stop_reason: str | int | None = None) -> None:
        self.status, self.finish_reason, self.stop_reason = SequenceStatus.FINISHED, reason, stop_reason

    # notebooks/08_where_the_time_goes.ipynb, cell 32
    def output(self) -> RequestOutput:
        """The request's output so far. It shares the sequence's lists instead of copying them every step (a
        finished request's never change again; a running one's grow: copy them if you keep one)."""
        completion = CompletionOutput(0, self.text, self.output_token_ids, self.finish_reason, self.stop_reason,
                                      self.sampling_mask, self.sampling_logz, self.cumulative_logprob, self.logprobs)
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, [completion], self.finished,
                             self.prompt_logprobs)

    # notebooks/01_token_generation.ipynb, cell 30
    def append_token(self, token: int, tokenizer, eos_token_ids: set[int], max_model_len: int) -> None:
        """Add one generated token, update the text, and decide whether the sequence is finished."""
        self.output_token_ids.append(token)
        may_stop = len(self.output_token_ids) >= self.params.min_tokens
        if may_stop and not self.params.ignore_eos and token in eos_token_ids:
            self.finish("stop")
        elif may_stop and token in self.params.stop_token_ids:
            self.finish("stop", token)
        if self.finished:                             # the stop token's text stays out unless asked for
            if self.params.include_stop_str_in_output:
                self._step_text(tokenizer, token)
            self._settle(tokenizer)
            return
        searched = len(self.text)
        self._step_text(tokenizer, token)
        if may_stop and self._cut_stop_string(searched):
            return                                    # the text is cut at the stop string
        room = self.params.max_tokens if self.params.max_tokens is not None else max_model_len
        if len(self.output_token_ids) >= room or len(self) >= max_model_len:
            self.finish("length")
            self._settle(tokenizer)

    # notebooks/01_token_generation.ipynb, cell 30
    def _step_text(self, tokenizer, token: int) -> None:
        """Append the new characters of token, the last one appended; None from the stream: it holds the bytes."""
        if self.detokenizer is None:
            self.detokenizer = DecodeStream(ids=prompt_tail(self.prompt_token_ids, tokenizer),
                                            skip_special_tokens=self.params.skip_special_tokens)
        text = self.detokenizer.step(tokenizer.backend_tokenizer, token)
        self.held = range(0) if text is not None else range(self.held.start if self.held else len(self) - 1, len(self))
        self.text += text or ""

    # notebooks/01_token_generation.ipynb, cell 31
    def _settle(self, tokenizer) -> None:
        """At the end, append the text of the bytes the stream still holds (a "\ufffd" per broken character),
        decoded after the tokens before them."""
        if self.held:
            ids = self.token_ids
            before = ids[max(0, self.held.start - PRIMING_TOKENS.start):self.held.start]
            whole = self._decode(tokenizer, before + ids[self.held.start:self.held.stop])
            self.text += whole[len(self._decode(tokenizer, before)):]
            self.held = range(0)

    # notebooks/01_token_generation.ipynb, cell 31
    def _decode(self, tokenizer, token_ids: list[int]) -> str:
        return tokenizer.decode(token_ids, skip_special_tokens=self.params.skip_special_tokens)

    # notebooks/01_token_generation.ipynb, cell 31
    def _cut_stop_string(self, searched: int = 0) -> bool:
        """Cut the text at the earliest stop string that ends after text[:searched] (already searched)."""
        hits = [(i, s) for s in self.params.stop if (i := self.text.find(s, max(0, searched - len(s) + 1))) >= 0]
        if not hits:
            return False
        index, stop = min(hits)
        self.text = self.text[:index + len(stop) if self.params.include_stop_str_in_output else index]
        self.finish("stop", stop)
        return True

    # notebooks/06_fast_sampling.ipynb, cell 53
    def record_sampling_mask(self, mask: list[int] | None, logz: float) -> None:
        """Keep the support the next token is drawn from; None (nothing truncated) makes the whole mask None."""
        self.sampling_logz.append(logz)
        if mask is None:
            self.sampling_mask = None
        else:
            self.sampling_mask.append(mask)

    # notebooks/06a_logprobs.ipynb, cell 16
    def record_logprobs(self, logprobs: dict[int, Logprob], token: int) -> None:
        """The sampled token's {id: Logprob}, before the token is appended."""
        self.logprobs.append(logprobs)
        self.cumulative_logprob += logprobs[token].logprob

    # notebooks/08_where_the_time_goes.ipynb, cell 32
    def token_slice(self, start: int, end: int) -> list[int]:
        """token_ids[start:end], reading only those positions (token_ids builds all of them)."""
        prompt_len = len(self.prompt_token_ids)
        if end <= prompt_len:
            return self.prompt_token_ids[start:end]
        if start >= prompt_len:
            return self.output_token_ids[start - prompt_len:end - prompt_len]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - prompt_len]


# notebooks/01_token_generation.ipynb, cell 30
PRIMING_TOKENS = range(4, 25)   # the lengths of prompt tail tried to prime the detokenizer with (vLLM's)


# notebooks/01_token_generation.ipynb, cell 31
def prompt_tail(prompt_token_ids: list[int], tokenizer) -> list[int]:
    """The shortest tail of the prompt (4 tokens or more) that decodes to whole characters; [] if none does."""
    tails = [prompt_token_ids[-n:] for n in PRIMING_TOKENS if n <= len(prompt_token_ids)] or [prompt_token_ids]
    return next((tail for tail in tails if "\ufffd" not in tokenizer.decode(tail)), [])


# notebooks/06_fast_sampling.ipynb, cell 51
def _copy(values: list | None) -> list | None:
    return None if values is None else list(values)
