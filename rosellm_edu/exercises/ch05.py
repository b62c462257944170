"""Chapter 05's exercises: the bucket a decode batch is padded to, the static inputs of one decode step, and
kernels told apart from views in a list of ATen operations."""

from __future__ import annotations

import torch

from rosellm_edu.exercises import Mismatch, checker, expect_equal


@checker("padded_size")
def check_padded_size(fn) -> str:
    """fn(num_seqs, max_num_seqs) -> the bucket ModelRunner pads a decode batch of num_seqs to."""
    from rosellm_edu.engine.model_runner import batch_size_buckets

    cases = 0
    for max_num_seqs in (1, 3, 4, 8, 9, 20, 64):
        buckets = batch_size_buckets(max_num_seqs)
        for num_seqs in range(1, max_num_seqs + 1):
            expected = min(b for b in buckets if b >= num_seqs)
            expect_equal(fn(num_seqs, max_num_seqs), expected,
                         f"padded_size({num_seqs}, {max_num_seqs}), buckets {buckets}")
            cases += 1
    return f"all {cases} batch sizes, for seven values of max_num_seqs, land in their bucket"


class _Model:
    """What ModelRunner reads of a model when it allocates its buffers."""

    def __init__(self, config):
        self.config = config


def _decode_cases():
    """(tokens, positions, tables, rows): one sequence; block boundaries; short tables; padding; no padding."""
    return [([5], [17], [[3, 9]], 2),
            ([11], [0], [[4]], 1),
            ([1, 2, 3], [15, 16, 40], [[0], [1, 2], [5, 6, 7]], 4),
            ([7, 8, 9, 10, 11], [3, 31, 32, 0, 47], [[2], [3, 4], [5, 6, 8], [9], [10, 11, 12]], 8),
            ([6, 6], [63, 1], [[13, 14, 15, 16], [17]], 2)]


@checker("decode_inputs")
def check_decode_inputs(fn) -> str:
    """fn(tokens, positions, tables, rows, block_size, scratch_block) -> the five static inputs, as chapter 05's
    ModelRunner.prepare_decode writes them (chapter 08 later pads short tables differently)."""
    from transformers import LlamaConfig

    from rosellm_edu.book.chapter import package_as_of

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    block_size = 16
    cases = _decode_cases()
    with package_as_of("06_fast_sampling.ipynb") as load:   # the package as chapter 05 leaves it
        cache = load("engine.kv_cache").KVCache(config, 24, block_size)
        runner = load("engine.model_runner").ModelRunner(_Model(config), cache, 8, 128, enforce_eager=True)
        Sequence, SamplingParams = load("sequence").Sequence, load("sampling_params").SamplingParams
        ScheduledSeq = load("engine.scheduler").ScheduledSeq
        references = []
        for tokens, positions, tables, rows in cases:
            batch = [ScheduledSeq(Sequence(str(i), None, [0] * p + [t], SamplingParams()), p, 1)
                     for i, (t, p) in enumerate(zip(tokens, positions))]
            width = runner.prepare_decode(batch, tables, rows)
            inputs = {name: getattr(runner, name)[:rows].clone()
                      for name in ("input_ids", "positions", "slot_mapping", "context_lens")}
            references.append(inputs | {"block_tables": runner.block_tables[:rows, :width].clone()})
    for (tokens, positions, tables, rows), expected in zip(cases, references):
        got = fn(list(tokens), list(positions), [list(t) for t in tables], rows, block_size, cache.scratch_block)
        where = f"decode_inputs({tokens}, {positions}, {tables}, rows={rows}, block_size={block_size}, " \
                f"scratch_block={cache.scratch_block})"
        if not isinstance(got, dict) or set(got) != set(expected):
            raise Mismatch(f"{where}: expected a dict with keys {sorted(expected)}, got "
                           f"{sorted(got) if isinstance(got, dict) else type(got).__name__}")
        for name, want in expected.items():
            expect_equal(torch.as_tensor(got[name]).tolist(), want.tolist(), f"{where}[{name!r}]")
    return f"all {len(cases)} batches give the runner's static inputs, padded rows and short tables included"


def _recorded(fn) -> list:
    from rosellm_edu.benchmarks.launches import RecordOps

    with torch.no_grad(), RecordOps() as record:
        fn()
    return record.ops


def _launch_cases() -> list[tuple[str, list]]:
    x = torch.randn(4, 4)
    return [("x.view(16)", _recorded(lambda: x.view(16))),
            ("x.t() @ x", _recorded(lambda: x.t() @ x)),
            ("x.add_(1)", _recorded(lambda: x.add_(1))),
            ("torch.empty_like(x)", _recorded(lambda: torch.empty_like(x))),
            ("x.float() on a float32 x", _recorded(lambda: x.float())),
            ("x[0], x[1:], x[[0, 2]]", _recorded(lambda: (x[0], x[1:], x[[0, 2]]))),
            ("x.chunk(2) then cat", _recorded(lambda: torch.cat(x.chunk(2)[::-1]))),
            ("x.unsqueeze(0).expand(3, 4, 4).sum()", _recorded(lambda: x.unsqueeze(0).expand(3, 4, 4).sum())),
            ("out.index_copy_(0, idx, x)", _recorded(lambda: torch.zeros(8, 4).index_copy_(0, torch.arange(4), x)))]


def _reference_launches(ops) -> tuple[int, int]:
    from rosellm_edu.benchmarks.launches import op_kind

    kinds = [op_kind(op) for op in ops]
    return kinds.count("kernel"), kinds.count("view")


@checker("count_launches")
def check_count_launches(fn) -> str:
    """fn(ops) -> (kernels, views) for a list of ATen operations."""
    cases = _launch_cases()
    for what, ops in cases:
        names = [str(op) for op in ops]
        expect_equal(tuple(fn(list(ops))), _reference_launches(ops), f"count_launches for {what}, ops {names}")
    return f"all {len(cases)} op lists counted right: views and allocations launch nothing, in-place ops do"
