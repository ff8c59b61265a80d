// mHC expand: the layer's output f joins the residual streams, which mix through comb,
//   out[t, n, d] = post[t, n] f[t, d] + sum_m comb[t, m, n] streams[t, m, d],
// stream n of the output gathering column n of the token's comb (comb's rows sum the
// old streams' shares out, its columns the new streams' shares in). post and comb are
// the Sinkhorn split's per-token outputs. Thread (i, t) writes features [i * EPT,
// (i + 1) * EPT) of all HC = 4 output streams of token t; sums in float, m = 0 first.
constexpr uint HC = 4;  // residual streams (DeepSeek-V4's hc_mult)
const uint t = thread_position_in_grid.y;
const uint first = thread_position_in_grid.x * EPT;
float post_n[HC];
float comb_mn[HC][HC];
for (uint m = 0; m < HC; ++m) {
    post_n[m] = post[t * HC + m];
    for (uint n = 0; n < HC; ++n) {
        comb_mn[m][n] = comb[(t * HC + m) * HC + n];
    }
}
const device T* token_streams = streams + t * HC * D;
device T* token_out = out + t * HC * D;
for (uint e = 0; e < EPT; ++e) {
    const uint d = first + e;
    const float fd = float(f[t * D + d]);
    float old[HC];
    for (uint m = 0; m < HC; ++m) {
        old[m] = float(token_streams[m * D + d]);
    }
    for (uint n = 0; n < HC; ++n) {
        float acc = post_n[n] * fd;
        for (uint m = 0; m < HC; ++m) {
            acc += comb_mn[m][n] * old[m];
        }
        token_out[n * D + d] = T(acc);
    }
}
