"""The next-token explorer of chapter 01: a prompt box and temperature / top-k / top-p sliders over a chart.

All the logic is in `NextTokenExplorer.state` (plain tensors and lists), so tests set slider values and read
the state without a browser; the widgets only draw it. The chart has two panels: the most likely tokens as
bars (kept, cut, sampled) and the cumulative probability by rank, where the top-k and top-p cuts show even
when they fall far beyond the bars. Displayed in a notebook, the explorer also leaves a PNG picture of its
chart and a plain-text kept-token line in the output, for a static page where the live widget cannot run.
"""

from __future__ import annotations

import base64
import html
import io
import textwrap
from dataclasses import dataclass

import ipywidgets as widgets
import torch
from matplotlib.figure import Figure

from rosellm_edu.layers.sampler import apply_temperature, apply_top_k, filtered_logits
from rosellm_edu.sampling_params import SamplingParams

KEPT_SHOWN = 20  # tokens named in the kept-token line; the count covers all of them
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@dataclass
class ExplorerState:
    params: SamplingParams
    top_ids: list[int]          # the n most likely tokens before filtering, most likely first
    base_probs: list[float]     # their probabilities after temperature only
    kept_probs: list[float]     # their probabilities after top-k / top-p and renormalisation (0 = cut)
    kept_ids: list[int]         # every token the filters keep, most likely first
    sampled_id: int
    cumulative: torch.Tensor    # (vocab,) cumulative probability by rank of what top-p sees (temperature, top-k)


