// trtspec's CPU weight-only matmuls for AVX512 CPUs, built in one of two variants from this file:
//   bf16 (TRTSPEC_DPBF16 defined, -mavx512bf16): CPUs with AVX512-BF16 dot products (AMD Zen 4+, Intel
//        Cooper Lake, Sapphire Rapids+);
//   fma  (plain AVX512F/BW): every other AVX512 CPU (Intel Skylake-SP, Cascade Lake, Ice Lake: most of the
//        x86 cloud fleet), where bf16 products would be emulated.
// The formats:
//   INT4 (W4A16): symmetric INT4 weights in blocks of `group` input channels, one scale per block
//                 (ModelOpt int4_wo / int4_awq), bf16 activations;
//   INT8 (W8A16): symmetric INT8 weights, one scale per output channel (ModelOpt int8_wo).
//
// Why not torch's aten::_weight_int4pack_mm_for_cpu / _weight_int8pack_mm: they turn each weight
// into fp32 and multiply with FMAs, which makes a decode step compute-bound on a small CPU (2 cores:
// ~15-18 GB/s of weights against ~28 GB/s of memory bandwidth), and a verify pass over 3 tokens
// costs 1.5x a one-token step (2x over 4 tokens on a 2-core Xeon without AVX512-BF16), which is most
// of what speculation has to win back.
// bf16 variant: a table lookup (vpermw) turns 32 4-bit fields into 32 exact bf16 values in one
// instruction, and one vdpbf16ps multiplies them with 32 bf16 activations:
//   INT4: the field is the weight (q + 8 -> q);
//   INT8: a weight is 16 * (its high nibble, signed) + (its low nibble), two lookups and two dot
//         products, each exact (bf16 holds every integer up to 256).
// fma variant: the activations are widened to fp32 once per call; a weight becomes fp32 already
// multiplied by its block's scale (INT4: one vpermps from a 16-entry table of q * scale, made once per
// block; INT8: widen, convert, multiply), and one fp32 FMA per 16 weights and token row adds it in.
// Either way a step reads weights at close to memory speed, and a tile's weights, unpacked once,
// serve up to 4 token rows while they sit in cache.
//
// Batch invariance: every output y[m, n] is computed by the same instructions in the same order
// whatever the number of token rows M and whichever tile or thread holds it (16 fp32 lanes per
// block, scaled per block into 16 running lanes, one horizontal sum at the end), so a verify pass
// over K+1 tokens gives, bit for bit, what K+1 one-token steps give. The two variants differ from
// each other in the last bits (they sum in different orders); one process uses one.
//
// Packed layout (pack): uint8 [N/4, K/64, 4, B] with B = 32 (INT4) or 64 (INT8) bytes: the 4
// output rows of a tile, 64 input channels at a time, so a tile's weights are one contiguous run.
//   INT4: byte j of a row's 32 holds q[k0+j] + 8 in its low nibble, q[k0+32+j] + 8 in its high one;
//   INT8: byte j of a row's 64 is q[k0+j] (two's complement).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cstring>
#include <type_traits>

namespace {

constexpr int R = 4;  // output rows per tile

#ifdef TRTSPEC_DPBF16
uint16_t bf16_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return uint16_t(bits >> 16);  // exact for the small integers below (no low mantissa bits)
}

// 32 bf16 entries, indexed by the low 5 bits of a 16-bit lane (vpermw); entries 16..31 repeat 0..15,
// so a zero-extended byte indexes its low nibble without masking
__m512i table(float (*value)(int)) {
  alignas(64) uint16_t t[32];
  for (int i = 0; i < 32; ++i) t[i] = bf16_bits(value(i & 15));
  return _mm512_load_si512(t);
}
#endif

inline __m512 load16(const uint16_t* p) {  // 16 bf16 -> fp32 (exact)
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
inline __m256i to_bf16(__m512 v) {  // fp32 -> bf16, round to nearest even
#ifdef TRTSPEC_DPBF16
  return (__m256i)_mm512_cvtneps_pbh(v);
#else  // what c10::BFloat16 does: add 0x7fff plus the kept part's lowest bit, truncate; NaN -> 0x7fc0
  const __m512i b = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
  return _mm512_cvtepi32_epi16(r);
#endif
}
inline void store16(uint16_t* p, __m512 v) { _mm256_storeu_si256((__m256i*)p, to_bf16(v)); }
inline __m512 rnd(__m512 v) {  // fp32 rounded to bf16 and back: what a bf16 torch op stores between ops
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16(v)), 16));
}

