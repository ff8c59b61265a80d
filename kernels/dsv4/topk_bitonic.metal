// Top-K of each row of scores [rows, n] by a bitonic sort in threadgroup memory: one
// threadgroup per row, N (a power of two >= n) slots, each thread compares N / 2 / TG
// pairs per step. Order: larger score first, equal scores by smaller index (a strict
// total order on (score, index), so the result is unique). Slots past n hold -inf with
// indices >= n, which rank after every real score. Scores must not be NaN.
threadgroup float slot_value[N];
threadgroup int slot_index[N];
const uint row = threadgroup_position_in_grid.y;
const uint tid = thread_index_in_threadgroup;
const uint tg = threads_per_threadgroup.x;
const uint n = scores_shape[1];
const device T* row_scores = scores + row * n;
for (uint i = tid; i < N; i += tg) {
    slot_value[i] = i < n ? float(row_scores[i]) : -INFINITY;  // exact for half and bfloat
    slot_index[i] = int(i);
}
threadgroup_barrier(mem_flags::mem_threadgroup);

// Blocks of `size` are sorted alternately ahead-first (rank order) and behind-first, so
// each pair of neighbours is bitonic; the last stage (size = N) sorts in rank order.
for (uint size = 2; size <= N; size <<= 1) {
    for (uint stride = size / 2; stride > 0; stride >>= 1) {
        for (uint p = tid; p < N / 2; p += tg) {
            const uint i = 2 * p - (p & (stride - 1));  // bit `stride` of i is 0
            const uint j = i + stride;
            const bool rank_order = (i & size) == 0;
            const float vi = slot_value[i], vj = slot_value[j];
            const int ii = slot_index[i], ij = slot_index[j];
            const bool i_ahead = vi > vj || (vi == vj && ii < ij);
            if (i_ahead != rank_order) {
                slot_value[i] = vj;
                slot_value[j] = vi;
                slot_index[i] = ij;
                slot_index[j] = ii;
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
}

for (uint k = tid; k < K; k += tg) {
    indices[row * K + k] = slot_index[k];
    values[row * K + k] = row_scores[slot_index[k]];
}
