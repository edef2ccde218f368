"""Peak memory for the benchmarks' reports, measured the one way each device allows.

    reset(device); run(); gb = peak_gb(device)        # CUDA: the allocator's peak since reset, per side
    print(describe(device))                           # one labelled phrase for a report line

On CUDA it is ``torch.cuda.max_memory_allocated`` (tensors only, since the last ``reset``), so sides run in turn in
one process each get their own peak. A CPU has no per-side counter: the figure is the process's maximum resident
set size (``ru_maxrss``), which covers the interpreter, torch and every side run so far, and is labelled so; a
per-side number on CPU is not available and is never printed as one.
"""

from __future__ import annotations

import resource
import sys

import torch


def _cuda(device: str) -> bool:
    return str(device).startswith("cuda")


def reset(device: str) -> None:
    """Start a new peak (CUDA); nothing on a CPU, whose figure is the process's."""
    if _cuda(device):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peak_gb(device: str) -> float:
    """GB: the CUDA allocator's peak since ``reset``, or the process's max RSS on a CPU."""
    if _cuda(device):
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 1e9
    unit = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit / 1e9


def kind(device: str) -> str:
    """What ``peak_gb`` measures on ``device``, for the report."""
    if _cuda(device):
        return "peak GPU memory (torch.cuda.max_memory_allocated)"
    return "peak memory per side n/a on CPU; process max RSS (ru_maxrss: every side and the interpreter together)"


def describe(device: str, gb: float | None = None) -> str:
    return f"{kind(device)} {peak_gb(device) if gb is None else gb:.2f} GB"