// ask for the tile's bytes 2 KiB ahead of the 64 input channels being read
template <int BITS>
inline void prefetch_ahead(const uint8_t* wb) {
  _mm_prefetch((const char*)(wb + 2048), _MM_HINT_T0);
  _mm_prefetch((const char*)(wb + 2048 + 64), _MM_HINT_T0);
  if constexpr (BITS == 8) {
    _mm_prefetch((const char*)(wb + 2048 + 128), _MM_HINT_T0);
    _mm_prefetch((const char*)(wb + 2048 + 192), _MM_HINT_T0);
  }
}

#ifdef TRTSPEC_DPBF16
template <int M, int BITS>
inline void tile(const uint8_t* __restrict W, const float* __restrict S, const uint16_t* __restrict X,
                 int64_t K, int64_t group, int64_t n0, int64_t N, at::BFloat16* __restrict Y, __m512i lut_lo,
                 __m512i lut_hi) {
  constexpr int B = BITS == 4 ? 32 : 64;  // bytes per row per 64 input channels
  const int64_t groups = K / group;
  __m512 tot[M][R];
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) tot[m][r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[M][R];
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_setzero_ps();
    for (int64_t k0 = g * group; k0 < (g + 1) * group; k0 += 64) {
      __m512bh x0[M], x1[M];  // channels k0..k0+31, k0+32..k0+63
      for (int m = 0; m < M; ++m) {
        x0[m] = (__m512bh)_mm512_loadu_si512(X + m * K + k0);
        x1[m] = (__m512bh)_mm512_loadu_si512(X + m * K + k0 + 32);
      }
      const uint8_t* wb = W + (k0 / 64) * (R * B);
      prefetch_ahead<BITS>(wb);
      for (int r = 0; r < R; ++r) {
        if constexpr (BITS == 4) {
          const __m512i w16 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(wb + r * B)));
          const __m512bh lo = (__m512bh)_mm512_permutexvar_epi16(w16, lut_lo);
          const __m512bh hi = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(w16, 4), lut_lo);
          for (int m = 0; m < M; ++m) {
            acc[m][r] = _mm512_dpbf16_ps(acc[m][r], lo, x0[m]);
            acc[m][r] = _mm512_dpbf16_ps(acc[m][r], hi, x1[m]);
          }
        } else {
          for (int h = 0; h < 2; ++h) {
            const __m512i w16 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(wb + r * B + h * 32)));
            const __m512bh lo = (__m512bh)_mm512_permutexvar_epi16(w16, lut_lo);
            const __m512bh hi = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(w16, 4), lut_hi);
            for (int m = 0; m < M; ++m) {
              const __m512bh x = h ? x1[m] : x0[m];
              acc[m][r] = _mm512_dpbf16_ps(acc[m][r], hi, x);
              acc[m][r] = _mm512_dpbf16_ps(acc[m][r], lo, x);
            }
          }
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m512 s = _mm512_set1_ps(S[(n0 + r) * groups + g]);
      for (int m = 0; m < M; ++m) tot[m][r] = _mm512_fmadd_ps(acc[m][r], s, tot[m][r]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) Y[m * N + n0 + r] = at::BFloat16(_mm512_reduce_add_ps(tot[m][r]));  // RNE
}

#else
// fma variant: X is fp32 [M, K] (widened once per call). Every output is one chain of FMAs over its
// input channels in ascending order, 16 lanes at a time, with the weights already scaled (INT4: the
// 16-entry table of q * scale, made per block; INT8: q * scale), then one horizontal sum: the same
// order whichever of the two loops below computes it, so any M gives every row the same bits.

// 64 weights of one output row (channels k0 .. k0 + 63, a row's B bytes at wb) in fp32, scaled
template <int BITS>
inline void weights64(const uint8_t* wb, __m512 s, __m512 w[4]) {
  if constexpr (BITS == 4) {
    const __m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)wb));
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wb + 16)));
    w[0] = _mm512_permutexvar_ps(a, s);  // vpermps reads the low 4 bits: the low nibble
    w[1] = _mm512_permutexvar_ps(b, s);
    w[2] = _mm512_permutexvar_ps(_mm512_srli_epi32(a, 4), s);
    w[3] = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), s);
  } else {
    for (int c = 0; c < 4; ++c)
      w[c] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(wb + 16 * c)))), s);
  }
}

// the block's scale for each of the tile's rows: INT4 as the table of q * scale, INT8 as the scale
template <int BITS>
inline void block_scales(const float* S, int64_t groups, int64_t g, int64_t n0, __m512 lut, __m512 s[R]) {
  for (int r = 0; r < R; ++r) {
    const __m512 sr = _mm512_set1_ps(S[(n0 + r) * groups + g]);
    s[r] = BITS == 4 ? _mm512_mul_ps(lut, sr) : sr;
  }
}

