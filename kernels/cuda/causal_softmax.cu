// Megatron's scaled_upper_triang_masked_softmax: x is [batches, sq, sk] with sq == sk; row r of each
// batch keeps columns c <= r, y = softmax(scale * x) over them and y = 0 above the diagonal. Vectors
// entirely above the diagonal are never read. Row layout in registers as in layer_norm.cu.

template <bool WARP>
__device__ __forceinline__ float row_reduce_sum(float v, float* scratch) {
  return WARP ? warp_sum(v) : block_sum(v, scratch);
}
template <bool WARP>
__device__ __forceinline__ float row_reduce_max(float v, float* scratch) {
  return WARP ? warp_max(v) : block_max(v, scratch);
}

template <typename T, int VEC, int SLOTS, bool WARP>
__global__ void causal_softmax_fwd(const T* __restrict__ x, T* __restrict__ y, long long rows, int sq, int cols,
                                   float scale) {
  __shared__ float scratch[33];
  const int tid = WARP ? (threadIdx.x & 31) : threadIdx.x;
  const int row_threads = WARP ? 32 : blockDim.x;
  const int rows_per_block = WARP ? (blockDim.x >> 5) : 1;
  const int nvec = cols / VEC;
  for (long long row = (long long)blockIdx.x * rows_per_block + (WARP ? (threadIdx.x >> 5) : 0); row < rows;
       row += (long long)gridDim.x * rows_per_block) {
    const int last = (int)(row % sq);  // last unmasked column
    float a[SLOTS][VEC];
    float m = NEG_INF;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int v = tid + s * row_threads;
      if (v < nvec && v * VEC <= last) {
        load_vec<T, VEC>(x + row * cols + v * VEC, a[s]);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          a[s][k] = v * VEC + k <= last ? a[s][k] * scale : NEG_INF;
          m = fmaxf(m, a[s][k]);
        }
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) a[s][k] = NEG_INF;
      }
    }
    m = row_reduce_max<WARP>(m, scratch);
    float sum = 0.f;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) { a[s][k] = __expf(a[s][k] - m); sum += a[s][k]; }  // exp(-inf) = 0
    }
    const float inv = 1.f / row_reduce_sum<WARP>(sum, scratch);
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int v = tid + s * row_threads;
      if (v < nvec) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) a[s][k] *= inv;
        store_vec<T, VEC>(y + row * cols + v * VEC, a[s]);
      }
    }
  }
}

template <typename T, int VEC, int SLOTS, bool WARP>
__global__ void causal_softmax_bwd(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx,
                                   long long rows, int sq, int cols, float scale) {
  __shared__ float scratch[33];
  const int tid = WARP ? (threadIdx.x & 31) : threadIdx.x;
  const int row_threads = WARP ? 32 : blockDim.x;
  const int rows_per_block = WARP ? (blockDim.x >> 5) : 1;
  const int nvec = cols / VEC;
  for (long long row = (long long)blockIdx.x * rows_per_block + (WARP ? (threadIdx.x >> 5) : 0); row < rows;
       row += (long long)gridDim.x * rows_per_block) {
    const int last = (int)(row % sq);
    float p[SLOTS][VEC], g[SLOTS][VEC];
    float dot = 0.f;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int v = tid + s * row_threads;
      if (v < nvec && v * VEC <= last) {
        load_vec<T, VEC>(y + row * cols + v * VEC, p[s]);
        load_vec<T, VEC>(dy + row * cols + v * VEC, g[s]);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          if (v * VEC + k > last) p[s][k] = 0.f;
          dot += p[s][k] * g[s][k];
        }
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) { p[s][k] = 0.f; g[s][k] = 0.f; }
      }
    }
    dot = row_reduce_sum<WARP>(dot, scratch);
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int v = tid + s * row_threads;
      if (v < nvec) {
        float o[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) o[k] = scale * p[s][k] * (g[s][k] - dot);
        store_vec<T, VEC>(dx + row * cols + v * VEC, o);
      }
    }
  }
}
