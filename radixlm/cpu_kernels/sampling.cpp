// The sampler's full-vocabulary work for the CPU (executor/sampler.py): the greedy argmax
// of each row, and the inverse-CDF draw from softmax(logits / temperature) of each drawing
// row after its top-k / top-p / min-p cuts, without materializing the probabilities, their
// cumulative sum or a sorted vocabulary.
//
// Invariants: a row is cut into fixed chunks of kChunk tokens; the per-chunk results
// (max, sum of weights) do not depend on which thread computed them or on the other rows,
// and each row's cut and draw run on one thread, so a row's token is the same at every
// batch size and thread count (deterministic inference relies on it). A token whose logit is -inf (a grammar's mask) has weight 0 and
// is never drawn; a row with a NaN or +inf logit, or no finite one, is reported invalid.
#include "torch_api.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "simd.h"

namespace {

constexpr int64_t kChunk = 2048;  // a multiple of kLanes
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int64_t num_chunks(int64_t vocab) { return (vocab + kChunk - 1) / kChunk; }

// Elements [begin, end) of a row as vectors; the tail padded with -inf (weight 0, never
// the max of a row that has a finite logit).
template <typename F>
inline void for_vectors(const float* row, int64_t begin, int64_t end, F&& f) {
  int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes) f(i, load(row + i));
  if (i < end) {
    float tail[kLanes];
    for (int j = 0; j < kLanes; ++j) tail[j] = i + j < end ? row[i + j] : kNegInf;
    f(i, load(tail));
  }
}

struct ChunkMax {
  float max;
  bool nan;
};

// A chunk's largest value, and whether it holds a NaN (vector compares only).
ChunkMax chunk_max(const float* row, int64_t begin, int64_t end) {
  vf m = splat(kNegInf);
  vi nan = vi{} + 0;
  for_vectors(row, begin, end, [&](int64_t, vf x) {
    m = x > m ? x : m;
    nan |= (x != x);
  });
  bool any_nan = false;
  for (int j = 0; j < kLanes; ++j) any_nan |= nan[j] != 0;
  return {hmax(m), any_nan};
}

// The first index in [begin, end) whose value is `value` (its first NaN if value is NaN).
int64_t first_index(const float* row, int64_t begin, int64_t end, float value) {
  const bool nan = value != value;
  int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes) {
    const vf x = load(row + i);
    const vi hit = nan ? (x != x) : (x == value);
    for (int j = 0; j < kLanes; ++j)
      if (hit[j]) return i + j;
  }
  for (; i < end; ++i)
    if (nan ? row[i] != row[i] : row[i] == value) return i;
  return begin;  // every element -inf and value -inf handled above; not reached otherwise
}

// exp((x - max) * inv_t) per lane, 0 where the argument is below float32's normal range
// (that covers -inf logits: a grammar-masked token's weight is exactly 0).
inline vf weights(vf x, float max, float inv_t) {
  const vf a = (x - max) * inv_t;
  const vf e = exp_vec(a);
  return a < -87.f ? splat(0.f) : e;
}

// Every (row, chunk) pair of `rows` rows of `chunks` chunks, split across threads: the
// per-chunk partial results of argmax_rows and sample_rows (out[r * chunks + c]).
template <typename Part, typename F>
std::vector<Part> per_chunk(int64_t rows, int64_t chunks, int64_t vocab, F chunk_of_row) {
  std::vector<Part> part(rows * chunks);
  at::parallel_for(0, rows * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r = t / chunks, c = t % chunks;
      part[t] = chunk_of_row(r, c * kChunk, std::min(vocab, (c + 1) * kChunk));
    }
  });
  return part;
}

// [n] int64: per row of logits [n, V] (float32, contiguous), the first index of its
// largest value (of its first NaN if it has one: torch.argmax's convention).
torch::Tensor argmax_rows(const torch::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == torch::kFloat && logits.is_contiguous(),
              "argmax_rows: logits must be a contiguous [n, V] float32 tensor");
  const int64_t n = logits.size(0), vocab = logits.size(1), chunks = num_chunks(vocab);
  const float* data = logits.data_ptr<float>();
  const auto part = per_chunk<ChunkMax>(n, chunks, vocab, [&](int64_t r, int64_t b, int64_t e) {
    return chunk_max(data + r * vocab, b, e);
  });
  auto out = torch::empty({n}, logits.options().dtype(torch::kLong));
  int64_t* ids = out.data_ptr<int64_t>();
  for (int64_t r = 0; r < n; ++r) {
    const ChunkMax* p = &part[r * chunks];
    int64_t best = 0;  // the first chunk holding a NaN, else the first holding the max
    for (int64_t c = 1; c < chunks && !p[best].nan; ++c)
      if (p[c].nan || p[c].max > p[best].max) best = c;
    const float* row = data + r * vocab;
    const float value = p[best].nan ? std::numeric_limits<float>::quiet_NaN() : p[best].max;
    ids[r] = first_index(row, best * kChunk, std::min(vocab, (best + 1) * kChunk), value);
  }
  return out;
}

