// Paged decode attention on the CPU: one new query token per request, its keys and values
// read in place from the KV pool through req_to_token (no gather, no copy of K/V).
//
//   q            [B, H, D]        the step's queries (any float dtype)
//   k_buf, v_buf [S + 1, KVH, D]  one layer of token_to_kv_pool (float or bf16)
//   req_to_token [R, C] int32     KV slot of position p of row r
//   rows, lens   [B] int64        each request's req_to_token row and sequence length
//   out          [B, H, D]        q's dtype
//   window       a query at position L - 1 sees positions (L - 1 - window, L - 1]; 0 = all
//   k, v, loc    optional: the step's own K/V [B, KVH, D] (rows may be strided), written
//                into k_buf/v_buf at slot loc[b] (int64) before attending (the pool's
//                set_kv fused in: each task writes the row of its own (request, KV head),
//                the only one it then reads at position L - 1, so no task reads a row
//                another task writes)
//   kv_first     write every row of k/v before any task attends (one serial pass): for
//                rows that read each other's K/V, as a speculative verify's rows of one
//                request do (row j sees the drafts of rows 0..j-1)
//
// One task per (request, KV head): the G = H / KVH query heads of the group share each K
// and V row (GQA without repeating K/V). Tasks are spread over torch's threads. In the
// float32 block kernel a (request, KV head) with more than kSplitPositions visible
// positions is split into chunks of that many, each a task, their softmax states merged in
// order afterwards (flash-decoding): one long request keeps every thread busy. The split
// depends on the request's own length only, so a row's result is the same in any batch. Which
// kernel: bf16 queries and KV take the AMX kernel (decode_amx.h) where AMX-BF16 runs, with
// head_dim 64 or 128 for groups of 1-4, 6, 7 and 8 (MHA; Qwen3, Gemma 2; SmolLM2, Llama
// 3.2 3B; Llama 3, Mistral; Qwen2.5) and 256 for groups of 1, 2, 4 and 8 (Gemma 2, 3),
// else, head_dim 64 or 128 in groups of 3 and 4, the bf16 dot-product kernel
// (decode_dpbf16.h) where AVX512-BF16 does: both multiply bf16 and round the
// probabilities to bf16 for P V, as flash attention does. Otherwise float32
// and bf16 KV with a head_dim that is a multiple of 2 * kLanes (simd.h: 16 lanes with
// AVX-512, else 8) take the block kernel (kLanes positions per step, scores in the lanes
// of one vector, online softmax, all float32); float16 KV and other head_dims the row
// kernel (one dot product per score, two-pass softmax).
#include "torch_api.h"
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "decode_amx.h"
#include "decode_dpbf16.h"
#include "decode_task.h"
#include "fast_exp.h"
#include "simd.h"

