// Scalar attention, the textbook way: out = softmax(q k^T * scale) v.
//
// q, k, v: [B, H, L, D] (head-major); out: [B, Lq, H, D] (token-major).
// Template values: T (element type), D (head dimension), CAUSAL (query i sees keys
// j <= i + Lk - Lq). One thread per (query row, head, batch), two passes over the keys:
// the row maximum, then the exp-weighted sum of the values, all in float.
const int H = q_shape[1];
const int LQ = q_shape[2];
const int LK = k_shape[2];
const int row = thread_position_in_grid.x;
const int head = thread_position_in_grid.y;
const int batch = thread_position_in_grid.z;
if (row >= LQ) {
  return;
}
const device T* q_row = q + (size_t(batch * H + head) * LQ + row) * D;
const device T* k_head = k + size_t(batch * H + head) * LK * D;
const device T* v_head = v + size_t(batch * H + head) * LK * D;
const int keys = CAUSAL ? metal::min(LK, row + LK - LQ + 1) : LK;

float qs[D];
for (int d = 0; d < D; ++d) {
  qs[d] = float(q_row[d]) * scale;
}

float max_score = -INFINITY;
for (int j = 0; j < keys; ++j) {
  float score = 0.0f;
  for (int d = 0; d < D; ++d) {
    score += qs[d] * float(k_head[j * D + d]);
  }
  max_score = metal::max(max_score, score);
}

float sum = 0.0f;
float acc[D];
for (int d = 0; d < D; ++d) {
  acc[d] = 0.0f;
}
for (int j = 0; j < keys; ++j) {
  float score = 0.0f;
  for (int d = 0; d < D; ++d) {
    score += qs[d] * float(k_head[j * D + d]);
  }
  const float p = metal::exp(score - max_score);
  sum += p;
  for (int d = 0; d < D; ++d) {
    acc[d] += p * float(v_head[j * D + d]);
  }
}

device T* dst = out + (size_t(batch * LQ + row) * H + head) * D;
for (int d = 0; d < D; ++d) {
  dst[d] = static_cast<T>(acc[d] / sum);
}
