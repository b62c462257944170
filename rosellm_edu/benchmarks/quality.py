# Generated from notebooks/11_weight_only_quantization.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import torch


# notebooks/11_weight_only_quantization.ipynb, cell 13
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "The three laws of motion are",
           "A recipe for bread:", "import numpy as np\n"]


# notebooks/11_weight_only_quantization.ipynb, cell 13
TEXT = ("The printing press spread across Europe within a few decades of its invention. Books that had taken a "
        "scribe months to copy could be produced in days, and their price fell so far that a merchant could own "
        "a small library. Literacy followed the books: schools multiplied, and with them the demand for "
        "grammars, almanacs and maps. Scholars in distant cities could now read the same edition of a text, "
        "cite its pages and argue over its errors, which changed how knowledge itself was checked and corrected.")


# notebooks/11_weight_only_quantization.ipynb, cell 13
@torch.no_grad()
def logits(model, ids: list[int]) -> torch.Tensor:
    """(len(ids), vocab) float32: one forward pass over the whole sequence, no cache, by PyTorch's own ops
    (fusion="torch"), so two models' logits differ by their weights alone, not by the matmul each chose at
    start-up: a packed weight and a plain one sum in different orders."""
    x = torch.tensor(ids, device=next(model.buffers()).device)
    fusion, model.model.fusion = model.model.fusion, "torch"
    try:
        return model.compute_logits(model(x, torch.arange(len(ids), device=x.device))).float()
    finally:
        model.model.fusion = fusion


# notebooks/11_weight_only_quantization.ipynb, cell 13
def compare(reference: torch.Tensor, other: torch.Tensor, ids: list[int]) -> dict:
    """Logits (T, V) of two models on the same ids: the mean KL(reference || other) per position, how often
    their argmax agrees, and each one's perplexity on ids[1:]."""
    ref, oth = reference.log_softmax(-1), other.log_softmax(-1)
    targets = torch.tensor(ids[1:])
    return {"kl": (ref.exp() * (ref - oth)).sum(-1).mean().item(),
            "top1": (reference.argmax(-1) == other.argmax(-1)).float().mean().item(),
            "ppl_reference": ref[:-1].gather(1, targets[:, None]).mean().neg().exp().item(),
            "ppl": oth[:-1].gather(1, targets[:, None]).mean().neg().exp().item()}


# notebooks/11_weight_only_quantization.ipynb, cell 14
def greedy_agreement(reference_llm, model, max_tokens: int = 48) -> float:
    """Top-1 agreement on the reference's greedy continuations of PROMPTS: the other model reads each prompt plus
    the reference's continuation, and we count the positions where its argmax is the reference's next token."""
    from rosellm_edu import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    agree = total = 0
    for out in reference_llm.generate(PROMPTS, params, use_tqdm=False):
        prompt, continuation = out.prompt_token_ids, out.outputs[0].token_ids
        predicted = logits(model, prompt + continuation[:-1])[len(prompt) - 1:].argmax(-1)
        agree += (predicted == torch.tensor(continuation)).sum().item()
        total += len(continuation)
    return agree / total
