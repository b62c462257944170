# Generated from notebooks/13_structured_output.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import json
import re

import torch
import xgrammar as xgr

from rosellm_edu.sampling_params import StructuredOutputsParams


# notebooks/13_structured_output.ipynb, cell 23
WHITESPACE_RUN = 16   # the most free whitespace between two JSON tokens: a small model can loop on it for ever


# notebooks/13_structured_output.ipynb, cell 23
class XgrammarBackend:
    """Grammars for one tokenizer, with xgrammar: parsed at once (a bad one is refused before it waits), compiled
    against the vocabulary later (the slow part, for a worker thread), then matched token by token."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int]):
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)   # the manager caches
        self.batch = xgr.BatchGrammarMatcher(max_threads=1)
        self.vocab_size = vocab_size

    def parse(self, params: StructuredOutputsParams) -> xgr.Grammar:
        kind, compact = params.kind, params.disable_any_whitespace
        try:
            if kind in ("json", "json_object"):
                schema = params.json if kind == "json" else {"type": "object"}
                check_enforced(schema)
                return xgr.Grammar.from_json_schema(schema, any_whitespace=not compact, max_whitespace_cnt=WHITESPACE_RUN)
            if kind == "regex":
                return xgr.Grammar.from_regex(params.regex)
            if kind == "choice":
                return xgr.Grammar.from_regex("|".join(re.escape(c) for c in params.choice))
            return xgr.Grammar.from_ebnf(params.grammar)
        except RuntimeError as e:   # xgrammar prefixes its messages with a time and a C++ file
            raise ValueError(re.sub(r"^\[[\d:]+\] \S+: ", "", str(e)).strip()) from None

    # notebooks/13_structured_output.ipynb, cell 26
    def compile(self, grammar: xgr.Grammar) -> xgr.CompiledGrammar:
        return self.compiler.compile_grammar(grammar)

    # notebooks/13_structured_output.ipynb, cell 26
    def matcher(self, compiled: xgr.CompiledGrammar) -> xgr.GrammarMatcher:
        return xgr.GrammarMatcher(compiled)

    # notebooks/13_structured_output.ipynb, cell 26
    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        return xgr.allocate_token_bitmask(rows, self.vocab_size)     # (rows, ceil(V / 32)) int32, on the CPU

    # notebooks/13_structured_output.ipynb, cell 26
    def fill(self, matchers: list[xgr.GrammarMatcher], bitmask: torch.Tensor, rows: list[int]) -> None:
        self.batch.batch_fill_next_token_bitmask(matchers, bitmask, indices=rows)   # one call for the batch

    # notebooks/13_structured_output.ipynb, cell 26
    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        """-inf wherever a row's bit is 0, in place, on the rows listed only."""
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True), indices=rows)


# notebooks/13_structured_output.ipynb, cell 25
# Keywords xgrammar 0.2 parses but does not enforce: a grammar built from them would let a breaking answer through.
UNENFORCED = ("not", "if", "then", "else", "uniqueItems")


# notebooks/13_structured_output.ipynb, cell 25
NAMED_SCHEMAS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


# notebooks/13_structured_output.ipynb, cell 25
def check_enforced(schema: str | dict, path: str = "#") -> None:
    """ValueError naming the first keyword of the schema the grammar would not enforce, and where it is."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError:
            return                                  # xgrammar's parser says what is wrong with the text
    if isinstance(schema, list):
        for i, item in enumerate(schema):
            check_enforced(item, f"{path}/{i}")
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        if key in UNENFORCED or (key == "allOf" and isinstance(value, list) and len(value) > 1):
            raise ValueError(f"{key!r} at {path} is not supported: the grammar cannot enforce it, so an answer could "
                             "break it")
        if key in NAMED_SCHEMAS and isinstance(value, dict):     # their keys are names: "not" may be a property
            for name, sub in value.items():
                check_enforced(sub, f"{path}/{key}/{name}")
        elif key not in ("const", "enum", "default", "examples"):          # values there are data, not schemas
            check_enforced(value, f"{path}/{key}")