// up to 4 token rows: the weights unpacked in registers, used by every row
template <int M, int BITS>
inline void tile(const uint8_t* __restrict W, const float* __restrict S, const float* __restrict X,
                 int64_t K, int64_t group, int64_t n0, int64_t N, at::BFloat16* __restrict Y, __m512 lut) {
  constexpr int B = BITS == 4 ? 32 : 64;  // bytes per row per 64 input channels
  const int64_t groups = K / group;
  __m512 acc[M][R];
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 s[R];
    block_scales<BITS>(S, groups, g, n0, lut, s);
    for (int64_t k0 = g * group; k0 < (g + 1) * group; k0 += 64) {
      const uint8_t* wb = W + (k0 / 64) * (R * B);
      prefetch_ahead<BITS>(wb);
      for (int r = 0; r < R; ++r) {
        __m512 w[4];
        weights64<BITS>(wb + r * B, s[r], w);
        for (int m = 0; m < M; ++m)
          for (int c = 0; c < 4; ++c)
            acc[m][r] = _mm512_fmadd_ps(w[c], _mm512_loadu_ps(X + m * K + k0 + 16 * c), acc[m][r]);
      }
    }
  }
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) Y[m * N + n0 + r] = at::BFloat16(_mm512_reduce_add_ps(acc[m][r]));  // RNE
}

// more token rows (a prefill, a wide verify pass): the tile's weights unpacked once into Wf [R, K]
// (fp32, scaled: the values tile() computes), then 4 token rows at a time against the tile's 4 output
// rows: 8 loads per 16 FMAs, no unpacking on the FMA ports
template <int BITS>
inline void unpack_tile(const uint8_t* __restrict W, const float* __restrict S, int64_t K, int64_t group, int64_t n0,
                        __m512 lut, float* __restrict Wf) {
  constexpr int B = BITS == 4 ? 32 : 64;
  const int64_t groups = K / group;
  for (int64_t g = 0; g < groups; ++g) {
    __m512 s[R];
    block_scales<BITS>(S, groups, g, n0, lut, s);
    for (int64_t k0 = g * group; k0 < (g + 1) * group; k0 += 64)
      for (int r = 0; r < R; ++r) {
        __m512 w[4];
        weights64<BITS>(W + (k0 / 64) * (R * B) + r * B, s[r], w);
        for (int c = 0; c < 4; ++c) _mm512_storeu_ps(Wf + r * K + k0 + 16 * c, w[c]);
      }
  }
}

