// PROTOTYPE, not used by trtspec: an INT4 weight-only matmul on AMX-BF16 tiles (tdpbf16ps), measured
// by scripts/bench_amx_verify.py against trtspec's AVX512-BF16 kernel (wo_cpu.cpp) on the Qwen pair's
// shapes. Why: on 2 cores the AVX512-BF16 kernel's cost grows with the token rows (each row is its
// own dot products), so a verify pass over k+1 tokens costs ~(k+1)/1.4 decode steps; an AMX tile
// multiplies 16 weight rows by up to 16 token rows in one instruction, so the cost is nearly flat
// up to 16 rows (issue 31 item 3: a verify pass costing about one read of the weights).
//
// Layout (repacked once at load, pack_amx): per 32 output rows as two 16-row blocks, per 128-channel
// block, per row 64 bytes = 32 16-bit lanes, lane i holding the nibbles (q + 8) of channels
// 32j + i at bits 4j .. 4j + 3 (j = 0..3). Unpacking is a shift and one ternary-logic op per 32
// weights (bf16 bits 0x4300 | u = 128 + u, exact); the offset 136 is taken back per token and block
// from the activations' block sums. The activations go in VNNI order, 16 token columns (columns
// >= M are never read back). Each token's output depends on its own activations only: the same
// bits for any M (checked by the benchmark). M <= 16, N a multiple of 32, K of 128.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstring>
#include <vector>

namespace {
struct alignas(64) TileCfg { uint8_t palette; uint8_t start; uint8_t res[14]; uint16_t colsb[16]; uint8_t rows[16]; };
// Linux hands out the tile state only on request (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA)
bool amx_permitted() { static bool ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0; return ok; }
}  // namespace

torch::Tensor pack_amx(torch::Tensor q) {  // q int8 [N, K] in -8..7 -> uint8 [N/16, K/128, 16, 64]
  const int64_t N = q.size(0), K = q.size(1);
  auto out = torch::empty({N / 16, K / 128, 16, 64}, torch::kUInt8);
  const int8_t* Q = q.data_ptr<int8_t>();
  uint8_t* O = out.data_ptr<uint8_t>();
  for (int64_t b = 0; b < N / 16; ++b)
    for (int64_t g = 0; g < K / 128; ++g)
      for (int r = 0; r < 16; ++r)
        for (int i = 0; i < 32; ++i) {
          uint16_t v = 0;
          for (int j = 0; j < 4; ++j) v |= uint16_t((Q[(b * 16 + r) * K + g * 128 + 32 * j + i] + 8) & 15) << (4 * j);
          uint8_t* o = O + (((b * (K / 128) + g) * 16 + r) * 64) + 2 * i;
          o[0] = v & 255; o[1] = v >> 8;
        }
  return out;
}

