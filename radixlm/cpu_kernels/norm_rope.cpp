// RMSNorm (alone and after the residual add), rotary embedding and SiLU(gate) * up or
// tanh-GELU(gate) * up for the CPU's eager forward: each is one pass over its rows instead
// of the small torch ops the Python versions dispatch (rms_norm.py, rope.py, mlp.py).
// Results equal those versions' rounding: float32 math, cast to the activation dtype at
// the same points HF's Llama casts.
#include "torch_api.h"
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "activations.h"
#include "fast_exp.h"

namespace {

// Rows per task: small batches stay on the calling thread (no parallel region).
inline int64_t grain_rows(int64_t row_elems) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(row_elems, 1)); }

// Element access the compiler can vectorize: Elem<T>::raw is what is stored (bf16 as its
// 16 bits), load/store convert to and from float32 (bf16 as bit operations, rounding to
// nearest even: c10::BFloat16's results for every value arithmetic produces; a quiet NaN
// stays a NaN, only a signalling one, which no float operation returns, would not).
template <typename T>
struct Elem {
  using raw = T;
  static float load(raw v) { return static_cast<float>(v); }
  static raw store(float f) { return static_cast<raw>(f); }
};

template <>
struct Elem<c10::BFloat16> {
  using raw = uint16_t;
  static float load(raw v) { return bf16_load(v); }
  static raw store(float f) { return bf16_store(f); }
};

template <typename T>
using raw_t = typename Elem<T>::raw;

template <typename T>
const raw_t<T>* raw_ptr(const torch::Tensor& t) { return reinterpret_cast<const raw_t<T>*>(t.data_ptr<T>()); }
template <typename T>
raw_t<T>* raw_ptr(torch::Tensor& t) { return reinterpret_cast<raw_t<T>*>(t.data_ptr<T>()); }

// rsqrt(mean(x^2) + eps) of one row x [n], summed in float32.
template <typename T>
inline float inv_rms(const raw_t<T>* __restrict x, int64_t n, float eps) {
  using E = Elem<T>;
  float ss = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = E::load(x[i]);
    ss += v * v;
  }
  return 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
}

// o = weight * cast(x * rsqrt(mean(x^2) + eps)) of one row x [n], in float32 (HF's order).
template <typename T>
inline void rms_norm_row(const raw_t<T>* __restrict x, const raw_t<T>* __restrict w,
                         raw_t<T>* __restrict o, int64_t n, float eps) {
  using E = Elem<T>;
  const float scale = inv_rms<T>(x, n, eps);
  for (int64_t i = 0; i < n; ++i) {
    const float normed = E::load(E::store(E::load(x[i]) * scale));
    o[i] = E::store(E::load(w[i]) * normed);
  }
}

template <typename T>
void rms_norm_rows(const raw_t<T>* x, const raw_t<T>* w, raw_t<T>* out, int64_t rows, int64_t n,
                   int64_t x_stride, float eps) {
  at::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) rms_norm_row<T>(x + r * x_stride, w, out + r * n, n, eps);
  });
}

// sum[t] = cast(x[t] + delta[t]) (the residual add, rounded as torch's add rounds), then
// out[t] = the RMSNorm of sum[t].
template <typename T>
void add_rms_norm_rows(const raw_t<T>* x, const raw_t<T>* delta, const raw_t<T>* w, raw_t<T>* sum,
                       raw_t<T>* out, int64_t rows, int64_t n, int64_t x_stride,
                       int64_t d_stride, float eps) {
  using E = Elem<T>;
  at::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const raw_t<T>* __restrict xr = x + r * x_stride;
      const raw_t<T>* __restrict dr = delta + r * d_stride;
      raw_t<T>* __restrict sr = sum + r * n;
      for (int64_t i = 0; i < n; ++i) sr[i] = E::store(E::load(xr[i]) + E::load(dr[i]));
      rms_norm_row<T>(sr, w, out + r * n, n, eps);
    }
  });
}

// Gemma's RMSNorm of one row x [n]: o = cast(x * rsqrt(mean(x^2) + eps) * w1) with w1 =
// 1 + w precomputed in float32 (HF Gemma3RMSNorm: both products in float32, one cast at
// the end, where Llama's rounds before the weight).
template <typename T>
inline void gemma_rms_norm_row(const raw_t<T>* __restrict x, const float* __restrict w1,
                               raw_t<T>* __restrict o, int64_t n, float eps) {
  using E = Elem<T>;
  const float scale = inv_rms<T>(x, n, eps);
  for (int64_t i = 0; i < n; ++i) {
    const float normed = E::load(x[i]) * scale;
    o[i] = E::store(normed * w1[i]);
  }
}

