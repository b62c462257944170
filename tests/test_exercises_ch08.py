"""Chapter 08's checkers reject typical wrong answers and say what is wrong."""

from rosellm_edu.exercises.ch08 import check_decode_flops, check_find_stop, check_step_bytes
from rosellm_edu.exercises.solutions.ch08 import decode_flops, find_stop, step_bytes


def test_decode_flops_without_the_lm_head_is_rejected(capsys):
    def no_head(config, context_lens):
        return decode_flops(config, context_lens) - 2 * config.vocab_size * config.hidden_size * len(context_lens)

    assert not check_decode_flops(no_head)
    assert "context_lens" in capsys.readouterr().out


def test_decode_flops_that_forgets_the_new_key_is_rejected(capsys):
    def keys_without_itself(config, context_lens):
        d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return decode_flops(config, context_lens) - 4 * config.num_hidden_layers * config.num_attention_heads * d * len(context_lens)

    assert not check_decode_flops(keys_without_itself)


def test_step_bytes_that_counts_only_the_weights_is_rejected_at_batch_32(capsys):
    assert not check_step_bytes(lambda batch, context: 134_515_008 * 2)
    out = capsys.readouterr().out
    assert "batch=32, context=128" in out and "you predicted" in out


def test_step_bytes_that_reads_the_tied_head_twice_is_rejected(capsys):
    head = 49152 * 576 * 2
    assert not check_step_bytes(lambda batch, context: step_bytes(batch, context) + head)
    assert "batch=1, context=128" in capsys.readouterr().out


def test_step_bytes_predicted_as_a_number_is_rejected_with_a_message(capsys):
    assert not check_step_bytes(lambda batch, context: "about 300 MB")
    assert "predict a number" in capsys.readouterr().out


def test_find_stop_that_misses_a_straddling_stop_is_rejected(capsys):
    def from_searched(text, searched, stops):
        hits = [(i, s) for s in stops if (i := text.find(s, searched)) >= 0]
        return min(hits) if hits else None

    assert not check_find_stop(from_searched)
    assert "STOP" in capsys.readouterr().out


def test_find_stop_that_rescans_everything_finds_old_stops_and_is_rejected(capsys):
    def whole_text(text, searched, stops):
        hits = [(i, s) for s in stops if (i := text.find(s)) >= 0]
        return min(hits) if hits else None

    assert not check_find_stop(whole_text)
    assert find_stop("STOP then more", 10, ["STOP"]) is None
