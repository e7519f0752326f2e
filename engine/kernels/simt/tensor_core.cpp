// The tensor-core instructions on the host: `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.
// {bf16,f16}.f32` and `ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16`, as warp
// collectives over the 32 lanes with exactly the element-to-lane mapping of the PTX ISA (PTX ISA
// 9.0, §9.7.14.5.8 "Matrix Fragments for mma.m16n8k16 with floating point type" and §9.7.14.5.15
// "Warp-level matrix load instruction: ldmatrix"), so a kernel that indexes a fragment wrongly
// computes a wrong answer here as it would on the GPU. `nvcuda::wmma` leaves its fragment layout
// unspecified; these instructions do not.
//
// `.aligned` means every lane of the warp executes the same instruction: each lane publishes
// what it brings (operands, row address, call site) in its slot of the warp's collective, waits
// for the whole warp (sync_warp), and checks that all 32 came to this instruction at this call
// site; anything else — a lane at another instruction or another line, a warp that is not 32
// lanes, a row address that is not 16-byte aligned shared memory — is an error naming the
// kernel's line, the launch fails with it. A lane that never comes is the deadlock the
// scheduler already reports.
//
// Numerics: each product of two bf16/f16 values is exact in f32; the emulation sums them in k
// order in f32 onto the accumulator. The hardware's internal order and rounding of that sum are
// not specified; the kernel tests' tolerances cover the difference.

