// Flash attention v2 on 8x8 simdgroup_matrix fragments: out = softmax(q k^T * scale) v.
//
// q, k, v: [B, H, L, D] (head-major); out: [B, Lq, H, D] (token-major).
// Template values: T (element type of q, k, v and out), D (head dimension, a multiple
// of 8), BQ and BK (query and key tile), SG (SIMD-groups per threadgroup, BQ a multiple
// of 8 * SG), CAUSAL (query i sees keys j <= i + Lk - Lq).
//
// One threadgroup computes BQ query rows of one (batch, head); SIMD-group sg owns rows
// sg * BQ / SG onwards, in MF fragments of 8 rows. Its q rows live in registers (scaled
// once), and so do its output accumulator, the scores S of the current key tile and the
// running row maximum; the per-lane partial row sums are combined once at the end. The
// threadgroup only shares the staged key and value tiles: 2 * BK * D elements of T.
constexpr int ROWS = BQ / SG;  // query rows per SIMD-group
constexpr int MF = ROWS / 8;   // 8-row fragments per SIMD-group
constexpr int DF = D / 8;      // 8-column fragments along the head dimension
constexpr int KF = BK / 8;     // 8-column fragments along the key tile
constexpr int THREADS = SG * 32;
static_assert(D % 8 == 0 && BK % 8 == 0, "D and BK must be multiples of 8");
static_assert(MF >= 1 && ROWS % 8 == 0, "BQ must be a multiple of 8 * SG");

const int H = q_shape[1];
const int LQ = q_shape[2];
const int LK = k_shape[2];
const int head = threadgroup_position_in_grid.y;
const int batch = threadgroup_position_in_grid.z;
const int q0 = threadgroup_position_in_grid.x * BQ;
const uint lane = thread_index_in_simdgroup;
const int sg_row0 = q0 + int(simdgroup_index_in_threadgroup) * ROWS;
const int frag_row = fa_fragment_row(lane);
const int frag_col = fa_fragment_col(lane);
// Causal attention aligns the last query with the last key.
const int causal_shift = LK - LQ;

const device T* q_head = q + size_t(batch * H + head) * LQ * D;
const device T* k_head = k + size_t(batch * H + head) * LK * D;
const device T* v_head = v + size_t(batch * H + head) * LK * D;

threadgroup T k_tile[BK * D];
threadgroup T v_tile[BK * D];

// The SIMD-group's query rows, scaled, read lane by lane in the fragment layout: rows
// past the sequence read as zero (their outputs are never written).
simdgroup_float8x8 q_frag[MF][DF];
for (int mi = 0; mi < MF; ++mi) {
  const int row = sg_row0 + mi * 8 + frag_row;
  for (int di = 0; di < DF; ++di) {
    float2 x(0.0f);
    if (row < LQ) {
      const device T* src = q_head + size_t(row) * D + di * 8 + frag_col;
      x = float2(float(src[0]), float(src[1])) * scale;
    }
    q_frag[mi][di].thread_elements() = x;
  }
}

simdgroup_float8x8 o_acc[MF][DF];
float row_max[MF];      // running maximum of the lane's row (the same in its four lanes)
float row_sum_part[MF]; // running sum of exp over the columns this lane holds
for (int mi = 0; mi < MF; ++mi) {
  for (int di = 0; di < DF; ++di) {
    o_acc[mi][di] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  }
  row_max[mi] = -INFINITY;
  row_sum_part[mi] = 0.0f;
}

// Causal: no query of this tile sees keys past its last row's diagonal.
const int last_row = metal::min(q0 + BQ, LQ) - 1;
const int k_end = CAUSAL ? metal::min(LK, last_row + causal_shift + 1) : LK;