// Each group of m consecutive elements of each row x[t] ([groups * m]) normalized alone
// (m = n: the whole row; m = head_dim: Gemma's per-head q/k norms).
template <typename T>
void gemma_rms_norm_rows(const raw_t<T>* x, const float* w1, raw_t<T>* out, int64_t rows,
                         int64_t groups, int64_t m, int64_t x_stride, float eps) {
  at::parallel_for(0, rows, grain_rows(groups * m), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t g = 0; g < groups; ++g)
        gemma_rms_norm_row<T>(x + r * x_stride + g * m, w1, out + (r * groups + g) * m, m, eps);
  });
}

// A sandwich block's end: sum[t] = cast(x[t] + GemmaNorm_post(delta[t])) (the block's
// output norm, then the residual add, each rounded as torch rounds them), then, when
// w_next is given, out[t] = GemmaNorm_next(sum[t]) (the next block's input norm).
template <typename T>
void gemma_norm_add_norm_rows(const raw_t<T>* x, const raw_t<T>* delta, const float* w_post,
                              const float* w_next, raw_t<T>* sum, raw_t<T>* out, int64_t rows,
                              int64_t n, int64_t x_stride, int64_t d_stride, float eps) {
  using E = Elem<T>;
  at::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const raw_t<T>* __restrict xr = x + r * x_stride;
      raw_t<T>* __restrict sr = sum + r * n;
      gemma_rms_norm_row<T>(delta + r * d_stride, w_post, sr, n, eps);  // sr = the normed delta
      for (int64_t i = 0; i < n; ++i) sr[i] = E::store(E::load(xr[i]) + E::load(sr[i]));
      if (w_next != nullptr) gemma_rms_norm_row<T>(sr, w_next, out + r * n, n, eps);
    }
  });
}

// out[t, i] = cast(cast(act(g)) * u) with g = gate_up[t, i], u = gate_up[t, inter + i]
// (the rows of gate_up are [gate | up]; act: activations.h's Silu or GeluTanh; torch's
// F.silu(gate) * up or F.gelu(gate, approximate="tanh") * up rounds at those points).
template <typename T, typename Act>
void act_mul_rows(const raw_t<T>* gu, raw_t<T>* out, int64_t rows, int64_t inter,
                  int64_t gu_stride) {
  using E = Elem<T>;
  at::parallel_for(0, rows, grain_rows(2 * inter), [&](int64_t begin, int64_t end) {
    // Two loops over blocks of a row: fused into one, GCC's vector code for it ran 5-6x
    // slower (~5 ns per element on a Xeon: 0.4 ms for 32 rows of 1536).
    constexpr int64_t kBlock = 1024;
    float act[kBlock];
    for (int64_t r = begin; r < end; ++r) {
      const raw_t<T>* __restrict g = gu + r * gu_stride;
      const raw_t<T>* __restrict u = g + inter;
      raw_t<T>* __restrict o = out + r * inter;
      for (int64_t i0 = 0; i0 < inter; i0 += kBlock) {
        const int64_t n = std::min(kBlock, inter - i0);
        for (int64_t i = 0; i < n; ++i) {
          const float x = E::load(g[i0 + i]);
          act[i] = Act::apply(x);
        }
        for (int64_t i = 0; i < n; ++i)
          o[i0 + i] = E::store(E::load(E::store(act[i])) * E::load(u[i0 + i]));
      }
    }
  });
}

