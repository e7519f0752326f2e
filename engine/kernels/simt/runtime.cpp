// The host SIMT scheduler: runs a kernel's blocks one at a time, each block's threads as fibers
// on the launching OS thread that take turns (a baton passed in a schedule order), with real
// barriers for `__syncthreads` and warp collectives, and deadlock detection. See host.h for the
// why.
//
// Entry point for Rust (engine/kernels/simt/src/lib.rs): simt_launch(), with the same argument
// convention as cuLaunchKernel (an array of pointers to the arguments' values).
//
// Fibers. Every block thread runs on a stack of its own (kStack bytes, mmap'd lazily committed
// above a PROT_NONE guard, so an overflow faults instead of writing into a neighbour), from a
// pool that grows to the largest block launched and is reused by every later launch. Switching
// to another fiber pushes the callee-saved registers on the current stack, saves the stack
// pointer and loads the other's: on x86-64 a hand-written switch of a dozen instructions
// (ortbench_simt_switch); elsewhere, or built with -DORTBENCH_SIMT_UCONTEXT, ucontext's
// makecontext/swapcontext, which is portable but makes a sigprocmask system call per switch.
//
// The scheduler is symmetric: a thread reaching a barrier picks the next runnable thread itself
// and switches straight to it. Only when no thread can run does control go back to the launch
// (simt_launch, on the launching thread's own stack), which then starts the next block, or
// reports a deadlock and resumes each waiting thread once so that it unwinds (Abort is thrown
// and caught on that fiber's own stack).
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__) && !defined(ORTBENCH_SIMT_UCONTEXT)
#define ORTBENCH_SIMT_ASM_SWITCH 1
#else
#define ORTBENCH_SIMT_ASM_SWITCH 0
#include <ucontext.h>
#endif

namespace simt {

// ---------------------------------------------------------------- contexts
#if ORTBENCH_SIMT_ASM_SWITCH
extern "C" void ortbench_simt_switch(void** save_sp, void* load_sp);
extern "C" void ortbench_simt_fiber_start();
// ortbench_simt_switch(save, load): pushes what the System V ABI makes callee-saved (rbx, rbp,
// r12–r15, the MXCSR and x87 control words) on the current stack, stores the stack pointer in
// *save, loads `load` as the stack pointer and pops the same from there — returning into the
// other fiber where it last called ortbench_simt_switch. A new fiber's stack is laid out by
// ctx_make so that this "returns" into ortbench_simt_fiber_start, which calls r13(r12) and is
// the outermost frame (rip undefined in its CFI: unwinders and debuggers stop there).
asm(R"(
    .pushsection .text
    .globl ortbench_simt_switch
    .hidden ortbench_simt_switch
    .type ortbench_simt_switch, @function
    .p2align 4
ortbench_simt_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size ortbench_simt_switch, .-ortbench_simt_switch

    .globl ortbench_simt_fiber_start
    .hidden ortbench_simt_fiber_start
    .type ortbench_simt_fiber_start, @function
    .p2align 4
ortbench_simt_fiber_start:
    .cfi_startproc
    .cfi_undefined rip
    movq %r12, %rdi
    callq *%r13
    ud2
    .cfi_endproc
    .size ortbench_simt_fiber_start, .-ortbench_simt_fiber_start
    .popsection
)");

struct Context {
    void* sp = nullptr;
};
static void ctx_switch(Context& from, Context& to) { ortbench_simt_switch(&from.sp, to.sp); }
// Makes the next switch to `c` run fn(arg) on the stack [lo, lo + size).
static void ctx_make(Context& c, unsigned char* lo, std::size_t size, void (*fn)(int), int arg) {
    // 16 zero bytes at the top, then the frame ortbench_simt_switch pops: control words, r15,
    // r14, r13 = fn, r12 = arg, rbx, rbp, return address. 16-byte aligned, so the stack is
    // aligned as the ABI wants at fiber_start's call.
    auto* top = reinterpret_cast<std::uint64_t*>((reinterpret_cast<std::uintptr_t>(lo + size) & ~std::uintptr_t{15}) - 16);
    top[0] = top[1] = 0;
    std::uint64_t* sp = top - 8;
    std::uint32_t mxcsr;
    std::uint16_t fpucw;
    asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(fpucw));  // the launching thread's
    sp[0] = mxcsr | (std::uint64_t)fpucw << 32;
    sp[1] = sp[2] = 0;
    sp[3] = reinterpret_cast<std::uint64_t>(fn);
    sp[4] = (std::uint64_t)(unsigned)arg;
    sp[5] = sp[6] = 0;
    sp[7] = reinterpret_cast<std::uint64_t>(&ortbench_simt_fiber_start);
    c.sp = sp;
}
#else
struct Context {
    ucontext_t uc;
    bool got = false;
};
static void ctx_switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
static void ctx_make(Context& c, unsigned char* lo, std::size_t size, void (*fn)(int), int arg) {
    if (!c.got) {  // once per pool slot (a system call); makecontext then reuses it
        getcontext(&c.uc);
        c.got = true;
    }
    c.uc.uc_stack.ss_sp = lo;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;  // fibers never return (fiber_main switches away for good)
    makecontext(&c.uc, reinterpret_cast<void (*)()>(fn), 1, arg);
}
#endif

