"""trtspec's own CPU kernels, compiled from source on first use (``torch.utils.cpp_extension``:
g++ and ninja; about 30 s once, then cached: :func:`cache_dir`).

Built once per source, flags, torch and Python into :func:`cache_dir` and imported from there.
One source today, ``wo_cpu.cpp``: the INT4 and INT8 weight-only matmuls that
:class:`~trtspec.speculative.model.Int4Linear` and :class:`~trtspec.speculative.model.Int8Linear`
run on an AVX512 CPU (why, and how: the file's head), and ``layer_step``, a whole decoder layer on
them in one call (``CausalLM.kernel_layers``). It is built in one of two variants, chosen by the
CPU's flags (:func:`variant`): ``bf16`` where the CPU has ``avx512_bf16`` (bf16 dot products),
``fma`` on any other AVX512 CPU (fp32 FMAs; Skylake-SP to Ice Lake Xeons). Where the CPU has no
AVX512, the compiler or ninja is missing, or ``TRTSPEC_CPU_KERNELS=torch`` is set, the layers use
torch's own ``aten._weight_int4pack_mm_for_cpu`` / ``aten._weight_int8pack_mm``, and
:func:`wo_cpu_status` says why. ``TRTSPEC_CPU_KERNELS=trtspec-fma`` takes the ``fma`` variant on
a bf16 CPU too (an A/B switch; the tests use it).
All are row-invariant; they differ from each other in the last bits, so a deployment's plain and
speculative decoding must (and do: one process, one choice) run on the same one.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import logging
import os
import pathlib
import platform
import shutil
import sys

log = logging.getLogger(__name__)

_SOURCE = pathlib.Path(__file__).with_name("wo_cpu.cpp")
_FLAGS = {  # per variant (see variant)
    "bf16": ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma", "-fopenmp", "-DTRTSPEC_DPBF16"],
    "fma": ["-O3", "-mavx512f", "-mfma", "-fopenmp"],
}
_NAME = "trtspec_wo_cpu"
CACHE_ENV = "TRTSPEC_KERNEL_CACHE"
ENV = "TRTSPEC_CPU_KERNELS"  # unset or "trtspec": ours where they run; "trtspec-fma": our fma variant even on a
# bf16 CPU; "torch": always torch's kernels (the A/B switches)
CHOICES = ("trtspec", "trtspec-fma", "torch")


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux ``/proc/cpuinfo``; empty elsewhere)."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cache_dir() -> pathlib.Path:
    """Where built kernels are kept: ``$TRTSPEC_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/trtspec/kernels``
    (``~/.cache/trtspec/kernels``)."""
    if os.environ.get(CACHE_ENV):
        return pathlib.Path(os.environ[CACHE_ENV])
    return pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "trtspec" / "kernels"


def variant(flags: frozenset[str] | None = None) -> str | None:
    """Which build of wo_cpu.cpp this CPU runs: ``bf16`` (``avx512_bf16``: bf16 dot products),
    ``fma`` (``avx512f`` without them: fp32 FMAs), or None (no AVX512: torch's kernels)."""
    flags = cpu_flags() if flags is None else flags
    if {"avx512_bf16", "avx512f", "avx512bw", "avx512vl"} <= flags:
        return "bf16"
    if "avx512f" in flags:
        return "fma"
    return None


def _build_key(torch_version: str, kind: str) -> str:
    """What the built library depends on: the source, the flags, torch, Python and the machine."""
    h = hashlib.sha256(_SOURCE.read_bytes())
    for part in (*_FLAGS[kind], torch_version, sys.version, platform.machine()):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def _import(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tagged(module, kind: str):
    module.variant = kind  # which build (bf16 or fma), for reports
    return module


@functools.cache
def _load():
    """(module, None) or (None, why not).

    A build is kept in its own folder under :func:`cache_dir`, named by :func:`_build_key`, and
    imported from there by every later process without asking the compiler or ninja again: torch's
    own JIT cache rebuilt (30 s) whenever a process with another ninja on its PATH loaded it (a
    shell, then each served engine worker). One process builds while the others wait on a lock."""
    choice = os.environ.get(ENV, "trtspec")
    if choice not in CHOICES:
        return None, f"{ENV}={choice!r} is not one of {', '.join(CHOICES)} (using torch's kernels)"
    if choice == "torch":
        return None, f"{ENV}=torch"
    kind = variant()
    if kind is None:
        return None, "this CPU has no AVX512 (avx512f)"
    if choice == "trtspec-fma":
        kind = "fma"
    name = _NAME if kind == "bf16" else f"{_NAME}_{kind}"
    try:
        import torch  # lazy: the kernels are torch extensions; this module is read without torch (trtspec check)

        folder = cache_dir() / f"wo_cpu-{kind}-{_build_key(torch.__version__, kind)}"
        built = folder / f"{name}.so"
        if built.is_file():
            return _tagged(_import(built), kind), None
        if shutil.which(os.environ.get("CXX", "c++")) is None:
            return None, "no C++ compiler (c++) on PATH"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if built.is_file():  # another process built it while this one waited
                return _tagged(_import(built), kind), None
            from torch.utils.cpp_extension import load
            module = load(name=name, sources=[str(_SOURCE)], extra_cflags=_FLAGS[kind],
                          extra_ldflags=["-fopenmp"], build_directory=str(folder), verbose=False)
            return _tagged(module, kind), None
    except Exception as e:  # a failed build falls back, once, with the compiler's reason in the log
        why = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        log.warning("trtspec's CPU weight-only kernels did not build (%s); INT4/INT8 layers use torch's", why)
        return None, f"the build failed: {why}"


def wo_cpu():
    """The compiled module (``mm``, ``pack``), or None (then :func:`wo_cpu_status` says why)."""
    return _load()[0]


_OP = None  # the registered custom op (see op)


def op():
    """The kernel as a torch custom op, ``torch.ops.trtspec.wo_mm_<version>`` (x, packed, scales,
    group, bits) -> bf16 [M, N], with a shape function, so that ``torch.compile``
    (runtime.compile_draft) keeps it in one graph instead of breaking at an opaque call. Eager code
    calls the module directly (the dispatcher costs a few µs per call). None where the kernels do
    not run.

    ``<version>`` hashes the C++ source and this file: inductor's on-disk graph cache keys a
    graph by the op's name and schema, not by what the op returns, and a graph compiled while the
    op returned fp32 was reused after it returned bf16 (its draft then proposed garbage)."""
    global _OP
    if wo_cpu() is None:
        return None
    if _OP is None:
        import torch  # lazy: as in _load

        version = hashlib.sha256(_SOURCE.read_bytes() + pathlib.Path(__file__).read_bytes()).hexdigest()[:12]
        name = f"wo_mm_{version}"

        @torch.library.custom_op(f"trtspec::{name}", mutates_args=(),
                                 schema="(Tensor x, Tensor packed, Tensor scales, int group, int bits) -> Tensor")
        def wo_mm(x, packed, scales, group, bits):
            return wo_cpu().mm(x, packed, scales, group, bits)

        @wo_mm.register_fake
        def _(x, packed, scales, group, bits):
            return x.new_empty((x.shape[0], packed.shape[0] * 4))

        _OP = getattr(torch.ops.trtspec, name)
    return _OP


def wo_cpu_status(*, if_used: bool = False) -> str | None:
    """Which kernels INT4/INT8 CPU layers get in this process, in words. ``if_used``: None unless
    a layer has already asked (no build or load just to report)."""
    if if_used and _load.cache_info().currsize == 0:
        return None
    module, why = _load()
    if module is not None:
        how = ("AVX512-BF16 dot products" if module.variant == "bf16"
               else "AVX512 fp32 FMAs: this CPU has no avx512_bf16" if variant() == "fma"
               else f"AVX512 fp32 FMAs: {ENV}=trtspec-fma")
        return f"trtspec wo_cpu, {module.variant} ({how}; decode/verify passes one call per decoder layer)"
    return f"torch's aten._weight_int4pack_mm_for_cpu / _weight_int8pack_mm ({why})"
