// The CUDA device side, emulated on the CPU, for running the kernels of kernels/cuda/ without a GPU
// (tests/gpu_emulator.py compiles a kernel source after this header with the host C++ compiler, and
// links the runtime this header defines under EMU_RUNTIME, compiled once).
// Every CUDA thread of a block is a fiber (a stack of its own, gpu_emulator_switch.h) on one OS
// thread; a fiber runs until it waits at __syncthreads or at a warp shuffle, and the scheduler
// resumes the fibers whose barrier has opened:
// one warp as far as it gets, then another (even seeds), or every thread once a round (odd seeds),
// warps, lanes and blocks in an order drawn from the seed. So a missing barrier between two threads'
// accesses to shared memory, a barrier not every live thread reaches (deadlock), a shuffle in a warp
// with exited lanes, and a block that reads shared memory no thread of it wrote (NaN bytes) all show.
// A thread runs from one barrier to the next without a switch, so two threads' unsynchronised
// read-modify-writes of one word never lose an update here: built with races (gpu_emulator_races.h),
// every shared-memory access is checked against the others of its barrier interval instead. Not
// emulated: what only the hardware decides: timing, caches, register limits, FMA contraction, __expf.
// Blocks run one at a time; shared memory (static and dynamic, gpu_emulator_shared.h) lives in mappings
// that end at a page no thread may touch, so an overrun faults (or, in the less than one element left
// before that page, reads NaN and fails the block if written).
#pragma once
#include <sys/mman.h>

#include <csignal>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpu_emulator_switch.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

struct dim3 { unsigned x = 1, y = 1, z = 1; };
inline dim3 threadIdx, blockIdx, blockDim, gridDim;  // the running fiber's, set at every switch
constexpr int warpSize = 32;

