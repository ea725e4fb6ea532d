"""Which float dtype to compute in: bfloat16 where the hardware has it natively, float32 elsewhere."""
from __future__ import annotations

__all__ = ["DTYPES", "native_bf16", "resolve_dtype"]

#: The dtypes models are evaluated and trained in; "auto" resolves to one of them on the machine that runs.
DTYPES = ("float32", "bfloat16")


def native_bf16() -> bool:
    """A CUDA GPU with bf16, or a CPU with AVX512-BF16 or AMX (emulated bf16 on other CPUs is slower than fp32)."""
    import torch

    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def resolve_dtype(dtype: str = "auto", what: str = "dtype") -> str:
    """``"auto"`` -> "bfloat16" with native bf16, else "float32"; a named dtype is checked and returned."""
    if dtype == "auto":
        return "bfloat16" if native_bf16() else "float32"
    if dtype not in DTYPES:
        raise ValueError(f"{what} must be 'auto' or one of {DTYPES}, got {dtype!r}")
    return dtype
