// The optimizer step on the GPU in three launches for all parameters together (they live in
// one flat buffer, as on the CPU), with no host round trip in between:
//   1. grad_sumsq_partial: per-block sums of squares of grads·inv_scale (f32, fixed order);
//   2. grad_stats_finish (one block): the global L2 norm (partials added in f64, in order), the
//      finite flag (an inf/NaN anywhere propagates into the sum) and torch's clip coefficient
//      max_norm / (norm + 1e-6) capped at 1, into a small stats buffer the host reads once per
//      step together with the loss;
//   3. adamw_step: if finite, the fused AdamW update of every element — unscale and clip folded
//      into the gradient multiplier, decoupled weight decay by segment, both moments, bias-
//      corrected step — and the write of the f16/bf16 compute copy the forward reads. A
//      non-finite step returns at once (skipped, as torch's GradScaler skips it).
// CPU counterparts: engine/src/optim/adamw.rs (`sum_squares`, `AdamW::clip_coef`,
// `AdamW::update`, `adamw_kernel`), the same f32 formulas in the same order.
#include "port.cuh"

// partials[blockIdx.x] = Σ (g·inv_scale)² over the block's grid-stride elements; inv_scale from
// the step block when given one (a captured step).
// grads: (N) f32; partials: (gridDim.x) f32. Block size: any multiple of the warp size ≤ 1024.
ORT_KERNEL(grad_sumsq_partial)(float* partials, const float* grads, long long n, float inv_scale, const StepBlock* step) {
    __shared__ float scratch[32];
    if (step) inv_scale = step->inv_scale;
    float s = 0.0f;
    GRID_STRIDE(i, n) {
        const float y = grads[i] * inv_scale;
        s = fmaf(y, y, s);
    }
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}
ORT_REGISTER(grad_sumsq_partial)

// stats = {norm, finite (1/0), clip coefficient}. One block. partials: (parts) f32; stats: (3) f32.
ORT_KERNEL(grad_stats_finish)(float* stats, const float* partials, int parts, float max_norm) {
    __shared__ double acc;
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int k = 0; k < parts; ++k) t += (double)partials[k];
        acc = t;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const float norm = (float)sqrt(acc);
        const bool finite = isfinite(acc);
        float coef = 1.0f;
        if (max_norm > 0.0f) coef = fminf(max_norm / (norm + 1e-6f), 1.0f);
        stats[0] = norm;
        stats[1] = finite ? 1.0f : 0.0f;
        stats[2] = coef;
    }
}
ORT_REGISTER(grad_stats_finish)

// One AdamW step over the flat buffer (adamw.rs `AdamW::update` / `adamw_kernel`):
//   g = grad·inv_scale·coef; p *= decay_mul (decaying segments only); m = β1·m + (1−β1)·g;
//   v = β2·v + (1−β2)·g²; p −= step_size·m / (sqrt(v)·inv_bc2_sqrt + eps); mirror = round(p).
// step_size = lr / (1 − β1^t), inv_bc2_sqrt = 1/sqrt(1 − β2^t), decay_mul = 1 − lr·wd: per-step
// scalars from the host (it knows t: skipped steps do not count), as arguments or, in the
// kernel `adamw_step_<T>`, from the step block when given one (with inv_scale). Segments: sorted starts,
// one decay flag each; an element's segment is found by binary search (a few hundred at most).
// params, grads, m, v: (N) f32; mirror: (N) T or null; seg_start: (nseg) i64; seg_decay: (nseg)
// i32; stats: (3) f32 from grad_stats_finish.
template <typename T>
__device__ void adamw_step(float* params, const float* grads, float* m, float* v, T* mirror, long long n, const long long* seg_start,
                           const int* seg_decay, int nseg, const float* stats, float inv_scale, float beta1, float beta2, float eps,
                           float step_size, float inv_bc2_sqrt, float decay_mul) {
    if (stats[1] == 0.0f) return;  // inf/NaN gradients: the whole step is skipped
    const float g_scale = inv_scale * stats[2];
    const float one_minus_beta1 = 1.0f - beta1, one_minus_beta2 = 1.0f - beta2;
    // The last segment whose start ≤ i.
    const auto segment = [&](long long i) {
        int lo = 0, hi = nseg - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (seg_start[mid] <= i) lo = mid; else hi = mid - 1;
        }
        return lo;
    };
    // One element's update, in place on p, mi, vi.
    const auto update = [&](float& p, float grad, float& mi, float& vi, int decay) {
        const float g = grad * g_scale;
        if (decay) p *= decay_mul;
        mi = beta1 * mi + one_minus_beta1 * g;
        vi = beta2 * vi + one_minus_beta2 * g * g;
        p -= step_size * mi / (sqrtf(vi) * inv_bc2_sqrt + eps);
    };
    // 4 f32 of each buffer in one 16-byte access where all four are aligned (the flat buffers
    // are; a ZeRO-1 chunk or a test's offset view may not be).
    grid_stride_packed<4>(
        n, aligned16(params) && aligned16(grads) && aligned16(m) && aligned16(v),
        [&](long long i) {
            float p = params[i], mi = m[i], vi = v[i];
            update(p, grads[i], mi, vi, seg_decay[segment(i)]);
            m[i] = mi;
            v[i] = vi;
            params[i] = p;
            if (mirror) mirror[i] = from_f32<T>(p);
        },
        [&](long long i) {
            Pack<float> p = load_pack(params + i), mi = load_pack(m + i), vi = load_pack(v + i);
            const Pack<float> g = load_pack(grads + i);
            int seg = segment(i);
            for (int j = 0; j < 4; ++j) {
                while (seg + 1 < nseg && seg_start[seg + 1] <= i + j) ++seg;  // a segment may start mid-pack
                update(p.e[j], g.e[j], mi.e[j], vi.e[j], seg_decay[seg]);
                if (mirror) mirror[i + j] = from_f32<T>(p.e[j]);
            }
            store_pack(m + i, mi);
            store_pack(v + i, vi);
            store_pack(params + i, p);
        });
}

#define ADAMW(S, T)                                                                                                            \
    ORT_KERNEL(adamw_step_##S)(float* params, const float* grads, float* m, float* v, T* mirror, long long n, const long long* seg_start, \
                               const int* seg_decay, int nseg, const float* stats, float inv_scale, float beta1, float beta2, float eps, \
                               float step_size, float inv_bc2_sqrt, float decay_mul, const StepBlock* step) {                  \
        if (step) {                                                                                                            \
            inv_scale = step->inv_scale;                                                                                       \
            step_size = step->step_size;                                                                                       \
            inv_bc2_sqrt = step->inv_bc2_sqrt;                                                                                 \
            decay_mul = step->decay_mul;                                                                                       \
        }                                                                                                                      \
        adamw_step<T>(params, grads, m, v, mirror, n, seg_start, seg_decay, nseg, stats, inv_scale, beta1, beta2, eps, step_size, \
                      inv_bc2_sqrt, decay_mul);                                                                                \
    }                                                                                                                          \
    ORT_REGISTER(adamw_step_##S)
ORT_FOR_FLOATS(ADAMW)
