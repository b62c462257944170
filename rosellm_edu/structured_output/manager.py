# Generated from notebooks/13_structured_output.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import threading
from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Callable

import torch

from rosellm_edu.sampling_params import StructuredOutputsParams
from rosellm_edu.sequence import Sequence
from rosellm_edu.structured_output.request import StructuredOutputRequest


# notebooks/13_structured_output.ipynb, cell 30
class StructuredOutputManager:
    """The engine's grammars: each distinct constraint compiled once, on a worker thread, and each step's bitmask
    filled for the whole batch in one call and applied to the rows that asked for it."""

    def __init__(self, make_backend: Callable[[], object], max_grammar_bytes: int = 65536, max_cached: int = 256):
        self.make_backend, self._backend, self._bitmask = make_backend, None, None
        self.max_grammar_bytes, self.max_cached = max_grammar_bytes, max_cached
        self.compiled: OrderedDict[tuple, Future] = OrderedDict()   # constraint -> its compilation, oldest first
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compiler")
        self._loading = threading.Lock()   # a server may load the backend from another thread, ahead of the engine

    @property
    def backend(self):
        with self._loading:   # the library and the vocabulary's table load on the first constrained request
            if self._backend is None:
                self._backend = self.make_backend()
        return self._backend

    # notebooks/13_structured_output.ipynb, cell 31
    def request(self, params: StructuredOutputsParams) -> StructuredOutputRequest:
        """A sequence's grammar, compiling in the background; a ValueError naming the field if it cannot be."""
        key = params.key()
        if (size := len(key[1].encode())) > self.max_grammar_bytes:
            raise ValueError(f"structured_outputs.{params.kind} is {size} bytes, over max_grammar_bytes="
                             f"{self.max_grammar_bytes}")
        if key not in self.compiled:
            try:
                grammar = self.backend.parse(params)                       # fast: refuse a bad one now
            except ValueError as e:
                raise ValueError(f"structured_outputs.{params.kind}: {e}") from None
            self.compiled[key] = self.executor.submit(self.backend.compile, grammar)
            if len(self.compiled) > self.max_cached:
                self.compiled.popitem(last=False)
        self.compiled.move_to_end(key)
        return StructuredOutputRequest(self.compiled[key], self.backend)

    # notebooks/13_structured_output.ipynb, cell 33
    def apply_bitmask(self, logits: torch.Tensor, seqs: list[Sequence], drafts: list[list[int]]) -> None:
        """Mask, in place, the rows of logits (B, V) whose sequence has a grammar. A sequence owns 1 + len(drafts)
        rows; its row j is masked by its grammar after drafts[:j], on a fork of its matcher (its own stays put)."""
        matchers, rows, row = [], [], 0
        for seq, draft in zip(seqs, drafts):
            if seq.grammar is not None:
                matcher = seq.grammar.matcher
                for j in range(1 + len(draft)):
                    matchers.append(matcher)
                    rows.append(row + j)
                    if j < len(draft):
                        matcher = matcher.fork()
                        if not matcher.accept_token(draft[j]):   # the grammar refuses draft j: no later row is kept
                            break
            row += 1 + len(draft)
        if not rows:
            return
        if self._bitmask is None or len(self._bitmask) < len(logits):
            self._bitmask = self.backend.allocate_bitmask(len(logits))          # (rows, ceil(V / 32)), reused
        self.backend.fill(matchers, self._bitmask, rows)
        self.backend.apply(logits, self._bitmask[:len(logits)], rows)

    # notebooks/13_structured_output.ipynb, cell 33
    def wait_for_grammars(self, seqs, timeout: float = 0.01) -> None:
        """Nothing could run: sleep until one of these sequences' grammars is compiled, or timeout (no busy loop)."""
        pending = [s.grammar.compiled for s in seqs if s.grammar is not None and not s.grammar.ready]
        if pending:
            wait(pending, timeout, return_when=FIRST_COMPLETED)