namespace {

using namespace decode_task;

template <typename T>
inline void to_float(const T* x, float* y, int64_t d) {
  for (int64_t i = 0; i < d; ++i) y[i] = static_cast<float>(x[i]);
}

// bf16 -> f32 is the 16 bits moved up: a loop the compiler vectorizes.
inline void to_float(const c10::BFloat16* x, float* y, int64_t d) {
  const uint16_t* u = reinterpret_cast<const uint16_t*>(x);
  uint32_t* o = reinterpret_cast<uint32_t*>(y);
  for (int64_t i = 0; i < d; ++i) o[i] = static_cast<uint32_t>(u[i]) << 16;
}

inline float dot(const float* __restrict a, const float* __restrict b, int64_t d) {
  float s = 0.f;
  for (int64_t i = 0; i < d; ++i) s += a[i] * b[i];
  return s;
}

// The row kernel asks for the row kAhead positions on while this one is computed.
constexpr int64_t kAhead = 8;

// In place: s[0, L) -> softmax(s).
inline void softmax(float* __restrict s, int64_t L) {
  float m = -INFINITY;
  for (int64_t l = 0; l < L; ++l) m = s[l] > m ? s[l] : m;
  float sum = 0.f;
  for (int64_t l = 0; l < L; ++l) {
    s[l] = exp_approx(s[l] - m);
    sum += s[l];
  }
  const float inv = L > 0 ? 1.f / sum : 0.f;
  for (int64_t l = 0; l < L; ++l) s[l] *= inv;
}

// Whether the block kernel below covers head_dim D (else decode_rows).
inline bool blocked(int64_t D) { return D > 0 && D % (2 * kLanes) == 0; }


// Scratch of one thread (reused across its tasks).
template <typename kv_t>
struct Scratch {
  std::vector<float> qf, acc, p;  // [G, D] scaled queries, [G, D] sums, [G, kLanes]
  std::vector<kv_t> zero;         // [D] zeros: the rows of a block's missing positions
  std::vector<float> m;           // [G] running max
  std::vector<vf> lsum;           // [G] softmax sums by lane
  std::vector<vf> part;           // [G, kLanes] a block's partial score vectors (GC > 0)
  Scratch(int64_t G, int64_t D)
      : qf(G * D), acc(G * D), p(G * kLanes), zero(D, static_cast<kv_t>(0.f)), m(G), lsum(G),
        part(G * kLanes) {}
};

// The online softmax's step for query head g over one block: its scores sc (lanes past
// the end masked by `valid`) raise the running max where they exceed it, what was
// accumulated under the old max is rescaled, and the block's probabilities go to s.p[g].
template <typename kv_t>
inline void softmax_step(Scratch<kv_t>& s, int64_t g, vf sc, vf valid, int64_t D, int64_t C) {
  sc = valid != 0.f ? sc : splat(-INFINITY);
  const float m_new = std::max(s.m[g], hmax(sc));
  const vf p = exp_vec(sc - m_new) * valid;
  if (m_new != s.m[g]) {
    const float corr = s.m[g] == -INFINITY ? 0.f : exp_approx(s.m[g] - m_new);
    s.lsum[g] *= corr;
    float* a = s.acc.data() + g * D;
    for (int64_t c = 0; c < C; ++c) store(a + c * kLanes, load(a + c * kLanes) * corr);
    s.m[g] = m_new;
  }
  s.lsum[g] += p;
  store(s.p.data() + g * kLanes, p);
}

// Positions per task of the block kernel (a multiple of every kLanes): longer requests
// are split (see the file's header). Shorter ones run as one task, as before the split.
constexpr int64_t kSplitPositions = 256;

// One task of the block kernel: request b's KV head h over visible positions [l0, l1);
// `part` >= 0: one chunk of a split (request, KV head), its state kept at that index.
struct BlockTask {
  int64_t b, h, l0, l1, part;
};

// A split (request, KV head): its chunks' states are parts [part0, part0 + count).
struct BlockSplit {
  int64_t b, h, part0, count;
};

// Every task of a call, in (request, KV head, chunk) order, and the splits among them.
inline std::vector<BlockTask> block_tasks(const int64_t* lens, int64_t B, int64_t KVH,
                                          int64_t window, std::vector<BlockSplit>* splits) {
  std::vector<BlockTask> tasks;
  int64_t parts = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t first = window > 0 ? std::max<int64_t>(0, lens[b] - window) : 0;
    const int64_t L = lens[b] - first;
    for (int64_t h = 0; h < KVH; ++h) {
      if (L <= kSplitPositions) {
        tasks.push_back({b, h, 0, L, -1});
        continue;
      }
      splits->push_back({b, h, parts, (L + kSplitPositions - 1) / kSplitPositions});
      for (int64_t l0 = 0; l0 < L; l0 += kSplitPositions)
        tasks.push_back({b, h, l0, std::min(L, l0 + kSplitPositions), parts++});
    }
  }
  return tasks;
}

