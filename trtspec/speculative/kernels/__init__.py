"""trtspec's own CPU kernels, compiled from source on first use (``torch.utils.cpp_extension``:
g++ and ninja; about 30 s once, then cached: :func:`cache_dir`).

Built once per source, flags, torch and Python into :func:`cache_dir` and imported from there.
One source today, ``wo_cpu.cpp``: the INT4 and INT8 weight-only matmuls that
:class:`~trtspec.speculative.model.Int4Linear` and :class:`~trtspec.speculative.model.Int8Linear`
run on an AVX512-BF16 CPU (why, and how: the file's head), and ``layer_step``, a whole decoder
layer on them in one call (``CausalLM.kernel_layers``). Where the CPU lacks ``avx512_bf16``,
the compiler or ninja is missing, or ``TRTSPEC_CPU_KERNELS=torch`` is set, the layers use torch's
own ``aten._weight_int4pack_mm_for_cpu`` / ``aten._weight_int8pack_mm``, and
:func:`wo_cpu_status` says why.
Both are row-invariant; they differ from each other in the last bits, so a deployment's plain and
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
_FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma", "-fopenmp"]
_NAME = "trtspec_wo_cpu"
CACHE_ENV = "TRTSPEC_KERNEL_CACHE"
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


def cache_dir() -> pathlib.Path:
    """Where built kernels are kept: ``$TRTSPEC_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/trtspec/kernels``
    (``~/.cache/trtspec/kernels``)."""
    if os.environ.get(CACHE_ENV):
        return pathlib.Path(os.environ[CACHE_ENV])
    return pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "trtspec" / "kernels"


def _build_key(torch_version: str) -> str:
    """What the built library depends on: the source, the flags, torch, Python and the machine."""
    h = hashlib.sha256(_SOURCE.read_bytes())
    for part in (*_FLAGS, torch_version, sys.version, platform.machine()):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def _import(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(_NAME, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _load():
    """(module, None) or (None, why not).

    A build is kept in its own folder under :func:`cache_dir`, named by :func:`_build_key`, and
    imported from there by every later process without asking the compiler or ninja again: torch's
    own JIT cache rebuilt (30 s) whenever a process with another ninja on its PATH loaded it (a
    shell, then each served engine worker). One process builds while the others wait on a lock."""
    choice = os.environ.get(ENV, "trtspec")
    if choice not in ("trtspec", "torch"):
        return None, f"{ENV}={choice!r} is not one of trtspec, torch (using torch's kernels)"
    if choice == "torch":
        return None, f"{ENV}=torch"
    if "avx512_bf16" not in cpu_flags():
        return None, "this CPU has no avx512_bf16"
    try:
        import torch  # lazy: the kernels are torch extensions; this module is read without torch (trtspec check)

        folder = cache_dir() / f"wo_cpu-{_build_key(torch.__version__)}"
        built = folder / f"{_NAME}.so"
        if built.is_file():
            return _import(built), None
        if shutil.which(os.environ.get("CXX", "c++")) is None:
            return None, "no C++ compiler (c++) on PATH"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if built.is_file():  # another process built it while this one waited
                return _import(built), None
            from torch.utils.cpp_extension import load
            module = load(name=_NAME, sources=[str(_SOURCE)], extra_cflags=_FLAGS, extra_ldflags=["-fopenmp"],
                          build_directory=str(folder), verbose=False)
            return module, None
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
        return "trtspec wo_cpu (AVX512-BF16; decode/verify passes one call per decoder layer)"
    return f"torch's aten._weight_int4pack_mm_for_cpu / _weight_int8pack_mm ({why})"