template <int M>
inline void tile_unpacked(const float* __restrict Wf, const float* __restrict X, int64_t K, int64_t n0, int64_t N,
                          at::BFloat16* __restrict Y) {
  __m512 acc[M][R];
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    __m512 w[R];
    for (int r = 0; r < R; ++r) w[r] = _mm512_loadu_ps(Wf + r * K + k);
    for (int m = 0; m < M; ++m) {
      const __m512 x = _mm512_loadu_ps(X + m * K + k);
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_fmadd_ps(w[r], x, acc[m][r]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) Y[m * N + n0 + r] = at::BFloat16(_mm512_reduce_add_ps(acc[m][r]));  // RNE
}
#endif

float int4_value(int u) { return float(u - 8); }       // INT4: the field is q + 8
#ifdef TRTSPEC_DPBF16
float low_nibble(int u) { return float(u); }           // INT8: the low nibble, unsigned
float high_nibble(int u) { return float(16 * (u < 8 ? u : u - 16)); }  // INT8: 16 x the high nibble, signed
#endif

// token rows m0 .. m1-1, four at a time: f(std::integral_constant<int, Mc>{}, m) for each run of Mc <= 4
// rows starting at m (the tile kernels are templates on their row count)
template <typename F>
inline void in_fours(int64_t m0, int64_t m1, F&& f) {
  for (int64_t m = m0; m < m1; m += 4)
    switch (std::min<int64_t>(4, m1 - m)) {
      case 1: f(std::integral_constant<int, 1>{}, m); break;
      case 2: f(std::integral_constant<int, 2>{}, m); break;
      case 3: f(std::integral_constant<int, 3>{}, m); break;
      default: f(std::integral_constant<int, 4>{}, m); break;
    }
}

#ifndef TRTSPEC_DPBF16
// fma variant, INT8 weights, up to UNPACK - 1 rows: token rows m0 .. m1-1 in runs of at most 6, as
// even as they can be (5 -> 5, 7 -> 4 + 3, 10 -> 5 + 5): each run unpacks the tile's weights once,
// so a verify pass over 5 or 6 tokens unpacks once instead of twice (4 + 1). 6 rows x 4 output rows
// are 24 accumulators, which with the 4 weight vectors and one scale per row fit the 32 registers.
// INT4 keeps runs of 4: its 4 per-row scale tables leave no room (5 and 6 rows ran slower than
// 4 + 1 and 4 + 2). Only while 6 rows of fp32 activations fit a 48 KiB L1 (K <= 2048): the tile
// reads each row once per output row, and from L2 the longer runs were slower (2-core Xeon).
template <int BITS, typename F>
inline void in_runs(int64_t K, int64_t m0, int64_t m1, F&& f) {
  if (BITS == 4 || 6 * K * int64_t(sizeof(float)) > 48 * 1024) return in_fours(m0, m1, f);
  const int64_t n = m1 - m0, runs = (n + 5) / 6;
  for (int64_t i = 0, m = m0; i < runs; ++i) {
    const int64_t len = n / runs + (i < n % runs ? 1 : 0);
    switch (len) {
      case 1: f(std::integral_constant<int, 1>{}, m); break;
      case 2: f(std::integral_constant<int, 2>{}, m); break;
      case 3: f(std::integral_constant<int, 3>{}, m); break;
      case 4: f(std::integral_constant<int, 4>{}, m); break;
      case 5: f(std::integral_constant<int, 5>{}, m); break;
      default: f(std::integral_constant<int, 6>{}, m); break;
    }
    m += len;
  }
}
#endif

// all M token rows; each tile's weights come from memory once, token rows go four at a time (the
// tile's bytes stay in cache for the next four), every row gets the same instructions
template <int BITS>
void rows(const uint8_t* W, const float* S, const uint16_t* X16, int64_t M, int64_t K, int64_t group, int64_t N,
          at::BFloat16* Y) {
  const int64_t tile_bytes = R * K * BITS / 8;
#ifdef TRTSPEC_DPBF16
  const __m512i lut_lo = table(BITS == 4 ? int4_value : low_nibble), lut_hi = table(high_nibble);
  at::parallel_for(0, N / R, 8, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      in_fours(0, M, [&](auto mc, int64_t m) {
        tile<decltype(mc)::value, BITS>(W + t * tile_bytes, S, X16 + m * K, K, group, t * R, N, Y + m * N, lut_lo,
                                        lut_hi);
      });
  });
#else
  alignas(64) float t16[16];
  for (int i = 0; i < 16; ++i) t16[i] = int4_value(i);
  const __m512 lut = _mm512_load_ps(t16);
  // the activations in fp32 (exact), in a buffer the calling thread keeps: no allocation per matmul
  thread_local std::vector<float> Xf;
  if (int64_t(Xf.size()) < M * K) Xf.resize(M * K);
  for (int64_t i = 0; i < M * K; i += 16) _mm512_storeu_ps(Xf.data() + i, load16(X16 + i));
  const float* X = Xf.data();
  // Up to UNPACK - 1 rows (decode, verify): 4 token rows at a time (INT8: up to 6, in_runs) with the
  // weights unpacked in registers (tile). From UNPACK rows (a prefill): each tile unpacked once (unpack_tile,
  // tile_unpacked), the token rows in blocks whose fp32 activations stay in L2 (<= 1 MiB, a multiple
  // of 4 rows), each block against every tile of this thread's share. Measured on a 2-core Xeon: 5-16
  // rows ran slower unpacked (the tile's stores and loads cost more than the unpacking they save), 32
  // and more faster.
  constexpr int64_t UNPACK = 32;
  if (M < UNPACK) {
    at::parallel_for(0, N / R, 8, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        in_runs<BITS>(K, 0, M, [&](auto mc, int64_t m) {
          tile<decltype(mc)::value, BITS>(W + t * tile_bytes, S, X + m * K, K, group, t * R, N, Y + m * N, lut);
        });
    });
    return;
  }
  const int64_t block = std::max<int64_t>(4, ((1 << 20) / (4 * K)) / 4 * 4);
  at::parallel_for(0, N / R, 8, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> Wf;  // one tile in fp32, [R, K]
    if (int64_t(Wf.size()) < R * K) Wf.resize(R * K);
    for (int64_t m0 = 0; m0 < M; m0 += block)
      for (int64_t t = begin; t < end; ++t) {
        unpack_tile<BITS>(W + t * tile_bytes, S, K, group, t * R, lut, Wf.data());
        in_fours(m0, std::min(M, m0 + block), [&](auto mc, int64_t m) {
          tile_unpacked<decltype(mc)::value>(Wf.data(), X + m * K, K, t * R, N, Y + m * N);
        });
      }
  });
#endif
}

// raw matmul: X bf16 [M, K] -> Y bf16 [M, N]
void matmul(const uint16_t* X, int64_t M, int64_t K, const torch::Tensor& packed, const torch::Tensor& scales,
            int64_t group, int64_t bits, at::BFloat16* Y) {
  const int64_t N = packed.size(0) * R;
  const auto* W = packed.data_ptr<uint8_t>();
  const auto* S = scales.data_ptr<float>();
  if (bits == 4) rows<4>(W, S, X, M, K, group, N, Y);
  else rows<8>(W, S, X, M, K, group, N, Y);
}

