# Generated from notebooks/11b_native_decode.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import functools

from rosellm_edu.kernels.build import build_cpp


# notebooks/11b_native_decode.ipynb, cell 28
@functools.cache
def extension():
    """A decode step's layers as one call, or None where it cannot be built (steps then run the model's modules)."""
    return build_cpp("rosellm_edu_decode_layer", "decode_layer.cpp",
                     ["decode_layers", "decode_plan", "decode_step", "region_costs", "decode_region"],
                     "decode steps run the model's modules instead", extra_cflags=("-fno-trapping-math",))