namespace simt {

// Publishes this lane's part of a tensor-core collective, waits for the warp, checks every lane
// came to the same instruction at the same line; returns the warp's 32 slots.
static WarpOp* tensor_collective(OpKind kind, const WarpOp& mine, const char* what, std::source_location where) {
    Sched& s = *g;
    if (s.ws != 32)
        kernel_error(std::string(what) + " at " + where.file_name() + ":" + std::to_string(where.line()) + " needs a warp of 32 lanes (the harness runs warp size " +
                     std::to_string(s.ws) + "): tensor-core code is NVIDIA-only");
    const int me = s.cur, w = me / 32, lane = me % 32;
    const unsigned parity = s.warp_gen[me]++ & 1u;
    WarpOp* ops = &s.ops[((std::size_t)w * 2 + parity) * 32];
    ops[lane] = mine;
    ops[lane].kind = kind;
    ops[lane].file = where.file_name();
    ops[lane].line = (int)where.line();
    sync_warp();
    for (int l = 0; l < 32; ++l) {
        const WarpOp& o = ops[l];
        if (o.kind != kind || o.line != (int)where.line() || std::strcmp(o.file, where.file_name()) != 0) {
            const char* other = o.kind == OpKind::Shuffle ? "a shuffle" : o.kind == OpKind::SyncWarp ? "__syncwarp" : o.kind == OpKind::Mma ? "mma.sync" : "ldmatrix";
            const std::string at = o.kind == OpKind::Mma || o.kind == OpKind::LdMatrix ? std::string(" at ") + o.file + ":" + std::to_string(o.line) : "";
            kernel_error(std::string(what) + " at " + where.file_name() + ":" + std::to_string(where.line()) + " is not reached by the whole warp together (.aligned): lane " +
                         std::to_string(l) + " is at " + other + at);
        }
    }
    return ops;
}

static float half_bits_to_f32(bool bf16, unsigned bits) {
    return bf16 ? to_f32(bf16_t{(std::uint16_t)bits}) : to_f32(f16_t{(std::uint16_t)bits});
}

// Element `half` (0 low, 1 high 16 bits) of register `reg` of lane `lane`.
static unsigned half_of(const unsigned* regs, int half) { return half ? regs[0] >> 16 : regs[0] & 0xffffu; }

// A (16×16, .row): lane 4·g + t holds a0..a7 in registers r0..r3 (two per register, the lower
// index in the low 16 bits): row g for a0,a1,a4,a5 and g + 8 for a2,a3,a6,a7; column 2t + (i & 1)
// for i < 4 and 2t + (i & 1) + 8 for i ≥ 4. So element (row, col) is in lane 4·(row % 8) +
// (col % 8) / 2, register (row ≥ 8) + 2·(col ≥ 8), half col & 1.
static float mma_a_elem(const WarpOp* ops, bool bf16, int row, int col) {
    const int lane = 4 * (row % 8) + (col % 8) / 2, reg = (row >= 8 ? 1 : 0) + (col >= 8 ? 2 : 0);
    return half_bits_to_f32(bf16, half_of(&ops[lane].a[reg], col & 1));
}
// B (16×8, .col): lane 4·g + t holds b0..b3 in r0, r1: row (k) 2t + (i & 1) for i < 2 and
// 2t + (i & 1) + 8 for i ≥ 2, column (n) g. So element (k, n) is in lane 4·n + (k % 8) / 2,
// register k ≥ 8, half k & 1.
static float mma_b_elem(const WarpOp* ops, bool bf16, int k, int n) {
    const int lane = 4 * n + (k % 8) / 2, reg = k >= 8 ? 1 : 0;
    return half_bits_to_f32(bf16, half_of(&ops[lane].b[reg], k & 1));
}

// D = A·B + C. C and D (16×8 f32): lane 4·g + t holds c0..c3: row g for c0, c1 and g + 8 for
// c2, c3; column 2t + (i & 1). d and c may alias (the accumulator, in place).
void mma_m16n8k16(bool bf16, float* d, const unsigned* a, const unsigned* b, std::source_location where) {
    WarpOp mine;
    std::memcpy(mine.a, a, sizeof mine.a);
    std::memcpy(mine.b, b, sizeof mine.b);
    std::memcpy(mine.c, d, sizeof mine.c);
    const WarpOp* ops = tensor_collective(OpKind::Mma, mine, "mma.sync.m16n8k16", where);
    const int lane = g->cur % 32, grp = lane / 4, tig = lane % 4;
    float out[4];
    for (int i = 0; i < 4; ++i) {
        const int row = grp + (i >= 2 ? 8 : 0), col = 2 * tig + (i & 1);
        float acc = ops[lane].c[i];
        for (int k = 0; k < 16; ++k) acc += mma_a_elem(ops, bf16, row, k) * mma_b_elem(ops, bf16, k, col);
        out[i] = acc;
    }
    std::memcpy(d, out, sizeof out);
}

// ldmatrix .m8n8 .x{count}: lanes 8i..8i + 7 give the addresses of rows 0..7 of matrix i (16
// bytes each: 8 b16 elements, in shared memory, 16-byte aligned); lane 4·g + t receives in
// register i the pair at row g, columns 2t, 2t + 1 of matrix i — or with .trans the pair at
// rows 2t, 2t + 1, column g (the matrix read column-major). Lanes past 8·count give no address.
void ldmatrix(int count, bool trans, unsigned* r, const void* row, std::source_location where) {
    WarpOp mine;
    mine.addr = row;
    mine.a[0] = (unsigned)count;
    mine.a[1] = trans ? 1u : 0u;
    const WarpOp* ops = tensor_collective(OpKind::LdMatrix, mine, trans ? "ldmatrix.trans" : "ldmatrix", where);
    Sched& s = *g;
    const int lane = s.cur % 32, grp = lane / 4, tig = lane % 4;
    // Every lane checks every address before any reads one, so no lane reads through a bad one.
    const unsigned char* lo = s.smem.data();
    const unsigned char* hi = lo + s.smem.size();
    for (int l = 0; l < 8 * count; ++l) {
        const auto* p = static_cast<const unsigned char*>(ops[l].addr);
        if ((reinterpret_cast<std::uintptr_t>(p) & 15u) != 0 || p < lo || p + 16 > hi)
            kernel_error(std::string("ldmatrix at ") + where.file_name() + ":" + std::to_string(where.line()) + ": lane " + std::to_string(l) +
                         "'s row address is not 16-byte aligned dynamic shared memory");
    }
    for (int i = 0; i < count; ++i) {
        unsigned v = 0;
        for (int h = 0; h < 2; ++h) {
            const int rr = trans ? 2 * tig + h : grp, cc = trans ? grp : 2 * tig + h;
            std::uint16_t e;
            std::memcpy(&e, static_cast<const unsigned char*>(ops[8 * i + rr].addr) + 2 * cc, 2);
            v |= (unsigned)e << (16 * h);
        }
        r[i] = v;
    }
}

}  // namespace simt