void check_mm(const torch::Tensor& packed, const torch::Tensor& scales, int64_t K, int64_t group, int64_t bits) {
  TORCH_CHECK(bits == 4 || bits == 8, "bits: 4 or 8");
  TORCH_CHECK(packed.scalar_type() == at::kByte && scales.scalar_type() == at::kFloat, "packed uint8, scales fp32");
  TORCH_CHECK(packed.is_contiguous() && scales.is_contiguous(), "packed and scales contiguous");
  const int64_t N = packed.size(0) * R;
  TORCH_CHECK(packed.dim() == 2 && packed.size(1) * 8 == R * K * bits && group % 64 == 0 && K % group == 0,
              "shapes: packed [N/4, 4*K*bits/8], K a multiple of group, group of 64");
  TORCH_CHECK(scales.dim() == 2 && scales.size(0) == N && scales.size(1) == K / group, "scales [N, K/group]");
}

// ---- one decoder layer's decode/verify step (layer_step): bf16 in and out, fp32 inside ops ----

// e^x, fp32, 16 lanes (Cephes' expf: range reduction by ln 2 in two parts, degree-6 polynomial, ~1 ulp)
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)), _mm512_set1_ps(-87.3365447504f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 q = _mm512_set1_ps(1.9875691500e-4f);
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.3981999507e-3f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(8.3334519073e-3f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(4.1665795894e-2f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.6666665459e-1f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(q, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

// RMSNorm as the model's bf16 path computes it: normalise in fp32, round, scale by the bf16 weight, round
void rms_norm(const uint16_t* X, const uint16_t* Wn, uint16_t* Y, int64_t M, int64_t Hd, float eps) {
  for (int64_t m = 0; m < M; ++m) {
    const uint16_t* x = X + m * Hd;
    __m512 ss = _mm512_setzero_ps();
    for (int64_t i = 0; i < Hd; i += 16) {
      const __m512 v = load16(x + i);
      ss = _mm512_fmadd_ps(v, v, ss);
    }
    const __m512 r = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(ss) / float(Hd) + eps));
    for (int64_t i = 0; i < Hd; i += 16)
      store16(Y + m * Hd + i, _mm512_mul_ps(load16(Wn + i), rnd(_mm512_mul_ps(load16(x + i), r))));
  }
}

// y = round(a + b), elementwise over n (a multiple of 16)
void add_into(const uint16_t* A, const uint16_t* Bv, uint16_t* Y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) store16(Y + i, _mm512_add_ps(load16(A + i), load16(Bv + i)));
}

// causal attention of one token row's query heads over one KV head's first n cached keys, in fp32:
// scores, softmax and the weighted sum of values; the same instructions whatever else is in the pass
void attend(const uint16_t* q, int64_t G, int64_t D, const uint16_t* keys, const uint16_t* values, int64_t n,
            float scale, uint16_t* out, float* sc) {
  for (int64_t j = 0; j < G; ++j) {
    const uint16_t* qj = q + j * D;
    float* s = sc + j * n;
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t* k = keys + i * D;
      __m512 acc = _mm512_setzero_ps();
      for (int64_t d = 0; d < D; d += 16) acc = _mm512_fmadd_ps(load16(qj + d), load16(k + d), acc);
      s[i] = _mm512_reduce_add_ps(acc) * scale;
    }
    float mx = s[0];
    for (int64_t i = 1; i < n; ++i) mx = std::max(mx, s[i]);
    const __m512 vmx = _mm512_set1_ps(mx);
    __m512 sum = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + i), vmx));
      _mm512_storeu_ps(s + i, e);
      sum = _mm512_add_ps(sum, e);
    }
    if (i < n) {
      const __mmask16 k = __mmask16((1u << (n - i)) - 1);
      const __m512 e = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + i), vmx)));
      _mm512_mask_storeu_ps(s + i, k, e);
      sum = _mm512_add_ps(sum, e);
    }
    const float inv = 1.0f / _mm512_reduce_add_ps(sum);
    for (int64_t d0 = 0; d0 < D; d0 += 64) {  // up to 4 accumulators of 16 lanes at a time
      const int64_t w = std::min<int64_t>(64, D - d0) / 16;
      __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      for (int64_t i2 = 0; i2 < n; ++i2) {
        const __m512 p = _mm512_set1_ps(s[i2] * inv);
        const uint16_t* v = values + i2 * D + d0;
        for (int64_t c = 0; c < w; ++c) acc[c] = _mm512_fmadd_ps(p, load16(v + 16 * c), acc[c]);
      }
      for (int64_t c = 0; c < w; ++c) store16(out + j * D + d0 + 16 * c, acc[c]);
    }
  }
}

}  // namespace

