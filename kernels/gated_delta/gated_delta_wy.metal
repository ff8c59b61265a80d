// Gated DeltaNet prefill, chunk by chunk in the compact WY form.
//
// Within a chunk of C tokens with prefix decays G_t = g_0 ... g_t, the recurrence of
// gated_delta_seq.metal unrolls to (S_0: the state entering the chunk)
//   S_t = G_t S_0 + sum_{j <= t} (G_t / G_j) u_j k_j^T
// where the new values u_t solve the unit lower-triangular system
//   u_t + sum_{j < t} A[t, j] u_j = beta_t (v_t - G_t S_0 k_t),
//   A[t, j] = beta_t (G_t / G_j) k_t . k_j.
// Then y_t = G_t S_0 q_t + sum_{j <= t} M[t, j] u_j with M[t, j] = (G_t / G_j) q_t . k_j,
// and the chunk hands S_C = G_C S_0 + sum_j (G_C / G_j) u_j k_j^T to the next one.
// The derivation is in notebooks/gated_delta.ipynb.
//
// A threadgroup owns Rows value rows of one head and walks the chunks in order. Its
// threads build the chunk's A and M together (threadgroup memory); then each SIMD-group
// finishes one value row, lane t owning token t of the chunk: S_0 k_t and S_0 q_t are
// whole dot products in lane t (the row is mirrored in threadgroup memory), the solve
// passes u_j from lane j to all lanes with simd_shuffle, and lane l updates the state
// elements [l * PerLane, (l + 1) * PerLane) it keeps in registers.
// A T that is not a multiple of C is padded inside the kernel: tokens past the end are
// identity steps (g = 1, beta = 0, q = k = 0) and write no output.
//
// Layouts as in gated_delta_seq.metal. Grid (32, Dv, B * Hv); threadgroup (32, Rows, 1).
// Template: InT, StT, Dk, Dv, C (chunk size, at most 32), Rows (value rows per
// threadgroup; must equal the threadgroup's y size).
// Threadgroup memory: 4 * (2 * C * Dk + 2 * C * C + 2 * C + Rows * Dk) bytes.
constexpr int PerLane = Dk / 32;
static_assert(Dk % 32 == 0, "Dk must be a multiple of 32");
static_assert(C >= 1 && C <= 32, "a chunk's tokens map onto the 32 lanes of a SIMD-group");

const int n_tokens = q_shape[1];
const int Hk = q_shape[2];
const int Hv = v_shape[2];
const uint n = thread_position_in_grid.z;  // b * Hv + hv
const uint b = n / Hv;
const uint hv = n % Hv;
const uint hk = hv / (Hv / Hk);
const uint dv = thread_position_in_grid.y;
const uint lane = thread_index_in_simdgroup;
const uint simd = simdgroup_index_in_threadgroup;
const uint tid = thread_index_in_threadgroup;
const uint n_threads = 32 * Rows;

threadgroup float q_c[C * Dk];       // the chunk's queries and keys, token-major
threadgroup float k_c[C * Dk];
threadgroup float g_c[C];            // decays, then their prefix products G_t
threadgroup float beta_c[C];
threadgroup float a_c[C * C];        // A[t, j], zero for j >= t
threadgroup float m_c[C * C];        // M[t, j], zero for j > t
threadgroup float s_rows[Rows * Dk]; // each SIMD-group's state row S_0[dv, :]

const uint qk_base = (b * n_tokens * Hk + hk) * Dk;  // token 0 of this key head
const uint gb_base = b * n_tokens * Hv + hv;          // token 0 of this value head
const uint v_base = gb_base * Dv + dv;
threadgroup float* s_row = s_rows + simd * Dk;

const uint state_base = (n * Dv + dv) * Dk + lane * PerLane;
float s[PerLane];
for (int i = 0; i < PerLane; ++i) {
  s[i] = static_cast<float>(state_in[state_base + i]);
}

