// Part of tests/gpu_emulator.h (included at its end): where shared memory lives. Each __shared__ array and
// each launch's dynamic shared memory has a mapping of its own that ends at a page no thread may touch,
// holds NaN bytes (0xff) when a block starts, and is aligned as declared and no more.
#pragma once

namespace emu {
#ifdef EMU_RUNTIME
// `bytes` in a mapping of their own, aligned to `align` (a power of two) and, below 16, to no more (an
// odd multiple of it: a GPU promises no more than declared), as close to a protected page as that
// allows: the gap is under one element, under `align` from 16 on. p is null if mmap fails.
Region guarded(size_t bytes, size_t align) {
  const size_t page = 4096, size = (bytes + 2 * std::max<size_t>(align, 16) + page - 1) / page * page + page;
  auto* base = (unsigned char*)mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return Region{};
  mprotect(base + size - page, page, PROT_NONE);
  unsigned char* end = base + size - page;
  uintptr_t start = reinterpret_cast<uintptr_t>(end - bytes) & ~uintptr_t(align - 1);
  if (align < 16 && start % (2 * align) == 0) start -= align;
  auto* p = reinterpret_cast<unsigned char*>(start);
  std::memset(p, 0xff, end - p);
  return Region{p, bytes, size_t(end - p) - bytes, {base, size}};
}
#endif

template <typename T, int DECLARATION, size_t ALIGN>
T& shared_array() {  // a __shared__ array, once per declaration, refilled with 0xff at each block
  static unsigned char* p = [] {
    const Region r = guarded(sizeof(T), ALIGN);
    L.static_shared.push_back(r);
    watch(r.p, sizeof(T));
    return r.p;
  }();
  return *reinterpret_cast<T*>(p);
}

#ifdef EMU_RUNTIME
// At each block's start: every shared array and the bytes after it 0xff.
void refill_shared() {
  std::memset(L.dynamic.p, 0xff, L.dynamic.bytes + L.dynamic.gap);
  for (const Region& r : L.static_shared) std::memset(r.p, 0xff, r.bytes + r.gap);
}

// After a block: the bytes between each shared array's end and its protected page still 0xff.
void check_gaps() {
  auto written = [](const Region& r) {
    for (size_t i = 0; i < r.gap; ++i)
      if (r.p[r.bytes + i] != 0xff) return true;
    return false;
  };
  const char* what = written(L.dynamic) ? "dynamic shared memory" : nullptr;
  for (const Region& r : L.static_shared)
    if (!what && written(r)) what = "a __shared__ array";
  if (!what) return;
  char b[160];
  snprintf(b, sizeof b, "block (%u,%u,%u) wrote past the end of %s", blockIdx.x, blockIdx.y, blockIdx.z, what);
  L.error = b;
}
#endif
}  // namespace emu

// `__shared__ float s[33];` is rewritten to EMU_SHARED(float, s, [33], alignof(float)): the array lives
// in a guarded mapping and holds NaN bytes (0xff) when a block starts, as garbage on a GPU would be, so
// a thread reading what no thread of its block wrote sees NaN, not the last block's values. Shared
// arrays are aligned as declared (`__align__(16)`, or their type's) and no more; the dynamic ones
// all start at one address, aligned as the most aligned of them (gpu_emulator.py passes it to launch).
#define EMU_SHARED(type, name, dims, align) \
  using emu_shared_##name = type dims; \
  emu_shared_##name& name = emu::shared_array<emu_shared_##name, __COUNTER__, align>()
#define EMU_DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(emu::L.dynamic.p)
