// LayerNorm over the last dimension with fp32 statistics. A row lives in registers: SLOTS vectors of
// VEC elements per thread. WARP = true: one warp per row (short rows, shuffle-only reductions, several
// rows per block); WARP = false: one block per row. Forward, STREAM = true: gamma and beta are read
// from cache for every row instead of held in registers, which leaves room to keep the next row's
// loads in flight (for a warp holding a long row); a 16-bit row loaded ahead waits as loaded, not as
// floats (NextRow: 79 registers instead of 94 on sm_90 for 1024 bf16). Backward computes dx and, in
// the same pass, this block's partial sums of dgamma and dbeta ([blocks, cols] fp32), which
// partial_sums.cu adds up.

template <bool WARP>
__device__ __forceinline__ float row_sum(float v, float* scratch) {
  return WARP ? warp_sum(v) : block_sum(v, scratch);
}

template <typename T, int VEC, int SLOTS, bool WARP, bool STREAM = false>
__global__ void layer_norm_fwd(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta,
                               T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                               long long rows, int cols, float eps) {
  __shared__ float scratch[33];
  const int tid = WARP ? (threadIdx.x & 31) : threadIdx.x;
  const int row_threads = WARP ? 32 : blockDim.x;
  const int rows_per_block = WARP ? (blockDim.x >> 5) : 1;
  const int nvec = cols / VEC;
  float g[SLOTS][VEC], b[SLOTS][VEC];
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    const int v = tid + s * row_threads;
    if (!STREAM && v < nvec) { load_vec<T, VEC>(gamma + v * VEC, g[s]); load_vec<T, VEC>(beta + v * VEC, b[s]); }
  }
  constexpr bool PREFETCH = STREAM || SLOTS * VEC <= 16;  // measured on an H200: 0.036 -> 0.031 ms at 16384 x 1024 bf16
  const long long stride = (long long)gridDim.x * rows_per_block;
  long long row = (long long)blockIdx.x * rows_per_block + (WARP ? (threadIdx.x >> 5) : 0);
  float a[SLOTS][VEC];
  NextRow<T, VEC, SLOTS, PREFETCH && held_raw<T, VEC>()> next;
  if (row < rows) next.load(x + row * cols, tid, row_threads, nvec, cols);
  for (; row < rows; row += stride) {
    next.take(a);
    // the next row's loads are in flight while this row is reduced and written (short rows only:
    // for long rows the second copy of the row would spill registers, so they load after the row)
    if (PREFETCH && row + stride < rows) next.load(x + (row + stride) * cols, tid, row_threads, nvec, cols);
    float sum = 0.f;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      if (tid + s * row_threads < nvec) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) sum += a[s][k];
      }
    }
    const float mean = row_sum<WARP>(sum, scratch) / cols;
    float sq = 0.f;  // two-pass variance from registers: no cancellation
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      if (tid + s * row_threads < nvec) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) { const float d = a[s][k] - mean; sq += d * d; }
      }
    }
    const float rstd = rsqrtf(row_sum<WARP>(sq, scratch) / cols + eps);
    T* yr = y + row * cols;
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int v = tid + s * row_threads;
      if (v < nvec) {
        if (STREAM) { load_vec<T, VEC>(gamma + v * VEC, g[s]); load_vec<T, VEC>(beta + v * VEC, b[s]); }
        float o[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) o[k] = (a[s][k] - mean) * rstd * g[s][k] + b[s][k];
        store_vec<T, VEC>(yr + v * VEC, o);
      }
    }
    if (tid == 0) { mean_out[row] = mean; rstd_out[row] = rstd; }
    if (!PREFETCH && row + stride < rows) next.load(x + (row + stride) * cols, tid, row_threads, nvec, cols);
  }
}

// acc[v * VEC + k] += part[s][k] for this lane's vectors v = lane + 32 s: 16-byte shared accesses
// where VEC allows (8 lanes 32 bytes apart: 2-way bank conflicts, not the 8-way of single floats).
template <int VEC, int SLOTS>
__device__ __forceinline__ void add_to_shared(float* acc, const float (&part)[SLOTS][VEC], int lane, int nvec) {
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    const int v = lane + s * 32;
    if (v >= nvec) continue;
    if constexpr (VEC % 4 == 0) {
#pragma unroll
      for (int k = 0; k < VEC; k += 4) {
        Pack<float, 4>* p = reinterpret_cast<Pack<float, 4>*>(acc + v * VEC + k);
        Pack<float, 4> t = *p;
#pragma unroll
        for (int i = 0; i < 4; ++i) t.v[i] += part[s][k + i];
        *p = t;
      }
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[v * VEC + k] += part[s][k];
    }
  }
}

