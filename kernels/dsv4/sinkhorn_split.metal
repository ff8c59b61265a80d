// mHC split of the (2 + 4) * 4 = 24 mixes of a token into pre [4], post [4] and the 4x4
// comb matrix, made doubly stochastic by Sinkhorn-Knopp. One quad per token: lane r owns
// pre[r], post[r] and comb row r, so a row sum is the lane's own and a column sum is a
// quad_sum of the rows.
//   pre  = sigmoid(scale[0] * m_pre + base_pre) + eps
//   post = 2 * sigmoid(scale[1] * m_post + base_post)
//   comb = softmax_rows(scale[2] * m_comb + base_comb) + eps, then columns, then ITERS - 1
//          times rows and columns, each normalised as c / (sum + eps).
const uint token = thread_position_in_grid.x / 4;
const uint r = thread_index_in_quadgroup;
const device T* m = mixes + token * 24;

pre[token * 4 + r] = sigmoid(float(m[r]) * hc_scale[0] + hc_base[r]) + eps;
post[token * 4 + r] = 2.0f * sigmoid(float(m[4 + r]) * hc_scale[1] + hc_base[4 + r]);

float4 row;
for (uint j = 0; j < 4; ++j) {
    row[j] = float(m[8 + 4 * r + j]) * hc_scale[2] + hc_base[8 + 4 * r + j];
}
row = exp(row - max(max(row.x, row.y), max(row.z, row.w)));
row = row / (row.x + row.y + row.z + row.w) + eps;
row = row / (quad_sum(row) + eps);
for (uint it = 1; it < ITERS; ++it) {
    row = row / ((row.x + row.y + row.z + row.w) + eps);
    row = row / (quad_sum(row) + eps);
}
for (uint j = 0; j < 4; ++j) {
    comb[token * 16 + 4 * r + j] = row[j];
}