def cumulative_by_rank(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(vocab,) -> (vocab,): the running sum of the sorted distribution that top-p cuts (after temperature and
    top-k, renormalised); greedy puts all the mass on the first rank."""
    if params.greedy:
        return torch.ones_like(logits, dtype=torch.float32)
    probs = apply_top_k(apply_temperature(logits.float(), params.temperature), params.top_k).softmax(-1)
    return probs.sort(descending=True).values.cumsum(-1)


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
                             int(torch.multinomial(probs, 1, generator=self.generator)),
                             cumulative_by_rank(logits, params))

    def _on_change(self, _change=None) -> None:
        self.state = self.compute()
        self.draw()

    def figure(self, with_kept_line: bool = False) -> Figure:
        """The chart of the current state: the bars, and the cumulative probability with the cuts marked."""
        fig = Figure(figsize=(12, 3.8), layout="constrained")
        bars, curve = fig.subplots(1, 2, width_ratios=[3, 2])
        draw_bars(bars, self.tokenizer, self.state)
        draw_cumulative(curve, self.state, self.n_bars)
        if with_kept_line:
            line = kept_tokens_plain(self.tokenizer, self.state.kept_ids)
            fig.suptitle(textwrap.fill(line, 150), fontsize=9, ha="left", x=0.01)
        return fig

    def png(self, with_kept_line: bool = False) -> bytes:
        buffer = io.BytesIO()
        self.figure(with_kept_line).savefig(buffer, format="png", dpi=80)
        return buffer.getvalue()

    def draw(self) -> None:
        # A PNG in an Image widget lives in the kernel-side widget state: it shows in JupyterLab and
        # prints nothing into the cell, where an Output widget would need a front end to route it.
        self.chart.value = self.png()
        self.kept_tokens.value = kept_tokens_text(self.tokenizer, self.state.kept_ids)

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs) -> dict:
        """The live widget for JupyterLab, plus a picture of its chart and the kept-token line for a static
        page (the book's HTML shows the picture, since the widget needs a running kernel)."""
        bundle = {key: value for key, value in self.widget._repr_mimebundle_(**kwargs).items() if key == WIDGET_VIEW}
        bundle["image/png"] = base64.b64encode(self.png(with_kept_line=True)).decode("ascii")
        bundle["text/plain"] = kept_tokens_plain(self.tokenizer, self.state.kept_ids)
        return bundle


def draw_bars(ax, tokenizer, s: ExplorerState) -> None:
    """The most likely tokens: kept ones renormalised (the sampled one orange), cut ones hatched at the
    probability they had before the cut, and a dashed line where the cut falls among them."""
    n = len(s.top_ids)
    kept = [p > 0 for p in s.kept_probs]
    cut = [b if not k else 0.0 for b, k in zip(s.base_probs, kept)]
    colours = ["tab:orange" if t == s.sampled_id else "tab:blue" for t in s.top_ids]
    ax.bar(range(n), s.kept_probs, color=colours, label="kept, renormalised (orange: sampled)")
    ax.bar(range(n), cut, color="whitesmoke", edgecolor="grey", hatch="///", label="cut (probability before the cut)")
    if sum(kept) < n:
        ax.axvline(sum(kept) - 0.5, color="tab:red", ls="--", label="the cut")
    ax.set_ylim(0, 1.15 * max(s.base_probs + s.kept_probs))   # the data's scale: a flat distribution stays readable
    labels = [repr(tokenizer.decode([t]))[1:-1] for t in s.top_ids]
    ax.set_xticks(range(n), labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("probability")
    p = s.params
    ax.set_title(f"temperature={p.temperature:g}, top_k={p.top_k}, top_p={p.top_p:g}: {len(s.kept_ids)} tokens kept;"
                 f" sampled {tokenizer.decode([s.sampled_id])!r}", fontsize=10)
    ax.legend(loc="upper right", fontsize=8)


def draw_cumulative(ax, s: ExplorerState, n_bars: int) -> None:
    """Cumulative probability by rank (log scale, the whole vocabulary): top-p cuts where the curve crosses p,
    top-k at rank k, so both cuts show even when they fall far beyond the bars."""
    vocab, n_kept = len(s.cumulative), len(s.kept_ids)
    ax.plot(range(1, vocab + 1), s.cumulative.tolist(), color="tab:blue")
    ax.set_xscale("log")
    ax.set_xlim(1, vocab)
    ax.set_ylim(0, 1.05)
    ax.axvline(n_bars, color="grey", lw=0.8, label=f"left: ranks 1-{n_bars}")
    if s.params.top_p < 1:
        ax.axhline(s.params.top_p, color="tab:red", ls=":", label=f"top_p = {s.params.top_p:g}")
    if 0 < s.params.top_k < vocab:
        ax.axvline(s.params.top_k, color="tab:green", ls=":", label=f"top_k = {s.params.top_k}")
    if n_kept < vocab:
        ax.axvspan(1, n_kept + 0.5, color="tab:blue", alpha=0.12)
        ax.axvline(n_kept + 0.5, color="tab:red", ls="--", label=f"cut: {n_kept} kept")
    ax.set_xlabel("token rank (log scale)")
    ax.set_ylabel("cumulative probability")
    ax.set_title("what top-p sees: the running mass of the most likely tokens"
                 + ("" if n_kept < vocab else f" (no cut: all {vocab} kept)"), fontsize=10)
    ax.legend(loc="lower right", fontsize=8)


def kept_tokens_names(tokenizer, kept_ids: list[int]) -> str:
    shown = ", ".join(repr(tokenizer.decode([t])) for t in kept_ids[:KEPT_SHOWN])
    return shown + (", …" if len(kept_ids) > KEPT_SHOWN else "")


def kept_tokens_text(tokenizer, kept_ids: list[int]) -> str:
    """The kept-token line: how many tokens the filters keep and the most likely of them, as HTML."""
    names = html.escape(kept_tokens_names(tokenizer, kept_ids))
    return f"<b>{len(kept_ids)} tokens kept</b>, most likely first: {names}"


def kept_tokens_plain(tokenizer, kept_ids: list[int]) -> str:
    """The kept-token line as plain text (the static picture's caption and the output's text)."""
    return f"{len(kept_ids)} tokens kept, most likely first: {kept_tokens_names(tokenizer, kept_ids)}"
