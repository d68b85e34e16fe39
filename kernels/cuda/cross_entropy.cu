// Softmax cross-entropy over a chunk of logits [rows, cols] (cols = this rank's vocabulary slice,
// starting at vocab_start). Pass 1 (stats): each row's max and sum of exp(x - max), one read, online;
// the caller combines them across tensor-parallel ranks in torch. Pass 2 (grad): overwrite the logits
// in place with weight[row] * (softmax - onehot(target)), so the full-precision probabilities are
// never stored. One block per row.

template <typename T, int VEC>
__global__ void xent_stats(const T* __restrict__ logits, const long long* __restrict__ target, long long vocab_start,
                           float* __restrict__ row_max, float* __restrict__ row_sumexp,
                           float* __restrict__ target_logit, int cols) {
  __shared__ float scratch[33];
  const long long row = blockIdx.x;
  const T* xr = logits + row * cols;
  const int nvec = cols / VEC;
  float m = NEG_INF, s = 0.f;
  for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
    float a[VEC];
    load_vec<T, VEC>(xr + v * VEC, a);
    float vm = a[0];
#pragma unroll
    for (int k = 1; k < VEC; ++k) vm = fmaxf(vm, a[k]);
    const float nm = fmaxf(m, vm);
    if (nm == NEG_INF) {  // nothing above -inf yet (an fp16 logit overflowed): exp(-inf - -inf) is NaN
      // skipped, but a NaN in it is kept (fmaxf drops NaN: a row whose first vector was NaN gave a finite
      // loss and NaN gradients, where torch's max, and so the loss, is NaN)
#pragma unroll
      for (int k = 0; k < VEC; ++k) if (a[k] != a[k]) s = a[k];
      continue;
    }
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc += __expf(a[k] - nm);
    s = s * __expf(m - nm) + acc;  // m = -inf at first: exp(-inf) = 0
    m = nm;
  }
  const float bm = block_max(m, scratch);
  s = block_sum(m == NEG_INF ? (s != s ? s : 0.f) : s * __expf(m - bm), scratch);
  if (threadIdx.x == 0) {
    row_max[row] = bm;
    row_sumexp[row] = s;
    const long long t = target[row] - vocab_start;
    target_logit[row] = (t >= 0 && t < cols) ? to_float(xr[t]) : 0.f;
  }
}

template <typename T, int VEC>
__global__ void xent_grad(T* __restrict__ logits, const long long* __restrict__ target, long long vocab_start,
                          const float* __restrict__ lse, const float* __restrict__ weight, int cols) {
  const long long row = blockIdx.x;
  T* xr = logits + row * cols;
  const float w = weight[row], l = lse[row];
  const long long t = target[row] - vocab_start;
  const int nvec = cols / VEC;
  for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
    float a[VEC];
    load_vec<T, VEC>(xr + v * VEC, a);
#pragma unroll
    for (int k = 0; k < VEC; ++k) a[k] = w * (__expf(a[k] - l) - (v * VEC + k == t ? 1.f : 0.f));
    store_vec<T, VEC>(xr + v * VEC, a);
  }
}

// Backward: the gradients held since forward times the incoming gradient, a device scalar, in fp32,
// written in the parameters' dtype. torch's own product rounds a CUDA 0-dim fp32 operand to a bf16
// tensor's dtype first (DeepSpeed's 1/3 for 3 accumulation steps became 0.33398: every gradient
// x1.0018). Grid-stride, VEC elements per step; fp16 reads its fp32-held gradients (deferred factor).
template <typename TIN, typename TOUT, int VEC>
__global__ void xent_scale(const TIN* __restrict__ held, TOUT* __restrict__ out, const float* __restrict__ factor,
                           long long n_vec) {
  const float f = *factor;
  for (long long v = blockIdx.x * (long long)blockDim.x + threadIdx.x; v < n_vec;
       v += (long long)gridDim.x * blockDim.x) {
    float a[VEC];
    load_vec<TIN, VEC>(held + v * VEC, a);
#pragma unroll
    for (int k = 0; k < VEC; ++k) a[k] *= f;
    store_vec<TOUT, VEC>(out + v * VEC, a);
  }
}
