"""trtspec's own CPU kernels, compiled from source on first use (``torch.utils.cpp_extension``:
g++ and ninja; about 30 s once, then cached under ``TORCH_EXTENSIONS_DIR``).

One source today, ``wo_cpu.cpp``: the INT4 and INT8 weight-only matmuls that
:class:`~trtspec.speculative.model.Int4Linear` and :class:`~trtspec.speculative.model.Int8Linear`
run on an AVX512-BF16 CPU (why, and how: the file's head). Where the CPU lacks ``avx512_bf16``,
the compiler or ninja is missing, or ``TRTSPEC_CPU_KERNELS=torch`` is set, the layers use torch's
own ``aten._weight_int4pack_mm_for_cpu`` / ``aten._weight_int8pack_mm``, and
:func:`wo_cpu_status` says why.
Both are row-invariant; they differ from each other in the last bits, so a deployment's plain and
speculative decoding must (and do: one process, one choice) run on the same one.
"""

from __future__ import annotations

import functools
import logging
import os
import pathlib
import shutil

log = logging.getLogger(__name__)

_SOURCE = pathlib.Path(__file__).with_name("wo_cpu.cpp")
_FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma", "-fopenmp"]
ENV = "TRTSPEC_CPU_KERNELS"  # "torch": always torch's kernels (an A/B switch); unset or "trtspec": ours where they run


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux ``/proc/cpuinfo``; empty elsewhere)."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def _load():
    """(module, None) or (None, why not)."""
    choice = os.environ.get(ENV, "trtspec")
    if choice not in ("trtspec", "torch"):
        return None, f"{ENV}={choice!r} is not one of trtspec, torch (using torch's kernels)"
    if choice == "torch":
        return None, f"{ENV}=torch"
    if "avx512_bf16" not in cpu_flags():
        return None, "this CPU has no avx512_bf16"
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return None, "no C++ compiler (c++) on PATH"
    try:
        from torch.utils.cpp_extension import load
        module = load(name="trtspec_wo_cpu", sources=[str(_SOURCE)], extra_cflags=_FLAGS,
                      extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as e:  # a failed build falls back, once, with the compiler's reason in the log
        why = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        log.warning("trtspec's CPU weight-only kernels did not build (%s); INT4/INT8 layers use torch's", why)
        return None, f"the build failed: {why}"
    return module, None


def wo_cpu():
    """The compiled module (``mm``, ``pack``), or None (then :func:`wo_cpu_status` says why)."""
    return _load()[0]


_OP = None  # torch.ops.trtspec.wo_mm, registered once per process (see op)


def op():
    """``torch.ops.trtspec.wo_mm`` (x, packed, scales, group, bits) -> bf16 [M, N]: the kernel as a
    torch custom op with a shape function, so ``torch.compile`` (runtime.compile_draft) keeps it in
    one graph instead of breaking at an opaque call. Eager code calls the module directly (the
    dispatcher costs a few µs per call). None where the kernels do not run."""
    global _OP
    if wo_cpu() is None:
        return None
    if _OP is None:
        import torch

        @torch.library.custom_op("trtspec::wo_mm", mutates_args=(),
                                 schema="(Tensor x, Tensor packed, Tensor scales, int group, int bits) -> Tensor")
        def wo_mm(x, packed, scales, group, bits):
            return wo_cpu().mm(x, packed, scales, group, bits)

        @wo_mm.register_fake
        def _(x, packed, scales, group, bits):
            return x.new_empty((x.shape[0], packed.shape[0] * 4))

        _OP = wo_mm
    return _OP


def wo_cpu_status(*, if_used: bool = False) -> str | None:
    """Which kernels INT4/INT8 CPU layers get in this process, in words. ``if_used``: None unless
    a layer has already asked (no build or load just to report)."""
    if if_used and _load.cache_info().currsize == 0:
        return None
    module, why = _load()
    if module is not None:
        return "trtspec wo_cpu (AVX512-BF16)"
    return f"torch's aten._weight_int4pack_mm_for_cpu / _weight_int8pack_mm ({why})"
