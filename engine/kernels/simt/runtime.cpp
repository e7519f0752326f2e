// The host SIMT scheduler: runs a kernel's blocks one at a time, each block's threads as host
// threads that take turns (a baton passed in a schedule order), with real barriers for
// `__syncthreads` and warp collectives, and deadlock detection. See host.h for the why.
//
// Entry point for Rust (engine/kernels/simt/src/lib.rs): simt_launch(), with the same argument
// convention as cuLaunchKernel (an array of pointers to the arguments' values).
#include <memory>
#include <mutex>
#include <random>
#include <semaphore>
#include <string>
#include <thread>
#include <vector>

namespace simt {

struct Abort {};  // unwinds a kernel thread after a deadlock was reported

enum class St : unsigned char { Run, AtBlock, AtWarp, Done };

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
    int block_arrived = 0;
    std::vector<int> warp_arrived;
    std::vector<std::unique_ptr<std::counting_semaphore<2>>> baton;
    std::vector<unsigned long long> scratch;  // [warp][generation parity][lane] shuffle slots
    std::vector<unsigned char> smem;
    unsigned long long nblocks = 0, block = 0;
    bool abort = false;
    std::string error;
    std::counting_semaphore<1> finished{0};
    std::mutex mu;
};

static Sched* g = nullptr;  // the launch in progress (one at a time: g_launch)
static std::mutex g_launch;
static thread_local int t_tid = 0;
static thread_local unsigned t_warp_gen = 0;

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

// Nobody can run but not everyone is done: a barrier or collective some thread never reaches.
// Records why, wakes every thread so each unwinds, and unwinds the caller. Lock held.
[[noreturn]] static void deadlock(std::unique_lock<std::mutex>& lk) {
    int at_block = 0, at_warp = 0, done = 0;
    for (St s : g->st) at_block += s == St::AtBlock, at_warp += s == St::AtWarp, done += s == St::Done;
    const unsigned long long b = g->block;
    g->error = "deadlock in block " + std::to_string(b) + ": " + std::to_string(at_block) + " thread(s) wait at __syncthreads, " +
               std::to_string(at_warp) + " at a warp collective, " + std::to_string(done) +
               " exited — a barrier or warp collective that not every thread of the block/warp reaches";
    g->abort = true;
    lk.unlock();
    for (auto& s : g->baton) s->release();
    g->finished.release();
    throw Abort{};
}

// Hands the baton to the next runnable thread after `me` in schedule order (me last). With
// `wait`, blocks until the baton comes back. Lock held on entry, released on return.
static void pass_baton(std::unique_lock<std::mutex>& lk, int me, bool wait) {
    Sched& s = *g;
    const int p = s.greedy ? -1 : s.pos[me];
    for (int k = 1; k <= s.n; ++k) {
        const int t = s.order[(p + k) % s.n];
        if (s.st[t] != St::Run) continue;
        if (t == me) return;  // the caller itself is next
        lk.unlock();
        s.baton[t]->release();
        if (wait) {
            s.baton[me]->acquire();
            if (s.abort) throw Abort{};
        }
        return;
    }
    bool all_done = true;
    for (St x : s.st) all_done &= x == St::Done;
    if (!all_done) deadlock(lk);
    // The block is complete: start the next one, or end the launch (waking every thread so
    // each leaves its block loop).
    if (++s.block < s.nblocks) {
        for (auto& x : s.st) x = St::Run;
        s.block_arrived = 0;
        for (int& a : s.warp_arrived) a = 0;
        std::fill(s.smem.begin(), s.smem.end(), (unsigned char)0xFF);
        lk.unlock();
        s.baton[s.order[0]]->release();
    } else {
        lk.unlock();
        for (auto& b : s.baton) b->release();
        s.finished.release();
    }
}

void sync_block() {
    std::unique_lock<std::mutex> lk(g->mu);
    const int me = t_tid;
    g->st[me] = St::AtBlock;
    if (++g->block_arrived == g->n) {
        for (auto& x : g->st)
            if (x == St::AtBlock) x = St::Run;
        g->block_arrived = 0;
    }
    pass_baton(lk, me, true);
}

void sync_warp() {
    std::unique_lock<std::mutex> lk(g->mu);
    const int me = t_tid, w = me / g->ws;
    g->st[me] = St::AtWarp;
    if (++g->warp_arrived[w] == g->ws) {
        for (int l = 0; l < g->ws; ++l)
            if (g->st[w * g->ws + l] == St::AtWarp) g->st[w * g->ws + l] = St::Run;
        g->warp_arrived[w] = 0;
    }
    pass_baton(lk, me, true);
}

// Every lane publishes its value in this call's slot set (two sets, alternating: a lane can
// only write the set again after every lane passed the next collective, i.e. read this one).
unsigned long long shfl_bits(unsigned long long bits, int src_lane) {
    const int me = t_tid, ws = g->ws, w = me / ws, lane = me % ws;
    const unsigned parity = t_warp_gen++ & 1u;
    unsigned long long* slots = &g->scratch[((std::size_t)w * 2 + parity) * ws];
    slots[lane] = bits;
    sync_warp();
    return slots[((src_lane % ws) + ws) % ws];
}

static void thread_main(int tid, const Entry* e, void** args) {
    t_tid = tid;
    const unsigned bx = blockDim.x, by = blockDim.y;
    threadIdx = dim3{tid % bx, (tid / bx) % by, tid / (bx * by)};
    for (;;) {
        g->baton[tid]->acquire();
        if (g->abort || g->block >= g->nblocks) return;
        const unsigned long long b = g->block;
        blockIdx = dim3{(unsigned)(b % gridDim.x), (unsigned)((b / gridDim.x) % gridDim.y), (unsigned)(b / ((unsigned long long)gridDim.x * gridDim.y))};
        t_warp_gen = 0;
        try {
            e->tramp(e->fn, args);
        } catch (Abort&) {
            return;
        }
        std::unique_lock<std::mutex> lk(g->mu);
        g->st[tid] = St::Done;
        try {
            pass_baton(lk, tid, false);
        } catch (Abort&) {
            return;
        }
    }
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
// 0, or 1 with a message in err.
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
    s.warp_arrived.assign(n / warp, 0);
    for (unsigned long long i = 0; i < n; ++i) s.baton.emplace_back(new std::counting_semaphore<2>(0));
    s.scratch.assign(2 * n, 0);
    s.smem.assign(smem, 0xFF);
    s.nblocks = nblocks;
    g = &s;
    blockDim = dim3{block[0], block[1], block[2]};
    gridDim = dim3{grid[0], grid[1], grid[2]};
    warpSize = (int)warp;

    std::vector<std::thread> threads;
    threads.reserve(n);
    for (int t = 0; t < s.n; ++t) threads.emplace_back(thread_main, t, e, args);
    s.baton[s.order[0]]->release();
    s.finished.acquire();
    for (auto& t : threads) t.join();
    g = nullptr;
    if (s.abort) return fail(std::string(name) + ": " + s.error);
    return 0;
}
}
