// Part of tests/gpu_emulator.h: switching between fibers (the emulated CUDA threads) and the scheduler.
// On x86-64, a switch saves what a call must preserve under the System V ABI (rbx, rbp, r12-r15, the
// stack pointer, MXCSR and the x87 control word) and nothing else. glibc's swapcontext also saves the
// whole register file and sets the signal mask with a system call each time: 60% of an emulated
// training step went there. Elsewhere, or with EMU_UCONTEXT (a test builds it so, to keep it working),
// swapcontext.
#pragma once
#include <cstddef>
#include <cstdint>

#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
// emu_switch_stack(save, load): pushes the preserved registers, stores the stack pointer in *save,
// loads `load` as the stack pointer, pops that fiber's registers and returns where it left off. Hidden:
// every kernel library carries its own copy.
extern "C" void emu_switch_stack(void** save, void* load);
#ifdef EMU_RUNTIME  // defined once, in the runtime's object
asm(".pushsection .text\n"
    ".p2align 4\n"
    ".globl emu_switch_stack\n"
    ".hidden emu_switch_stack\n"
    ".type emu_switch_stack, @function\n"
    "emu_switch_stack:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $16, %rsp\n  stmxcsr 8(%rsp)\n  fnstcw (%rsp)\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  ldmxcsr 8(%rsp)\n  fldcw (%rsp)\n  addq $16, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_switch_stack, .-emu_switch_stack\n"
    ".popsection\n");
#endif

namespace emu {
struct Context { void* sp = nullptr; };

inline void switch_context(Context& from, const Context& to) { emu_switch_stack(&from.sp, to.sp); }

// A fiber whose first switch returns into `entry` (which never returns), at the top of its stack: the
// frame emu_switch_stack pops, laid out as it pushes one, the stack aligned as at a function's entry.
inline void make_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  auto* top = reinterpret_cast<unsigned long long*>(reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15});
  unsigned long long* sp = top - 10;
  unsigned short control = 0;
  unsigned mxcsr = 0;
  asm volatile("fnstcw %0" : "=m"(control));
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  sp[0] = control;  // at (sp): the x87 control word; at 8(sp): MXCSR
  sp[1] = mxcsr;
  for (int i = 2; i < 8; ++i) sp[i] = 0;  // r15 r14 r13 r12 rbx rbp
  sp[8] = reinterpret_cast<unsigned long long>(entry);  // where `ret` goes
  sp[9] = 0;  // entry's own return address: none
  c.sp = sp;
}
}  // namespace emu
#else
#include <ucontext.h>

namespace emu {
struct Context { ucontext_t uc; };

inline void switch_context(Context& from, const Context& to) { swapcontext(&from.uc, &to.uc); }

inline void make_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;  // entry never returns
  makecontext(&c.uc, entry, 0);
}
}  // namespace emu
#endif
