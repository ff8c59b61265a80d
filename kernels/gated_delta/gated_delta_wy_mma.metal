// Gated DeltaNet prefill in the compact WY form (gated_delta_wy.metal's algebra), with
// its products on 8x8 simdgroup_float8x8 tiles. Per chunk of C tokens, prefix decays
// G_t and ratios Gamma[t, j] = G_t / G_j (j <= t), state S_0 entering the chunk:
//   (I + A) U = beta * (V - G * K S_0^T),     A = strict_lower(beta_t Gamma K K^T)
//   Y = G * Q S_0^T + M U,                    M = lower(Gamma Q K^T)
//   S_C^T = G_C S_0^T + K^T (diag(G_C / G) U)
// The triangular system is solved by blocks of 8 rows: U_I = T_I (R_I - sum_{J<I} A_IJ U_J)
// with T_I = (I + A_II)^-1, so every product (K K^T, Q K^T, K S_0^T, Q S_0^T, the
// off-diagonal and diagonal-block products of the solve, M U and the state update) is an
// 8x8x8 multiply-accumulate; only the inverses of the C/8 diagonal blocks (8x8 unit lower
// triangular) are found by forward substitution, one lane per column.
//
// A threadgroup owns ValueTile value columns of one head (grid (32 * Simdgroups,
// Dv / ValueTile, B * Hv)) and walks the chunks in order. Its SIMD-groups build the
// chunk's A and M tiles together in threadgroup memory; then SIMD-group g owns value
// fragments g, g + Simdgroups, ... of the tile: its part of the state, S_0^T as Dk / 8
// fragments per value fragment, lives in its registers from the first chunk to the last,
// and so does its U. The columns of U are independent (the system is the same for every
// value column), so the SIMD-groups never wait for each other inside the solve.
// A T that is not a multiple of C is padded inside the kernel with identity steps
// (g = 1, beta = 0, q = k = v = 0), whose outputs are not written.
//
// Layouts as in gated_delta_seq.metal. Template: InT, StT, Dk, Dv, C (chunk: 8, 16 or 32),
// ValueTile (a multiple of 8 dividing Dv), Simdgroups (dividing ValueTile / 8), Pad (floats
// added to each row of the threadgroup tiles: rows of Dk or C floats, a multiple of 32, put
// the 8 rows of a fragment on the same banks; 8 more floats a row spread them out).
// Threadgroup memory: 4 * (2 * C * (Dk + Pad) + 2 * C * (C + Pad) + 10 * C) bytes.
constexpr int KS = Dk + Pad;                // row stride of the q and k tiles
constexpr int CS = C + Pad;                 // row stride of the -A and M tiles
constexpr int KF = Dk / 8;                  // fragments along the key dimension
constexpr int CF = C / 8;                   // fragments along the chunk
constexpr int VF = ValueTile / 8 / Simdgroups;  // value fragments per SIMD-group
constexpr int THREADS = 32 * Simdgroups;
static_assert(Dk % 8 == 0 && Dv % ValueTile == 0, "Dk and Dv must be tiled by 8 and ValueTile");
static_assert(C % 8 == 0 && C >= 8 && C <= 32, "the chunk is 8, 16 or 32 tokens");
static_assert(ValueTile % 8 == 0 && VF >= 1 && (ValueTile / 8) % Simdgroups == 0,
              "ValueTile / 8 fragments are shared out evenly over the SIMD-groups");

const int n_tokens = q_shape[1];
const int Hk = q_shape[2];
const int Hv = v_shape[2];
const int n = int(threadgroup_position_in_grid.z);  // b * Hv + hv
const int b = n / Hv;
const int hv = n % Hv;
const int hk = hv / (Hv / Hk);
const int dv0 = int(threadgroup_position_in_grid.y) * ValueTile;
const int sg = int(simdgroup_index_in_threadgroup);
const int tid = int(thread_index_in_threadgroup);
const uint lane = thread_index_in_simdgroup;
const int frow = gd_fragment_row(lane);
const int fcol = gd_fragment_col(lane);

