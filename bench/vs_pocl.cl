// The OpenCL C side of bench/vs_pocl.py: each kernel is the algorithm of its MSL
// counterpart with the same work-group geometry (a Metal threadgroup is a work-group, a
// 32-thread SIMD-group is 32 consecutive work-items along x).
//
// SIMD-group reductions (simd_sum, simd_max) become sub_group_reduce_* when the device has
// cl_khr_subgroups (the host defines USE_SUBGROUPS) and a tree in local memory otherwise.

#ifdef USE_SUBGROUPS
#pragma OPENCL EXTENSION cl_khr_subgroups : enable
#endif

// --- reductions over the 32 work-items of one SIMD-group-sized row -----------------------
// `slot` is 32 floats of local memory owned by the row; every work-item of the work-group
// must call these together (they contain barriers).

float row32_sum(__local float* slot, float x, uint lane) {
#ifdef USE_SUBGROUPS
  return sub_group_reduce_add(x);
#else
  slot[lane] = x;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint s = 16; s > 0; s >>= 1) {
    if (lane < s) slot[lane] += slot[lane + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float total = slot[0];
  barrier(CLK_LOCAL_MEM_FENCE);  // the slot is reused by the next reduction
  return total;
#endif
}

float row32_max(__local float* slot, float x, uint lane) {
#ifdef USE_SUBGROUPS
  return sub_group_reduce_max(x);
#else
  slot[lane] = x;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint s = 16; s > 0; s >>= 1) {
    if (lane < s) slot[lane] = fmax(slot[lane], slot[lane + s]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float total = slot[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return total;
#endif
}

// --- 1. elementwise: exp, a * b + c ---------------------------------------------------

__kernel void exp_f32(__global const float* x, __global float* out) {
  const size_t i = get_global_id(0);
  out[i] = exp(x[i]);
}

__kernel void multiply_add_f32(__global const float* a, __global const float* b,
                               __global const float* c, __global float* out) {
#pragma OPENCL FP_CONTRACT OFF
  const size_t i = get_global_id(0);
  out[i] = a[i] * b[i] + c[i];
}

// --- 2. threadgroup tree sum: one partial sum per 256-thread work-group -----------------

__kernel __attribute__((reqd_work_group_size(256, 1, 1)))
void tree_sum_256(__global const float* x, __global float* out) {
  __local float partial[256];
  const uint t = get_local_id(0);
  partial[t] = x[get_global_id(0)];
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint s = 128; s > 0; s >>= 1) {
    if (t < s) partial[t] += partial[t + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (t == 0) out[get_group_id(0)] = partial[0];
}

// --- 3. row softmax, 256 work-items a row, reductions in local memory -------------------

__kernel __attribute__((reqd_work_group_size(256, 1, 1)))
void softmax_tg256(__global const float* x, __global float* out, uint n) {
  __local float part[256];
  const uint t = get_local_id(0);
  const size_t row = get_group_id(1);
  __global const float* xr = x + row * n;
  float m = -INFINITY;
  for (uint j = t; j < n; j += 256) m = fmax(m, xr[j]);
  part[t] = m;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint s = 128; s > 0; s >>= 1) {
    if (t < s) part[t] = fmax(part[t], part[t + s]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  m = part[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  float sum = 0.0f;
  for (uint j = t; j < n; j += 256) sum += exp(xr[j] - m);
  part[t] = sum;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint s = 128; s > 0; s >>= 1) {
    if (t < s) part[t] += part[t + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  sum = part[0];
  for (uint j = t; j < n; j += 256) out[row * n + j] = exp(xr[j] - m) / sum;
}

// --- 4. GEMM C = A B with 16x16 tiles in local memory, one output per work-item --------

__kernel __attribute__((reqd_work_group_size(16, 16, 1)))
void gemm_tiled16(__global const float* a, __global const float* b, __global float* c,
                  uint k_dim, uint n_dim) {
  __local float a_tile[16][16];
  __local float b_tile[16][16];
  const uint tx = get_local_id(0), ty = get_local_id(1);
  const size_t col = get_global_id(0), row = get_global_id(1);
  float acc = 0.0f;
  for (uint k0 = 0; k0 < k_dim; k0 += 16) {
    a_tile[ty][tx] = a[row * k_dim + k0 + tx];
    b_tile[ty][tx] = b[(k0 + ty) * n_dim + col];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint k = 0; k < 16; ++k) acc += a_tile[ty][k] * b_tile[k][tx];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  c[row * n_dim + col] = acc;
}

// --- 5. row softmax, one 32-wide row group a row (the simd_max / simd_sum kernel) --------

__kernel __attribute__((reqd_work_group_size(32, 1, 1)))
void softmax_row32(__global const float* x, __global float* out, uint n) {
  __local float slot[32];
  const uint lane = get_local_id(0);
  const size_t row = get_group_id(1);
  __global const float* xr = x + row * n;
  float m = -INFINITY;
  for (uint j = lane; j < n; j += 32) m = fmax(m, xr[j]);
  m = row32_max(slot, m, lane);
  float s = 0.0f;
  for (uint j = lane; j < n; j += 32) s += exp(xr[j] - m);
  s = row32_sum(slot, s, lane);
  for (uint j = lane; j < n; j += 32) out[row * n + j] = exp(xr[j] - m) / s;
}

// --- 6. GEMM with the simdgroup_matrix kernel's tiling: 32 work-items own a 32x32 tile
// of C and read A and B straight from global memory; each work-item keeps a 4x8 block of
// C in registers (float8 rows), the register-blocked counterpart of 4x4 8x8 fragments.

__kernel __attribute__((reqd_work_group_size(32, 1, 1)))
void gemm_block32(__global const float* a, __global const float* b, __global float* c,
                  uint k_dim, uint n_dim) {
  const uint lane = get_local_id(0);
  const size_t row0 = get_group_id(1) * 32 + (lane / 4) * 4;
  const size_t col0 = get_group_id(0) * 32 + (lane % 4) * 8;
  float8 acc[4] = {(float8)(0.0f), (float8)(0.0f), (float8)(0.0f), (float8)(0.0f)};
  for (uint k = 0; k < k_dim; ++k) {
    const float8 bk = vload8(0, b + k * n_dim + col0);
    for (int i = 0; i < 4; ++i) acc[i] += a[(row0 + i) * k_dim + k] * bk;
  }
  for (int i = 0; i < 4; ++i) vstore8(acc[i], 0, c + (row0 + i) * n_dim + col0);
}

// --- 7. gated-delta decode, the `seq` layout: one 32-wide row group per value row --------
// q, k [B, T, Hk, Dk]; v, y [B, T, Hv, Dv]; g, beta [B, T, Hv]; state [B, Hv, Dv, Dk].
// Global (32, Dv, B * Hv), work-group (32, GD_ROWS, 1); lane l holds state elements
// [l * GD_PER_LANE, (l + 1) * GD_PER_LANE) of its row.

#define GD_DK 128
#define GD_DV 128
#define GD_ROWS 4
#define GD_PER_LANE (GD_DK / 32)

__kernel __attribute__((reqd_work_group_size(32, GD_ROWS, 1)))
void gated_delta_seq(__global const float* q, __global const float* k,
                     __global const float* v, __global const float* g,
                     __global const float* beta, __global const float* state_in,
                     __global float* y, __global float* state_out,
                     int n_tokens, int hk_count, int hv_count) {
  __local float slots[GD_ROWS][32];
  const uint lane = get_local_id(0);
  __local float* slot = slots[get_local_id(1)];
  const uint n = get_global_id(2);  // b * Hv + hv
  const uint b = n / hv_count, hv = n % hv_count;
  const uint hk = hv / (hv_count / hk_count);
  const uint dv = get_global_id(1);

  __global const float* q_t = q + (b * n_tokens * hk_count + hk) * GD_DK + lane * GD_PER_LANE;
  __global const float* k_t = k + (b * n_tokens * hk_count + hk) * GD_DK + lane * GD_PER_LANE;
  __global const float* v_t = v + (b * n_tokens * hv_count + hv) * GD_DV + dv;
  __global float* y_t = y + (b * n_tokens * hv_count + hv) * GD_DV + dv;
  __global const float* g_t = g + b * n_tokens * hv_count + hv;
  __global const float* beta_t = beta + b * n_tokens * hv_count + hv;

  const size_t at = ((size_t)n * GD_DV + dv) * GD_DK + lane * GD_PER_LANE;
  float s[GD_PER_LANE];
  for (int i = 0; i < GD_PER_LANE; ++i) s[i] = state_in[at + i];

  for (int t = 0; t < n_tokens; ++t) {
    const float decay = *g_t;
    float kv_mem = 0.0f;
    for (int i = 0; i < GD_PER_LANE; ++i) {
      s[i] *= decay;
      kv_mem += s[i] * k_t[i];
    }
    kv_mem = row32_sum(slot, kv_mem, lane);
    const float delta = (*v_t - kv_mem) * *beta_t;
    float out = 0.0f;
    for (int i = 0; i < GD_PER_LANE; ++i) {
      s[i] += k_t[i] * delta;
      out += s[i] * q_t[i];
    }
    out = row32_sum(slot, out, lane);
    if (lane == 0) *y_t = out;
    q_t += hk_count * GD_DK;
    k_t += hk_count * GD_DK;
    v_t += hv_count * GD_DV;
    y_t += hv_count * GD_DV;
    g_t += hv_count;
    beta_t += hv_count;
  }
  for (int i = 0; i < GD_PER_LANE; ++i) state_out[at + i] = s[i];
}

// --- 8. flash attention v2 with the MSL kernel's tiles: FA_BQ query rows a work-group of
// FA_THREADS work-items, key and value tiles of FA_BK keys staged in local memory, online
// softmax. FA_SPLIT work-items share a query row: each scores FA_BK / FA_SPLIT keys of the
// tile and accumulates FA_D / FA_SPLIT output columns.
// q, k, v [B, H, L, D] (head-major); out [B, Lq, H, D] (token-major).

#define FA_D 64
#define FA_BQ 16
#define FA_BK 16
#define FA_THREADS 64
#define FA_SPLIT (FA_THREADS / FA_BQ)
#define FA_COLS (FA_D / FA_SPLIT)

__kernel __attribute__((reqd_work_group_size(FA_THREADS, 1, 1)))
void flash_attention(__global const float* q, __global const float* k,
                     __global const float* v, __global float* out, int heads, int lq,
                     int lk, float scale) {
  __local float k_tile[FA_BK * FA_D];
  __local float v_tile[FA_BK * FA_D];
  __local float scores[FA_BQ][FA_BK];
  const int t = get_local_id(0);
  const int r = t / FA_SPLIT, part = t % FA_SPLIT;
  const int head = get_group_id(1), batch = get_group_id(2);
  const int row = get_group_id(0) * FA_BQ + r;
  const size_t bh = (size_t)batch * heads + head;
  __global const float* k_head = k + bh * lk * FA_D;
  __global const float* v_head = v + bh * lk * FA_D;

  float q_row[FA_D];
  for (int d = 0; d < FA_D; ++d) {
    q_row[d] = row < lq ? q[(bh * lq + row) * FA_D + d] * scale : 0.0f;
  }
  float o[FA_COLS];
  for (int c = 0; c < FA_COLS; ++c) o[c] = 0.0f;
  float row_max = -INFINITY, row_sum = 0.0f;

  for (int k0 = 0; k0 < lk; k0 += FA_BK) {
    for (int i = t; i < FA_BK * FA_D; i += FA_THREADS) {
      const int key = k0 + i / FA_D;
      k_tile[i] = key < lk ? k_head[(size_t)key * FA_D + i % FA_D] : 0.0f;
      v_tile[i] = key < lk ? v_head[(size_t)key * FA_D + i % FA_D] : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int j = part; j < FA_BK; j += FA_SPLIT) {
      float s = 0.0f;
      for (int d = 0; d < FA_D; ++d) s += q_row[d] * k_tile[j * FA_D + d];
      scores[r][j] = k0 + j < lk ? s : -INFINITY;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    float tile_max = -INFINITY;
    for (int j = 0; j < FA_BK; ++j) tile_max = fmax(tile_max, scores[r][j]);
    const float new_max = fmax(row_max, tile_max);
    const float correction = exp(row_max - new_max);
    row_max = new_max;
    row_sum *= correction;
    for (int c = 0; c < FA_COLS; ++c) o[c] *= correction;
    for (int j = 0; j < FA_BK; ++j) {
      const float p = exp(scores[r][j] - new_max);
      row_sum += p;
      for (int c = 0; c < FA_COLS; ++c) o[c] += p * v_tile[j * FA_D + part * FA_COLS + c];
    }
    barrier(CLK_LOCAL_MEM_FENCE);  // the next tile overwrites k_tile, v_tile and scores
  }
  if (row < lq) {
    __global float* dst = out + (((size_t)batch * lq + row) * heads + head) * FA_D;
    for (int c = 0; c < FA_COLS; ++c) dst[part * FA_COLS + c] = o[c] / row_sum;
  }
}

// --- 9. q4_0 weights (GGUF blocks of 32: a half scale d, then 16 bytes; byte j holds
// weight j in its low nibble and weight j + 16 in its high nibble; w = d * (q - 8)).
// W is [M, K] in blocks, x is [N, K] float rows, dst[n * M + m] = sum_k W[m, k] x[n, k].

#define QK 32
#define Q4_BLOCK_BYTES 18

float q4_scale(__global const uchar* block) {
  return vload_half(0, (__global const half*)block);
}

// mul_mv: a work-group of MV_SG row groups of 32 work-items; each row group computes
// MV_R0 consecutive rows; its 32 work-items take 16 blocks at a time, half a block each.
#define MV_SG 2
#define MV_R0 4

__kernel __attribute__((reqd_work_group_size(32, MV_SG, 1)))
void mul_mv_q4_0(__global const uchar* w, __global const float* x, __global float* dst,
                 int k_dim, int m_dim) {
  __local float partials[MV_SG][MV_R0][32];
  const int lane = get_local_id(0), sg = get_local_id(1);
  const int r0 = (get_group_id(0) * MV_SG + sg) * MV_R0;
  const int n = get_group_id(1);
  const int blocks = k_dim / QK;
  const int half_block = (lane % 2) * 8;  // weights [h, h + 8) and [h + 16, h + 24)
  __global const float* xn = x + (size_t)n * k_dim;
  float sums[MV_R0] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int ib = lane / 2; ib < blocks; ib += 16) {
    __global const float* xb = xn + ib * QK + half_block;
    float lo[8], hi[8], x_sum = 0.0f;
    for (int i = 0; i < 8; ++i) {
      lo[i] = xb[i];
      hi[i] = xb[i + 16];
      x_sum += lo[i] + hi[i];
    }
    for (int row = 0; row < MV_R0; ++row) {
      __global const uchar* block =
          w + ((size_t)(r0 + row) * blocks + ib) * Q4_BLOCK_BYTES;
      __global const uchar* qs = block + 2 + half_block;
      float acc = 0.0f;
      for (int i = 0; i < 8; ++i) acc += lo[i] * (qs[i] & 0x0F) + hi[i] * (qs[i] >> 4);
      sums[row] += q4_scale(block) * (acc - 8.0f * x_sum);
    }
  }
  for (int row = 0; row < MV_R0; ++row) partials[sg][row][lane] = sums[row];
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lane < MV_R0 && r0 + lane < m_dim) {
    float total = 0.0f;
    for (int i = 0; i < 32; ++i) total += partials[sg][lane][i];
    dst[(size_t)n * m_dim + r0 + lane] = total;
  }
}

// mul_mm: a work-group of 128 work-items computes a 64 (rows of W) x 32 (rows of x) tile
// of dst, 32 values of K at a time: each work-item dequantises 16 weights and converts 8
// values of x into half tiles in local memory (the MSL kernel's tiles are half too), then
// accumulates a 4x4 block of dst in float. Tiles hold half bits in ushort: OpenCL C 1.2
// without cl_khr_fp16 has half only behind vload_half / vstore_half.
#define MM_R0 64
#define MM_R1 32
#define MM_THREADS 128

__kernel __attribute__((reqd_work_group_size(MM_THREADS, 1, 1)))
void mul_mm_q4_0(__global const uchar* w, __global const float* x, __global float* dst,
                 int k_dim, int m_dim) {
  __local ushort w_tile[QK][MM_R0];  // [k][m]
  __local ushort x_tile[QK][MM_R1];  // [k][n]
  const int t = get_local_id(0);
  const int m0 = get_group_id(1) * MM_R0, n0 = get_group_id(0) * MM_R1;
  const int blocks = k_dim / QK;
  const int wm = t / 2, w_half = (t % 2) * 8;  // W row m0 + wm, bytes [w_half, w_half + 8)
  const int xn = t / 4, xk = (t % 4) * 8;      // x row n0 + xn, values [xk, xk + 8)
  const int tm = (t % 16) * 4, tn = (t / 16) * 4;
  float4 acc[4] = {(float4)(0.0f), (float4)(0.0f), (float4)(0.0f), (float4)(0.0f)};
  for (int ib = 0; ib < blocks; ++ib) {
    __global const uchar* block = w + ((size_t)(m0 + wm) * blocks + ib) * Q4_BLOCK_BYTES;
    const float d = q4_scale(block);
    for (int i = 0; i < 8; ++i) {
      const uchar byte = block[2 + w_half + i];
      vstore_half(d * ((byte & 0x0F) - 8), 0, (__local half*)&w_tile[w_half + i][wm]);
      vstore_half(d * ((byte >> 4) - 8), 0, (__local half*)&w_tile[w_half + i + 16][wm]);
    }
    __global const float* xr = x + (size_t)(n0 + xn) * k_dim + ib * QK + xk;
    for (int i = 0; i < 8; ++i) vstore_half(xr[i], 0, (__local half*)&x_tile[xk + i][xn]);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kk = 0; kk < QK; ++kk) {
      const float4 wv = vload_half4(0, (__local half*)&w_tile[kk][tm]);
      const float4 xv = vload_half4(0, (__local half*)&x_tile[kk][tn]);
      acc[0] += wv * xv.x;
      acc[1] += wv * xv.y;
      acc[2] += wv * xv.z;
      acc[3] += wv * xv.w;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (int j = 0; j < 4; ++j) vstore4(acc[j], 0, dst + (size_t)(n0 + tn + j) * m_dim + m0 + tm);
}
