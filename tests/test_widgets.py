"""The next-token explorer's logic, driven through its sliders without a browser."""

import base64
import html

import pytest
import torch

from rosellm_edu.layers.sampler import filtered_logits
from rosellm_edu.sampling_params import SamplingParams
from rosellm_edu.widgets import NextTokenExplorer


@pytest.fixture
def explorer(our_model, tokenizer):
    return NextTokenExplorer(our_model, tokenizer, prompt="The capital of France is")


def expected_kept(explorer, **params):
    probs = filtered_logits(explorer.next_token_logits(), SamplingParams(**params)).softmax(-1)
    return set(probs.nonzero().flatten().tolist())


def test_sliders_drive_the_kept_set(explorer):
    explorer.top_k.value = 5
    assert len(explorer.state.kept_ids) == 5
    assert set(explorer.state.kept_ids) == expected_kept(explorer, top_k=5)
    explorer.top_k.value = 0
    explorer.top_p.value = 0.5
    assert set(explorer.state.kept_ids) == expected_kept(explorer, top_p=0.5)
    explorer.temperature.value = 1.8
    hot = set(explorer.state.kept_ids)
    assert hot == expected_kept(explorer, temperature=1.8, top_p=0.5) and len(hot) > 1


def test_temperature_zero_keeps_only_the_argmax(explorer):
    explorer.temperature.value = 0.0
    top = int(explorer.next_token_logits().argmax())
    assert explorer.state.kept_ids == [top] and explorer.state.sampled_id == top


def test_sampled_token_is_always_kept_and_bars_are_consistent(explorer):
    explorer.top_k.value = 8
    for _ in range(5):
        explorer.resample.click()
        s = explorer.state
        assert s.sampled_id in s.kept_ids
        assert sum(s.kept_probs) == pytest.approx(1.0, abs=1e-5)  # 8 kept tokens are all among the 20 bars
        assert s.base_probs == sorted(s.base_probs, reverse=True)


def test_prompt_change_recomputes_the_logits(explorer, our_model, tokenizer):
    explorer.prompt.value = "def fibonacci(n):"
    ids = torch.tensor(tokenizer("def fibonacci(n):").input_ids)
    with torch.no_grad():
        expected = our_model.compute_logits(our_model(ids, torch.arange(len(ids)))[-1])
    torch.testing.assert_close(explorer.next_token_logits(), expected)
    assert explorer.state.top_ids[0] == int(expected.argmax())


def test_the_chart_is_redrawn_when_a_slider_moves(explorer):
    before = bytes(explorer.chart.value)
    assert before.startswith(b"\x89PNG")
    explorer.top_k.value = 3
    after = bytes(explorer.chart.value)
    assert after != before and after.startswith(b"\x89PNG")


def test_the_kept_token_line_names_the_kept_tokens(explorer, tokenizer):
    explorer.top_k.value = 5
    kept = sorted(expected_kept(explorer, top_k=5), key=lambda t: -float(explorer.next_token_logits()[t]))
    line = explorer.kept_tokens.value
    assert line.startswith("<b>5 tokens kept</b>")
    positions = [line.index(html.escape(repr(tokenizer.decode([t])))) for t in kept]
    assert positions == sorted(positions)  # most likely first


def test_the_bars_are_scaled_to_the_data_not_to_one(explorer):
    bars, _ = explorer.figure().axes
    tallest = max(explorer.state.base_probs + explorer.state.kept_probs)
    assert tallest <= bars.get_ylim()[1] < 1.5 * tallest


def lines_at(ax, axis: str) -> list[float]:
    """The x of every vertical line (axis='x') or the y of every horizontal line (axis='y') drawn on ax."""
    data = [(line.get_xdata(), line.get_ydata()) for line in ax.get_lines()]
    if axis == "x":
        return [float(xs[0]) for xs, _ in data if len(xs) == 2 and xs[0] == xs[1]]
    return [float(ys[0]) for _, ys in data if len(ys) == 2 and ys[0] == ys[1]]


def test_the_top_p_cut_shows_even_when_it_falls_beyond_the_bars(explorer):
    explorer.temperature.value = 1.5
    explorer.top_p.value = 0.9
    s = explorer.state
    n_kept = len(s.kept_ids)
    assert n_kept > explorer.n_bars and all(p > 0 for p in s.kept_probs)  # every bar is kept: the bars show no cut
    assert s.cumulative[n_kept - 2] < 0.9 <= s.cumulative[n_kept - 1]    # the token that crosses p is the last kept
    _, curve = explorer.figure().axes
    assert 0.9 in lines_at(curve, "y") and n_kept + 0.5 in lines_at(curve, "x")


def test_a_cut_among_the_bars_is_marked_between_the_last_kept_and_the_first_cut(explorer):
    explorer.top_k.value = 5
    bars, curve = explorer.figure().axes
    assert 4.5 in lines_at(bars, "x") and 5 in lines_at(curve, "x") and 5.5 in lines_at(curve, "x")


def test_displaying_the_explorer_gives_the_live_widget_and_a_picture_of_it(explorer):
    explorer.top_k.value = 5
    bundle = explorer._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == explorer.widget.model_id
    assert base64.b64decode(bundle["image/png"]).startswith(b"\x89PNG")
    assert bundle["text/plain"].startswith("5 tokens kept, most likely first: ")