for (int k0 = 0; k0 < k_end; k0 += BK) {
  // Stage the key and value tiles; keys past the sequence are zero (and masked below).
  for (int i = int(thread_index_in_threadgroup); i < BK * D; i += THREADS) {
    const int key = k0 + i / D;
    const bool inside = key < LK;
    const size_t at = size_t(key) * D + i % D;
    k_tile[i] = inside ? k_head[at] : static_cast<T>(0.0f);
    v_tile[i] = inside ? v_head[at] : static_cast<T>(0.0f);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  // A SIMD-group whose rows all precede the tile's first key has nothing to add.
  const bool sees_tile = !CAUSAL || k0 <= sg_row0 + ROWS - 1 + causal_shift;
  if (sees_tile) {
    // S = (q * scale) k^T over the tile.
    simdgroup_float8x8 s[MF][KF];
    for (int mi = 0; mi < MF; ++mi) {
      for (int ni = 0; ni < KF; ++ni) {
        s[mi][ni] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
      }
    }
    for (int di = 0; di < DF; ++di) {
      for (int ni = 0; ni < KF; ++ni) {
        const simdgroup_float8x8 kt = fa_load_as_float(k_tile, D, ni * 8, di * 8, true);
        for (int mi = 0; mi < MF; ++mi) {
          simdgroup_multiply_accumulate(s[mi][ni], q_frag[mi][di], kt, s[mi][ni]);
        }
      }
    }

    // Online softmax, row by row in registers: mask, new maximum, rescale what the
    // row accumulated so far by exp(old max - new max), and turn S into P = exp(S - max).
    for (int mi = 0; mi < MF; ++mi) {
      const int row = sg_row0 + mi * 8 + frag_row;
      float tile_max = -INFINITY;
      for (int ni = 0; ni < KF; ++ni) {
        thread auto& x = s[mi][ni].thread_elements();
        for (int e = 0; e < 2; ++e) {
          const int key = k0 + ni * 8 + frag_col + e;
          const bool seen = key < LK && (!CAUSAL || key <= row + causal_shift);
          x[e] = seen ? x[e] : -INFINITY;
          tile_max = metal::max(tile_max, x[e]);
        }
      }
      const float new_max = metal::max(row_max[mi], fa_row_max(tile_max));
      // A row that has seen no key yet keeps max = -inf; subtract 0 then, so that
      // exp(-inf - 0) = 0 rather than exp(-inf + inf) = NaN.
      const float shift = new_max == -INFINITY ? 0.0f : new_max;
      const float correction = metal::exp(row_max[mi] - shift);
      row_max[mi] = new_max;
      float tile_sum = 0.0f;
      for (int ni = 0; ni < KF; ++ni) {
        thread auto& x = s[mi][ni].thread_elements();
        x = float2(metal::exp(x[0] - shift), metal::exp(x[1] - shift));
        tile_sum += x[0] + x[1];
      }
      row_sum_part[mi] = row_sum_part[mi] * correction + tile_sum;
      for (int di = 0; di < DF; ++di) {
        o_acc[mi][di].thread_elements() *= correction;
      }
    }

    // O += P v over the tile.
    for (int kk = 0; kk < KF; ++kk) {
      for (int di = 0; di < DF; ++di) {
        const simdgroup_float8x8 vf = fa_load_as_float(v_tile, D, kk * 8, di * 8, false);
        for (int mi = 0; mi < MF; ++mi) {
          simdgroup_multiply_accumulate(o_acc[mi][di], s[mi][kk], vf, o_acc[mi][di]);
        }
      }
    }
  }
  // The next tile overwrites k_tile and v_tile.
  threadgroup_barrier(mem_flags::mem_threadgroup);
}

// out[b, row, head, :] = O[row, :] / (sum of exp over the row), token-major.
for (int mi = 0; mi < MF; ++mi) {
  const float inv_sum = 1.0f / fa_row_sum(row_sum_part[mi]);
  const int row = sg_row0 + mi * 8 + frag_row;
  if (row < LQ) {
    device T* dst = out + (size_t(batch * LQ + row) * H + head) * D + frag_col;
    for (int di = 0; di < DF; ++di) {
      const float2 x = o_acc[mi][di].thread_elements() * inv_sum;
      dst[di * 8] = static_cast<T>(x[0]);
      dst[di * 8 + 1] = static_cast<T>(x[1]);
    }
  }
}
