"""A Sequence's text grows incrementally and always agrees with decoding all its tokens at once."""

from hypothesis import given, settings
from hypothesis import strategies as st

from rosellm_edu.sampling_params import SamplingParams
from rosellm_edu.sequence import Sequence

MULTILINGUAL = "Naïve café, 東京の天気は晴れ 🤖🎉 — ça va? Ünïcödé\n\tdef f(x): return x ** 2  # ok"


def generate(tokenizer, ids: list[int], params: SamplingParams) -> tuple[Sequence, list[str]]:
    """Feed ids to a fresh Sequence one at a time, as an engine would; its text after every token."""
    seq = Sequence("r", None, [1], params)
    texts = []
    for token in ids:
        seq.append_token(token, tokenizer, eos_token_ids=set(), max_model_len=10**6)
        texts.append(seq.text)
        if seq.finished:
            break
    return seq, texts


def test_text_after_every_token_is_the_full_decode_of_the_tokens_so_far(tokenizer):
    ids = tokenizer(MULTILINGUAL, add_special_tokens=False).input_ids
    seq, texts = generate(tokenizer, ids, SamplingParams(max_tokens=len(ids)))
    held_back = 0
    for n, text in enumerate(texts, 1):
        decoded = tokenizer.decode(ids[:n], skip_special_tokens=True)
        if decoded.endswith("\ufffd"):    # a character split over byte-level tokens: held back, never shown
            assert decoded.startswith(text) and "\ufffd" not in text
            held_back += 1
        else:
            assert text == decoded
    assert held_back > 0                  # the text above does split characters over tokens
    assert seq.finish_reason == "length" and seq.text == MULTILINGUAL


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_tokens_stream_append_only_and_finish_as_a_full_decode(tokenizer, data):
    ids = data.draw(st.lists(st.integers(0, len(tokenizer) - 1), min_size=1, max_size=40))
    seq, texts = generate(tokenizer, ids, SamplingParams(max_tokens=len(ids)))
    full = tokenizer.decode(ids, skip_special_tokens=True)
    assert seq.text == full
    for before, after in zip(texts, texts[1:]):
        assert after.startswith(before)          # a stream only ever appends


def test_a_stop_string_split_over_tokens_is_found_and_cut(tokenizer):
    ids = tokenizer("The end 🤖 of the story. More text follows.", add_special_tokens=False).input_ids
    seq, _ = generate(tokenizer, ids, SamplingParams(max_tokens=len(ids), stop=["🤖 of"]))
    assert seq.finish_reason == "stop" and seq.stop_reason == "🤖 of" and seq.text == "The end "


def test_token_at_reads_prompt_and_output_positions():
    seq = Sequence("r", None, [5, 6, 7], SamplingParams())
    seq.output_token_ids += [8, 9]
    assert [seq.token_at(i) for i in range(len(seq))] == seq.token_ids
