// A backward's partial sums ([sums, parts, cols] fp32: the LayerNorm's dgamma and dbeta, a row per
// block; the bias-GeLU's dbias, a row per row chunk) added up into [sums, cols] of the parameter's
// type, in one launch where torch's sum and cast were two kernels. A block takes COLS columns of one
// sum (blockIdx.y); a warp's lanes are 32 / COLS groups, each reading COLS floats of a partial row
// (8: a 32-byte sector), so a block of 1024 threads streams 128 partial rows at a time, ILP loads in
// flight per thread (256 blocks for 2 x 1024 columns); fewer parts, fewer warps (kernels/partial_sums.py).
// Every sum is taken in a fixed order (groups and warps by shuffles and shared memory, no atomics):
// the same bytes every run.
template <typename T, int COLS, int ILP>
__global__ void __launch_bounds__(1024) partial_sums(const float* __restrict__ parts, T* __restrict__ out, int n_parts,
                                                     int cols) {
  constexpr int GROUPS = 32 / COLS;
  __shared__ float warp_sums[32][COLS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int streams = warps * GROUPS, stream = warp * GROUPS + lane / COLS;
  const int c = blockIdx.x * COLS + lane % COLS;
  const float* p = parts + (long long)blockIdx.y * n_parts * cols + c;
  float total = 0.f;
  if (c < cols) {
    float acc[ILP] = {};
    int r = stream;
    for (; r + (ILP - 1) * streams < n_parts; r += ILP * streams) {
#pragma unroll
      for (int i = 0; i < ILP; ++i) acc[i] += p[(long long)(r + i * streams) * cols];
    }
#pragma unroll
    for (int i = 0; i < ILP; ++i) {  // the fewer than ILP rows left, their loads in flight together
      if (r + i * streams < n_parts) acc[i] += p[(long long)(r + i * streams) * cols];
    }
#pragma unroll
    for (int i = 0; i < ILP; ++i) total += acc[i];
  }
  // the warp's groups into its first COLS lanes (lanes a multiple of COLS apart hold the same column)
#pragma unroll
  for (int d = 16; d >= COLS; d >>= 1) total += __shfl_down_sync(0xffffffffu, total, d);
  if (lane < COLS) warp_sums[warp][lane] = total;
  __syncthreads();
  if (warp == 0) {  // lane: column lane % COLS of every GROUPS-th warp from lane / COLS, then folded
    float sum = 0.f;
    for (int w = lane / COLS; w < warps; w += GROUPS) sum += warp_sums[w][lane % COLS];
#pragma unroll
    for (int d = 16; d >= COLS; d >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, d);
    if (lane < COLS && c < cols) out[(long long)blockIdx.y * cols + c] = from_float<T>(sum);
  }
}