// x: bf16 [M, K]; packed: pack(q, bits); scales: fp32 [N, K/group] (INT8: group = K, one per row).
// Returns bf16 [M, N] (the fp32 sums rounded to nearest even, as torch's kernels return them).
torch::Tensor mm(torch::Tensor x, torch::Tensor packed, torch::Tensor scales, int64_t group, int64_t bits) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_cpu(), "x: a 2-D bf16 CPU tensor");
  auto xc = x.contiguous(), pc = packed.contiguous(), sc = scales.contiguous();
  check_mm(pc, sc, x.size(1), group, bits);
  const int64_t M = x.size(0), N = pc.size(0) * R;
  auto y = torch::empty({M, N}, x.options());
  matmul(reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>()), M, x.size(1), pc, sc, group, bits,
         y.data_ptr<at::BFloat16>());
  return y;
}

// One decoder layer (Llama/Qwen2, the torch runtime's model.DecoderLayer) for a decode or verify
// pass: x bf16 [B*T, Hd], row b's T tokens at positions starts[b]..starts[b]+T-1 of cache row rows[b].
// input RMSNorm -> q|k|v (+ bias) -> RoPE -> K/V written to the cache -> attention over each query's
// own keys (fp32) -> o -> residual -> RMSNorm -> gate|up -> SiLU(gate) * up -> down -> residual.
// Every projection runs on the kernel above; every op rounds to bf16 where the model's bf16 torch
// ops do. One call instead of ~55 torch ops a layer: at decode sizes their dispatch is 20-30 % of
// a pass. Every token row gets the same instructions whatever else shares the pass (batch-invariant).
// w: input_layernorm, qkv packed, qkv scales, qkv bias (empty: none), o packed, o scales,
//    post_attention_layernorm, gate|up packed, gate|up scales, down packed, down scales
// meta: H, Hkv, D, then (group, bits) of qkv, o, gate|up, down
//
// layer_step_in: the same layer with its attention input given (xin, bf16 [M, Kin]) instead of
// input_layernorm(x): an EAGLE-3 head's layer, whose q|k|v read concat(input_layernorm(embedding),
// hidden_norm(feature)) (2*Hd wide) while the residual is the feature x. w[0] is then unused.
torch::Tensor layer_step_impl(const torch::Tensor& x, const torch::Tensor* xin, std::vector<torch::Tensor> w,
                              std::vector<int64_t> meta, double eps, torch::Tensor k_cache, torch::Tensor v_cache,
                              std::vector<int64_t> cache_rows, std::vector<int64_t> starts, int64_t T,
                              torch::Tensor cos, torch::Tensor sin) {
  TORCH_CHECK(w.size() == 11 && meta.size() == 11, "layer_step: 11 weights and 11 meta values");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(), "x: contiguous bf16 [M, Hd]");
  const int64_t M = x.size(0), Hd = x.size(1), H = meta[0], Hkv = meta[1], D = meta[2], G = H / Hkv;
  if (xin)
    TORCH_CHECK(xin->dim() == 2 && xin->scalar_type() == at::kBFloat16 && xin->is_contiguous() && xin->size(0) == M &&
                xin->size(1) % 64 == 0, "xin: contiguous bf16 [M, Kin], Kin a multiple of 64");
  const int64_t Kin = xin ? xin->size(1) : Hd;
  const int64_t Bn = int64_t(cache_rows.size());
  TORCH_CHECK(Bn == int64_t(starts.size()) && Bn * T == M, "rows/starts: one per row of T tokens");
  TORCH_CHECK(Hd % 64 == 0 && D % 16 == 0 && D <= 512 && H % Hkv == 0,
              "hidden a multiple of 64, head_dim a multiple of 16 up to 512");
  for (const auto& c : {k_cache, v_cache})
    TORCH_CHECK(c.scalar_type() == at::kBFloat16 && c.is_contiguous() && c.dim() == 4 && c.size(1) == Hkv &&
                c.size(3) == D, "cache: contiguous bf16 [rows, Hkv, L, D]");
  TORCH_CHECK(cos.scalar_type() == at::kBFloat16 && sin.scalar_type() == at::kBFloat16 && cos.is_contiguous() &&
              sin.is_contiguous() && cos.size(1) == D, "rope tables: contiguous bf16 [n, D]");
  const int64_t L = k_cache.size(2), NQKV = (H + 2 * Hkv) * D;
  for (int64_t b = 0; b < Bn; ++b)
    TORCH_CHECK(cache_rows[b] >= 0 && cache_rows[b] < k_cache.size(0) && starts[b] >= 0 && starts[b] + T <= L &&
                starts[b] + T <= cos.size(0), "a row or position outside the cache or rope table");
  auto bf = [](const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); };
  auto bfp = [](uint16_t* p) { return reinterpret_cast<at::BFloat16*>(p); };
  check_mm(w[1], w[2], Kin, meta[3], meta[4]);
  check_mm(w[4], w[5], H * D, meta[5], meta[6]);
  check_mm(w[7], w[8], Hd, meta[7], meta[8]);
  const int64_t I2 = w[7].size(0) * R, I = I2 / 2;
  check_mm(w[9], w[10], I, meta[9], meta[10]);
  TORCH_CHECK(w[1].size(0) * R == NQKV && w[4].size(0) * R == Hd && w[9].size(0) * R == Hd && I % 64 == 0,
              "projection shapes do not match H, Hkv, D and hidden");
  for (int i : {0, 6}) TORCH_CHECK(w[i].scalar_type() == at::kBFloat16 && w[i].numel() == Hd, "norm weights: bf16 [Hd]");
  const bool bias = w[3].numel() > 0;
  TORCH_CHECK(!bias || (w[3].scalar_type() == at::kBFloat16 && w[3].numel() == NQKV), "qkv bias: bf16 [(H+2Hkv)D]");

  const uint16_t* X = bf(x);
  // scratch, kept per calling thread and grown as needed: no allocation (and no page faults) per call
  thread_local std::vector<uint16_t> scratch;
  const int64_t nh = M * std::max(Hd, I), nqkv = M * NQKV, natt = M * H * D, nx1 = M * Hd;
  if (int64_t(scratch.size()) < nh + nqkv + natt + nx1 + M * std::max(Hd, I2))
    scratch.resize(nh + nqkv + natt + nx1 + M * std::max(Hd, I2));
  struct Span { uint16_t* p; uint16_t* data() const { return p; } };
  const Span h{scratch.data()}, qkv{h.p + nh}, att{qkv.p + nqkv}, x1{att.p + natt}, tmp{x1.p + nx1};
  auto out = torch::empty_like(x);

  if (xin) {
    matmul(bf(*xin), M, Kin, w[1], w[2], meta[3], meta[4], bfp(qkv.data()));
  } else {
    rms_norm(X, bf(w[0]), h.data(), M, Hd, float(eps));
    matmul(h.data(), M, Hd, w[1], w[2], meta[3], meta[4], bfp(qkv.data()));
  }
  uint16_t* kc = bf(k_cache);
  uint16_t* vc = bf(v_cache);
  const uint16_t *C = bf(cos), *S = bf(sin);
  for (int64_t m = 0; m < M; ++m) {
    uint16_t* r = qkv.data() + m * NQKV;
    if (bias) add_into(r, bf(w[3]), r, NQKV);
    const int64_t b = m / T, pos = starts[b] + m % T;
    const uint16_t *c = C + pos * D, *s = S + pos * D;
    for (int64_t head = 0; head < H + Hkv; ++head) {  // RoPE on q and k: round(round(x cos) + round(rot(x) sin))
      uint16_t* v = r + head * D;
      alignas(64) uint16_t rot[512];  // D <= 512: checked above
      for (int64_t d = 0; d < D / 2; ++d) {
        rot[d] = v[d + D / 2] ^ 0x8000;  // -x: flip the sign bit (exact)
        rot[d + D / 2] = v[d];
      }
      for (int64_t d = 0; d < D; d += 16)
        store16(v + d, _mm512_add_ps(rnd(_mm512_mul_ps(load16(v + d), load16(c + d))),
                                     rnd(_mm512_mul_ps(load16(rot + d), load16(s + d)))));
    }
    for (int64_t g = 0; g < Hkv; ++g) {
      const int64_t at_ = ((cache_rows[b] * Hkv + g) * L + pos) * D;
      std::memcpy(kc + at_, r + (H + g) * D, D * 2);
      std::memcpy(vc + at_, r + (H + Hkv + g) * D, D * 2);
    }
  }
  const float scale = float(1.0 / std::sqrt(double(D)));
  at::parallel_for(0, M * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> sc;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t m = task / Hkv, g = task % Hkv, b = m / T, n = starts[b] + m % T + 1;
      sc.resize(G * n);
      const int64_t base = (cache_rows[b] * Hkv + g) * L * D;
      attend(qkv.data() + m * NQKV + g * G * D, G, D, kc + base, vc + base, n, scale,
             att.data() + m * H * D + g * G * D, sc.data());
    }
  });
  matmul(att.data(), M, H * D, w[4], w[5], meta[5], meta[6], bfp(tmp.data()));
  add_into(X, tmp.data(), x1.data(), M * Hd);
  rms_norm(x1.data(), bf(w[6]), h.data(), M, Hd, float(eps));
  matmul(h.data(), M, Hd, w[7], w[8], meta[7], meta[8], bfp(tmp.data()));
  for (int64_t m = 0; m < M; ++m)  // SiLU(gate) * up, each rounded as torch's bf16 ops round
    for (int64_t i = 0; i < I; i += 16) {
      const __m512 g = load16(tmp.data() + m * I2 + i), u = load16(tmp.data() + m * I2 + I + i);
      const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
      store16(h.data() + m * I + i, _mm512_mul_ps(rnd(silu), u));
    }
  matmul(h.data(), M, I, w[9], w[10], meta[9], meta[10], bfp(tmp.data()));
  add_into(x1.data(), tmp.data(), bf(out), M * Hd);
  return out;
}

