// Gated DeltaNet recurrence, eight value rows per SIMD-group (the packed layout).
//
// Same recurrence as gated_delta_seq.metal, and the same bits: four lanes share a value
// row (row_in_simd = lane / 4, lane_in_row = lane % 4) and lane_in_row r keeps the state
// elements the sequential layout gives to its lanes 8r .. 8r + 7, as eight partials of
// PerPartial elements. Each partial is accumulated exactly as that sequential lane
// accumulates its own elements; gd_packed_row_sum then adds the partials in the
// butterfly's order (see gated_delta.h).
//
// Layouts as in gated_delta_seq.metal. Grid (32, Dv / 8, B * Hv); threadgroup (32, R, 1).
// Template: InT, StT, Dk, Dv.
constexpr int RowsPerSimd = 8;
constexpr int LanesPerRow = 32 / RowsPerSimd;
constexpr int Partials = 32 / LanesPerRow;  // sequential lanes folded into one lane
constexpr int PerPartial = Dk / 32;         // elements per sequential lane
constexpr int PerLane = Partials * PerPartial;
static_assert(Dk % 32 == 0, "Dk must be a multiple of 32");
static_assert(Dv % RowsPerSimd == 0, "Dv must be a multiple of 8");
static_assert(Partials == 8, "gd_packed_row_sum adds eight partials");

const int n_tokens = q_shape[1];
const int Hk = q_shape[2];
const int Hv = v_shape[2];
const uint n = thread_position_in_grid.z;  // b * Hv + hv
const uint b = n / Hv;
const uint hv = n % Hv;
const uint hk = hv / (Hv / Hk);
const uint lane = thread_index_in_simdgroup;
const uint lane_in_row = lane % LanesPerRow;
const uint dv = thread_position_in_grid.y * RowsPerSimd + lane / LanesPerRow;

// `auto`: MLX binds an input of fewer than 8 elements in the constant address space,
// so each of these may point to constant as well as device memory.
auto q_t = q + (b * n_tokens * Hk + hk) * Dk + lane_in_row * PerLane;
auto k_t = k + (b * n_tokens * Hk + hk) * Dk + lane_in_row * PerLane;
auto v_t = v + (b * n_tokens * Hv + hv) * Dv + dv;
device InT* y_t = y + (b * n_tokens * Hv + hv) * Dv + dv;
auto g_t = g + b * n_tokens * Hv + hv;
auto beta_t = beta + b * n_tokens * Hv + hv;

const uint row = (n * Dv + dv) * Dk + lane_in_row * PerLane;
float s[PerLane];
for (int i = 0; i < PerLane; ++i) {
  s[i] = static_cast<float>(state_in[row + i]);
}

float part[Partials];
for (int t = 0; t < n_tokens; ++t) {
  const float decay = static_cast<float>(*g_t);
  for (int p = 0; p < Partials; ++p) {
    float kv_mem = 0.0f;
    for (int i = p * PerPartial; i < (p + 1) * PerPartial; ++i) {
      s[i] = s[i] * decay;
      kv_mem += s[i] * static_cast<float>(k_t[i]);
    }
    part[p] = kv_mem;
  }
  const float kv_mem = gd_packed_row_sum(part);

  const float delta = (static_cast<float>(*v_t) - kv_mem) * static_cast<float>(*beta_t);

  for (int p = 0; p < Partials; ++p) {
    float out = 0.0f;
    for (int i = p * PerPartial; i < (p + 1) * PerPartial; ++i) {
      s[i] = s[i] + static_cast<float>(k_t[i]) * delta;
      out += s[i] * static_cast<float>(q_t[i]);
    }
    part[p] = out;
  }
  const float out = gd_packed_row_sum(part);
  if (lane_in_row == 0) {
    *y_t = static_cast<InT>(out);
  }

  q_t += Hk * Dk;
  k_t += Hk * Dk;
  v_t += Hv * Dv;
  y_t += Hv * Dv;
  g_t += Hv;
  beta_t += Hv;
}

for (int i = 0; i < PerLane; ++i) {
  state_out[row + i] = static_cast<StT>(s[i]);
}
