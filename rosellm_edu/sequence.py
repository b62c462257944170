# Generated from notebooks/01_token_generation.ipynb by `python -m rosellm_edu.export`.
# Edit the notebook, not this file.

from dataclasses import dataclass, field
from enum import Enum

import torch

from rosellm_edu.outputs import CompletionOutput, RequestOutput
from rosellm_edu.sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


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
    generator: torch.Generator | None = None   # set when the request has its own seed

    def __post_init__(self):
        if self.params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.params.seed)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def __len__(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def finish(self, reason: str, stop_reason: str | int | None = None) -> None:
        self.status, self.finish_reason, self.stop_reason = SequenceStatus.FINISHED, reason, stop_reason

    def append_token(self, token: int, tokenizer, eos_token_ids: set[int], max_model_len: int) -> None:
        """Add one generated token, update the text, and decide whether the sequence is finished."""
        self.output_token_ids.append(token)
        self.text = tokenizer.decode(self.output_token_ids, skip_special_tokens=True)
        if not self.params.ignore_eos and token in eos_token_ids:
            self.finish("stop")
        elif token in self.params.stop_token_ids:
            self.finish("stop", token)
        elif self._cut_stop_string():
            pass
        elif len(self.output_token_ids) >= self.params.max_tokens or len(self) >= max_model_len:
            self.finish("length")

    def _cut_stop_string(self) -> bool:
        hits = [(self.text.find(s), s) for s in self.params.stop if s in self.text]
        if not hits:
            return False
        index, stop = min(hits)
        self.text = self.text[:index]
        self.finish("stop", stop)
        return True

    def output(self) -> RequestOutput:
        completion = CompletionOutput(0, self.text, list(self.output_token_ids), self.finish_reason,
                                      self.stop_reason)
        return RequestOutput(self.request_id, self.prompt, list(self.prompt_token_ids), [completion],
                             self.finished)
