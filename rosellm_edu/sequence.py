# Generated from notebooks/01_token_generation.ipynb, notebooks/06_fast_sampling.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from dataclasses import dataclass, field
from enum import Enum

import torch
from tokenizers.decoders import DecodeStream

from rosellm_edu.outputs import CompletionOutput, RequestOutput
from rosellm_edu.sampling_params import SamplingParams


# notebooks/01_token_generation.ipynb, cell 25
class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


# notebooks/01_token_generation.ipynb, cell 25
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

    # notebooks/06_fast_sampling.ipynb, cell 48
    def __post_init__(self):
        self.detokenizer = DecodeStream(skip_special_tokens=True)
        asked = self.params.return_sampling_mask
        self.sampling_mask: list[list[int]] | None = [] if asked else None   # kept ids per token, when asked
        self.sampling_logz: list[float] | None = [] if asked else None

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def __len__(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    # notebooks/01_token_generation.ipynb, cell 27
    def token_at(self, position: int) -> int:
        """token_ids[position] without building the whole list."""
        prompt_len = len(self.prompt_token_ids)
        return self.prompt_token_ids[position] if position < prompt_len else self.output_token_ids[position - prompt_len]

    # notebooks/01_token_generation.ipynb, cell 27
    @property
    def finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    # notebooks/01_token_generation.ipynb, cell 27
    def finish(self, reason: str, stop_reason: str | int | None = None) -> None:
        self.status, self.finish_reason, self.stop_reason = SequenceStatus.FINISHED, reason, stop_reason

    # notebooks/06_fast_sampling.ipynb, cell 48
    def output(self) -> RequestOutput:
        completion = CompletionOutput(0, self.text, list(self.output_token_ids), self.finish_reason,
                                      self.stop_reason, _copy(self.sampling_mask), _copy(self.sampling_logz))
        return RequestOutput(self.request_id, self.prompt, list(self.prompt_token_ids), [completion], self.finished)

    # notebooks/01_token_generation.ipynb, cell 29
    def append_token(self, token: int, tokenizer, eos_token_ids: set[int], max_model_len: int) -> None:
        """Add one generated token, update the text, and decide whether the sequence is finished."""
        self.output_token_ids.append(token)
        self.text += self.detokenizer.step(tokenizer.backend_tokenizer, token) or ""   # None: bytes held back
        if not self.params.ignore_eos and token in eos_token_ids:
            self.finish("stop")
        elif token in self.params.stop_token_ids:
            self.finish("stop", token)
        elif self._cut_stop_string():
            return                                    # the text is cut where the stop string begins
        elif len(self.output_token_ids) >= self.params.max_tokens or len(self) >= max_model_len:
            self.finish("length")
        if self.finished:                             # settle any bytes the stream still holds
            self.text = tokenizer.decode(self.output_token_ids, skip_special_tokens=True)

    # notebooks/01_token_generation.ipynb, cell 29
    def _cut_stop_string(self) -> bool:
        hits = [(self.text.find(s), s) for s in self.params.stop if s in self.text]
        if not hits:
            return False
        index, stop = min(hits)
        self.text = self.text[:index]
        self.finish("stop", stop)
        return True

    # notebooks/06_fast_sampling.ipynb, cell 48
    def record_sampling_mask(self, mask: list[int] | None, logz: float) -> None:
        """Keep the support the next token is drawn from; None (nothing truncated) makes the whole mask None."""
        self.sampling_logz.append(logz)
        if mask is None:
            self.sampling_mask = None
        else:
            self.sampling_mask.append(mask)


# notebooks/06_fast_sampling.ipynb, cell 48
def _copy(values: list | None) -> list | None:
    return None if values is None else list(values)
