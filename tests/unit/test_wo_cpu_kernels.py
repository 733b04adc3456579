"""trtspec's CPU weight-only kernels (trtspec/speculative/kernels/wo_cpu.cpp): INT4 in blocks and
INT8 per row, against the dequantized matmul they stand for; every row's bits independent of the
rows beside it (what runtime.batch_invariant relies on); the layers use them, and fall back to
torch's kernels, with the reason, where they cannot run.

Two builds (kernels.variant): bf16 on an AVX512-BF16 CPU, fma on any other AVX512 CPU; on a bf16
CPU the matmul tests run both (TRTSPEC_CPU_KERNELS=trtspec-fma). Skipped, with the reason, on a CPU
without AVX512 or where the kernels do not build (the layers then run torch's kernels, which
tests/unit/test_batch_invariance.py also covers).
"""

from __future__ import annotations

import pytest
import torch

from trtspec.speculative import kernels
from trtspec.speculative.model import Int4Linear, Int8Linear


@pytest.fixture
def kernel_choice(monkeypatch):
    """Set TRTSPEC_CPU_KERNELS (or CXX) for one test: the choice is made once per process, so the
    cache is cleared before and after."""
    def choose(**env):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        kernels._load.cache_clear()
    yield choose
    monkeypatch.undo()
    kernels._load.cache_clear()


def _ext():
    ext = kernels.wo_cpu()
    if ext is None:
        pytest.skip(f"trtspec's CPU kernels do not run here: {kernels.wo_cpu_status()}")
    return ext


@pytest.fixture(params=["trtspec", "trtspec-fma"])
def each_build(request, kernel_choice):
    """The kernel module of each build this CPU can run: the best one, then the fma one (the same
    build on a CPU without AVX512-BF16: skipped there as a repeat)."""
    if request.param == "trtspec-fma":
        if kernels.variant() != "bf16":
            pytest.skip("the best build here is the fma one: tested as trtspec")
        kernel_choice(TRTSPEC_CPU_KERNELS="trtspec-fma")
    else:
        kernel_choice()
    ext = _ext()
    assert ext.variant == ("fma" if request.param == "trtspec-fma" else kernels.variant())
    return ext


def test_the_build_follows_the_cpu_flags():
    assert kernels.variant(frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "fma"})) == "bf16"
    assert kernels.variant(frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "fma"})) == "fma"
    assert kernels.variant(frozenset({"avx2", "fma"})) is None


