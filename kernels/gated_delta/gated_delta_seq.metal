// Gated DeltaNet recurrence, one SIMD-group per value row (decode and short prefill).
//
// Per token t, for value row dv of head hv (k, q of key head hk = hv / (Hv / Hk)):
//   S      = g_t * S                        decay
//   kv_mem = S[dv, :] . k_t                 what the state recalls for k_t
//   delta  = (v_t[dv] - kv_mem) * beta_t    delta-rule correction
//   S      = S + delta * k_t^T
//   y_t    = S[dv, :] . q_t
// Lane l keeps state elements [l * PerLane, (l + 1) * PerLane) of the row in registers;
// the two dot products end in a 32-lane reduction.
//
// Layouts: q, k [B, T, Hk, Dk]; v, y [B, T, Hv, Dv]; g, beta [B, T, Hv];
// state_in, state_out [B, Hv, Dv, Dk]. Grid (32, Dv, B * Hv); threadgroup (32, R, 1).
// Template: InT, StT (element types of y and of the state), Dk, Dv, XorTree (reduce with
// the written-out butterfly instead of simd_sum).
constexpr int PerLane = Dk / 32;
static_assert(Dk % 32 == 0, "Dk must be a multiple of 32");

const int n_tokens = q_shape[1];
const int Hk = q_shape[2];
const int Hv = v_shape[2];
const uint n = thread_position_in_grid.z;  // b * Hv + hv
const uint b = n / Hv;
const uint hv = n % Hv;
const uint hk = hv / (Hv / Hk);
const uint dv = thread_position_in_grid.y;
const uint lane = thread_index_in_simdgroup;

// `auto`: MLX binds an input of fewer than 8 elements in the constant address space,
// so each of these may point to constant as well as device memory.
auto q_t = q + (b * n_tokens * Hk + hk) * Dk + lane * PerLane;
auto k_t = k + (b * n_tokens * Hk + hk) * Dk + lane * PerLane;
auto v_t = v + (b * n_tokens * Hv + hv) * Dv + dv;
device InT* y_t = y + (b * n_tokens * Hv + hv) * Dv + dv;
auto g_t = g + b * n_tokens * Hv + hv;
auto beta_t = beta + b * n_tokens * Hv + hv;

const uint row = (n * Dv + dv) * Dk + lane * PerLane;
float s[PerLane];
for (int i = 0; i < PerLane; ++i) {
  s[i] = static_cast<float>(state_in[row + i]);
}

for (int t = 0; t < n_tokens; ++t) {
  const float decay = static_cast<float>(*g_t);
  float kv_mem = 0.0f;
  for (int i = 0; i < PerLane; ++i) {
    s[i] = s[i] * decay;
    kv_mem += s[i] * static_cast<float>(k_t[i]);
  }
  kv_mem = XorTree ? gd_xor_tree_sum(kv_mem) : simd_sum(kv_mem);

  const float delta = (static_cast<float>(*v_t) - kv_mem) * static_cast<float>(*beta_t);

  float out = 0.0f;
  for (int i = 0; i < PerLane; ++i) {
    s[i] = s[i] + static_cast<float>(k_t[i]) * delta;
    out += s[i] * static_cast<float>(q_t[i]);
  }
  out = XorTree ? gd_xor_tree_sum(out) : simd_sum(out);
  if (lane == 0) {
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