// Kernels keep a few scalars and small arrays: 256 KiB is ample, and only what a fiber touches
// is ever committed. The guard is address space only.
constexpr std::size_t kStack = 256 << 10, kGuard = 64 << 10;

struct Fiber {
    unsigned char* stack = nullptr;  // kStack bytes, above a kGuard guard
    Context ctx;                     // (a ucontext_t must not move: fibers are held by pointer)
};

// ---------------------------------------------------------------- the scheduler

struct Abort {};  // unwinds a waiting fiber after a deadlock was reported

enum class St : unsigned char { Run, AtBlock, AtWarp, Done };

// What a lane brought to a warp collective: which instruction (and, for the tensor-core ones,
// where in the kernel and its operands: tensor_core.cpp), so that lanes meeting at different
// instructions are reported instead of silently combined.
enum class OpKind : unsigned char { Shuffle, SyncWarp, Mma, LdMatrix };
struct WarpOp {
    OpKind kind = OpKind::Shuffle;
    const char* file = "";
    int line = 0;
    unsigned a[4] = {}, b[2] = {};
    float c[4] = {};
    const void* addr = nullptr;
};

struct Sched {
    int n = 0, ws = 32;
    std::vector<int> order, pos;  // order[k] = thread id running k-th; pos = its inverse
    // Greedy: the baton always goes to the earliest runnable thread in the order (the early
    // threads run ahead as far as barriers let them), instead of round-robin from the thread
    // that yields. Round-robin lets every warp finish a phase before any moves on; greedy lets
    // warp 0 race into the next phase while later warps have not read the last one — what a
    // barrier guarding shared-memory reuse exists for.
    bool greedy = false;
    std::vector<St> st;
    std::vector<dim3> idx;           // each thread's threadIdx
    std::vector<unsigned> warp_gen;  // each thread's warp collectives so far this block
    int block_arrived = 0;
    std::vector<int> warp_arrived;
    std::vector<unsigned long long> scratch;  // [warp][generation parity][lane] shuffle slots
    std::vector<WarpOp> ops;                  // [warp][generation parity][lane] what each lane's collective is, and its tensor-core operands
    std::vector<unsigned char> smem;
    unsigned long long nblocks = 0, block = 0;
    const Entry* entry = nullptr;
    void** args = nullptr;
    int cur = -1;  // the running thread
    Context main;  // the launch's own (simt_launch on the launching thread's stack)
    bool abort = false;
    std::string error;
};

// The launch in progress and the fiber pool. Launches take turns (g_launch), each running all
// its fibers on its own OS thread, so a launch owns these — and threadIdx, blockIdx, blockDim,
// gridDim, warpSize and every `__shared__` static — while it runs.
static Sched* g = nullptr;
static std::mutex g_launch;
static std::vector<std::unique_ptr<Fiber>> g_fibers;

Entry* registry_add(const Entry& e);
std::vector<Entry>& registry() {
    static std::vector<Entry> r;
    return r;
}
Entry* registry_add(const Entry& e) {
    registry().push_back(e);
    return &registry().back();
}

unsigned char* dyn_smem() { return g->smem.data(); }

// Suspends the caller into `from` and runs thread t, with t's threadIdx set for the kernel.
static void resume(Context& from, int t) {
    g->cur = t;
    threadIdx = g->idx[t];
    ctx_switch(from, g_fibers[t]->ctx);
}

// Hands the baton to the next runnable thread after `me` in schedule order (me last), or back
// to the launch when nobody can run (the block is complete, or deadlocked). Returns when `me`
// runs again — at once if it is itself the next runnable thread; a finished thread never does.
static void pass_baton(int me) {
    Sched& s = *g;
    const int p = s.greedy ? -1 : s.pos[me];
    int next = -1;
    for (int k = 1; k <= s.n; ++k) {
        const int t = s.order[(p + k) % s.n];
        if (s.st[t] != St::Run) continue;
        if (t == me) return;  // the caller itself is next
        next = t;
        break;
    }
    Context& mine = g_fibers[me]->ctx;
    if (next >= 0) {
        resume(mine, next);
    } else {
        s.cur = -1;
        ctx_switch(mine, s.main);
    }
    if (s.abort) throw Abort{};
}

