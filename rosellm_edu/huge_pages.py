"""A CPU model's weights moved into one buffer backed by 2 MB pages (Linux's transparent huge pages).

A decode step streams every weight from memory. With 4 KB pages it crosses a page every 4 KB: a TLB miss each
time, and a boundary the hardware prefetchers do not cross. One buffer that the kernel is asked to back with
2 MB pages (madvise MADV_HUGEPAGE, before the first write) removes both. Chapter 10 measures the difference.
"""

import ctypes
import sys

import torch
from torch import nn

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14          # Linux's <sys/mman.h>


def advise_huge_pages(address: int, length: int) -> bool:
    """Ask Linux to back [address, address + length) with huge pages; False where it cannot be asked (another OS,
    a kernel built without transparent huge pages). Whether it grants them is the kernel's choice."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc.madvise(address, length, MADV_HUGEPAGE) == 0


def empty_on_huge_pages(num_bytes: int) -> torch.Tensor | None:
    """An uninitialised uint8 CPU tensor of num_bytes starting on a 2 MB boundary, which Linux was asked to back
    with huge pages before anything touched it; None where it cannot be asked."""
    raw = torch.empty(num_bytes + HUGE_PAGE, dtype=torch.uint8)        # untouched yet: no page is backed
    start = -raw.data_ptr() % HUGE_PAGE                                  # the first 2 MB boundary inside it
    if num_bytes == 0 or not advise_huge_pages(raw.data_ptr() + start, -(-num_bytes // HUGE_PAGE) * HUGE_PAGE):
        return None
    return raw[start:start + num_bytes]                                  # a view: it keeps raw alive


def place_in_huge_pages(model: nn.Module) -> bool:
    """Copy every parameter and buffer of a CPU model into one huge-page buffer, each tensor now a view of it
    (tied weights stay one tensor). Values are unchanged. False, and nothing moved, where huge pages cannot be
    asked for."""
    tensors = {}                                         # storage pointer -> (tensor, [(module, name, kind)])
    for module in model.modules():
        for kind, table in (("parameter", module._parameters), ("buffer", module._buffers)):
            for name, t in table.items():
                if t is not None and t.device.type == "cpu" and t.is_contiguous() and t.numel() > 0:
                    tensors.setdefault(t.data_ptr(), (t, []))[1].append((module, name, kind))
    sizes = {ptr: -(-t.numel() * t.element_size() // 64) * 64 for ptr, (t, _) in tensors.items()}
    arena = empty_on_huge_pages(sum(sizes.values()))
    if arena is None:
        return False
    offset = 0
    for ptr, size in sizes.items():
        t, owners = tensors.pop(ptr)                     # dropped after the move: the old copy is freed as we go
        view = arena[offset:offset + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        view.copy_(t.detach())
        for module, name, kind in owners:
            if kind == "parameter":
                module._parameters[name].data = view
            else:
                module._buffers[name] = view
        offset += size
    return True
