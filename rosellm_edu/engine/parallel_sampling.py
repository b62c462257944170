# Generated from notebooks/04a_parallel_sampling.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from dataclasses import dataclass, replace

from rosellm_edu.outputs import RequestOutput
from rosellm_edu.sampling_params import SamplingParams
from rosellm_edu.sequence import Sequence


# notebooks/04a_parallel_sampling.ipynb, cell 25
@dataclass
class ParentRequest:
    """The samples of a request with n > 1: sample 0 first, the rest once the engine forks them from it."""
    request_id: str
    n: int
    samples: list[Sequence]

    @property
    def forked(self) -> bool:
        return len(self.samples) == self.n

    @property
    def finished(self) -> bool:
        return self.forked and all(s.finished for s in self.samples)

    def output(self) -> RequestOutput:
        """One RequestOutput for the request: each sample's completion so far, in index order."""
        completions = [replace(s.output().outputs[0], index=i) for i, s in enumerate(self.samples)]
        return replace(self.samples[0].output(), outputs=completions, finished=self.finished)


# notebooks/04a_parallel_sampling.ipynb, cell 25
def child_id(request_id: str, index: int) -> str:
    return f"{index}_{request_id}"


# notebooks/04a_parallel_sampling.ipynb, cell 25
def sample_params(params: SamplingParams, index: int) -> SamplingParams:
    """Sample index's parameters: with a seed, its own seed + index, so that each sample reproduces alone."""
    return params if params.seed is None or index == 0 else replace(params, seed=params.seed + index)
