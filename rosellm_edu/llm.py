# Generated from notebooks/01_token_generation.ipynb, notebooks/13b_model_checkpoints.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from itertools import count

from tqdm.auto import tqdm

from rosellm_edu.engine.llm_engine import LLMEngine
from rosellm_edu.outputs import RequestOutput
from rosellm_edu.sampling_params import SamplingParams


# notebooks/01_token_generation.ipynb, cell 42
class LLM:
    def __init__(self, model: str | None = None, **engine_kwargs):
        self.llm_engine = LLMEngine(model, **engine_kwargs)
        self._ids = count()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} sampling_params")
        request_ids = [str(next(self._ids)) for _ in prompts]
        self._add_all(request_ids, prompts, params)
        finished: dict[str, RequestOutput] = {}
        with tqdm(total=len(prompts), desc="Generating", disable=not use_tqdm) as bar:
            while self.llm_engine.has_unfinished_requests():
                for out in self.llm_engine.step():
                    if out.finished:
                        finished[out.request_id] = out
                        bar.update()
        return [finished[r] for r in request_ids]

    # notebooks/13b_model_checkpoints.ipynb, cell 11
    def _add_all(self, request_ids, prompts, params) -> None:
        """Add every request, or none: a bad prompt aborts the ones already added."""
        default = self.get_default_sampling_params()                                    # not SamplingParams()
        for i, (request_id, prompt, p) in enumerate(zip(request_ids, prompts, params)):
            try:
                self.llm_engine.add_request(request_id, prompt, p or default)
            except Exception:
                for added in request_ids[:i]:
                    self.llm_engine.abort_request(added)
                raise

    # notebooks/13b_model_checkpoints.ipynb, cell 11
    def get_default_sampling_params(self) -> SamplingParams:
        """What generate() uses when given no SamplingParams: ours, with the model's generation_config.json on top."""
        return SamplingParams(**self.llm_engine.get_diff_sampling_param())
