// The pieces every decode attention kernel's task shares (decode_attention.cpp and the
// kernels it includes): the step's own K/V row written into the pool (the fused set_kv),
// the request's visible slots, and software prefetch of a gathered row.
//
// Invariants: a task (request b, KV head h) writes only its own row at loc[b] and reads
// only the slots visible_slots returns; prefetch_row only hints (reads nothing).
#pragma once

#include <algorithm>
#include <cstdint>

namespace decode_task {

// Rows are read through req_to_token (a gather the hardware prefetcher cannot predict
// across slots): the kernels ask for rows ahead of the one they compute.
template <typename T>
inline void prefetch_row(const T* x, int64_t d) {
  const char* p = reinterpret_cast<const char*>(x);
  for (int64_t off = 0; off < d * static_cast<int64_t>(sizeof(T)); off += 64) __builtin_prefetch(p + off);
}

// The step's K/V rows to write into the pool (KvWrite::k == nullptr: none).
template <typename q_t>
struct KvWrite {
  const q_t* k = nullptr;
  const q_t* v = nullptr;
  int64_t k_stride = 0, v_stride = 0;  // between requests, in elements
  const int64_t* loc = nullptr;
};

template <typename q_t, typename kv_t>
inline void write_row(const q_t* src, kv_t* dst, int64_t d) {
  for (int64_t i = 0; i < d; ++i) dst[i] = static_cast<kv_t>(static_cast<float>(src[i]));
}

// The step's K and V rows of (request b, KV head h) into the pool at slot loc[b].
template <typename q_t, typename kv_t>
inline void write_kv(const KvWrite<q_t>& kv, int64_t b, int64_t h, int64_t KVH, int64_t D,
                     kv_t* kb, kv_t* vb) {
  const int64_t slot = kv.loc[b];
  write_row(kv.k + b * kv.k_stride + h * D, kb + (slot * KVH + h) * D, D);
  write_row(kv.v + b * kv.v_stride + h * D, vb + (slot * KVH + h) * D, D);
}

// Request b's visible positions [first, lens[b]) (all, or the last `window`): returns
// their slots, *L their count.
inline const int32_t* visible_slots(int64_t b, const int32_t* r2t, int64_t r2t_stride,
                                    const int64_t* rows, const int64_t* lens, int64_t window,
                                    int64_t* L) {
  const int64_t first = window > 0 ? std::max<int64_t>(0, lens[b] - window) : 0;
  *L = lens[b] - first;
  return r2t + rows[b] * r2t_stride + first;
}

// A task's start, shared by the kernels: the step's K/V row of (b, h) written into the
// pool (the fused write), then visible_slots.
template <typename q_t, typename kv_t>
inline const int32_t* begin_task(int64_t b, int64_t h, int64_t KVH, int64_t D, kv_t* kb,
                                 kv_t* vb, const int32_t* r2t, int64_t r2t_stride,
                                 const int64_t* rows, const int64_t* lens, int64_t window,
                                 const KvWrite<q_t>& kv, int64_t* L) {
  if (kv.k != nullptr) write_kv(kv, b, h, KVH, D, kb, vb);
  return visible_slots(b, r2t, r2t_stride, rows, lens, window, L);
}

}  // namespace decode_task
