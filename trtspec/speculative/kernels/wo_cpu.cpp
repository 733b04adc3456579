// trtspec's CPU weight-only matmuls for AVX512-BF16 CPUs (AMD Zen 4+, Intel Sapphire Rapids+):
//   INT4 (W4A16): symmetric INT4 weights in blocks of `group` input channels, one scale per block
//                 (ModelOpt int4_wo / int4_awq), bf16 activations;
//   INT8 (W8A16): symmetric INT8 weights, one scale per output channel (ModelOpt int8_wo).
//
// Why not torch's aten::_weight_int4pack_mm_for_cpu / _weight_int8pack_mm: they turn each weight
// into fp32 and multiply with FMAs, which makes a decode step compute-bound on a small CPU (2 cores:
// ~15-18 GB/s of weights against ~28 GB/s of memory bandwidth), and a verify pass over 3 tokens
// costs 1.5x a one-token step, which is most of what speculation has to win back.
// Here a table lookup (vpermw) turns 32 4-bit fields into 32 exact bf16 values in one instruction,
// and one vdpbf16ps multiplies them with 32 bf16 activations:
//   INT4: the field is the weight (q + 8 -> q);
//   INT8: a weight is 16 * (its high nibble, signed) + (its low nibble), two lookups and two dot
//         products, each exact (bf16 holds every integer up to 256).
// A step then reads weights at close to memory speed, and a tile's weights, unpacked once, serve up
// to 4 token rows while they sit in cache.
//
// Batch invariance: every output y[m, n] is computed by the same instructions in the same order
// whatever the number of token rows M and whichever tile or thread holds it (16 fp32 lanes per
// block, scaled per block into 16 running lanes, one horizontal sum at the end), so a verify pass
// over K+1 tokens gives, bit for bit, what K+1 one-token steps give.
//
// Packed layout (pack): uint8 [N/4, K/64, 4, B] with B = 32 (INT4) or 64 (INT8) bytes: the 4
// output rows of a tile, 64 input channels at a time, so a tile's weights are one contiguous run.
//   INT4: byte j of a row's 32 holds q[k0+j] + 8 in its low nibble, q[k0+32+j] + 8 in its high one;
//   INT8: byte j of a row's 64 is q[k0+j] (two's complement).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cstdint>
#include <cstring>

namespace {

constexpr int R = 4;  // output rows per tile

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
      _mm_prefetch((const char*)(wb + 2048), _MM_HINT_T0);
      _mm_prefetch((const char*)(wb + 2048 + 64), _MM_HINT_T0);
      if constexpr (BITS == 8) {
        _mm_prefetch((const char*)(wb + 2048 + 128), _MM_HINT_T0);
        _mm_prefetch((const char*)(wb + 2048 + 192), _MM_HINT_T0);
      }
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

float int4_value(int u) { return float(u - 8); }       // INT4: the field is q + 8
float low_nibble(int u) { return float(u); }           // INT8: the low nibble, unsigned
float high_nibble(int u) { return float(16 * (u < 8 ? u : u - 16)); }  // INT8: 16 x the high nibble, signed

// all M token rows; each tile's weights come from memory once, token rows go four at a time (the
// tile's bytes stay in cache for the next four), every row gets the same instructions
template <int BITS>
void rows(const uint8_t* W, const float* S, const uint16_t* X, int64_t M, int64_t K, int64_t group, int64_t N,
          at::BFloat16* Y) {
  const __m512i lut_lo = table(BITS == 4 ? int4_value : low_nibble), lut_hi = table(high_nibble);
  const int64_t tile_bytes = R * K * BITS / 8;
  at::parallel_for(0, N / R, 8, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const uint8_t* Wt = W + t * tile_bytes;
      for (int64_t m = 0; m < M; m += 4) {
        const uint16_t* Xm = X + m * K;
        at::BFloat16* Ym = Y + m * N;
        switch (std::min<int64_t>(4, M - m)) {
          case 1: tile<1, BITS>(Wt, S, Xm, K, group, t * R, N, Ym, lut_lo, lut_hi); break;
          case 2: tile<2, BITS>(Wt, S, Xm, K, group, t * R, N, Ym, lut_lo, lut_hi); break;
          case 3: tile<3, BITS>(Wt, S, Xm, K, group, t * R, N, Ym, lut_lo, lut_hi); break;
          default: tile<4, BITS>(Wt, S, Xm, K, group, t * R, N, Ym, lut_lo, lut_hi); break;
        }
      }
    }
  });
}

}  // namespace

// x: bf16 [M, K]; packed: pack(q, bits); scales: fp32 [N, K/group] (INT8: group = K, one per row).
// Returns bf16 [M, N] (the fp32 sums rounded to nearest even, as torch's kernels return them).
torch::Tensor mm(torch::Tensor x, torch::Tensor packed, torch::Tensor scales, int64_t group, int64_t bits) {
  TORCH_CHECK(bits == 4 || bits == 8, "bits: 4 or 8");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_cpu(), "x: a 2-D bf16 CPU tensor");
  TORCH_CHECK(packed.scalar_type() == at::kByte && scales.scalar_type() == at::kFloat, "packed uint8, scales fp32");
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0) * R;
  TORCH_CHECK(packed.dim() == 2 && packed.size(1) * 8 == R * K * bits && group % 64 == 0 && K % group == 0,
              "shapes: packed [N/4, 4*K*bits/8], K a multiple of group, group of 64");
  TORCH_CHECK(scales.dim() == 2 && scales.size(0) == N && scales.size(1) == K / group, "scales [N, K/group]");
  auto xc = x.contiguous(), pc = packed.contiguous(), sc = scales.contiguous();
  auto y = torch::empty({M, N}, x.options());
  const auto* W = pc.data_ptr<uint8_t>();
  const auto* S = sc.data_ptr<float>();
  const auto* X = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  auto* Y = y.data_ptr<at::BFloat16>();
  if (bits == 4) rows<4>(W, S, X, M, K, group, N, Y);
  else rows<8>(W, S, X, M, K, group, N, Y);
  return y;
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("mm", &mm, "weight-only matmul, INT4 (blocks of group) or INT8 (per row), bf16 activations");
  m.def("pack", &pack, "pack INT4 or INT8 values for mm");
}
