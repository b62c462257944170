# Generated from notebooks/05_cuda_graphs.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


# notebooks/05_cuda_graphs.ipynb, cell 6
ALLOCATIONS = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default,
               torch.ops.aten.empty_strided.default}


# notebooks/05_cuda_graphs.ipynb, cell 6
class RecordOps(TorchDispatchMode):
    """Records every ATen operation the dispatcher runs."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


# notebooks/05_cuda_graphs.ipynb, cell 6
class RecordCalls(TorchFunctionMode):
    """Records each call from Python into PyTorch with the ATen operations it became (attribute reads skipped)."""

    def __init__(self, recorder: RecordOps):
        super().__init__()
        self.recorder, self.calls = recorder, []          # calls: [(name, [ATen operations])]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        start = len(self.recorder.ops)
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", str(func))
        if name != "__get__" and not isinstance(func, torch._ops.OpOverload):   # not an ATen operation itself
            self.calls.append((name, self.recorder.ops[start:]))
        return out


# notebooks/05_cuda_graphs.ipynb, cell 6
def op_kind(op) -> str:
    """'view' (new shape, same memory), 'allocation' (memory only) or 'kernel' (it computes)."""
    return "view" if op.is_view else "allocation" if op in ALLOCATIONS else "kernel"
