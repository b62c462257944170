import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Without a GPU, Triton kernels run in its interpreter. Triton reads the flag when a kernel is decorated, that is
# when its module is first imported, which may be by any test: so it is set here, before all of them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import transformers

from rosellm_edu import model_loader

transformers.logging.set_verbosity_error()


@pytest.fixture(scope="session")
def embedded_dir():
    return model_loader.resolve_model()


@pytest.fixture(scope="session")
def tokenizer(embedded_dir):
    return model_loader.load_tokenizer(embedded_dir)


@pytest.fixture(scope="session")
def our_model(embedded_dir):
    return model_loader.load_model(embedded_dir)


@pytest.fixture(scope="session")
def hf_model(embedded_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(embedded_dir, dtype=torch.float32).eval()


def hf_greedy(hf_model, prompt_ids: list[int], n: int) -> list[int]:
    """transformers' own greedy continuation, EOS disabled so that exactly n tokens come out."""
    out = hf_model.generate(torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False,
                            eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()
