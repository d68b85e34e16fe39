// y = gelu_tanh(x + bias) over rows of `cols` features; backward gives dx and per-row-chunk
// partial sums of dbias (summed over chunks by torch: a [chunks, cols] fp32 tensor, tiny).

// 0.5 * (1 + tanh(z)) == sigmoid(2z): one fast exp and one fast reciprocal instead of tanhf, whose
// precise software sequence made the kernel compute-bound. exp overflow gives s = 0, the exact limit.
__device__ __forceinline__ float gelu_sigmoid(float u) {
  const float z = 0.7978845608028654f * u * (1.f + 0.044715f * u * u);
  return __frcp_rn(1.f + __expf(-2.f * z));
}
__device__ __forceinline__ float gelu_tanh(float u) { return u * gelu_sigmoid(u); }
__device__ __forceinline__ float gelu_tanh_grad(float u) {
  // d/du [0.5 u (1 + tanh z)] = s + 2 u s (1 - s) dz/du, with s = sigmoid(2z), 1 - tanh^2 = 4 s (1 - s)
  const float s = gelu_sigmoid(u);
  return s + 2.f * u * s * (1.f - s) * (0.7978845608028654f + 0.1070322243f * u * u);
}

// One thread per VEC consecutive elements, grid-stride; needs cols % VEC == 0. The column advances
// by a constant each step, so it is updated by an add and a compare, not a 64-bit division.
template <typename T, int VEC>
__global__ void bias_gelu_fwd(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y,
                              long long n_vec, int cols) {
  const int row_vecs = cols / VEC;
  const long long stride = (long long)gridDim.x * blockDim.x;
  const int col_step = (int)(stride % row_vecs);
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  int cv = (int)(i % row_vecs);  // this vector's column, in vectors
  for (; i < n_vec; i += stride) {
    float a[VEC], b[VEC];
    load_vec<T, VEC>(x + i * VEC, a);
    load_vec<T, VEC>(bias + cv * VEC, b);
#pragma unroll
    for (int k = 0; k < VEC; ++k) a[k] = gelu_tanh(a[k] + b[k]);
    store_vec<T, VEC>(y + i * VEC, a);
    cv += col_step;
    if (cv >= row_vecs) cv -= row_vecs;
  }
}

// Backward: grid.x tiles the columns (one thread per VEC columns), grid.y splits the rows into
// chunks, contiguous or (INTERLEAVED) every gridDim.y-th row; ROWS rows of dy and x in flight per
// thread; each chunk's dbias partial sums its rows in order. PREFETCH (ROWS 1): the next row's dy and
// x loads issued before this row's work and held until it (NextRow: 16-bit vectors as loaded), two rows
// in flight for 6 more registers (bf16, sm_90: 54), where ROWS 2 took 19 more and half the resident threads.
template <typename T, int VEC, int ROWS, bool INTERLEAVED, bool PREFETCH = false>
__global__ void bias_gelu_bwd(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ bias,
                              T* __restrict__ dx, float* __restrict__ dbias_partial, long long rows, int cols) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (c >= cols) return;
  const long long per = (rows + gridDim.y - 1) / gridDim.y;
  const long long r0 = INTERLEAVED ? blockIdx.y : blockIdx.y * per;
  const long long r1 = INTERLEAVED ? rows : (r0 + per < rows ? r0 + per : rows);
  const long long step = INTERLEAVED ? gridDim.y : 1;  // between this chunk's consecutive rows
  float b[VEC], acc[VEC];
  load_vec<T, VEC>(bias + c, b);
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc[k] = 0.f;
  static_assert(!PREFETCH || ROWS == 1, "PREFETCH holds one next row");
  NextRow<T, VEC, 1, held_raw<T, VEC>()> next_dy, next_x;  // PREFETCH: the next row (unused otherwise)
  auto prefetch = [&](long long row) {  // this thread's VEC columns of the row
    next_dy.load(dy + row * cols + c, 0, 1, 1, VEC);
    next_x.load(x + row * cols + c, 0, 1, 1, VEC);
  };
  if (PREFETCH && r0 < r1) prefetch(r0);
  for (long long r = r0; r < r1; r += ROWS * step) {
    float g[ROWS][VEC], a[ROWS][VEC];
    if constexpr (PREFETCH) {
      next_dy.take(g);
      next_x.take(a);
      if (r + step < r1) prefetch(r + step);
    } else {
#pragma unroll
      for (int j = 0; j < ROWS; ++j) {
        if (r + j * step < r1) {
          load_vec<T, VEC>(dy + (r + j * step) * cols + c, g[j]);
          load_vec<T, VEC>(x + (r + j * step) * cols + c, a[j]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < ROWS; ++j) {
      if (r + j * step < r1) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          g[j][k] *= gelu_tanh_grad(a[j][k] + b[k]);
          acc[k] += to_float(from_float<T>(g[j][k]));  // dbias sums the dx that is returned
        }
        store_vec<T, VEC>(dx + (r + j * step) * cols + c, g[j]);
      }
    }
  }
  float* out = dbias_partial + blockIdx.y * (long long)cols + c;
#pragma unroll
  for (int k = 0; k < VEC; ++k) out[k] = acc[k];
}
