"""What a measurement ran on, named the same way by every benchmark and notebook: the CPU's model or the GPU's."""

import os
import platform
from datetime import date

import torch


def device_name(device: torch.device = torch.device("cpu")) -> str:
    """The GPU's name for a CUDA device; otherwise the CPU's model name, from /proc/cpuinfo where there is one."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def describe(device: torch.device = torch.device("cpu")) -> str:
    """The device's name, torch's threads and torch's version, for a line printed beside a figure."""
    return f"{device_name(device)}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def machine_line(device: torch.device = torch.device("cpu")) -> str:
    """The line a timing chapter prints above its numbers: machine, threads, torch and today's date."""
    return f"Machine: {describe(device)}, {date.today()}"
