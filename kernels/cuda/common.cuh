// Shared by every kernel source. No #include: the same text compiles under NVRTC (CuPy, at run
// time) and nvcc (the CI compile check) without either needing the CUDA headers on a search path.
// 16-bit floats are carried as raw bits and converted by hand (bf16) or by a PTX cvt (fp16).

struct bf16 { unsigned short bits; };
struct fp16 { unsigned short bits; };

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) { return __uint_as_float(((unsigned)v.bits) << 16); }
__device__ __forceinline__ float to_float(fp16 v) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits)); return f;
}

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_float<bf16>(float v) {
  bf16 r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // one instruction (sm_80+); the integer sequence below cost ~7 per element, which left the
  // LayerNorm and bias-GeLU kernels issue-bound on an H100 (ncu: SM throughput 55-74%)
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
#else
  // round to nearest even, NaN kept quiet
  unsigned u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) { r.bits = (unsigned short)((u >> 16) | 0x40u); return r; }
  u += 0x7fffu + ((u >> 16) & 1u);
  r.bits = (unsigned short)(u >> 16);
#endif
  return r;
}
template <> __device__ __forceinline__ fp16 from_float<fp16>(float v) {
  fp16 r; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(v)); return r;
}

#define NEG_INF __int_as_float(0xff800000)

// VEC elements of T moved as one aligned access (16 bytes when VEC * sizeof(T) == 16).
template <typename T, int VEC> struct alignas(sizeof(T) * VEC) Pack { T v[VEC]; };

template <typename T, int VEC>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[VEC]) {
  Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC>*>(p);
#pragma unroll
  for (int i = 0; i < VEC; ++i) out[i] = to_float(pk.v[i]);
}

template <typename A, typename B> struct same_type { static constexpr bool value = false; };
template <typename A> struct same_type<A, A> { static constexpr bool value = true; };

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[VEC]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (same_type<T, bf16>::value && VEC % 2 == 0) {  // two elements per cvt
    Pack<unsigned, VEC / 2> pk;
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i)
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pk.v[i]) : "f"(in[2 * i + 1]), "f"(in[2 * i]));
    *reinterpret_cast<Pack<unsigned, VEC / 2>*>(p) = pk;
    return;
  }
#endif
  Pack<T, VEC> pk;
#pragma unroll
  for (int i = 0; i < VEC; ++i) pk.v[i] = from_float<T>(in[i]);
  *reinterpret_cast<Pack<T, VEC>*>(p) = pk;
}

// VEC floats to `p`, 16 bytes a store where VEC allows (p then 16-byte aligned): a thread's VEC floats
// are contiguous, so single stores left each warp's store touching 32 sectors for 4 bytes each.
template <int VEC>
__device__ __forceinline__ void store_floats(float* p, const float (&in)[VEC]) {
  if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int k = 0; k < VEC; k += 4)
      *reinterpret_cast<Pack<float, 4>*>(p + k) = Pack<float, 4>{{in[k], in[k + 1], in[k + 2], in[k + 3]}};
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) p[k] = in[k];
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reductions; every thread gets the result. `scratch` holds >= 33 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.f;
  return warp_sum(v);
}
// N block-wide sums in one round of barriers; `scratch` holds >= 33 * N floats.
template <int N>
__device__ __forceinline__ void block_sums(float (&v)[N], float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = warp_sum(v[i]);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) scratch[33 * i + warp] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = warp_sum(lane < nwarps ? scratch[33 * i + lane] : 0.f);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : NEG_INF;
  return warp_max(v);
}

// One row's SLOTS vectors of this thread (vector v = tid + s * row_threads); slots past the row's
// end, or wholly past `last_col` (causal rows), are left untouched and must not be read.
template <typename T, int VEC, int SLOTS>
__device__ __forceinline__ void load_row(const T* row, int tid, int row_threads, int nvec, int last_col,
                                         float (&a)[SLOTS][VEC]) {
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    const int v = tid + s * row_threads;
    if (v < nvec && v * VEC <= last_col) load_vec<T, VEC>(row + (long long)v * VEC, a[s]);
  }
}

// A row loaded ahead of its use, held until taken: as loaded where RAW (16-bit vectors, in half the
// registers of their floats, for a row whose loads stay in flight while the previous row is worked
// on), as floats otherwise (fp32, or single 16-bit elements: a register each either way, and a row
// loaded after the previous one, where holding it as loaded cost fp16 registers). Slots past the
// row's end hold nothing and must not be read.
template <typename T, int VEC, int SLOTS, bool RAW>
struct NextRow {
  Pack<T, VEC> raw[RAW ? SLOTS : 1];
  float f[RAW ? 1 : SLOTS][VEC];
  __device__ __forceinline__ void load(const T* row, int tid, int row_threads, int nvec, int last_col) {
    if constexpr (RAW) {
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        const int v = tid + s * row_threads;
        if (v < nvec) raw[s] = *reinterpret_cast<const Pack<T, VEC>*>(row + (long long)v * VEC);
      }
    } else {
      load_row<T, VEC, SLOTS>(row, tid, row_threads, nvec, last_col, f);
    }
  }
  __device__ __forceinline__ void take(float (&to)[SLOTS][VEC]) const {
#pragma unroll
    for (int s = 0; s < SLOTS; ++s)
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        if constexpr (RAW) to[s][k] = to_float(raw[s].v[k]);
        else to[s][k] = f[s][k];
      }
  }
};

// Whether a row of T in vectors of VEC is held as loaded when it is loaded ahead (NextRow's RAW).
template <typename T, int VEC>
__host__ __device__ constexpr bool held_raw() { return sizeof(T) < 4 && VEC > 1; }
