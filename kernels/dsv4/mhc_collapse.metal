// mHC collapse: the layer's input is a per-token weighted sum of the HC = 4 residual
// streams, x[t, d] = sum_s pre[t, s] streams[t, s, d], with pre from the Sinkhorn split
// (dynamic: a token's own weights, not a model constant). Thread (i, t) writes features
// [i * EPT, (i + 1) * EPT) of token t; the sum is taken in float, stream 0 first.
constexpr uint HC = 4;  // residual streams (DeepSeek-V4's hc_mult)
const uint t = thread_position_in_grid.y;
const uint first = thread_position_in_grid.x * EPT;
float weight[HC];
for (uint s = 0; s < HC; ++s) {
    weight[s] = pre[t * HC + s];
}
const device T* token_streams = streams + t * HC * D;
for (uint e = 0; e < EPT; ++e) {
    const uint d = first + e;
    float acc = 0.0f;
    for (uint s = 0; s < HC; ++s) {
        acc += weight[s] * float(token_streams[s * D + d]);
    }
    x[t * D + d] = T(acc);
}
