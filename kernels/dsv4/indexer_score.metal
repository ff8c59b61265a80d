// Lightning-indexer score: score[s, t] = sum_h w[s, h] * ReLU(q[s, h] . k[t, h']),
// h' = h when KH == H, 0 when the key is shared (KH == 1). One SIMD-group per (s, t);
// lanes stride the head dimension DK.
const uint t = thread_position_in_grid.x / 32;
const uint s = thread_position_in_grid.y;
const uint lane = thread_index_in_simdgroup;
const uint n_keys = threads_per_grid.x / 32;
float total = 0.0f;
for (uint h = 0; h < H; ++h) {
    const device T* qh = q + (s * H + h) * DK;
    const device T* kh = k + (t * KH + (KH == 1 ? 0 : h)) * DK;
    float dot = 0.0f;
    for (uint d = lane; d < DK; d += 32) {
        dot += float(qh[d]) * float(kh[d]);
    }
    dot = simd_sum(dot);
    total += w[s * H + h] * max(dot, 0.0f);
}
if (lane == 0) {
    score[s * n_keys + t] = total;
}
