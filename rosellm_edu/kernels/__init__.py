"""Attention kernels that read the paged KV cache in place: C++ for CPUs, Triton for GPUs."""
