# Generated from notebooks/04_paged_attention.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import hashlib
import warnings


# notebooks/04_paged_attention.ipynb, cell 53
def build_cpp(name: str, source: str, functions: list[str], fallback: str, extra_cflags: tuple[str, ...] = ()):
    """Compile `source` into a module exposing `functions`, once per machine and source (torch caches the build
    under ~/.cache/torch_extensions, in a folder named after a hash of the source and flags, so that a chapter's
    earlier version of a kernel and the package's do not rebuild over each other). A compiler without OpenMP
    (Apple's clang) gets a second try without -fopenmp and runs on one core. None, with a warning that ends in
    `fallback`, where nothing builds."""
    from torch.utils.cpp_extension import load_inline

    error = None
    for threads in ("-fopenmp", "-fopenmp-simd"):   # -fopenmp-simd: `omp simd` loops only, no threads
        flags = ["-O3", "-march=native", threads, *extra_cflags]
        key = hashlib.sha1("\0".join([source, *functions, *flags]).encode()).hexdigest()[:12]
        try:
            return load_inline(f"{name}_{key}", cpp_sources=source, functions=functions, extra_cflags=flags)
        except Exception as e:  # no compiler, no ninja, no OpenMP, a failed build
            error = e
    warnings.warn(f"{name} could not be built ({error}); {fallback}")
    return None