torch::Tensor layer_step(torch::Tensor x, std::vector<torch::Tensor> w, std::vector<int64_t> meta, double eps,
                         torch::Tensor k_cache, torch::Tensor v_cache, std::vector<int64_t> cache_rows,
                         std::vector<int64_t> starts, int64_t T, torch::Tensor cos, torch::Tensor sin) {
  return layer_step_impl(x, nullptr, w, meta, eps, k_cache, v_cache, cache_rows, starts, T, cos, sin);
}

torch::Tensor layer_step_in(torch::Tensor x, torch::Tensor xin, std::vector<torch::Tensor> w,
                            std::vector<int64_t> meta, double eps, torch::Tensor k_cache, torch::Tensor v_cache,
                            std::vector<int64_t> cache_rows, std::vector<int64_t> starts, int64_t T,
                            torch::Tensor cos, torch::Tensor sin) {
  return layer_step_impl(x, &xin, w, meta, eps, k_cache, v_cache, cache_rows, starts, T, cos, sin);
}

// q: int8 [N, K] (INT4 values in [-8, 7] for bits = 4) -> uint8 [N/4, 4*K*bits/8], the layout above.
torch::Tensor pack(torch::Tensor q, int64_t bits) {
  TORCH_CHECK(bits == 4 || bits == 8, "bits: 4 or 8");
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kChar && q.size(1) % 64 == 0 && q.size(0) % R == 0,
              "q: int8 [N, K], N a multiple of 4, K of 64");
  auto qc = q.contiguous();
  const int64_t N = qc.size(0), K = qc.size(1), B = bits == 4 ? 32 : 64;
  auto out = torch::empty({N / R, R * K * bits / 8}, qc.options().dtype(at::kByte));
  const int8_t* Q = qc.data_ptr<int8_t>();
  uint8_t* O = out.data_ptr<uint8_t>();
  at::parallel_for(0, N, 64, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n)
      for (int64_t k0 = 0; k0 < K; k0 += 64) {
        uint8_t* o = O + (n / R) * R * (K * bits / 8) + (k0 / 64) * R * B + (n % R) * B;
        const int8_t* q = Q + n * K + k0;
        if (bits == 4)
          for (int j = 0; j < 32; ++j) o[j] = uint8_t(((q[j] + 8) & 15) | (((q[32 + j] + 8) & 15) << 4));
        else
          for (int j = 0; j < 64; ++j) o[j] = uint8_t(q[j]);
      }
  });
  return out;
}

