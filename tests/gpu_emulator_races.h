// Part of tests/gpu_emulator.h (included at its end): with EMU_RACES (gpu_emulator.py builds a race
// check with -fsanitize=thread -DEMU_RACES, and GCC then calls the __tsan_* hooks below at every load
// and store), shared memory is checked for races; without, nothing is watched.
#pragma once

#ifdef EMU_RUNTIME  // all of it: the runtime's (gpu_emulator.h)
namespace emu {
#ifdef EMU_RACES
// Within one barrier interval, a word of a __shared__ array or of the dynamic shared memory that one
// thread writes and another reads or writes is a race (whatever order the scheduler ran them in),
// unless the two are lanes of one warp with a shuffle between (a warp barrier). One shadow entry per
// 4-byte word.
struct Word {
  unsigned long long interval = 0;
  int writer = -1, reader = -1;  // the last of each in this interval; reader -2: several, in one warp
  int readers_warp = -1;
  unsigned writer_wgen = 0, reader_wgen = 0;  // their warp's barrier generation when they accessed
  bool mixed = false;  // read by several threads of different warps
};
struct Shadow { unsigned char* base; size_t bytes; std::vector<Word> words; };
inline std::vector<Shadow> shadows;

// touch() and the hooks are not instrumented themselves; what they call may be (GCC does not inline
// across sanitizer attributes), so a hook reached from inside touch() returns at once.
#define EMU_UNWATCHED __attribute__((no_sanitize_thread))
inline bool in_touch = false;

EMU_UNWATCHED inline bool synced(int other, unsigned other_wgen) {
  return other == L.current || (other / 32 == L.current / 32 && L.warps[L.current / 32].gen != other_wgen);
}

EMU_UNWATCHED inline void race(const char* what, int other, const Shadow& sh, size_t word) {
  in_touch = false;  // fail() leaves this fiber for good
  char b[200];
  snprintf(b, sizeof b, ": race on shared memory (%s thread %d, byte %zu of a %zu-byte array, in one barrier interval)",
           what, other, word * 4, sh.bytes);
  fail(where() + b);
}

EMU_UNWATCHED inline void touch_words(const unsigned char* a, size_t n, bool write) {
  for (Shadow& sh : shadows) {
    if (a < sh.base || a >= sh.base + sh.bytes) continue;
    const unsigned long long interval = (L.block_serial << 32) | L.block.gen;
    const int t = L.current;
    const unsigned wgen = L.warps[t / 32].gen;
    for (size_t w = (a - sh.base) / 4; w <= (a + n - 1 - sh.base) / 4 && w < sh.words.size(); ++w) {
      Word& s = sh.words[w];
      if (s.interval != interval) s = Word{interval};
      if (s.writer >= 0 && !synced(s.writer, s.writer_wgen)) race(write ? "also written by" : "written by", s.writer, sh, w);
      if (write) {
        if (s.mixed || (s.reader == -2 && (s.readers_warp != t / 32 || wgen == s.reader_wgen)))
          race("read by several threads, then written by", t, sh, w);
        if (s.reader >= 0 && !synced(s.reader, s.reader_wgen)) race("read by", s.reader, sh, w);
        s.writer = t;
        s.writer_wgen = wgen;
      } else if (s.reader == -1 || (s.reader >= 0 && synced(s.reader, s.reader_wgen))) {
        s.reader = t;
        s.reader_wgen = wgen;
      } else if (s.reader != t) {  // several readers: fine among themselves, not with a later writer
        const int warp = s.reader >= 0 ? s.reader / 32 : s.readers_warp;
        if (warp != t / 32) s.mixed = true;
        s.readers_warp = warp;
        s.reader_wgen = std::min(s.reader_wgen, wgen);
        s.reader = -2;
      }
    }
    return;
  }
}

EMU_UNWATCHED inline void touch(const void* p, size_t n, bool write) {
  if (in_touch || L.current < 0) return;
  in_touch = true;
  touch_words((const unsigned char*)p, n, write);
  in_touch = false;
}

// (touch() is held off while the list changes: the vector's own instrumented code calls the hooks)
EMU_UNWATCHED void watch(void* p, size_t bytes) {
  in_touch = true;
  shadows.push_back(Shadow{(unsigned char*)p, bytes, std::vector<Word>((bytes + 3) / 4)});
  in_touch = false;
}
EMU_UNWATCHED void unwatch(void* p) {
  in_touch = true;
  for (size_t i = 0; i < shadows.size(); ++i)
    if (shadows[i].base == p) { shadows.erase(shadows.begin() + i); break; }
  in_touch = false;
}
#else
void watch(void*, size_t) {}
void unwatch(void*) {}
#endif
}  // namespace emu

#ifdef EMU_RACES
// The hooks -fsanitize=thread instruments every access with, defined here (no TSan runtime is linked):
// shared-memory accesses go to the race check, everything else passes.
#define EMU_TSAN_ACCESS(n)                                                                           \
  extern "C" EMU_UNWATCHED void __tsan_read##n(void* p) { emu::touch(p, n, false); }                 \
  extern "C" EMU_UNWATCHED void __tsan_write##n(void* p) { emu::touch(p, n, true); }                 \
  extern "C" EMU_UNWATCHED void __tsan_unaligned_read##n(void* p) { emu::touch(p, n, false); }       \
  extern "C" EMU_UNWATCHED void __tsan_unaligned_write##n(void* p) { emu::touch(p, n, true); }
EMU_TSAN_ACCESS(1)
EMU_TSAN_ACCESS(2)
EMU_TSAN_ACCESS(4)
EMU_TSAN_ACCESS(8)
EMU_TSAN_ACCESS(16)
extern "C" void __tsan_read_range(void* p, unsigned long n) { emu::touch(p, n, false); }
extern "C" void __tsan_write_range(void* p, unsigned long n) { emu::touch(p, n, true); }
extern "C" void __tsan_init() {}
extern "C" void __tsan_func_entry(void*) {}
extern "C" void __tsan_func_exit() {}
extern "C" void __tsan_vptr_update(void**, void*) {}
extern "C" void __tsan_vptr_read(void**) {}
extern "C" char __tsan_atomic8_load(const volatile char* a, int) { return *a; }
extern "C" void __tsan_atomic8_store(volatile char* a, char v, int) { *a = v; }
extern "C" void __tsan_acquire(void*) {}
extern "C" void __tsan_release(void*) {}
#endif
#endif  // EMU_RUNTIME