threadgroup float q_c[C * KS];   // the chunk's queries and keys, token-major
threadgroup float k_c[C * KS];
threadgroup float na_c[C * CS];  // -A[t, j] (its strictly lower part is read)
threadgroup float m_c[C * CS];   // M[t, j] (its lower part is read)
threadgroup float inv_c[C * 8];  // T_I = (I + A_II)^-1, block I at rows 8I..8I+7
threadgroup float g_c[C];        // prefix decays G_t
threadgroup float beta_c[C];

const int qk_base = (b * n_tokens * Hk + hk) * Dk;  // token 0 of this key head
const int gb_base = b * n_tokens * Hv + hv;          // token 0 of this value head

// The state, transposed: st[f][kf] is the fragment (kf, value fragment sg + f * Simdgroups)
// of S^T, i.e. element (r, c) is S[dv0 + 8 * (sg + f * Simdgroups) + c][8 * kf + r].
simdgroup_float8x8 st[VF][KF];
for (int f = 0; f < VF; ++f) {
  const int col = dv0 + 8 * (sg + f * Simdgroups) + fcol;
  for (int kf = 0; kf < KF; ++kf) {
    const int key = 8 * kf + frow;
    const int at = (n * Dv + col) * Dk + key;
    st[f][kf].thread_elements() = float2(float(state_in[at]), float(state_in[at + Dk]));
  }
}