for (int t0 = 0; t0 < n_tokens; t0 += C) {
  const int n_valid = min(C, n_tokens - t0);

  // 1. Stage the chunk (padding its tail with identity steps) and this row of S_0. The
  //    barrier first lets every SIMD-group finish reading the previous chunk.
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint e = tid; e < C * Dk; e += n_threads) {
    const int t = e / Dk;
    const uint src = qk_base + (t0 + t) * Hk * Dk + e % Dk;
    q_c[e] = t < n_valid ? static_cast<float>(q[src]) : 0.0f;
    k_c[e] = t < n_valid ? static_cast<float>(k[src]) : 0.0f;
  }
  for (uint t = tid; t < C; t += n_threads) {
    const bool valid = int(t) < n_valid;
    g_c[t] = valid ? static_cast<float>(g[gb_base + (t0 + t) * Hv]) : 1.0f;
    beta_c[t] = valid ? static_cast<float>(beta[gb_base + (t0 + t) * Hv]) : 0.0f;
  }
  for (int i = 0; i < PerLane; ++i) {
    s_row[lane * PerLane + i] = s[i];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  // 2. Prefix products of the decays.
  if (tid == 0) {
    float prefix = 1.0f;
    for (int t = 0; t < C; ++t) {
      prefix *= g_c[t];
      g_c[t] = prefix;
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  // 3. A and M, one (t, j) pair per thread.
  for (uint e = tid; e < C * C; e += n_threads) {
    const uint t = e / C;
    const uint j = e % C;
    float kk = 0.0f;
    float qk = 0.0f;
    if (j <= t) {
      for (int d = 0; d < Dk; ++d) {
        kk += k_c[t * Dk + d] * k_c[j * Dk + d];
        qk += q_c[t * Dk + d] * k_c[j * Dk + d];
      }
    }
    const float ratio = j <= t ? g_c[t] / g_c[j] : 0.0f;
    a_c[e] = j < t ? beta_c[t] * ratio * kk : 0.0f;
    m_c[e] = ratio * qk;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  // 4. Lane t: S_0 k_t and S_0 q_t, then the right-hand side of its row of the solve.
  const uint t = lane;
  const bool mine = int(t) < n_valid;
  float u = 0.0f;
  float s_q = 0.0f;
  if (mine) {
    float s_k = 0.0f;
    for (int d = 0; d < Dk; ++d) {
      s_k += s_row[d] * k_c[t * Dk + d];
      s_q += s_row[d] * q_c[t * Dk + d];
    }
    const float v_t = static_cast<float>(v[v_base + (t0 + t) * Hv * Dv]);
    u = beta_c[t] * (v_t - g_c[t] * s_k);
  }

  // 5. Forward substitution: u_j is final once lanes 0..j-1 have been folded into it;
  //    every lane keeps a copy of all of them for steps 6 and 7.
  float u_all[C];
  for (int j = 0; j < C; ++j) {
    u_all[j] = simd_shuffle(u, ushort(j));
    if (mine && int(t) > j) {
      u -= a_c[t * C + j] * u_all[j];
    }
  }

  // 6. Lane t: y_t = G_t S_0 q_t + sum_{j <= t} M[t, j] u_j.
  if (mine) {
    float out = g_c[t] * s_q;
    for (int j = 0; j < C; ++j) {
      out += m_c[t * C + j] * u_all[j];
    }
    y[v_base + (t0 + t) * Hv * Dv] = static_cast<InT>(out);
  }

  // 7. S_C = G_C S_0 + sum_j (G_C / G_j) u_j k_j^T on this lane's elements.
  const float g_end = g_c[C - 1];
  for (int j = 0; j < C; ++j) {
    u_all[j] *= g_end / g_c[j];
  }
  for (int i = 0; i < PerLane; ++i) {
    float acc = g_end * s[i];
    for (int j = 0; j < C; ++j) {
      acc += u_all[j] * k_c[j * Dk + lane * PerLane + i];
    }
    s[i] = acc;
  }
}

for (int i = 0; i < PerLane; ++i) {
  state_out[state_base + i] = static_cast<StT>(s[i]);
}