// the inverse of pack: uint8 [N/4, 4*K*bits/8] -> int8 [N, K] (the layers keep only the packed copy)
torch::Tensor unpack(torch::Tensor packed, int64_t bits, int64_t K) {
  TORCH_CHECK(bits == 4 || bits == 8, "bits: 4 or 8");
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte && K % 64 == 0 &&
              packed.size(1) * 8 == R * K * bits, "packed: uint8 [N/4, 4*K*bits/8]");
  auto pc = packed.contiguous();
  const int64_t N = pc.size(0) * R, B = bits == 4 ? 32 : 64;
  auto out = torch::empty({N, K}, pc.options().dtype(at::kChar));
  const uint8_t* P = pc.data_ptr<uint8_t>();
  int8_t* Q = out.data_ptr<int8_t>();
  at::parallel_for(0, N, 64, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n)
      for (int64_t k0 = 0; k0 < K; k0 += 64) {
        const uint8_t* o = P + (n / R) * R * (K * bits / 8) + (k0 / 64) * R * B + (n % R) * B;
        int8_t* q = Q + n * K + k0;
        if (bits == 4)
          for (int j = 0; j < 32; ++j) {
            q[j] = int8_t((o[j] & 15) - 8);
            q[32 + j] = int8_t((o[j] >> 4) - 8);
          }
        else
          for (int j = 0; j < 64; ++j) q[j] = int8_t(o[j]);
      }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("mm", &mm, "weight-only matmul, INT4 (blocks of group) or INT8 (per row), bf16 activations");
  m.def("pack", &pack, "pack INT4 or INT8 values for mm");
  m.def("unpack", &unpack, "the INT4 or INT8 values of a packed weight");
  m.def("layer_step", &layer_step, "one decoder layer's decode/verify step on the weight-only kernels");
  m.def("layer_step_in", &layer_step_in, "layer_step with the attention input given (an EAGLE-3 head's layer)");
}
