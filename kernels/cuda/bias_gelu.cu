// y = gelu_tanh(x + bias) over rows of `cols` features; backward gives dx and per-row-chunk
// partial sums of dbias (summed over chunks by torch: a [chunks, cols] fp32 tensor, tiny).

__device__ __forceinline__ float gelu_tanh(float u) {
  const float t = tanhf(0.7978845608028654f * u * (1.f + 0.044715f * u * u));
  return 0.5f * u * (1.f + t);
}
__device__ __forceinline__ float gelu_tanh_grad(float u) {
  const float t = tanhf(0.7978845608028654f * u * (1.f + 0.044715f * u * u));
  return 0.5f * u * ((1.f - t * t) * (0.7978845608028654f + 0.1070322243f * u * u)) + 0.5f * (1.f + t);
}

// One thread per VEC consecutive elements, grid-stride; needs cols % VEC == 0.
template <typename T, int VEC>
__global__ void bias_gelu_fwd(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y,
                              long long n_vec, int cols) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_vec;
       i += (long long)gridDim.x * blockDim.x) {
    const long long e = i * VEC;
    const int c = (int)(e % cols);
    float a[VEC], b[VEC];
    load_vec<T, VEC>(x + e, a);
    load_vec<T, VEC>(bias + c, b);
#pragma unroll
    for (int k = 0; k < VEC; ++k) a[k] = gelu_tanh(a[k] + b[k]);
    store_vec<T, VEC>(y + e, a);
  }
}

// grid.x tiles the columns (one thread per VEC columns), grid.y splits the rows into chunks.
template <typename T, int VEC>
__global__ void bias_gelu_bwd(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ bias,
                              T* __restrict__ dx, float* __restrict__ dbias_partial, long long rows, int cols) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (c >= cols) return;
  const long long per = (rows + gridDim.y - 1) / gridDim.y;
  const long long r0 = blockIdx.y * per;
  const long long r1 = r0 + per < rows ? r0 + per : rows;
  float b[VEC], acc[VEC];
  load_vec<T, VEC>(bias + c, b);
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc[k] = 0.f;
#pragma unroll 4
  for (long long r = r0; r < r1; ++r) {
    const long long e = r * cols + c;
    float g[VEC], a[VEC];
    load_vec<T, VEC>(dy + e, g);
    load_vec<T, VEC>(x + e, a);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      g[k] *= gelu_tanh_grad(a[k] + b[k]);
      acc[k] += to_float(from_float<T>(g[k]));  // dbias sums the dx that is returned
    }
    store_vec<T, VEC>(dx + e, g);
  }
  float* out = dbias_partial + blockIdx.y * (long long)cols + c;
#pragma unroll
  for (int k = 0; k < VEC; ++k) out[k] = acc[k];
}
