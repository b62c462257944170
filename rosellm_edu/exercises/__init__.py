"""Checkers for the book's exercises, three per chapter, in `rosellm_edu.exercises.chNN`.

A checker takes the reader's function, runs it on cases where the package (or a plain re-computation) gives the
right answer, and prints one verdict: what is wrong on the first case that disagrees, or that all cases pass. It
returns a Verdict, true when every case passed, and never raises, so "Run all" goes past an exercise the reader
has not tried yet. Worked solutions are in `rosellm_edu.exercises.solutions.chNN`; the test suite runs every
checker on them.

A prediction checker (`checker(title, predicts=True)`) takes the reader's prediction, measures the same quantity
on the engine, and accepts the prediction when it lands in an honest range of the measurement
(`compare_prediction`): the reader reasons first, then the machine answers.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import torch


class Verdict:
    """A checker's result: true when every case passed. A notebook shows nothing for it; the printed line says it."""

    def __init__(self, passed: bool):
        self.passed = passed

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"Verdict(passed={self.passed})"

    def _ipython_display_(self) -> None:
        pass


class Mismatch(Exception):
    """The reader's answer differs from the reference; the message says where and how."""


def checker(title: str, predicts: bool = False) -> Callable:
    """Turn `check(fn)`, which raises Mismatch on a wrong answer, into a checker that prints a verdict.
    `predicts`: the checker compares the reader's prediction with a measurement."""
    def wrap(check: Callable) -> Callable:
        @functools.wraps(check)
        def run(fn: Callable) -> Verdict:
            try:
                passed = check(fn)
            except NotImplementedError:
                print(f"{title}: not attempted yet. Replace `raise NotImplementedError` with your code and run "
                      f"this cell again.")
                return Verdict(False)
            except Mismatch as wrong:
                print(f"✗ {title}: {wrong}")
                return Verdict(False)
            except Exception as error:  # the reader's code crashed: say how, without a traceback into ours
                print(f"✗ {title}: your function raised {type(error).__name__}: {error}")
                return Verdict(False)
            print(f"✓ {title}: {passed}")
            return Verdict(True)

        run.title, run.predicts = title, predicts
        return run

    return wrap


def expect_close(got, expected: torch.Tensor, what: str, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """Raise Mismatch unless `got` is a tensor of `expected`'s shape whose values are close to it."""
    if not isinstance(got, torch.Tensor):
        raise Mismatch(f"{what}: expected a tensor, got {type(got).__name__}")
    if got.shape != expected.shape:
        raise Mismatch(f"{what}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}")
    if not torch.allclose(got.double(), expected.double(), atol=atol, rtol=rtol, equal_nan=True):
        diff = (got.double() - expected.double()).abs()
        where = tuple(int(i) for i in torch.nonzero(diff == diff.nan_to_num(0).max())[0])
        raise Mismatch(f"{what}: differs by up to {diff.nan_to_num(0).max():.3g}, first at index {where}: "
                       f"{got[where].item():.6g} where the reference has {expected[where].item():.6g}")


def expect_equal(got, expected, what: str) -> None:
    """Raise Mismatch unless got == expected (plain values: ints, lists, tuples, strings)."""
    if got != expected:
        raise Mismatch(f"{what}: got {got!r}, expected {expected!r}")


def compare_prediction(predicted, measured: float, what: str, within: tuple[float, float] = (0.8, 1.25),
                       unit: str = "") -> str:
    """Raise Mismatch unless predicted / measured lies in `within`; else say how close the prediction was."""
    if isinstance(predicted, bool) or not isinstance(predicted, (int, float)):
        raise Mismatch(f"{what}: predict a number, got {type(predicted).__name__}")
    low, high = within
    said = f"you predicted {predicted:.4g}{unit}, the engine measured {measured:.4g}{unit}"
    ratio = predicted / measured if measured else (1.0 if predicted == 0 else float("inf"))
    if not low <= ratio <= high:
        raise Mismatch(f"{what}: {said}, {ratio:.2f}x of it; an estimate that models what the engine does "
                       f"lands within {low:g}x to {high:g}x")
    return f"{what}: {said} ({ratio:.2f}x of it, within {low:g}x to {high:g}x)"


@functools.cache
def tiny_model_dir() -> str:
    """A tiny random Llama with the book model's tokenizer, saved once per process (and removed at its exit) for
    an engine to load: what a checker counts on an engine (positions, steps, rows) does not depend on the weights,
    and a tiny model runs a step in milliseconds."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rosellm_edu.model_loader import resolve_model

    config = LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    path = tempfile.mkdtemp(prefix="rosellm-tiny-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(resolve_model()) / name, path)
    return path
