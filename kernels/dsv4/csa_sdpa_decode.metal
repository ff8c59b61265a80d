// CSA decode attention: sdpa_decode_sink with the dense loop over the cache replaced by a
// gather. One query token per head attends to the cache rows a list names (the lightning
// indexer's top-k of the compressed entries and the sliding window's raw ones, kept side
// by side in one cache), plus the head's softmax sink:
//   out = sum_{j in list} e^{s_j - M} v_j / (sum_{j in list} e^{s_j - M} + e^{sink - M}).
// indices [B, N]: the rows of batch b's list; an entry < 0 is an empty slot (a list padded
// to a fixed N). One threadgroup per (head, batch), SG SIMD-groups splitting the list
// (SIMD-group g takes entries g, g + SG, ...), each with an online softmax; lane l holds
// features [l * DL, (l + 1) * DL). The partial results meet in threadgroup memory, where
// the sink joins the denominator. With the list 0, 1, ..., L - 1 the arithmetic is
// sdpa_decode_sink's, operation for operation.
constexpr uint DL = D / 32;
threadgroup float part_max[SG];
threadgroup float part_sum[SG];
threadgroup float part_out[SG * D];
const uint head = threadgroup_position_in_grid.x;
const uint batch = threadgroup_position_in_grid.y;
const uint lane = thread_index_in_simdgroup;
const uint sg = simdgroup_index_in_threadgroup;
const uint n_keys = k_shape[2];
const uint n_list = indices_shape[1];
const uint kv_head = head / (H / HKV);

float qr[DL], o[DL];
const device T* qh = q + (batch * H + head) * D + lane * DL;
for (uint c = 0; c < DL; ++c) {
    qr[c] = float(qh[c]) * scale;
    o[c] = 0.0f;
}
float running_max = -INFINITY, running_sum = 0.0f;
const uint kv = (batch * HKV + kv_head) * n_keys * D + lane * DL;
const device int* list = indices + batch * n_list;
for (uint i = sg; i < n_list; i += SG) {
    const int j = list[i];  // the same for the whole SIMD-group
    if (j < 0) {
        continue;
    }
    const device T* kj = k + kv + uint(j) * D;
    const device T* vj = v + kv + uint(j) * D;
    float s = 0.0f;
    for (uint c = 0; c < DL; ++c) {
        s += qr[c] * float(kj[c]);
    }
    s = simd_sum(s);
    const float new_max = max(running_max, s);
    const float rescale = exp(running_max - new_max);  // 0 on the first key
    const float p = exp(s - new_max);
    running_sum = running_sum * rescale + p;
    for (uint c = 0; c < DL; ++c) {
        o[c] = o[c] * rescale + p * float(vj[c]);
    }
    running_max = new_max;
}
if (lane == 0) {
    part_max[sg] = running_max;  // -inf for a SIMD-group without keys
    part_sum[sg] = running_sum;
}
for (uint c = 0; c < DL; ++c) {
    part_out[sg * D + lane * DL + c] = o[c];
}
threadgroup_barrier(mem_flags::mem_threadgroup);

const float sink = sinks[head];
float m = sink;
for (uint g = 0; g < SG; ++g) {
    m = max(m, part_max[g]);
}
float denominator = exp(sink - m);
for (uint g = 0; g < SG; ++g) {
    denominator += part_sum[g] * exp(part_max[g] - m);
}
for (uint d = thread_index_in_threadgroup; d < D; d += SG * 32) {
    float numerator = 0.0f;
    for (uint g = 0; g < SG; ++g) {
        numerator += part_out[g * D + d] * exp(part_max[g] - m);
    }
    out[(batch * H + head) * D + d] = T(numerator / denominator);
}