// Neox rotation of every head of x[t] ([heads * d], contiguous rows): with x1, x2 the
// halves of a head, out = [x1 c - x2 s, x2 c + x1 s], each product and sum rounded to T
// as torch's elementwise ops on T tensors round them.
template <typename T>
void rotary_rows(const raw_t<T>* x, const raw_t<T>* cos, const raw_t<T>* sin, raw_t<T>* out,
                 int64_t rows, int64_t heads, int64_t d, int64_t x_stride) {
  using E = Elem<T>;
  const int64_t half = d / 2;
  at::parallel_for(0, rows, grain_rows(heads * d), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const raw_t<T>* __restrict c = cos + t * half;
      const raw_t<T>* __restrict s = sin + t * half;
      for (int64_t h = 0; h < heads; ++h) {
        const raw_t<T>* __restrict xh = x + t * x_stride + h * d;
        raw_t<T>* __restrict oh = out + (t * heads + h) * d;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = E::load(xh[i]), x2 = E::load(xh[i + half]);
          const float ci = E::load(c[i]), si = E::load(s[i]);
          const float a = E::load(E::store(x1 * ci));
          const float b = E::load(E::store(x2 * si));
          const float e = E::load(E::store(x2 * ci));
          const float f = E::load(E::store(x1 * si));
          oh[i] = E::store(a - b);
          oh[i + half] = E::store(e + f);
        }
      }
    }
  });
}

template <typename F>
void dispatch(at::ScalarType t, const char* what, F&& f) {
  switch (t) {
    case at::kFloat: f(static_cast<float*>(nullptr)); break;
    case at::kBFloat16: f(static_cast<c10::BFloat16*>(nullptr)); break;
    case at::kHalf: f(static_cast<c10::Half*>(nullptr)); break;
    default: TORCH_CHECK(false, what, ": dtype ", t);
  }
}

}  // namespace

// x [T, n] (rows may be strided), weight [n] of x's dtype -> [T, n] contiguous.
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && weight.dim() == 1 && weight.size(0) == x.size(1)
              && weight.scalar_type() == x.scalar_type() && weight.is_contiguous(),
              "rms_norm: x [T, n] with contiguous rows, weight [n] of x's dtype");
  auto out = torch::empty({x.size(0), x.size(1)}, x.options());
  dispatch(x.scalar_type(), "rms_norm", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    rms_norm_rows<T>(raw_ptr<T>(x), raw_ptr<T>(weight), raw_ptr<T>(out), x.size(0), x.size(1),
                     x.stride(0), static_cast<float>(eps));
  });
  return out;
}

// x [T, heads * d] (rows may be strided), cos/sin [T, d/2] of x's dtype -> [T, heads * d].
torch::Tensor rotary(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, int64_t head_dim) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) % head_dim == 0 && head_dim % 2 == 0,
              "rotary: x [T, heads * head_dim] with contiguous rows");
  auto c = cos.contiguous(), s = sin.contiguous();
  TORCH_CHECK(c.scalar_type() == x.scalar_type() && s.scalar_type() == x.scalar_type()
              && c.numel() == x.size(0) * (head_dim / 2) && s.numel() == c.numel(),
              "rotary: cos/sin [T, head_dim / 2] of x's dtype");
  auto out = torch::empty({x.size(0), x.size(1)}, x.options());
  dispatch(x.scalar_type(), "rotary", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    rotary_rows<T>(raw_ptr<T>(x), raw_ptr<T>(c), raw_ptr<T>(s), raw_ptr<T>(out), x.size(0),
                   x.size(1) / head_dim, head_dim, x.stride(0));
  });
  return out;
}

// x, delta [T, n] (rows may be strided), weight [n], all of x's dtype -> (x + delta, RMSNorm
// of it), both [T, n] contiguous.
std::vector<torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor delta, torch::Tensor weight,
                                        double eps) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && delta.sizes() == x.sizes() && delta.stride(1) == 1
              && delta.scalar_type() == x.scalar_type() && weight.dim() == 1
              && weight.size(0) == x.size(1) && weight.scalar_type() == x.scalar_type()
              && weight.is_contiguous(),
              "add_rms_norm: x, delta [T, n] with contiguous rows, weight [n], one dtype");
  auto sum = torch::empty({x.size(0), x.size(1)}, x.options());
  auto out = torch::empty({x.size(0), x.size(1)}, x.options());
  dispatch(x.scalar_type(), "add_rms_norm", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    add_rms_norm_rows<T>(raw_ptr<T>(x), raw_ptr<T>(delta), raw_ptr<T>(weight), raw_ptr<T>(sum),
                         raw_ptr<T>(out), x.size(0), x.size(1), x.stride(0), delta.stride(0),
                         static_cast<float>(eps));
  });
  return {sum, out};
}

