# Generated from notebooks/13_structured_output.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from concurrent.futures import Future


# notebooks/13_structured_output.ipynb, cell 28
class StructuredOutputRequest:
    """One sequence's grammar: its compilation (shared by every request with the same constraint) and, once that is
    done, the sequence's own matcher, which has accepted exactly the tokens the sequence generated."""

    def __init__(self, compiled: Future, backend):
        self.compiled, self.backend, self._matcher = compiled, backend, None

    @property
    def ready(self) -> bool:
        return self.compiled.done()

    @property
    def matcher(self):
        if self._matcher is None:
            self._matcher = self.backend.matcher(self.compiled.result())
        return self._matcher

    def accept(self, token: int) -> bool:
        return self.matcher.accept_token(token)

    @property
    def terminated(self) -> bool:
        """It accepted a stop token at a point where the grammar may end."""
        return self.matcher.is_terminated()