// The split (request, KV head)s' outputs: their chunks' states merged in chunk order, each
// rescaled to the largest max (the online softmax's step, once per chunk).
template <typename q_t, typename kv_t>
void merge_parts(const std::vector<BlockSplit>& splits, const float* state,
                 int64_t part_floats, q_t* out, int64_t H, int64_t G, int64_t D) {
  at::parallel_for(0, static_cast<int64_t>(splits.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(D);
    for (int64_t f = begin; f < end; ++f) {
      const BlockSplit& sp = splits[f];
      const float* first = state + sp.part0 * part_floats;
      q_t* ob = out + (sp.b * H + sp.h * G) * D;
      for (int64_t g = 0; g < G; ++g) {
        float m = -INFINITY;
        for (int64_t c = 0; c < sp.count; ++c) m = std::max(m, first[c * part_floats + g]);
        float sum = 0.f;
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t c = 0; c < sp.count; ++c) {
          const float* st = first + c * part_floats;
          const float w = exp_approx(st[g] - m);
          sum += st[G + g] * w;
          const float* a = st + 2 * G + g * D;
          for (int64_t d = 0; d < D; ++d) acc[d] += a[d] * w;
        }
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        for (int64_t d = 0; d < D; ++d)
          ob[g * D + row_index<kv_t>(d)] = static_cast<q_t>(acc[d] * inv);
      }
    }
  });
}