// x [T, groups * m] (rows may be strided), w1 = 1 + w [m] float32 -> [T, groups * m]
// contiguous, each group of m normalized alone.
torch::Tensor gemma_rms_norm(torch::Tensor x, torch::Tensor w1, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && w1.dim() == 1 && w1.size(0) > 0
              && x.size(1) % w1.size(0) == 0 && w1.scalar_type() == at::kFloat
              && w1.is_contiguous(),
              "gemma_rms_norm: x [T, groups * m] with contiguous rows, w1 [m] float32");
  auto out = torch::empty({x.size(0), x.size(1)}, x.options());
  const int64_t m = w1.size(0);
  dispatch(x.scalar_type(), "gemma_rms_norm", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gemma_rms_norm_rows<T>(raw_ptr<T>(x), w1.data_ptr<float>(), raw_ptr<T>(out), x.size(0),
                           x.size(1) / m, m, x.stride(0), static_cast<float>(eps));
  });
  return out;
}

// x, delta [T, n] (rows may be strided) of one dtype, w_post / w_next = 1 + w [n] float32
// (w_next may be empty) -> (x + GemmaNorm_post(delta), GemmaNorm_next of it or an empty
// tensor), [T, n] contiguous.
std::vector<torch::Tensor> gemma_norm_add_norm(torch::Tensor x, torch::Tensor delta,
                                               torch::Tensor w_post, torch::Tensor w_next,
                                               double eps) {
  const bool next = w_next.numel() > 0;
  auto ok_w = [&](const torch::Tensor& w) {
    return w.dim() == 1 && w.size(0) == x.size(1) && w.scalar_type() == at::kFloat
           && w.is_contiguous();
  };
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && delta.sizes() == x.sizes() && delta.stride(1) == 1
              && delta.scalar_type() == x.scalar_type() && ok_w(w_post) && (!next || ok_w(w_next)),
              "gemma_norm_add_norm: x, delta [T, n] with contiguous rows, one dtype; "
              "w_post, w_next [n] float32");
  auto sum = torch::empty({x.size(0), x.size(1)}, x.options());
  auto out = next ? torch::empty({x.size(0), x.size(1)}, x.options()) : torch::empty({0}, x.options());
  dispatch(x.scalar_type(), "gemma_norm_add_norm", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gemma_norm_add_norm_rows<T>(raw_ptr<T>(x), raw_ptr<T>(delta), w_post.data_ptr<float>(),
                                next ? w_next.data_ptr<float>() : nullptr, raw_ptr<T>(sum),
                                next ? raw_ptr<T>(out) : nullptr, x.size(0), x.size(1),
                                x.stride(0), delta.stride(0), static_cast<float>(eps));
  });
  return {sum, out};
}

// gate_up [T, 2 * inter] (rows may be strided) -> act(gate) * up [T, inter].
template <typename Act>
torch::Tensor act_mul(torch::Tensor gate_up, const char* name) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.stride(1) == 1 && gate_up.size(1) % 2 == 0,
              name, ": gate_up [T, 2 * inter] with contiguous rows");
  const int64_t inter = gate_up.size(1) / 2;
  auto out = torch::empty({gate_up.size(0), inter}, gate_up.options());
  dispatch(gate_up.scalar_type(), name, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    act_mul_rows<T, Act>(raw_ptr<T>(gate_up), raw_ptr<T>(out), gate_up.size(0), inter,
                         gate_up.stride(0));
  });
  return out;
}

torch::Tensor silu_mul(torch::Tensor gate_up) { return act_mul<Silu>(gate_up, "silu_mul"); }
torch::Tensor gelu_tanh_mul(torch::Tensor gate_up) {
  return act_mul<GeluTanh>(gate_up, "gelu_tanh_mul");
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "RMSNorm of each row (see the file's header).");
  m.def("rotary", &rotary, "Neox rotary embedding of each head of each row.");
  m.def("add_rms_norm", &add_rms_norm, "The residual add, then RMSNorm, of each row.");
  m.def("gemma_rms_norm", &gemma_rms_norm, "Gemma's (1 + w) RMSNorm of each group of each row.");
  m.def("gemma_norm_add_norm", &gemma_norm_add_norm,
        "Gemma's block output norm, the residual add, then the next block's input norm.");
  m.def("silu_mul", &silu_mul, "SiLU(gate) * up of each row of [gate | up].");
  m.def("gelu_tanh_mul", &gelu_tanh_mul, "tanh-GELU(gate) * up of each row of [gate | up].");
}