def _reference(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    n, k = q.shape
    w = (q.double().view(n, k // group, group) * scales.double()[..., None]).view(n, k)
    return x.double() @ w.t()


@pytest.mark.parametrize("bits,group", [(4, 128), (4, 64), (8, None)])
@pytest.mark.parametrize("n,k", [(64, 256), (36, 896), (128, 1536)])
def test_matches_the_dequantized_matmul(each_build, bits, group, n, k):
    ext = each_build
    torch.manual_seed(n + k + bits)
    lo, hi = (-8, 8) if bits == 4 else (-128, 128)  # INT8: every byte value, -128 included
    q = torch.randint(lo, hi, (n, k), dtype=torch.int8)
    group = group or k  # INT8: one scale per output row
    scales = torch.rand(n, k // group) * 0.1 + 1e-3
    x = torch.randn(5, k).to(torch.bfloat16)
    y = ext.mm(x, ext.pack(q, bits), scales, group, bits)
    ref = _reference(x, q, scales, group)
    assert y.dtype == torch.bfloat16 and y.shape == (5, n)
    # bf16 x small-integer products are exact in fp32; the fp32 sums round a little, the bf16
    # result by at most half a unit in its last place (2^-9 relative)
    err = (y.double() - ref).abs()
    assert (err <= ref.abs() * 2.0**-8 + 1e-5 * ref.abs().max()).all()


@pytest.mark.parametrize("bits", [4, 8])
def test_each_row_is_the_same_bits_in_any_batch(each_build, bits):
    ext = each_build
    torch.manual_seed(bits)
    n, k, group = 96, 512, 128 if bits == 4 else 512
    q = torch.randint(-8, 8, (n, k), dtype=torch.int8) if bits == 4 else torch.randint(-127, 128, (n, k), dtype=torch.int8)
    packed, scales = ext.pack(q, bits), torch.rand(n, k // group)
    # 37 rows: the bf16 build goes 4 rows at a time; the fma build too (INT8: runs of up to 6, so 5
    # is one run, 7 is 4 + 3), with the weights unpacked in registers, up to 31 rows, and from 32
    # rows (a prefill) from a tile unpacked once
    x = torch.randn(37, k).to(torch.bfloat16)
    full = ext.mm(x, packed, scales, group, bits)
    for m in [*range(1, 10), 15, 16, 17, 31, 32, 33, 36, 37]:
        part = ext.mm(x[:m], packed, scales, group, bits)
        assert torch.equal(part, full[:m]), f"{m} rows"
    for i in range(37):
        assert torch.equal(ext.mm(x[i : i + 1], packed, scales, group, bits), full[i : i + 1]), f"row {i} alone"


def test_refuses_shapes_it_cannot_run():
    ext = _ext()
    with pytest.raises(RuntimeError, match="K of 64"):
        ext.pack(torch.zeros(8, 100, dtype=torch.int8), 4)
    with pytest.raises(RuntimeError, match="N a multiple of 4"):
        ext.pack(torch.zeros(6, 128, dtype=torch.int8), 8)
    packed = ext.pack(torch.zeros(8, 128, dtype=torch.int8), 4)
    with pytest.raises(RuntimeError, match="bf16"):
        ext.mm(torch.zeros(1, 128), packed, torch.ones(8, 1), 128, 4)
    with pytest.raises(RuntimeError, match="scales"):
        ext.mm(torch.zeros(1, 128, dtype=torch.bfloat16), packed, torch.ones(8, 2), 128, 4)


def _layers():
    torch.manual_seed(0)
    w8, w4 = torch.randn(64, 256) * 0.02, torch.randn(64, 256) * 0.02
    return (Int8Linear(w8, torch.randn(64)),
            Int4Linear(w4, None, w4.abs().view(64, 2, 128).amax(-1)))


def test_layers_run_on_it_and_agree_with_torchs_kernels(kernel_choice):
    _ext()
    x = torch.randn(3, 256).to(torch.bfloat16)
    layers = _layers()
    ours = [lin(x) for lin in layers]
    assert all(lin.packed and lin.packed[0] is not None for lin in layers)  # (kernel, op, weights, scales)
    kernel_choice(TRTSPEC_CPU_KERNELS="torch")
    assert kernels.wo_cpu() is None and "TRTSPEC_CPU_KERNELS=torch" in kernels.wo_cpu_status()
    theirs = [lin(x) for lin in _layers()]
    for a, b in zip(ours, theirs):  # the same grid; the kernels differ only in summation order and rounding
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-3)


def test_built_once_then_imported_from_the_cache(kernel_choice, tmp_path):
    """Another process (or this one after a reset) imports the build from the cache folder, without
    the compiler: a bogus CXX does not matter once it is built."""
    _ext()
    built = list(kernels.cache_dir().glob(f"wo_cpu-{kernels.variant()}-*/trtspec_wo_cpu*.so"))
    assert built, kernels.cache_dir()
    kernel_choice(CXX="no-such-compiler-xyz")
    assert kernels.wo_cpu() is not None


def test_falls_back_with_the_reason(kernel_choice, tmp_path):
    kernel_choice(CXX="no-such-compiler-xyz", TRTSPEC_KERNEL_CACHE=str(tmp_path))  # nothing built there
    if kernels.variant() is None:
        assert "no AVX512" in kernels.wo_cpu_status()
    else:
        assert kernels.wo_cpu() is None and "no C++ compiler" in kernels.wo_cpu_status()
    x = torch.randn(2, 256).to(torch.bfloat16)
    for lin in _layers():  # the layers still run, on torch's kernels
        assert lin(x).shape == (2, 64)
        assert not lin.packed or lin.packed[0] is None
    kernel_choice(TRTSPEC_CPU_KERNELS="fast")
    assert "is not one of trtspec, trtspec-fma, torch" in kernels.wo_cpu_status()


@pytest.mark.parametrize("bits", [4, 8])
def test_unpack_inverts_pack(bits):
    ext = _ext()
    torch.manual_seed(11)
    lo, hi = (-8, 8) if bits == 4 else (-128, 128)
    q = torch.randint(lo, hi, (12, 192), dtype=torch.int8)
    assert torch.equal(ext.unpack(ext.pack(q, bits), bits, 192), q)


def test_packed_copy_is_the_only_one_and_dequantizes_the_same():
    """Once packed for trtspec's kernel, a layer drops its row-major INT values (a second copy of
    every quantized weight); ``int_values`` and ``dequantized`` read them back from the packed copy."""
    _ext()
    x = torch.randn(2, 256).to(torch.bfloat16)
    for lin in _layers():
        before, deq = lin.qweight.clone(), (lin.dequantized() if isinstance(lin, Int8Linear) else None)
        y = lin(x)
        assert lin.qweight is None and "qweight" not in lin.state_dict()
        assert torch.equal(lin.int_values, before)
        if deq is not None:
            assert torch.equal(lin.dequantized(), deq)
        assert torch.equal(lin(x), y)  # still runs, same bits