// The block kernel: positions in blocks of kLanes. Per block and query head g the scores
// of the kLanes positions come out in the lanes of one vector (per position a partial
// vector of q * k over head_dim, kept in registers, then one transpose_sum for the
// block), the online softmax runs on that vector, and V is accumulated vectorized over
// head_dim in register tiles over the block's positions. Each K/V row is read (and
// converted, in registers) for the G query heads of its KV head from L1. A block's lane k is position
// order[k] of it (transpose_sum's order); positions past the end read a zero row and get
// probability 0. DC: head_dim known at compile time (64, 128), 0 = D. GC: the group size
// G known at compile time (3 and 4: SmolLM2's and Gemma 3's / Llama 3's), 0 = H / KVH:
// with it each K and V row is loaded and converted once for all G heads, the G heads'
// accumulators in registers (1.36x on bf16 KV at batch 32, 30 layers, on an AMX Xeon;
// with a runtime G the same loop order was slower than one head at a time).
template <typename q_t, typename kv_t, int DC, int GC = 0>
void decode_blocks(const q_t* q, kv_t* kb, kv_t* vb, const int32_t* r2t, int64_t r2t_stride,
                   const int64_t* rows, const int64_t* lens, q_t* out, int64_t B, int64_t H,
                   int64_t KVH, int64_t d_runtime, float scale, int64_t window, KvWrite<q_t> kv) {
  const int64_t D = DC ? DC : d_runtime;
  const int64_t C = D / kLanes;  // vectors per row
  const int64_t G = H / KVH;
  const vf order = transpose_order();
  int order_i[kLanes];
  for (int k = 0; k < kLanes; ++k) order_i[k] = static_cast<int>(order[k]);
  std::vector<BlockSplit> splits;
  const std::vector<BlockTask> tasks = block_tasks(lens, B, KVH, window, &splits);
  // A split chunk's state: per head its max, its sum of probabilities, its G x D sums.
  const int64_t part_floats = G * (D + 2);
  const int64_t parts = splits.empty() ? 0 : splits.back().part0 + splits.back().count;
  std::vector<float> part_state(parts * part_floats);
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    Scratch<kv_t> s(G, D);
    for (int64_t ti = begin; ti < end; ++ti) {
      const BlockTask& task = tasks[ti];
      const int64_t b = task.b, h = task.h;
      int64_t L;
      // The step's own K/V row is position L - 1: the task holding it writes it first.
      const int32_t* slots = visible_slots(b, r2t, r2t_stride, rows, lens, window, &L);
      if (kv.k != nullptr && task.l1 == L) write_kv(kv, b, h, KVH, D, kb, vb);
      // Queries and sums in load2's layout of kv_t (bf16: even, odd elements).
      const q_t* qb = q + (b * H + h * G) * D;
      for (int64_t i = 0; i < G * D; ++i)
        s.qf[i] = static_cast<float>(qb[i - i % D + row_index<kv_t>(i % D)]) * scale;
      std::fill(s.acc.begin(), s.acc.end(), 0.f);
      std::fill(s.m.begin(), s.m.end(), -INFINITY);
      std::fill(s.lsum.begin(), s.lsum.end(), vf{});
      const auto row = [&](kv_t* buf, int64_t l) {
        return buf + (static_cast<int64_t>(slots[l]) * KVH + h) * D;
      };
      const int64_t lend = task.l1;
      for (int64_t l0 = task.l0; l0 < lend; l0 += kLanes) {
        const int64_t n = std::min<int64_t>(kLanes, lend - l0);
        // The next block's rows are gathered through req_to_token (no hardware prefetch).
        for (int64_t l = l0 + kLanes; l < std::min<int64_t>(lend, l0 + 2 * kLanes); ++l) {
          prefetch_row(row(kb, l), D);
          prefetch_row(row(vb, l), D);
        }
        // The block's rows: K by position, V by lane (position order[k]).
        const kv_t* kr[kLanes];
        const kv_t* vr[kLanes];
        for (int j = 0; j < kLanes; ++j) kr[j] = j < n ? row(kb, l0 + j) : s.zero.data();
        for (int k = 0; k < kLanes; ++k) vr[k] = order_i[k] < n ? row(vb, l0 + order_i[k]) : s.zero.data();
        const vf valid = order < static_cast<float>(n) ? splat(1.f) : vf{};
        if constexpr (GC > 0) {
          // Scores: each K row is loaded (and converted) once for the GC query heads.
          for (int j = 0; j < kLanes; ++j) {
            vf a[GC];
            for (int g = 0; g < GC; ++g) a[g] = vf{};
            for (int64_t c = 0; c < C; c += 2) {
              vf x, y;
              load2(kr[j] + c * kLanes, x, y);
              for (int g = 0; g < GC; ++g) {
                const float* qg = s.qf.data() + g * D + c * kLanes;
                a[g] += load(qg) * x + load(qg + kLanes) * y;
              }
            }
            for (int g = 0; g < GC; ++g) s.part[g * kLanes + j] = a[g];
          }
          for (int g = 0; g < GC; ++g)
            softmax_step(s, g, transpose_sum(s.part.data() + g * kLanes), valid, D, C);
          // V: each V row loaded once for the GC heads; GC x kTileV accumulators in registers
          // (about 24 of AVX-512's 32 vector registers, 12 of AVX2's 16).
          constexpr int64_t kRegs = kLanes >= 16 ? 24 : 12;
          constexpr int64_t kTileV = std::max<int64_t>(2, (kRegs / GC) & ~int64_t{1});
          for (int64_t c0 = 0; c0 < C; c0 += kTileV) {
            const int64_t t_end = std::min<int64_t>(kTileV, C - c0);
            vf t[GC][kTileV];
            for (int g = 0; g < GC; ++g)
              for (int64_t c = 0; c < t_end; ++c) t[g][c] = load(s.acc.data() + g * D + (c0 + c) * kLanes);
            for (int k = 0; k < kLanes; ++k) {
              const kv_t* v = vr[k] + c0 * kLanes;
              for (int64_t c = 0; c < t_end; c += 2) {
                vf x, y;
                load2(v + c * kLanes, x, y);
                for (int g = 0; g < GC; ++g) {
                  const float w = s.p[g * kLanes + k];
                  t[g][c] += w * x;
                  t[g][c + 1] += w * y;
                }
              }
            }
            for (int g = 0; g < GC; ++g)
              for (int64_t c = 0; c < t_end; ++c) store(s.acc.data() + g * D + (c0 + c) * kLanes, t[g][c]);
          }
          continue;
        }
        for (int64_t g = 0; g < G; ++g) {
          // part[j]: q . k of position j, in kLanes partial sums.
          vf part[kLanes];
          const float* qg = s.qf.data() + g * D;
          for (int j = 0; j < kLanes; ++j) {
            vf a{}, x, y;
            for (int64_t c = 0; c < C; c += 2) {
              load2(kr[j] + c * kLanes, x, y);
              a += load(qg + c * kLanes) * x + load(qg + (c + 1) * kLanes) * y;
            }
            part[j] = a;
          }
          softmax_step(s, g, transpose_sum(part), valid, D, C);
          const float* pg = s.p.data() + g * kLanes;
          // V: a tile of up to 8 vectors of head_dim in registers over the block's lanes.
          float* acc = s.acc.data() + g * D;
          constexpr int64_t kTile = 8;
          for (int64_t c0 = 0; c0 < C; c0 += kTile) {
            const int64_t t_end = std::min<int64_t>(kTile, C - c0);
            vf t[kTile];
            for (int64_t c = 0; c < t_end; ++c) t[c] = load(acc + (c0 + c) * kLanes);
            for (int k = 0; k < kLanes; ++k) {
              const float w = pg[k];
              const kv_t* v = vr[k] + c0 * kLanes;
              for (int64_t c = 0; c < t_end; c += 2) {
                vf x, y;
                load2(v + c * kLanes, x, y);
                t[c] += w * x;
                t[c + 1] += w * y;
              }
            }
            for (int64_t c = 0; c < t_end; ++c) store(acc + (c0 + c) * kLanes, t[c]);
          }
        }
      }
      if (task.part >= 0) {  // a chunk: its state, merged below
        float* st = part_state.data() + task.part * part_floats;
        for (int64_t g = 0; g < G; ++g) {
          st[g] = s.m[g];
          st[G + g] = hsum(s.lsum[g]);
        }
        std::copy(s.acc.begin(), s.acc.end(), st + 2 * G);
        continue;
      }
      q_t* ob = out + (b * H + h * G) * D;
      for (int64_t g = 0; g < G; ++g) {
        const float sum = hsum(s.lsum[g]);
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        for (int64_t i = 0; i < D; ++i)
          ob[g * D + row_index<kv_t>(i)] = static_cast<q_t>(s.acc[g * D + i] * inv);
      }
    }
  });
  if (!splits.empty())
    merge_parts<q_t, kv_t>(splits, part_state.data(), part_floats, out, H, G, D);
}


