// MinHash signatures of many documents (datasketch's affine32 scheme): sig[d, k] = min over document
// d's shingle hashes h of a[k] * fmix32(h) + b[k] (mod 2**32), 0xFFFFFFFF for a document without any.
// One block per document; each thread owns permutations k = threadIdx.x, threadIdx.x + blockDim.x, ...
// The document's mixed hashes are staged through shared memory in tiles, so each is read from global
// memory once per block. Integer arithmetic only: bit-identical to the CPU path (tasks/dedup/fused.py).

#define MINHASH_TILE 1024

__device__ __forceinline__ unsigned fmix32(unsigned h) {
  h ^= h >> 16; h *= 0x85EBCA6Bu; h ^= h >> 13; h *= 0xC2B2AE35u; return h ^ (h >> 16);
}

extern "C" __global__ void minhash_signatures(const unsigned* __restrict__ shingles,
                                              const long long* __restrict__ offsets,
                                              const unsigned* __restrict__ a, const unsigned* __restrict__ b,
                                              unsigned* __restrict__ sig, int num_perm) {
  __shared__ unsigned tile[MINHASH_TILE];
  const int d = blockIdx.x;
  const long long first = offsets[d], last = offsets[d + 1];
  unsigned best[8];  // up to 8 permutations per thread (num_perm <= 8 * blockDim.x)
  unsigned pa[8], pb[8];
  int mine = 0;
  for (int k = threadIdx.x; k < num_perm && mine < 8; k += blockDim.x, ++mine) {
    best[mine] = 0xFFFFFFFFu; pa[mine] = a[k]; pb[mine] = b[k];
  }
  for (long long start = first; start < last; start += MINHASH_TILE) {
    const int count = (int)min((long long)MINHASH_TILE, last - start);
    __syncthreads();
    for (int i = threadIdx.x; i < count; i += blockDim.x) tile[i] = fmix32(shingles[start + i]);
    __syncthreads();
    for (int i = 0; i < count; ++i) {
      const unsigned h = tile[i];
      #pragma unroll
      for (int m = 0; m < 8; ++m) {
        if (m < mine) best[m] = min(best[m], pa[m] * h + pb[m]);
      }
    }
  }
  int m = 0;
  for (int k = threadIdx.x; k < num_perm && m < 8; k += blockDim.x, ++m) sig[(long long)d * num_perm + k] = best[m];
}