namespace emu {

struct Fiber {
  Context ctx;
  dim3 idx;
  int wait = 0;  // 0: runnable, 1: at __syncthreads, 2: at its warp's barrier
  unsigned gen = 0;  // the barrier generation it waits to see pass
  bool done = false;
};

// A shared array: `bytes` at `p`, then `gap` bytes (0xff, checked after every block) up to a page no
// thread may touch; `map`: the mapping's address and size.
struct Region {
  unsigned char* p = nullptr;
  size_t bytes = 0, gap = 0;
  std::pair<void*, size_t> map{nullptr, 0};
};

struct Barrier {  // opens when every live member has arrived; a member that exits stops counting
  unsigned gen = 0, arrived = 0, live = 0;
};

struct Launch {
  void (*body)(void*) = nullptr;
  void* closure = nullptr;
  std::vector<Fiber> fibers;
  std::vector<Barrier> warps;
  std::vector<unsigned long long> lanes;  // shuffle exchange: 32 per warp
  Barrier block;
  int current = -1;
  Context scheduler;
  char* stacks = nullptr;
  size_t stack_bytes = 0, stacks_size = 0;
  unsigned long long rng = 1;
  bool greedy = true;
  unsigned long long block_serial = 0;  // blocks run so far: with the block barrier's generation, an interval
  std::string error;
  Region dynamic;  // this launch's dynamic shared memory: every extern __shared__ array starts there
  std::vector<Region> static_shared;  // the __shared__ arrays met so far, refilled each block
  volatile sig_atomic_t faulted = 0;  // a thread touched a protected page, or trapped
  int fault_signal = 0;
  void* fault_address = nullptr;
  struct sigaction old[4];
  stack_t old_alt;
  std::vector<char> alt_stack = std::vector<char>(1 << 16);  // the fault handler's: a fiber's may be exhausted
};
constexpr int SIGNALS[4] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
inline Launch L;

// The runtime (scheduler, barriers, fault handling, shared memory, race checks): declared here, defined
// under EMU_RUNTIME, which gpu_emulator.py compiles once per set of flags into an object that every
// kernel's library links. A kernel's unit then compiles its kernel, not the whole emulator again.
void fail(const std::string& why);
std::string where();
void arrive(Barrier& b, int kind);
Region guarded(size_t bytes, size_t align);  // gpu_emulator_shared.h: shared memory
void refill_shared();
void check_gaps();
void watch(void* p, size_t bytes);  // gpu_emulator_races.h: shared memory to check for races
void unwatch(void* p);
// launch() below, past its checks of the kernel's parameters
std::string run_launch(void (*body)(void*), void* closure, const unsigned* grid, const unsigned* block,
                       size_t shared_bytes, unsigned long long seed, size_t dynamic_align);

#ifdef EMU_RUNTIME
unsigned long long next_random() {  // xorshift64*
  L.rng ^= L.rng >> 12; L.rng ^= L.rng << 25; L.rng ^= L.rng >> 27;
  return L.rng * 2685821657736338717ull;
}

void fail(const std::string& why) {
  if (L.error.empty()) L.error = why;
  // park the fiber for good: the scheduler stops at the first error
  switch_context(L.fibers[L.current].ctx, L.scheduler);
}

std::string where() {
  const Fiber& f = L.fibers[L.current];
  char b[96];
  snprintf(b, sizeof b, "block (%u,%u,%u) thread %u", blockIdx.x, blockIdx.y, blockIdx.z, f.idx.x);
  return b;
}

// Opens `b` if every live member has arrived (the last to arrive, or a member exiting, completes it).
bool open_if_complete(Barrier& b) {
  if (b.arrived == 0 || b.arrived != b.live) return false;
  b.arrived = 0;
  ++b.gen;
  return true;
}

// Arrive at a barrier; the last to arrive opens it and goes on, the others wait to be resumed.
void arrive(Barrier& b, int kind) {
  ++b.arrived;
  if (open_if_complete(b)) return;
  Fiber& f = L.fibers[L.current];
  f.wait = kind;
  f.gen = b.gen;
  switch_context(f.ctx, L.scheduler);
}

void exit_fiber() {  // a returned thread no longer counts at its block's or warp's barriers
  Barrier& warp = L.warps[L.current / 32];
  if (warp.arrived > 0)  // its lanes wait at a shuffle: they would read what it never wrote
    fail(where() + ": returned while " + std::to_string(warp.arrived) + " lanes of its warp wait at a shuffle");
  Barrier* bs[2] = {&L.block, &warp};
  for (Barrier* b : bs) {
    --b->live;
    open_if_complete(*b);
  }
  L.fibers[L.current].done = true;
}

// A fault or trap inside a fiber (a protected page touched, an integer division by zero, a misaligned
// access trapped by -fsanitize=alignment) ends the launch with an error; one anywhere else goes to
// the handler that was there before.
void on_fault(int sig, siginfo_t* info, void*) {
  if (L.current < 0 || L.faulted) {
    for (int i = 0; i < 4; ++i)
      if (SIGNALS[i] == sig) sigaction(sig, &L.old[i], nullptr);
    return;  // the instruction faults again, under the previous handler
  }
  L.faulted = 1;
  L.fault_signal = sig;
  L.fault_address = info->si_addr;
  sigset_t caught;  // blocked while its handler runs, which is left here for good
  sigemptyset(&caught);
  sigaddset(&caught, sig);
  sigprocmask(SIG_UNBLOCK, &caught, nullptr);
  Context abandoned;
  switch_context(abandoned, L.scheduler);  // back into run_block, as if the fiber had yielded
}

void trampoline() {
  L.body(L.closure);
  exit_fiber();
  switch_context(L.fibers[L.current].ctx, L.scheduler);  // done: never resumed
}

bool waiting(const Fiber& f) {
  if (f.wait == 1) return L.block.gen == f.gen;
  if (f.wait == 2) return L.warps[(&f - L.fibers.data()) / 32].gen == f.gen;
  return false;
}

// What on_fault caught in thread `t`, and, where the address tells, the shared memory it ran past.
std::string fault_message(unsigned t) {
  char b[192];
  const char* what = L.fault_signal == SIGFPE   ? "arithmetic trap (integer division by zero?)"
                     : L.fault_signal == SIGILL ? "trap (a misaligned access, under -fsanitize=alignment)"
                                                : "fault";
  snprintf(b, sizeof b, "%s at address %p in block (%u,%u,%u) thread %u", what, L.fault_address, blockIdx.x,
           blockIdx.y, blockIdx.z, t);
  std::string message = b;
  auto* at = (unsigned char*)L.fault_address;
  auto within = [&](void* p, size_t n) { return at >= (unsigned char*)p && at < (unsigned char*)p + n; };
  if (within(L.dynamic.map.first, L.dynamic.map.second)) message += ": past the end of dynamic shared memory";
  for (const Region& r : L.static_shared)
    if (within(r.map.first, r.map.second)) message += ": past the end of a __shared__ array";
  return message;
}

void run_block(unsigned threads) {
  ++L.block_serial;
  L.fibers.assign(threads, Fiber{});
  const unsigned nwarps = (threads + 31) / 32;
  L.warps.assign(nwarps, Barrier{});
  L.lanes.assign(nwarps * 32, 0);
  L.block = Barrier{0, 0, threads};
  for (unsigned w = 0; w < nwarps; ++w) L.warps[w].live = std::min(32u, threads - 32 * w);
  refill_shared();
  for (unsigned t = 0; t < threads; ++t) {
    Fiber& f = L.fibers[t];
    f.idx = dim3{t % blockDim.x, (t / blockDim.x) % blockDim.y, t / (blockDim.x * blockDim.y)};
    // its stack above its guard page
    make_context(f.ctx, L.stacks + (size_t)t * (L.stack_bytes + 4096) + 4096, L.stack_bytes, trampoline);
  }
  // Even seeds: a warp runs as far as it can (through its shuffles) before another is picked, so warps
  // run ahead of one another, as on a GPU, which is what a missing barrier between them needs to show.
  // Odd seeds: every runnable thread once a round (warps and their lanes interleaved).
  std::vector<unsigned> warp_order(nwarps), lane_order(32);
  for (unsigned w = 0; w < nwarps; ++w) warp_order[w] = w;
  unsigned live = threads;
  while (live && L.error.empty()) {
    for (unsigned w = nwarps; w > 1; --w) std::swap(warp_order[w - 1], warp_order[next_random() % w]);
    bool progress = false;
    for (unsigned w : warp_order) {
      const unsigned lanes = std::min(32u, threads - 32 * w);
      for (bool ran = true; ran; ran = ran && L.greedy) {
        ran = false;
        for (unsigned l = 0; l < lanes; ++l) lane_order[l] = l;
        for (unsigned l = lanes; l > 1; --l) std::swap(lane_order[l - 1], lane_order[next_random() % l]);
        for (unsigned l = 0; l < lanes; ++l) {
          const unsigned t = 32 * w + lane_order[l];
          Fiber& f = L.fibers[t];
          if (f.done || waiting(f)) continue;
          f.wait = 0;
          L.current = (int)t;
          threadIdx = f.idx;
          switch_context(L.scheduler, f.ctx);
          L.current = -1;
          if (L.faulted) L.error = fault_message(t);
          ran = progress = true;
          if (!L.error.empty()) return;
          if (f.done) --live;
        }
      }
    }
    if (!progress) {
      unsigned at_block = 0, at_warp = 0;
      for (const Fiber& f : L.fibers) (f.done ? 0 : f.wait == 1 ? ++at_block : ++at_warp);
      char b[160];
      snprintf(b, sizeof b, "deadlock in block (%u,%u,%u): %u threads wait at __syncthreads, %u at a warp shuffle, "
               "%u returned", blockIdx.x, blockIdx.y, blockIdx.z, at_block, at_warp, threads - live);
      L.error = b;
    }
  }
  if (L.error.empty()) check_gaps();
}
#endif  // EMU_RUNTIME

template <typename T>
T exchange(unsigned mask, T v, int lane_from_delta, bool xor_lanes, int width) {
  const int t = L.current, w = t / 32, lane = t % 32;
  if (mask != 0xffffffffu || width != 32) fail(where() + ": shuffle with a partial mask or width (not emulated)");
  if (L.warps[w].live != 32) fail(where() + ": full-mask shuffle in a warp with " + std::to_string(L.warps[w].live) +
                                  " live lanes (undefined on a GPU)");
  static_assert(sizeof(T) <= 8, "shuffles of up to 8 bytes");
  unsigned long long bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  L.lanes[w * 32 + lane] = bits;
  arrive(L.warps[w], 2);  // every lane has written
  if (L.warps[w].live != 32) fail(where() + ": a lane of its warp returned during a shuffle");
  const int src = xor_lanes ? (lane ^ lane_from_delta) : (lane + lane_from_delta < 32 ? lane + lane_from_delta : lane);
  bits = L.lanes[w * 32 + src];
  arrive(L.warps[w], 2);  // every lane has read before any writes its next value
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

// The kernels' vector accesses (reinterpret_cast to Pack<T, VEC>, rewritten to this): a GPU faults on
// a 16-byte access at an address not a multiple of 16, where x86 would not.
template <typename To, typename From>
To aligned_cast(From* p) {
  constexpr size_t align = alignof(std::remove_cv_t<std::remove_pointer_t<To>>);
  if (reinterpret_cast<uintptr_t>(p) % align) {
    char b[96];
    snprintf(b, sizeof b, ": misaligned %zu-byte access at %p", align, (const void*)p);
    fail(where() + b);
  }
  return reinterpret_cast<To>(p);
}

inline unsigned short bf16_rn(float v) {  // cvt.rn.bf16.f32: nearest even, NaN canonical
  if (std::isnan(v)) return 0x7fff;
  unsigned u;
  std::memcpy(&u, &v, 4);
  const unsigned lower = u & 0xffffu, upper = u >> 16;
  const bool up = lower > 0x8000u || (lower == 0x8000u && (upper & 1u));
  return (unsigned short)(upper + (up ? 1u : 0u));
}

// The inline PTX of kernels/cuda/common.cuh, as tests/gpu_emulator.py rewrites each asm statement.
inline float ptx_cvt_f32_f16(unsigned short h) { _Float16 x; std::memcpy(&x, &h, 2); return (float)x; }
inline unsigned short ptx_cvt_rn_f16_f32(float v) { _Float16 x = (_Float16)v; unsigned short h; std::memcpy(&h, &x, 2); return h; }
inline unsigned short ptx_cvt_rn_bf16_f32(float v) { return bf16_rn(v); }
// d = {a -> upper half, b -> lower half} (PTX ISA, cvt with .bf16x2)
inline unsigned ptx_cvt_rn_bf16x2_f32(float a, float b) { return ((unsigned)bf16_rn(a) << 16) | bf16_rn(b); }

template <typename... A, size_t... I>
void call(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
  kernel(*reinterpret_cast<A*>(args[I])...);
}

template <typename... A>
struct Closure { void (*kernel)(A...); void** args; };

template <typename... A>
void run_closure(void* c) {
  auto* k = static_cast<Closure<A...>*>(c);
  call(k->kernel, k->args, std::index_sequence_for<A...>{});
}

// Launch `kernel` over the grid; `args[i]` points to parameter i's value, `sizes[i]` its size in
// bytes as the caller packed it; `dynamic_align`: the largest declared alignment of the source's
// extern __shared__ arrays. Returns "" or the first error.
template <typename... A>
std::string launch(void (*kernel)(A...), const unsigned* grid, const unsigned* block, size_t shared_bytes,
                   void** args, const int* sizes, int nargs, unsigned long long seed, size_t dynamic_align) {
  const size_t expected[] = {sizeof(A)..., 0};
  if (nargs != (int)sizeof...(A)) return "kernel takes " + std::to_string(sizeof...(A)) + " arguments, given " + std::to_string(nargs);
  for (int i = 0; i < nargs; ++i)
    if ((size_t)sizes[i] != expected[i])
      return "argument " + std::to_string(i) + " is " + std::to_string(sizes[i]) + " bytes, the kernel's parameter " +
             std::to_string(expected[i]);
  Closure<A...> closure{kernel, args};
  return run_launch(run_closure<A...>, &closure, grid, block, shared_bytes, seed, dynamic_align);
}

#ifdef EMU_RUNTIME
std::string run_launch(void (*body)(void*), void* closure, const unsigned* grid, const unsigned* block,
                       size_t shared_bytes, unsigned long long seed, size_t dynamic_align) {
  const unsigned threads = block[0] * block[1] * block[2];
  if (threads == 0 || threads > 1024 || block[2] > 64) return "a block of " + std::to_string(block[0]) + " x " +
    std::to_string(block[1]) + " x " + std::to_string(block[2]) + " threads: a GPU launches at most 1024, z at most 64";
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0 || grid[0] > 2147483647u || grid[1] > 65535 || grid[2] > 65535)
    return "a grid of " + std::to_string(grid[0]) + " x " + std::to_string(grid[1]) + " x " + std::to_string(grid[2]) +
           ": a GPU's limits are 2^31 - 1 x 65535 x 65535, none 0";
  L.body = body;
  L.closure = closure;
  L.error.clear();
  L.rng = seed * 0x9E3779B97F4A7C15ull + 1;
  L.greedy = seed % 2 == 0;
  if (shared_bytes > 48 * 1024)  // beyond 48 KB a launch fails unless cudaFuncSetAttribute raised the limit
    return std::to_string(shared_bytes) + " bytes of dynamic shared memory: over 48 KB needs an opt-in the launch does not make";
  L.dynamic = guarded(shared_bytes, dynamic_align);
  if (!L.dynamic.p) return "no memory for dynamic shared memory";
  watch(L.dynamic.p, shared_bytes);
  L.stack_bytes = 256 * 1024;  // each below a page no fiber may touch: an overflow faults, not overwrites
  L.stacks_size = (L.stack_bytes + 4096) * threads;
  L.stacks = (char*)mmap(nullptr, L.stacks_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (L.stacks == MAP_FAILED) return "no memory for the threads' stacks";
  for (unsigned t = 0; t < threads; ++t) mprotect(L.stacks + (size_t)t * (L.stack_bytes + 4096), 4096, PROT_NONE);
  blockDim = dim3{block[0], block[1], block[2]};
  gridDim = dim3{grid[0], grid[1], grid[2]};
  L.faulted = 0;
  L.current = -1;
  struct sigaction on;
  std::memset(&on, 0, sizeof on);
  on.sa_sigaction = on_fault;
  on.sa_flags = SA_SIGINFO | SA_ONSTACK;
  stack_t alt{};
  alt.ss_sp = L.alt_stack.data();
  alt.ss_size = L.alt_stack.size();
  sigaltstack(&alt, &L.old_alt);
  for (int i = 0; i < 4; ++i) sigaction(SIGNALS[i], &on, &L.old[i]);
  // blocks in an order drawn from the seed: no kernel may depend on which block runs first
  std::vector<dim3> blocks;
  for (unsigned z = 0; z < grid[2]; ++z)
    for (unsigned y = 0; y < grid[1]; ++y)
      for (unsigned x = 0; x < grid[0]; ++x) blocks.push_back(dim3{x, y, z});
  for (size_t n = blocks.size(); n > 1; --n) std::swap(blocks[n - 1], blocks[next_random() % n]);
  for (size_t i = 0; i < blocks.size() && L.error.empty(); ++i) {
    blockIdx = blocks[i];
    run_block(threads);
  }
  for (int i = 0; i < 4; ++i) sigaction(SIGNALS[i], &L.old[i], nullptr);
  sigaltstack(&L.old_alt, nullptr);
  munmap(L.stacks, L.stacks_size);
  unwatch(L.dynamic.p);
  munmap(L.dynamic.map.first, L.dynamic.map.second);
  L.dynamic = Region{};
  return L.error;
}
#endif  // EMU_RUNTIME

}  // namespace emu

inline void __syncthreads() { emu::arrive(emu::L.block, 1); }
template <typename T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return emu::exchange(mask, v, lane_mask, true, width);
}
template <typename T> T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return emu::exchange(mask, v, (int)delta, false, width);
}
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline int __float_as_int(float f) { int u; std::memcpy(&u, &f, 4); return u; }
template <typename T> T min(T a, T b) { return b < a ? b : a; }  // CUDA's integer min and max
template <typename T> T max(T a, T b) { return a < b ? b : a; }
inline float __expf(float x) { return std::exp(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

#include "gpu_emulator_shared.h"
#include "gpu_emulator_races.h"