void sync_block() {
    Sched& s = *g;
    const int me = s.cur;
    s.st[me] = St::AtBlock;
    if (++s.block_arrived == s.n) {
        for (auto& x : s.st)
            if (x == St::AtBlock) x = St::Run;
        s.block_arrived = 0;
    }
    pass_baton(me);
}

void sync_warp() {
    Sched& s = *g;
    const int me = s.cur, w = me / s.ws;
    s.st[me] = St::AtWarp;
    if (++s.warp_arrived[w] == s.ws) {
        for (int l = 0; l < s.ws; ++l)
            if (s.st[w * s.ws + l] == St::AtWarp) s.st[w * s.ws + l] = St::Run;
        s.warp_arrived[w] = 0;
    }
    pass_baton(me);
}

// Every lane publishes its value in this call's slot set (two sets, alternating: a lane can
// only write the set again after every lane passed the next collective, i.e. read this one).
unsigned long long shfl_bits(unsigned long long bits, int src_lane) {
    Sched& s = *g;
    const int me = s.cur, ws = s.ws, w = me / ws, lane = me % ws;
    const unsigned parity = s.warp_gen[me]++ & 1u;
    const std::size_t set = ((std::size_t)w * 2 + parity) * ws;
    unsigned long long* slots = &s.scratch[set];
    slots[lane] = bits;
    s.ops[set + lane].kind = OpKind::Shuffle;
    sync_warp();
    return slots[((src_lane % ws) + ws) % ws];
}

// __syncwarp: a warp collective with nothing to exchange (it still takes a slot set, so that a
// lane at a tensor-core instruction meeting it is reported).
void warp_barrier() {
    Sched& s = *g;
    const int me = s.cur, ws = s.ws, w = me / ws, lane = me % ws;
    const unsigned parity = s.warp_gen[me]++ & 1u;
    s.ops[((std::size_t)w * 2 + parity) * ws + lane].kind = OpKind::SyncWarp;
    sync_warp();
}

// An error a kernel's thread detects (a misused tensor-core instruction): recorded for the
// launch, which fails with it; every thread unwinds.
[[noreturn]] void kernel_error(const std::string& what) {
    Sched& s = *g;
    if (s.error.empty()) s.error = "block " + std::to_string(s.block) + ", thread " + std::to_string(s.cur) + ": " + what;
    s.abort = true;
    throw Abort{};
}

// A fiber's body: thread `me` runs the kernel once for the current block, then hands over for
// good (the next block starts every fiber afresh).
static void fiber_main(int me) {
    Sched& s = *g;
    try {
        s.entry->tramp(s.entry->fn, s.args);
    } catch (Abort&) {
    }
    // Outside the handler: switching away inside it would leave this exception on the OS
    // thread's caught-exception stack under whatever the next fiber throws.
    s.st[me] = St::Done;
    pass_baton(me);
    std::abort();  // unreachable: nobody resumes a finished thread
}

// Grows the fiber pool to n fibers. Lock g_launch held.
static bool grow_pool(std::size_t n) {
    while (g_fibers.size() < n) {
        int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#ifdef MAP_NORESERVE
        flags |= MAP_NORESERVE;
#endif
#ifdef MAP_STACK
        flags |= MAP_STACK;
#endif
        void* p = mmap(nullptr, kGuard + kStack, PROT_READ | PROT_WRITE, flags, -1, 0);
        if (p == MAP_FAILED) return false;
        if (mprotect(p, kGuard, PROT_NONE) != 0) {
            munmap(p, kGuard + kStack);
            return false;
        }
        auto f = std::make_unique<Fiber>();
        f->stack = static_cast<unsigned char*>(p) + kGuard;
        g_fibers.push_back(std::move(f));
    }
    return true;
}