torch::Tensor mm_amx(torch::Tensor x, torch::Tensor packed, torch::Tensor scales) {
  TORCH_CHECK(amx_permitted(), "AMX not permitted");
  const int64_t M = x.size(0), K = x.size(1), N = scales.size(0), groups = K / 128;
  TORCH_CHECK(M >= 1 && M <= 16 && K % 128 == 0 && N % 32 == 0, "M 1..16, K a multiple of 128, N of 32");
  auto y = torch::empty({M, N}, x.options());
  const uint16_t* X = (const uint16_t*)x.data_ptr<at::BFloat16>();
  const uint8_t* W = packed.data_ptr<uint8_t>();
  const float* S = scales.data_ptr<float>();
  at::BFloat16* Y = y.data_ptr<at::BFloat16>();
  const int64_t chunks = K / 32;
  thread_local std::vector<uint16_t> Bv; if (int64_t(Bv.size()) < chunks * 512) Bv.resize(chunks * 512);  // columns >= M: never read back   // VNNI: [chunk][kpair][token 0..15][2]
  thread_local std::vector<float> sx; sx.assign(groups * 16, 0.f);              // 136 x the block sum of each token's activations
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < chunks; ++c)
      for (int kp = 0; kp < 16; ++kp)
        for (int j = 0; j < 2; ++j) {
          const uint16_t b = X[m * K + 32 * c + 2 * kp + j];
          Bv[((c * 16 + kp) * 16 + m) * 2 + j] = b;
          uint32_t f = uint32_t(b) << 16; float v; std::memcpy(&v, &f, 4);
          sx[(c / 4) * 16 + m] += 136.f * v;
        }
  const uint16_t* Bp = Bv.data(); const float* sxp = sx.data();
  // two 16-row blocks at a time: two independent accumulator tiles share each activation tile
  at::parallel_for(0, N / 32, 1, [&](int64_t begin, int64_t end) {
    TileCfg c{}; c.palette = 1;
    for (int t = 0; t < 8; ++t) { c.rows[t] = 16; c.colsb[t] = 64; }
    _tile_loadconfig(&c);
    alignas(64) uint16_t A[2][4][16][32];  // [block][nibble][row][32]
    alignas(64) float C[2][16][16];
    const __m512i mask = _mm512_set1_epi16(0x000F), bias = _mm512_set1_epi16(0x4300);
    for (int64_t pair = begin; pair < end; ++pair) {
      __m512 tot[2][16];
      for (int b = 0; b < 2; ++b) for (int r = 0; r < 16; ++r) tot[b][r] = _mm512_setzero_ps();
      for (int64_t g = 0; g < groups; ++g) {
        _tile_zero(0);
        _tile_zero(1);
        for (int h = 0; h < 2; ++h) {
          for (int b = 0; b < 2; ++b) {
            const uint8_t* wg = W + ((2 * pair + b) * groups + g) * 1024;
            for (int r = 0; r < 16; ++r) {
              _mm_prefetch((const char*)(wg + 1024 + r * 64), _MM_HINT_T0);  // the next block of 128 channels (6 ahead measured no faster)
              const __m512i v = _mm512_load_si512(wg + r * 64);
              _mm512_store_si512(A[b][2 * h][r], _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 8 * h), mask, bias, 0xEA));
              _mm512_store_si512(A[b][2 * h + 1][r], _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 8 * h + 4), mask, bias, 0xEA));
            }
          }
          _tile_loadd(2, A[0][2 * h], 64);
          _tile_loadd(3, A[1][2 * h], 64);
          _tile_loadd(4, Bp + (g * 4 + 2 * h) * 512, 64);
          _tile_loadd(5, A[0][2 * h + 1], 64);
          _tile_loadd(6, A[1][2 * h + 1], 64);
          _tile_loadd(7, Bp + (g * 4 + 2 * h + 1) * 512, 64);
          _tile_dpbf16ps(0, 2, 4);
          _tile_dpbf16ps(1, 3, 4);
          _tile_dpbf16ps(0, 5, 7);
          _tile_dpbf16ps(1, 6, 7);
        }
        _tile_stored(0, C[0], 64);
        _tile_stored(1, C[1], 64);
        const __m512 off = _mm512_loadu_ps(sxp + g * 16);
        for (int b = 0; b < 2; ++b)
          for (int r = 0; r < 16; ++r)
            tot[b][r] = _mm512_fmadd_ps(_mm512_sub_ps(_mm512_load_ps(C[b][r]), off),
                                        _mm512_set1_ps(S[((2 * pair + b) * 16 + r) * groups + g]), tot[b][r]);
      }
      for (int b = 0; b < 2; ++b)
        for (int r = 0; r < 16; ++r) {
          alignas(64) float o[16];
          _mm512_store_ps(o, tot[b][r]);
          for (int64_t m = 0; m < M; ++m) Y[m * N + (2 * pair + b) * 16 + r] = at::BFloat16(o[m]);
        }
    }
    _tile_release();
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("mm_amx", &mm_amx); m.def("pack_amx", &pack_amx); }
