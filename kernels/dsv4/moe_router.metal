// sqrt-softplus MoE router with bias correction: one threadgroup per token.
// score_e = sqrt(softplus(x . gate_e)); the K experts of largest score_e + bias_e are
// chosen (in rank order, equal keys by smaller index); their weights are the unbiased
// scores normalised over the chosen ones, times route_scale. K <= 32: lane k holds pick k.
threadgroup float score[E];
threadgroup float key[E];
const uint token = threadgroup_position_in_grid.y;
const uint lane = thread_index_in_simdgroup;
const uint sg = simdgroup_index_in_threadgroup;

// Logits: one SIMD-group per expert, lanes stride the hidden dimension.
const device T* xt = x + token * H;
for (uint e = sg; e < E; e += simdgroups_per_threadgroup) {
    const device T* g = gate + e * H;
    float dot = 0.0f;
    for (uint j = lane; j < H; j += 32) {
        dot += float(xt[j]) * float(g[j]);
    }
    dot = simd_sum(dot);
    if (lane == 0) {
        const float s = sqrt(softplus(dot));
        score[e] = s;
        key[e] = s + bias[e];
    }
}
threadgroup_barrier(mem_flags::mem_threadgroup);
if (sg != 0) {
    return;
}

// Selection: K rounds of a 32-lane argmax. Lane l only ever reads experts e = l (mod 32),
// and the winner's owner lane retires it, so no lane reads another's write.
uint pick = 0;
for (uint k = 0; k < K; ++k) {
    float best = -INFINITY;
    uint best_e = E;  // no candidate
    for (uint e = lane; e < E; e += 32) {
        if (key[e] > best) {  // ascending e and a strict >: the smaller index keeps a tie
            best = key[e];
            best_e = e;
        }
    }
    for (uint offset = 16; offset > 0; offset >>= 1) {
        const float other = simd_shuffle_xor(best, offset);
        const uint other_e = simd_shuffle_xor(best_e, offset);
        if (other > best || (other == best && other_e < best_e)) {
            best = other;
            best_e = other_e;
        }
    }
    if (lane == k) {
        pick = best_e;
    }
    if (best_e % 32 == lane) {
        key[best_e] = -INFINITY;
    }
}

const float chosen = lane < K ? score[pick] : 0.0f;
const float total = simd_sum(chosen);
if (lane < K) {
    expert_ids[token * K + lane] = int(pick);
    expert_weights[token * K + lane] = chosen / total * route_scale;
}