// Runs the launch's blocks in turn on the calling thread. False after a deadlock (s.error).
static bool run_blocks(Sched& s) {
    for (s.block = 0; s.block < s.nblocks; ++s.block) {
        const unsigned long long b = s.block;
        blockIdx = dim3{(unsigned)(b % gridDim.x), (unsigned)((b / gridDim.x) % gridDim.y), (unsigned)(b / ((unsigned long long)gridDim.x * gridDim.y))};
        std::fill(s.st.begin(), s.st.end(), St::Run);
        std::fill(s.warp_gen.begin(), s.warp_gen.end(), 0u);
        s.block_arrived = 0;
        std::fill(s.warp_arrived.begin(), s.warp_arrived.end(), 0);
        std::fill(s.smem.begin(), s.smem.end(), (unsigned char)0xFF);
        for (int t = 0; t < s.n; ++t) ctx_make(g_fibers[t]->ctx, g_fibers[t]->stack, kStack, fiber_main, t);
        resume(s.main, s.order[0]);
        // Nobody can run. Either every thread is done, or a barrier or collective some thread
        // never reaches: record who waits where, then let each waiting thread unwind.
        int at_block = 0, at_warp = 0, done = 0;
        for (St x : s.st) at_block += x == St::AtBlock, at_warp += x == St::AtWarp, done += x == St::Done;
        if (done == s.n && !s.abort) continue;
        if (s.error.empty())
            s.error = "deadlock in block " + std::to_string(b) + ": " + std::to_string(at_block) + " thread(s) wait at __syncthreads, " +
                  std::to_string(at_warp) + " at a warp collective, " + std::to_string(done) +
                  " exited — a barrier or warp collective that not every thread of the block/warp reaches";
        s.abort = true;
        for (int t = 0; t < s.n; ++t)
            if (s.st[t] != St::Done) resume(s.main, t);  // throws Abort in t, which comes back done
        return false;
    }
    return true;
}

}  // namespace simt

extern "C" {

// How many kernels the harness holds, and the i-th one's name (for the registry check against
// the NVRTC build).
unsigned long long simt_kernel_count() { return simt::registry().size(); }
const char* simt_kernel_name(unsigned long long i) { return simt::registry()[i].name; }

// Runs kernel `name` on grid × block threads with `smem` bytes of dynamic shared memory at warp
// size `warp`, threads taking turns in schedule `order` (0 forward, 1 reverse, k ≥ 2 a shuffle
// seeded by k; bit 31 set: the same order, handed over greedily — see Sched::greedy). Returns
// 0, or 1 with a message in err. Concurrent calls take turns; each runs on its caller's thread.
int simt_launch(const char* name, const unsigned* grid, const unsigned* block, unsigned smem, unsigned warp, unsigned order, void** args,
                char* err, unsigned long long err_len) {
    using namespace simt;
    auto fail = [&](const std::string& m) {
        std::snprintf(err, err_len, "%s", m.c_str());
        return 1;
    };
    const Entry* e = nullptr;
    for (const Entry& x : registry())
        if (std::strcmp(x.name, name) == 0) e = &x;
    if (!e) return fail(std::string("no kernel named '") + name + "' in the SIMT harness");
    const unsigned long long n = (unsigned long long)block[0] * block[1] * block[2];
    if (n == 0 || n > 1024) return fail("block of " + std::to_string(n) + " threads: must be 1..1024");
    if (warp == 0 || (warp & (warp - 1)) != 0 || n % warp != 0)
        return fail("block of " + std::to_string(n) + " threads is not a multiple of warp size " + std::to_string(warp));
    const unsigned long long nblocks = (unsigned long long)grid[0] * grid[1] * grid[2];
    if (nblocks == 0) return 0;

    std::lock_guard<std::mutex> launch(g_launch);
    if (!grow_pool(n)) return fail("cannot map " + std::to_string(n) + " fiber stacks of " + std::to_string(kStack >> 10) + " KiB");
    Sched s;
    s.n = (int)n;
    s.ws = (int)warp;
    s.order.resize(n);
    s.greedy = (order & 0x80000000u) != 0;
    order &= 0x7fffffffu;
    for (int i = 0; i < s.n; ++i) s.order[i] = order == 1 ? s.n - 1 - i : i;
    if (order >= 2) std::shuffle(s.order.begin(), s.order.end(), std::mt19937_64(order));
    s.pos.resize(n);
    for (int i = 0; i < s.n; ++i) s.pos[s.order[i]] = i;
    s.st.assign(n, St::Run);
    s.idx.resize(n);
    for (unsigned t = 0; t < n; ++t) s.idx[t] = dim3{t % block[0], (t / block[0]) % block[1], t / (block[0] * block[1])};
    s.warp_gen.assign(n, 0);
    s.warp_arrived.assign(n / warp, 0);
    s.scratch.assign(2 * n, 0);
    s.ops.assign(2 * n, WarpOp{});
    s.smem.assign(smem, 0xFF);
    s.nblocks = nblocks;
    s.entry = e;
    s.args = args;
    g = &s;
    blockDim = dim3{block[0], block[1], block[2]};
    gridDim = dim3{grid[0], grid[1], grid[2]};
    warpSize = (int)warp;
    const bool ok = run_blocks(s);
    g = nullptr;
    if (!ok) return fail(std::string(name) + ": " + s.error);
    return 0;
}
}