// One chunk of a drawing row: its max, and its weights' sum relative to that max
// (exp((x - chunk max) * inv_t), float32 lanes): the chunk is read from memory once, the
// second loop finds it in L1. mass_at() rescales the sum to the row's max.
struct ChunkSum {
  ChunkMax max;
  float sum;
  // 0 where even the chunk's max has weight 0 at the row's max (weights()' cut-off), so
  // that a chunk of positive mass always holds a token of positive weight.
  float mass_at(float row_max, float inv_t) const {
    const float a = (max.max - row_max) * inv_t;
    return max.max == kNegInf || a < -87.f ? 0.f : sum * std::exp(a);
  }
};

ChunkSum chunk_sum(const float* row, int64_t begin, int64_t end, float inv_t) {
  ChunkSum c{chunk_max(row, begin, end), 0.f};
  if (c.max.nan || !std::isfinite(c.max.max)) return c;
  vf acc = splat(0.f);
  for_vectors(row, begin, end, [&](int64_t, vf x) { acc += weights(x, c.max.max, inv_t); });
  c.sum = hsum(acc);
  return c;
}

// A token and its weight.
struct Cand {
  float w;
  int64_t i;
};
// Weight descending, index ascending: the order of Sampler._top_k_p's sort (with ties
// broken by the lower token id).
inline bool before_in_order(const Cand& a, const Cand& b) { return a.w > b.w || (a.w == b.w && a.i < b.i); }

// The tokens a row keeps after its cuts, in vocabulary order: Sampler._cut's rule (in the
// order above a token goes when its rank reaches top_k or the mass strictly before it
// already reaches top_p of the row's total; min-p drops weights below min_p, the max's
// weight being 1). Only candidates are ordered: with top_k, the k first in that order (a
// heap over one pass); with top_p, the tokens of weight >= (1 - top_p) * total / V, which
// hold more than top_p of the mass (the rest holds less than V times that bound), so the
// nucleus is among them; with min-p, weights >= min_p. Returned in vocabulary order.
std::vector<Cand> kept_tokens(const float* row, int64_t vocab, float max, float inv_t, double total,
                              int64_t top_k, float top_p, float min_p) {
  const bool cut_k = top_k < vocab, cut_p = top_p < 1.f;
  const double limit = static_cast<double>(top_p) * total;
  float floor_w = std::max(min_p, 0.f);
  if (cut_p) floor_w = std::max(floor_w, static_cast<float>((1.0 - top_p) * total / vocab));
  std::vector<Cand> cand;
  auto worse = [](const Cand& a, const Cand& b) { return before_in_order(a, b); };  // min-heap
  for_vectors(row, 0, vocab, [&](int64_t i, vf x) {
    const vf w = weights(x, max, inv_t);
    // With top_k and a full heap, only weights above its smallest can enter (strictly: an
    // equal weight comes later in vocabulary order, so it is worse).
    const float bar = cut_k && static_cast<int64_t>(cand.size()) == top_k ? cand.front().w : floor_w;
    const vi take = cut_k && static_cast<int64_t>(cand.size()) == top_k ? (w > bar) : (w >= bar);
    bool any = false;
    for (int j = 0; j < kLanes; ++j) any |= take[j] != 0;
    if (!any) return;
    for (int j = 0; j < kLanes; ++j) {
      if (!(w[j] > 0.f) || w[j] < floor_w) continue;
      const Cand c{w[j], i + j};
      if (!cut_k) {
        cand.push_back(c);
      } else if (static_cast<int64_t>(cand.size()) < top_k) {
        cand.push_back(c);
        std::push_heap(cand.begin(), cand.end(), worse);
      } else if (before_in_order(c, cand.front())) {
        std::pop_heap(cand.begin(), cand.end(), worse);
        cand.back() = c;
        std::push_heap(cand.begin(), cand.end(), worse);
      }
    }
  });
  if (cut_k) std::sort(cand.begin(), cand.end(), [](const Cand& a, const Cand& b) { return a.i < b.i; });
  if (!cut_k && !cut_p) return cand;  // min-p alone: every candidate stays
  // The last token kept, by quickselect on the order above with the mass on each side:
  // O(candidates), where a sort would be O(c log c) (a flat distribution's nucleus can
  // hold most of the vocabulary).
  std::vector<Cand> work(cand);
  size_t lo = 0, hi = work.size();
  double before = 0.0;
  int64_t rank = 0;
  auto stops = [&] { return (cut_k && rank >= top_k) || (cut_p && before >= limit); };
  while (hi - lo > 32) {
    Cand a = work[lo], b = work[lo + (hi - lo) / 2], c = work[hi - 1];
    if (before_in_order(b, a)) std::swap(a, b);
    if (before_in_order(c, b)) std::swap(b, c);
    if (before_in_order(b, a)) std::swap(a, b);
    const Cand pivot = b;  // the median of three
    const auto mid = std::partition(work.begin() + lo, work.begin() + hi,
                                    [&](const Cand& x) { return before_in_order(x, pivot); });
    const size_t m = mid - work.begin();
    double left = 0.0;
    for (size_t i = lo; i < m; ++i) left += work[i].w;
    if ((cut_k && rank + static_cast<int64_t>(m - lo) > top_k) || (cut_p && before + left >= limit)) {
      hi = m;  // the first token dropped is in the left part, or right after it
    } else if (m > lo) {
      before += left;  // the whole left part stays
      rank += m - lo;
      lo = m;
    } else {  // nothing is before the pivot: it is the part's first token
      const auto best = std::min_element(work.begin() + lo, work.begin() + hi, before_in_order);
      std::iter_swap(work.begin() + lo, best);
      if (stops()) break;
      before += work[lo].w;
      rank += 1;
      lo += 1;
    }
  }
  std::sort(work.begin() + lo, work.begin() + hi, before_in_order);
  size_t n = lo;
  for (; n < hi && !stops(); ++n) {
    before += work[n].w;
    rank += 1;
  }
  if (n == 0) return {};
  // The kept tokens, the worst of them included, in vocabulary order.
  const Cand last = *std::max_element(work.begin(), work.begin() + n, before_in_order);
  cand.erase(std::remove_if(cand.begin(), cand.end(),
                            [&](const Cand& x) { return before_in_order(last, x); }),
             cand.end());
  return cand;
}