for (int t0 = 0; t0 < n_tokens; t0 += C) {
  const int n_valid = min(C, n_tokens - t0);

  // 1. Stage the chunk (its tail padded with identity steps); thread t < C also forms the
  //    prefix decay G_t, multiplying g_0 ... g_t in order (the bits of a sequential scan).
  //    The barrier first lets every SIMD-group finish reading the previous chunk.
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int e = tid; e < C * Dk; e += THREADS) {
    const int t = e / Dk;
    const int src = qk_base + (t0 + t) * Hk * Dk + e % Dk;
    q_c[t * KS + e % Dk] = t < n_valid ? float(q[src]) : 0.0f;
    k_c[t * KS + e % Dk] = t < n_valid ? float(k[src]) : 0.0f;
  }
  if (tid < C) {
    float prefix = 1.0f;
    for (int t = 0; t <= tid && t < n_valid; ++t) {
      prefix *= float(g[gb_base + (t0 + t) * Hv]);
    }
    g_c[tid] = prefix;
    beta_c[tid] = tid < n_valid ? float(beta[gb_base + (t0 + tid) * Hv]) : 0.0f;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  // 2. The lower tiles (I >= J) of K K^T and Q K^T, shared out over the SIMD-groups, made
  //    into -A and M element by element (the lane's two elements: row frow, columns fcol
  //    and fcol + 1 of the tile) and stored.
  for (int p = sg; p < CF * (CF + 1) / 2; p += Simdgroups) {
    int bi = 0;
    while ((bi + 1) * (bi + 2) / 2 <= p) {
      ++bi;
    }
    const int bj = p - bi * (bi + 1) / 2;
    simdgroup_float8x8 kk = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    simdgroup_float8x8 qk = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    for (int kf = 0; kf < KF; ++kf) {
      simdgroup_float8x8 ki, qi, kj_t;
      simdgroup_load(ki, k_c + 8 * bi * KS + 8 * kf, KS);
      simdgroup_load(qi, q_c + 8 * bi * KS + 8 * kf, KS);
      simdgroup_load(kj_t, k_c + 8 * bj * KS + 8 * kf, KS, ulong2(0, 0), true);
      simdgroup_multiply_accumulate(kk, ki, kj_t, kk);
      simdgroup_multiply_accumulate(qk, qi, kj_t, qk);
    }
    const int t = 8 * bi + frow;
    for (int e = 0; e < 2; ++e) {
      const int j = 8 * bj + fcol + e;
      const float ratio = j <= t ? g_c[t] / g_c[j] : 0.0f;
      kk.thread_elements()[e] = j < t ? -(beta_c[t] * ratio * kk.thread_elements()[e]) : 0.0f;
      qk.thread_elements()[e] = ratio * qk.thread_elements()[e];
    }
    simdgroup_store(kk, na_c + 8 * bi * CS + 8 * bj, CS);
    simdgroup_store(qk, m_c + 8 * bi * CS + 8 * bj, CS);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  // 3. T_I = (I + A_II)^-1: thread 8I + c solves (I + A_II) x = e_c by forward substitution.
  if (tid < C) {
    const int block = tid / 8;
    const int c = tid % 8;
    float x[8];
    for (int r = 0; r < 8; ++r) {
      float acc = r == c ? 1.0f : 0.0f;
      for (int s = 0; s < r; ++s) {
        acc += na_c[(8 * block + r) * CS + 8 * block + s] * x[s];
      }
      x[r] = acc;
      inv_c[(8 * block + r) * 8 + c] = acc;
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  // 4. Each value fragment of this SIMD-group, alone: per block row I of the chunk, the
  //    right-hand side, U_I, and Y_I; then the state's fragments.
  const float g_end = g_c[C - 1];
  for (int f = 0; f < VF; ++f) {
    const int col = dv0 + 8 * (sg + f * Simdgroups) + fcol;
    simdgroup_float8x8 u[CF];
    for (int bi = 0; bi < CF; ++bi) {
      simdgroup_float8x8 ks = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
      simdgroup_float8x8 qs = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
      for (int kf = 0; kf < KF; ++kf) {
        simdgroup_float8x8 ki, qi;
        simdgroup_load(ki, k_c + 8 * bi * KS + 8 * kf, KS);
        simdgroup_load(qi, q_c + 8 * bi * KS + 8 * kf, KS);
        simdgroup_multiply_accumulate(ks, ki, st[f][kf], ks);
        simdgroup_multiply_accumulate(qs, qi, st[f][kf], qs);
      }
      // R_I = beta * (V - G * K S_0^T); Q S_0^T scaled by G starts Y_I.
      const int t = 8 * bi + frow;
      const bool valid = t < n_valid;
      const int v_at = (gb_base + (t0 + t) * Hv) * Dv + col;
      for (int e = 0; e < 2; ++e) {
        const float v_te = valid ? float(v[v_at + e]) : 0.0f;
        ks.thread_elements()[e] = beta_c[t] * (v_te - g_c[t] * ks.thread_elements()[e]);
        qs.thread_elements()[e] = g_c[t] * qs.thread_elements()[e];
      }
      // U_I = T_I (R_I - sum_{J<I} A_IJ U_J), the sum accumulated onto R_I as (-A_IJ) U_J.
      for (int bj = 0; bj < bi; ++bj) {
        simdgroup_float8x8 na;
        simdgroup_load(na, na_c + 8 * bi * CS + 8 * bj, CS);
        simdgroup_multiply_accumulate(ks, na, u[bj], ks);
      }
      simdgroup_float8x8 inv;
      simdgroup_load(inv, inv_c + 64 * bi, 8);
      simdgroup_multiply(u[bi], inv, ks);
      // Y_I = G * Q S_0^T + sum_{J<=I} M_IJ U_J.
      for (int bj = 0; bj <= bi; ++bj) {
        simdgroup_float8x8 m;
        simdgroup_load(m, m_c + 8 * bi * CS + 8 * bj, CS);
        simdgroup_multiply_accumulate(qs, m, u[bj], qs);
      }
      if (valid) {
        y[v_at] = static_cast<InT>(qs.thread_elements()[0]);
        y[v_at + 1] = static_cast<InT>(qs.thread_elements()[1]);
      }
    }
    // S_C^T = G_C S_0^T + K^T W, W = U with row t scaled by G_C / G_t.
    for (int bi = 0; bi < CF; ++bi) {
      u[bi].thread_elements() *= g_end / g_c[8 * bi + frow];
    }
    for (int kf = 0; kf < KF; ++kf) {
      st[f][kf].thread_elements() *= g_end;
      for (int bi = 0; bi < CF; ++bi) {
        simdgroup_float8x8 k_t;
        simdgroup_load(k_t, k_c + 8 * bi * KS + 8 * kf, KS, ulong2(0, 0), true);
        simdgroup_multiply_accumulate(st[f][kf], k_t, u[bi], st[f][kf]);
      }
    }
  }
}

for (int f = 0; f < VF; ++f) {
  const int col = dv0 + 8 * (sg + f * Simdgroups) + fcol;
  for (int kf = 0; kf < KF; ++kf) {
    const int at = (n * Dv + col) * Dk + 8 * kf + frow;
    state_out[at] = static_cast<StT>(st[f][kf].thread_elements()[0]);
    state_out[at + Dk] = static_cast<StT>(st[f][kf].thread_elements()[1]);
  }
}