// The row kernel (16-bit KV, and head_dims the block kernel does not cover): a row at a
// time, each score one dot product; scores kept for a two-pass softmax. DC as above.
template <typename q_t, typename kv_t, int DC>
void decode_rows(const q_t* q, kv_t* kb, kv_t* vb, const int32_t* r2t, int64_t r2t_stride,
                 const int64_t* rows, const int64_t* lens, q_t* out, int64_t B, int64_t H,
                 int64_t KVH, int64_t d_runtime, float scale, int64_t window, KvWrite<q_t> kv) {
  const int64_t D = DC ? DC : d_runtime;
  const int64_t G = H / KVH;
  at::parallel_for(0, B * KVH, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(G * D), acc(G * D), row(D), p;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / KVH, h = task % KVH;
      int64_t L;
      const int32_t* slots = begin_task(b, h, KVH, D, kb, vb, r2t, r2t_stride, rows, lens,
                                        window, kv, &L);
      to_float(q + (b * H + h * G) * D, qf.data(), G * D);
      for (int64_t i = 0; i < G * D; ++i) qf[i] *= scale;
      p.resize(static_cast<size_t>(G * L));
      for (int64_t l = 0; l < L; ++l) {
        if (l + kAhead < L) prefetch_row(kb + (static_cast<int64_t>(slots[l + kAhead]) * KVH + h) * D, D);
        to_float(kb + (static_cast<int64_t>(slots[l]) * KVH + h) * D, row.data(), D);
        for (int64_t g = 0; g < G; ++g) p[g * L + l] = dot(qf.data() + g * D, row.data(), D);
      }
      for (int64_t g = 0; g < G; ++g) softmax(p.data() + g * L, L);
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t l = 0; l < L; ++l) {
        if (l + kAhead < L) prefetch_row(vb + (static_cast<int64_t>(slots[l + kAhead]) * KVH + h) * D, D);
        to_float(vb + (static_cast<int64_t>(slots[l]) * KVH + h) * D, row.data(), D);
        for (int64_t g = 0; g < G; ++g) {
          const float w = p[g * L + l];
          float* __restrict a = acc.data() + g * D;
          for (int64_t i = 0; i < D; ++i) a[i] += w * row[i];
        }
      }
      q_t* ob = out + (b * H + h * G) * D;
      for (int64_t i = 0; i < G * D; ++i) ob[i] = static_cast<q_t>(acc[i]);
    }
  });
}

