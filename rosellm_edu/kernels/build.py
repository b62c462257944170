# Generated from notebooks/04_paged_attention.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import hashlib
import os
import warnings
from pathlib import Path

import rosellm_edu


# notebooks/04_paged_attention.ipynb, cell 53
CSRC = Path(rosellm_edu.__file__).parent / "kernels" / "csrc"   # the exporter writes the %%cpp cells here


# notebooks/04_paged_attention.ipynb, cell 53
def include_dirs() -> list[Path]:
    """Where a C++ file and what it includes are found: the folder of this notebook's %%cpp cells first (named by
    ROSELLM_EDU_CPP_CELLS), so that a chapter compiles its own cells as they stand, then the package's csrc/."""
    cells = os.environ.get("ROSELLM_EDU_CPP_CELLS")
    return [Path(cells), CSRC] if cells else [CSRC]


# notebooks/04_paged_attention.ipynb, cell 53
def build_cpp(name: str, file: str, functions: list[str], fallback: str, extra_cflags: tuple[str, ...] = ()):
    """Compile the C++ file `file` into a module exposing `functions`, once per machine and source (torch caches
    the build under ~/.cache/torch_extensions, in a folder named after a hash of the files it could include and the
    flags). A compiler without OpenMP (Apple's clang) gets a second try without -fopenmp and runs on one core.
    None, with a warning that ends in `fallback` (and holds the compiler's errors, by file and line), where
    nothing builds."""
    from torch.utils.cpp_extension import load_inline

    dirs = include_dirs()
    found = {path.name: path for folder in reversed(dirs) for path in folder.glob("*.[ch]*")}   # the first dir's wins
    texts = [f"{base}\0{path.read_text()}" for base, path in sorted(found.items())]
    error = None
    for threads in ("-fopenmp", "-fopenmp-simd"):   # -fopenmp-simd: `omp simd` loops only, no threads
        flags = ["-O3", "-march=native", threads, *extra_cflags]
        key = hashlib.sha1("\0".join([*texts, file, *functions, *flags]).encode()).hexdigest()[:12]
        try:
            return load_inline(f"{name}_{key}", cpp_sources=f'#include "{file}"', functions=functions,
                               extra_cflags=flags, extra_include_paths=[str(folder) for folder in dirs])
        except Exception as e:  # no compiler, no ninja, no OpenMP, a failed build
            error = e
    warnings.warn(f"{name} could not be built ({error}); {fallback}")
    return None