// Draws one token for each row rows[s] of logits [n, V] (float32, contiguous) from
// softmax(logits[rows[s]] * inv_temps[s]) after its cuts (top_ks[s] < V, top_ps[s] < 1,
// min_ps[s] > 0: Sampler._cut's), without renormalizing: the first kept token whose
// cumulative weight (vocabulary order) exceeds u[s] * the kept total. Returns
// (tokens [S] int64, valid [S] bool).
std::vector<torch::Tensor> sample_rows(const torch::Tensor& logits, const torch::Tensor& rows,
                                       const torch::Tensor& inv_temps, const torch::Tensor& u,
                                       const torch::Tensor& top_ks, const torch::Tensor& top_ps,
                                       const torch::Tensor& min_ps) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == torch::kFloat && logits.is_contiguous(),
              "sample_rows: logits must be a contiguous [n, V] float32 tensor");
  TORCH_CHECK(rows.scalar_type() == torch::kLong && inv_temps.scalar_type() == torch::kFloat &&
                  u.scalar_type() == torch::kDouble && top_ks.scalar_type() == torch::kLong &&
                  top_ps.scalar_type() == torch::kFloat && min_ps.scalar_type() == torch::kFloat,
              "sample_rows: rows and top_ks int64, u float64, the others float32");
  const int64_t vocab = logits.size(1), chunks = num_chunks(vocab), s_rows = rows.numel();
  for (const auto* t : {&inv_temps, &u, &top_ks, &top_ps, &min_ps})
    TORCH_CHECK(t->numel() == s_rows, "sample_rows: one value per row");
  const auto rows_c = rows.contiguous(), temps_c = inv_temps.contiguous(), u_c = u.contiguous();
  const auto ks_c = top_ks.contiguous(), ps_c = top_ps.contiguous(), mins_c = min_ps.contiguous();
  const int64_t* row_ids = rows_c.data_ptr<int64_t>();
  const float* inv_t = temps_c.data_ptr<float>();
  const double* draws = u_c.data_ptr<double>();
  const int64_t* ks = ks_c.data_ptr<int64_t>();
  const float* ps = ps_c.data_ptr<float>();
  const float* mins = mins_c.data_ptr<float>();
  const float* data = logits.data_ptr<float>();
  for (int64_t s = 0; s < s_rows; ++s)
    TORCH_CHECK(row_ids[s] >= 0 && row_ids[s] < logits.size(0), "sample_rows: row out of range");
  auto row_of = [&](int64_t s) { return data + row_ids[s] * vocab; };

  // Pass 1: each chunk's max and weight sum (relative to the chunk's max).
  auto chunk_of_row = [&](int64_t s, int64_t b, int64_t e) {
    return chunk_sum(row_of(s), b, e, inv_t[s]);
  };
  const auto part = per_chunk<ChunkSum>(s_rows, chunks, vocab, chunk_of_row);

  // Pass 2, per row: its max and each chunk's mass at it; then, for a row with a cut, its
  // kept tokens and the draw among them; else the chunk where the cumulative weight
  // crosses the target and the token inside it (its weights recomputed, summed in order).
  auto tokens = torch::empty({s_rows}, logits.options().dtype(torch::kLong));
  auto valid = torch::empty({s_rows}, logits.options().dtype(torch::kBool));
  int64_t* tok = tokens.data_ptr<int64_t>();
  bool* ok = valid.data_ptr<bool>();
  at::parallel_for(0, s_rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> mass(chunks);
    for (int64_t s = begin; s < end; ++s) {
      const ChunkSum* p = &part[s * chunks];
      const float* row = row_of(s);
      float m = kNegInf;
      bool nan = false;
      for (int64_t c = 0; c < chunks; ++c) {
        nan |= p[c].max.nan;
        m = p[c].max.max > m ? p[c].max.max : m;
      }
      tok[s] = 0;
      // No finite logit, or +inf: softmax is no distribution; a temperature that is not a
      // positive finite number neither.
      ok[s] = !nan && std::isfinite(m) && inv_t[s] > 0.f && std::isfinite(inv_t[s]);
      if (!ok[s]) continue;
      double total = 0.0;
      for (int64_t c = 0; c < chunks; ++c) total += (mass[c] = p[c].mass_at(m, inv_t[s]));
      ok[s] = std::isfinite(total) && total > 0.0;
      if (!ok[s]) continue;
      if (ks[s] < vocab || ps[s] < 1.f || mins[s] > 0.f) {
        const std::vector<Cand> kept = kept_tokens(row, vocab, m, inv_t[s], total, ks[s], ps[s], mins[s]);
        double kept_total = 0.0;
        for (const Cand& c : kept) kept_total += c.w;
        ok[s] = kept_total > 0.0;
        if (!ok[s]) continue;
        const double target = std::min(draws[s] * kept_total, std::nextafter(kept_total, 0.0));
        double acc = 0.0;
        tok[s] = kept.back().i;  // rounding left the target past the last token
        for (const Cand& c : kept) {
          acc += c.w;
          if (acc > target) {
            tok[s] = c.i;
            break;
          }
        }
        continue;
      }
      // u * total may round up to total: stay one ulp below it.
      const double target = std::min(draws[s] * total, std::nextafter(total, 0.0));
      double before = 0.0;
      int64_t c = 0, last_chunk = -1;
      for (; c < chunks; ++c) {
        if (mass[c] > 0.0) last_chunk = c;
        if (before + mass[c] > target) break;
        before += mass[c];
      }
      if (c == chunks) c = last_chunk;  // rounding left the target past the last chunk
      const double rest = target - before;
      double acc = 0.0;
      int64_t pick = -1, last_token = c * kChunk;
      for_vectors(row, c * kChunk, std::min(vocab, (c + 1) * kChunk), [&](int64_t i, vf x) {
        if (pick >= 0) return;
        const vf w = weights(x, m, inv_t[s]);
        for (int j = 0; j < kLanes && pick < 0; ++j) {
          if (!(w[j] > 0.f)) continue;
          acc += w[j];
          last_token = i + j;
          if (acc > rest) pick = i + j;
        }
      });
      // The chunk's weights summed in order may fall short of its rescaled lane-wise sum
      // by a rounding: the chunk's last token of positive weight then.
      tok[s] = pick >= 0 ? pick : last_token;
    }
  });
  return {tokens, valid};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("argmax_rows", &argmax_rows, "First index of each row's largest value (see the header).");
  m.def("sample_rows", &sample_rows,
        "Inverse-CDF draw from softmax(logits * inv_temp), after top-k/top-p/min-p cuts, of "
        "the given rows (see the header).");
}