template <typename q_t>
void dispatch_kv(const torch::Tensor& q, torch::Tensor& k_buf, torch::Tensor& v_buf,
                 const torch::Tensor& r2t, const torch::Tensor& rows, const torch::Tensor& lens,
                 torch::Tensor& out, float scale, int64_t window,
                 const c10::optional<torch::Tensor>& k, const c10::optional<torch::Tensor>& v,
                 const c10::optional<torch::Tensor>& loc, bool kv_first) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), KVH = k_buf.size(1);
  KvWrite<q_t> kv;
  if (k.has_value()) {
    kv = {k->data_ptr<q_t>(), v->data_ptr<q_t>(), k->stride(0), v->stride(0),
          loc->data_ptr<int64_t>()};
  }
  const auto run = [&](auto* kv_tag) {
    using kv_t = std::remove_pointer_t<decltype(kv_tag)>;
    if (kv_first && kv.k != nullptr) {  // every row written, then no task writes
      kv_t* kb = k_buf.data_ptr<kv_t>();
      kv_t* vb = v_buf.data_ptr<kv_t>();
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < KVH; ++h) write_kv(kv, b, h, KVH, D, kb, vb);
      kv = KvWrite<q_t>{};
    }
    const auto go = [&](auto dc) {
      constexpr int DC = decltype(dc)::value;
      // bf16 KV: the block kernel with the group fused (GC) was 1.27-1.51x the row kernel
      // on an AMX Xeon (docs/benchmarks.md); one head at a time it was 0.84-0.91x on a
      // Zen 4 EPYC at 30 layers (KV from memory): re-measure there.
#if RADIXLM_DECODE_DPBF16
      // bf16 queries and KV: the AMX kernel, else the dp kernel for groups of 3, 4 (both
      // 1.3-1.4x this file's block kernel at batch 32 x 160 with K/V in cache on an AMX
      // Xeon; docs/benchmarks.md, "Decode attention on AMX tiles and bf16 dot products").
      if constexpr (std::is_same_v<q_t, c10::BFloat16> && std::is_same_v<kv_t, c10::BFloat16>) {
#if RADIXLM_DECODE_AMX
        if (amx_tiles::amx_permitted()) {
          const auto amx = [&](auto dc, auto gc) {
            amx_decode::decode_amx<decltype(dc)::value, decltype(gc)::value>(
                q.data_ptr<q_t>(), k_buf.data_ptr<kv_t>(), v_buf.data_ptr<kv_t>(),
                r2t.data_ptr<int32_t>(), r2t.stride(0), rows.data_ptr<int64_t>(),
                lens.data_ptr<int64_t>(), out.data_ptr<q_t>(), B, KVH, scale, window, kv);
          };
          using std::integral_constant;
          if constexpr (DC != 0) {
            switch (H / KVH) {  // the groups of common models (MHA, Qwen3, Llama, Qwen2.5)
              case 1: return amx(integral_constant<int, DC>{}, integral_constant<int, 1>{});
              case 2: return amx(integral_constant<int, DC>{}, integral_constant<int, 2>{});
              case 3: return amx(integral_constant<int, DC>{}, integral_constant<int, 3>{});
              case 4: return amx(integral_constant<int, DC>{}, integral_constant<int, 4>{});
              case 6: return amx(integral_constant<int, DC>{}, integral_constant<int, 6>{});
              case 7: return amx(integral_constant<int, DC>{}, integral_constant<int, 7>{});
              case 8: return amx(integral_constant<int, DC>{}, integral_constant<int, 8>{});
              default: break;
            }
          } else if (D == 256) {  // Gemma: 1 (7B), 2 (Gemma 2, Gemma 3 4B-27B), 4 (270M, 1B), 8
            switch (H / KVH) {
              case 1: return amx(integral_constant<int, 256>{}, integral_constant<int, 1>{});
              case 2: return amx(integral_constant<int, 256>{}, integral_constant<int, 2>{});
              case 4: return amx(integral_constant<int, 256>{}, integral_constant<int, 4>{});
              case 8: return amx(integral_constant<int, 256>{}, integral_constant<int, 8>{});
              default: break;
            }
          }
        }
#endif
        if constexpr (DC != 0) {
          const auto dp = [&](auto gc) {
            decode_dp::decode_blocks_dp<DC, decltype(gc)::value>(
                q.data_ptr<q_t>(), k_buf.data_ptr<kv_t>(), v_buf.data_ptr<kv_t>(),
                r2t.data_ptr<int32_t>(), r2t.stride(0), rows.data_ptr<int64_t>(),
                lens.data_ptr<int64_t>(), out.data_ptr<q_t>(), B, KVH, scale, window, kv);
          };
          if (H == 3 * KVH) return dp(std::integral_constant<int, 3>{});
          if (H == 4 * KVH) return dp(std::integral_constant<int, 4>{});
        }
      }
#endif
      if constexpr (std::is_same_v<kv_t, float> || std::is_same_v<kv_t, c10::BFloat16>) {
        if (blocked(D)) {
          const auto blocks = [&](auto gc) {
            decode_blocks<q_t, kv_t, DC, decltype(gc)::value>(
                q.data_ptr<q_t>(), k_buf.data_ptr<kv_t>(), v_buf.data_ptr<kv_t>(),
                r2t.data_ptr<int32_t>(), r2t.stride(0), rows.data_ptr<int64_t>(),
                lens.data_ptr<int64_t>(), out.data_ptr<q_t>(), B, H, KVH, D, scale, window, kv);
          };
          if (H == 3 * KVH) blocks(std::integral_constant<int, 3>{});
          else if (H == 4 * KVH) blocks(std::integral_constant<int, 4>{});
          else blocks(std::integral_constant<int, 0>{});
          return;
        }
      }
      decode_rows<q_t, kv_t, DC>(
          q.data_ptr<q_t>(), k_buf.data_ptr<kv_t>(), v_buf.data_ptr<kv_t>(),
          r2t.data_ptr<int32_t>(), r2t.stride(0), rows.data_ptr<int64_t>(),
          lens.data_ptr<int64_t>(), out.data_ptr<q_t>(), B, H, KVH, D, scale, window, kv);
    };
    if (D == 64) go(std::integral_constant<int, 64>{});
    else if (D == 128) go(std::integral_constant<int, 128>{});
    else go(std::integral_constant<int, 0>{});
  };
  switch (k_buf.scalar_type()) {
    case at::kFloat: run(static_cast<float*>(nullptr)); break;
    case at::kBFloat16: run(static_cast<c10::BFloat16*>(nullptr)); break;
    case at::kHalf: run(static_cast<c10::Half*>(nullptr)); break;
    default: TORCH_CHECK(false, "paged_decode_attention: KV dtype ", k_buf.scalar_type());
  }
}

}  // namespace

torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_buf, torch::Tensor v_buf,
                                     torch::Tensor req_to_token, torch::Tensor rows,
                                     torch::Tensor lens, double scale, int64_t window,
                                     c10::optional<torch::Tensor> k,
                                     c10::optional<torch::Tensor> v,
                                     c10::optional<torch::Tensor> loc, bool kv_first) {
  TORCH_CHECK(q.dim() == 3 && k_buf.dim() == 3 && v_buf.sizes() == k_buf.sizes(),
              "paged_decode_attention: q [B, H, D], k/v [S, KVH, D]");
  TORCH_CHECK(q.size(1) % k_buf.size(1) == 0 && q.size(2) == k_buf.size(2),
              "paged_decode_attention: heads must be a multiple of KV heads, same head_dim");
  TORCH_CHECK(k_buf.is_contiguous() && v_buf.is_contiguous() && k_buf.scalar_type() == v_buf.scalar_type(),
              "paged_decode_attention: contiguous K/V buffers of one dtype");
  TORCH_CHECK(req_to_token.scalar_type() == at::kInt && req_to_token.stride(1) == 1,
              "paged_decode_attention: req_to_token int32 with contiguous rows");
  TORCH_CHECK(rows.scalar_type() == at::kLong && lens.scalar_type() == at::kLong,
              "paged_decode_attention: rows and lens int64");
  TORCH_CHECK(window >= 0, "paged_decode_attention: window >= 0 (0 = none)");
  TORCH_CHECK(k.has_value() == v.has_value() && k.has_value() == loc.has_value(),
              "paged_decode_attention: k, v and loc together or not at all");
  if (k.has_value()) {
    const auto rows_of = [&](const torch::Tensor& t) {
      return t.dim() == 3 && t.size(0) == q.size(0) && t.size(1) == k_buf.size(1)
             && t.size(2) == k_buf.size(2) && t.stride(2) == 1 && t.stride(1) == t.size(2)
             && t.scalar_type() == q.scalar_type();
    };
    TORCH_CHECK(rows_of(*k) && rows_of(*v),
                "paged_decode_attention: k/v [B, KVH, D] of q's dtype, contiguous within a request");
    TORCH_CHECK(loc->scalar_type() == at::kLong && loc->numel() == q.size(0) && loc->is_contiguous(),
                "paged_decode_attention: loc [B] int64");
  }
  auto qc = q.contiguous();
  auto rc = rows.contiguous();
  auto lc = lens.contiguous();
  auto out = torch::empty_like(qc);
  const float s = static_cast<float>(scale);
  switch (q.scalar_type()) {
    case at::kFloat: dispatch_kv<float>(qc, k_buf, v_buf, req_to_token, rc, lc, out, s, window, k, v, loc, kv_first); break;
    case at::kBFloat16: dispatch_kv<c10::BFloat16>(qc, k_buf, v_buf, req_to_token, rc, lc, out, s, window, k, v, loc, kv_first); break;
    case at::kHalf: dispatch_kv<c10::Half>(qc, k_buf, v_buf, req_to_token, rc, lc, out, s, window, k, v, loc, kv_first); break;
    default: TORCH_CHECK(false, "paged_decode_attention: q dtype ", q.scalar_type());
  }
  return out;
}

