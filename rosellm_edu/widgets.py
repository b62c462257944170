"""The next-token explorer of chapter 01: a prompt box and temperature / top-k / top-p sliders over a bar chart.

All the logic is in `NextTokenExplorer.state` (plain tensors and lists), so tests set slider values and read
the state without a browser; the widgets only draw it.
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from rosellm_edu.layers.sampler import filtered_logits
from rosellm_edu.sampling_params import SamplingParams

KEPT_SHOWN = 20  # tokens named in the kept-token line; the count covers all of them


@dataclass
class ExplorerState:
    params: SamplingParams
    top_ids: list[int]          # the n most likely tokens before filtering, most likely first
    base_probs: list[float]     # their probabilities after temperature only
    kept_probs: list[float]     # their probabilities after top-k / top-p and renormalisation (0 = cut)
    kept_ids: list[int]         # every token the filters keep, most likely first
    sampled_id: int


class NextTokenExplorer:
    def __init__(self, model, tokenizer, prompt: str = "The capital of France is", n_bars: int = 20, seed: int = 0):
        self.model, self.tokenizer, self.n_bars = model, tokenizer, n_bars
        self.generator = torch.Generator().manual_seed(seed)
        self.prompt = widgets.Text(value=prompt, description="prompt", continuous_update=False,
                                   layout=widgets.Layout(width="60%"))
        self.temperature = widgets.FloatSlider(value=1.0, min=0.0, max=2.0, step=0.05, description="temperature")
        self.top_k = widgets.IntSlider(value=0, min=0, max=100, description="top_k (0=off)")
        self.top_p = widgets.FloatSlider(value=1.0, min=0.05, max=1.0, step=0.05, description="top_p")
        self.resample = widgets.Button(description="sample again")
        self.kept_tokens = widgets.HTML()
        self.chart = widgets.Image(format="png")
        self._logits_for: tuple[str, torch.Tensor] | None = None
        self.state = self.compute()
        for control in (self.prompt, self.temperature, self.top_k, self.top_p):
            control.observe(self._on_change, names="value")
        self.resample.on_click(self._on_change)
        self.widget = widgets.VBox([self.prompt, widgets.HBox([self.temperature, self.top_k, self.top_p]),
                                    self.resample, self.kept_tokens, self.chart])
        self.draw()

    def next_token_logits(self) -> torch.Tensor:
        """Logits (vocab,) after the prompt, computed once per prompt."""
        if self._logits_for is None or self._logits_for[0] != self.prompt.value:
            ids = torch.tensor(self.tokenizer(self.prompt.value).input_ids or [self.tokenizer.eos_token_id])
            with torch.no_grad():
                logits = self.model.compute_logits(self.model(ids, torch.arange(len(ids)))[-1]).float()
            self._logits_for = (self.prompt.value, logits)
        return self._logits_for[1]

    def compute(self) -> ExplorerState:
        params = SamplingParams(temperature=self.temperature.value, top_k=self.top_k.value, top_p=self.top_p.value)
        logits = self.next_token_logits()
        probs = filtered_logits(logits, params).softmax(-1)
        base = probs if params.greedy else (logits / params.temperature).softmax(-1)
        top = base.topk(self.n_bars).indices
        kept = probs.nonzero().flatten()
        kept = kept[probs[kept].argsort(descending=True)]
        return ExplorerState(params, top.tolist(), base[top].tolist(), probs[top].tolist(), kept.tolist(),
                             int(torch.multinomial(probs, 1, generator=self.generator)))

    def _on_change(self, _change=None) -> None:
        self.state = self.compute()
        self.draw()

    def draw(self) -> None:
        s = self.state
        labels = [repr(self.tokenizer.decode([t]))[1:-1] for t in s.top_ids]
        colours = ["tab:orange" if t == s.sampled_id else "tab:blue" if p > 0 else "lightgrey"
                   for t, p in zip(s.top_ids, s.kept_probs)]
        fig, ax = plt.subplots(figsize=(10, 3.5))
        ax.bar(range(len(labels)), s.base_probs, color="lightgrey", label="before top-k / top-p")
        ax.bar(range(len(labels)), s.kept_probs, color=colours, alpha=0.9, label="kept, renormalised")
        ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("probability")
        ax.set_title(f"{len(s.kept_ids)} tokens kept; sampled {self.tokenizer.decode([s.sampled_id])!r} (orange)")
        ax.legend(loc="upper right")
        fig.tight_layout()
        # A PNG in an Image widget lives in the kernel-side widget state: it shows in JupyterLab and
        # prints nothing into the cell, where an Output widget would need a front end to route it.
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=80)
        plt.close(fig)
        self.chart.value = png.getvalue()
        self.kept_tokens.value = kept_tokens_text(self.tokenizer, s.kept_ids)


def kept_tokens_text(tokenizer, kept_ids: list[int]) -> str:
    """The kept-token line: how many tokens the filters keep and the most likely of them, as HTML."""
    shown = ", ".join(repr(tokenizer.decode([t])) for t in kept_ids[:KEPT_SHOWN])
    more = ", …" if len(kept_ids) > KEPT_SHOWN else ""
    return f"<b>{len(kept_ids)} tokens kept</b>, most likely first: {html.escape(shown)}{more}"