// Variants measured against the defaults by benchmarks/kernel_sweep.py. ROWS (block layout): rows per
// iteration (their loads in flight together, their four sums in one round of barriers). SHARED_ACC:
// this thread's dgamma/dbeta accumulators in shared memory instead of 2 * SLOTS * VEC registers (more
// resident blocks), laid out [warp][slot][element][thread of the row] there: conflict-free, and each
// thread owns its entries, so they need no barrier. With WARP, it is what makes a warp per row fit a
// long row: gamma is then read from cache for every row, as the streamed forward does, and the row's
// x and dy are all a lane holds; no block barrier is left in the row loop. PREFETCH: the next row's x
// and dy loads are issued before this row's reductions and stay in flight through them (NextRow:
// 16-bit vectors held as loaded, in half the registers of their floats).
template <typename T, int VEC, int SLOTS, bool WARP, int ROWS = 1, bool SHARED_ACC = false, bool PREFETCH = false>
__global__ void layer_norm_bwd(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ gamma,
                               const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                               T* __restrict__ dx, float* __restrict__ dgamma_part, float* __restrict__ dbeta_part,
                               long long rows, int cols) {
  static_assert(!WARP || ROWS == 1, "ROWS is for the block layout");
  static_assert(!PREFETCH || ROWS == 1, "PREFETCH holds one next row");
  constexpr int ACC = SHARED_ACC ? 1 : SLOTS;  // register accumulators (unused with SHARED_ACC)
  constexpr bool GAMMA_CACHED = WARP && SHARED_ACC;
  __shared__ float scratch[66 * ROWS];
  // SHARED_ACC: 2 * SLOTS * VEC * blockDim.x floats; else WARP: 2 * cols, the block's dgamma and dbeta.
  // 16-byte aligned as declared (add_to_shared's accesses): CUDA guarantees a float array's 4 bytes only
  extern __shared__ __align__(16) float block_acc[];
  const int tid = WARP ? (threadIdx.x & 31) : threadIdx.x;
  const int row_threads = WARP ? 32 : blockDim.x;
  const int rows_per_block = WARP ? (blockDim.x >> 5) : 1;
  const int nvec = cols / VEC;
  float g[SLOTS][VEC], ga[ACC][VEC], ba[ACC][VEC];
  float* my_acc = block_acc + (WARP ? (threadIdx.x >> 5) * 2 * SLOTS * VEC * 32 : 0);  // this row's threads'
  // this thread's accumulators of element k of slot s: dgamma's (`beta` false) or dbeta's
  auto acc = [&](int s, int k, bool beta) -> float& {
    if constexpr (SHARED_ACC) return my_acc[((beta ? SLOTS : 0) + s) * VEC * row_threads + k * row_threads + tid];
    else return beta ? ba[s][k] : ga[s][k];
  };
#pragma unroll
  for (int s = 0; s < SLOTS; ++s) {
    const int v = tid + s * row_threads;
    if (!GAMMA_CACHED && v < nvec) load_vec<T, VEC>(gamma + v * VEC, g[s]);
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc(s, k, false) = acc(s, k, true) = 0.f;
  }
  const float inv_cols = 1.f / cols;
  // (an earlier prefetching variant held the next row as floats, with gamma read from cache: 0.41 of
  // peak bandwidth on the H100 against 0.47, its extra registers cost resident blocks)
  const long long stride = (long long)gridDim.x * rows_per_block * ROWS;
  long long first = ((long long)blockIdx.x * rows_per_block + (WARP ? (threadIdx.x >> 5) : 0)) * ROWS;
  NextRow<T, VEC, SLOTS, held_raw<T, VEC>()> next_x, next_dy;  // PREFETCH: the next row (unused otherwise)
  float next_mean = 0.f, next_rstd = 0.f;
  auto prefetch = [&](long long row) {
    next_mean = mean_in[row];
    next_rstd = rstd_in[row];
    next_x.load(x + row * cols, tid, row_threads, nvec, cols);
    next_dy.load(dy + row * cols, tid, row_threads, nvec, cols);
  };
  if (PREFETCH && first < rows) prefetch(first);
  for (; first < rows; first += stride) {
    float mean[ROWS], rstd[ROWS], xh[ROWS][SLOTS][VEC], d[ROWS][SLOTS][VEC], sums[2 * ROWS];
    if constexpr (PREFETCH) {
      mean[0] = next_mean;
      rstd[0] = next_rstd;
      next_x.take(xh[0]);
      next_dy.take(d[0]);
      if (first + stride < rows) prefetch(first + stride);
    } else {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        if (first + r < rows) {  // a row past the end is neither read nor written
          mean[r] = mean_in[first + r];
          rstd[r] = rstd_in[first + r];
          load_row<T, VEC, SLOTS>(x + (first + r) * cols, tid, row_threads, nvec, cols, xh[r]);
          load_row<T, VEC, SLOTS>(dy + (first + r) * cols, tid, row_threads, nvec, cols, d[r]);
        }
      }
    }
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int v = tid + s * row_threads;
      if (v < nvec) {
        if (GAMMA_CACHED) load_vec<T, VEC>(gamma + v * VEC, g[s]);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          // from the accumulator, not from 0: one rounding per product (fma), as for a single row
          float pg = acc(s, k, false), pb = acc(s, k, true);
#pragma unroll
          for (int r = 0; r < ROWS; ++r) {
            if (first + r < rows) {
              xh[r][s][k] = (xh[r][s][k] - mean[r]) * rstd[r];
              pg += d[r][s][k] * xh[r][s][k];
              pb += d[r][s][k];
              d[r][s][k] *= g[s][k];  // from here on d is dy * gamma
            }
          }
          acc(s, k, false) = pg;
          acc(s, k, true) = pb;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      float s1 = 0.f, s2 = 0.f;
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        if (first + r < rows && tid + s * row_threads < nvec) {
#pragma unroll
          for (int k = 0; k < VEC; ++k) { s1 += d[r][s][k]; s2 += d[r][s][k] * xh[r][s][k]; }
        }
      }
      sums[2 * r] = s1;
      sums[2 * r + 1] = s2;
    }
    if constexpr (WARP) {
      sums[0] = warp_sum(sums[0]);
      sums[1] = warp_sum(sums[1]);
    } else {
      block_sums<2 * ROWS>(sums, scratch);
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float s1 = sums[2 * r] * inv_cols, s2 = sums[2 * r + 1] * inv_cols;
#pragma unroll
      for (int s = 0; s < SLOTS; ++s) {
        const int v = tid + s * row_threads;
        if (first + r < rows && v < nvec) {
          float o[VEC];
#pragma unroll
          for (int k = 0; k < VEC; ++k) o[k] = rstd[r] * (d[r][s][k] - s1 - xh[r][s][k] * s2);
          store_vec<T, VEC>(dx + (first + r) * cols + v * VEC, o);
        }
      }
    }
  }
  if constexpr (WARP && SHARED_ACC) {  // the block's warps' accumulators added in warp order (the same
                                      // sums every run, as atomics would not give) into one partial row
    __syncthreads();
    const int warps = blockDim.x >> 5;
    for (int c = threadIdx.x; c < nvec * VEC; c += blockDim.x) {
      const int v = c / VEC, k = c % VEC, lane = v & 31, s = v >> 5;
      float pg = 0.f, pb = 0.f;
      for (int w = 0; w < warps; ++w) {
        const float* a = block_acc + w * 2 * SLOTS * VEC * 32;
        pg += a[(s * VEC + k) * 32 + lane];
        pb += a[((SLOTS + s) * VEC + k) * 32 + lane];
      }
      dgamma_part[blockIdx.x * (long long)cols + c] = pg;
      dbeta_part[blockIdx.x * (long long)cols + c] = pb;
    }
  } else if constexpr (WARP) {  // fold the block's warps together in shared memory, in warp order (the same
                                // sums every run, as atomics would not give), before writing one partial row
    for (int i = threadIdx.x; i < 2 * cols; i += blockDim.x) block_acc[i] = 0.f;
    for (int w = 0; w < rows_per_block; ++w) {
      __syncthreads();
      if ((threadIdx.x >> 5) == w) {
        add_to_shared<VEC, SLOTS>(block_acc, ga, tid, nvec);
        add_to_shared<VEC, SLOTS>(block_acc + cols, ba, tid, nvec);
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
      dgamma_part[blockIdx.x * (long long)cols + i] = block_acc[i];
      dbeta_part[blockIdx.x * (long long)cols + i] = block_acc[cols + i];
    }
  } else {
#pragma unroll
    for (int s = 0; s < SLOTS; ++s) {
      const int v = tid + s * row_threads;
      if (v < nvec) {
        float pg[VEC], pb[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) { pg[k] = acc(s, k, false); pb[k] = acc(s, k, true); }
        store_floats<VEC>(dgamma_part + blockIdx.x * (long long)cols + v * VEC, pg);
        store_floats<VEC>(dbeta_part + blockIdx.x * (long long)cols + v * VEC, pb);
      }
    }
  }
}