// 2: the AMX kernel, 1: the bf16 dot-product kernel, 0: neither (what bf16 queries and KV
// with head_dim 64 or 128 in groups of 3 or 4 take).
int64_t decode_attention_path() {
#if RADIXLM_DECODE_AMX
  if (amx_tiles::amx_permitted()) return 2;
#endif
  return RADIXLM_DECODE_DPBF16;
}

#if RADIXLM_TORCH_OPS
// radixlm::paged_decode_attention (schema and shape for tracing: cpu_kernels/ops.py), the
// compiled decode graphs' attention: no KV write fused (the graph writes K/V itself), and
// no Python between the graph's dispatcher and this function.
torch::Tensor paged_decode_attention_op(torch::Tensor q, torch::Tensor k_buf, torch::Tensor v_buf,
                                        torch::Tensor req_to_token, torch::Tensor rows,
                                        torch::Tensor lens, double scale, int64_t window) {
  return paged_decode_attention(q, k_buf, v_buf, req_to_token, rows, lens, scale, window,
                                c10::nullopt, c10::nullopt, c10::nullopt, false);
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) {
  m.impl("paged_decode_attention", &paged_decode_attention_op);
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention_path", &decode_attention_path,
        "bf16 queries and KV (head_dim 64, 128) in groups of 3 or 4: 2 the AMX kernel, "
        "1 the bf16 dot-product kernel, 0 the float32 block kernel.");
  m.def("paged_decode_attention", &paged_decode_attention,
        "Decode attention over the paged KV pool (see the file's header).", py::arg("q"),
        py::arg("k_buf"), py::arg("v_buf"), py::arg("req_to_token"), py::arg("rows"),
        py::arg("lens"), py::arg("scale"), py::arg("window") = 0, py::arg("k") = py::none(),
        py::arg("v") = py::none(), py::arg("loc") = py::none(), py::arg("kv_first") = false);
}
