// Partial RoPE on x [tokens, heads, D]: features [0, D - R) pass through, the last R are
// R/2 complex pairs (x[2i], x[2i+1]) rotated by the angle of pair i at the token's
// position: forward by +theta, INVERSE by -theta (the conjugate). The angles come as
// cos/sin tables [positions, R/2], computed on the host in double precision.
// Thread (p, h, t) handles features 2p and 2p + 1.
const uint p = thread_position_in_grid.x;
const uint head = thread_position_in_grid.y;
const uint token = thread_position_in_grid.z;
const uint base = (token * threads_per_grid.y + head) * D + 2 * p;
const float a = float(x[base]);
const float b = float(x[base + 1]);
constexpr uint NOPE = D - R;
if (2 * p < NOPE) {
    out[base] = T(a);
    out[base + 1] = T(b);
} else {
    const uint i = p - NOPE / 2;
    const uint row = uint(positions[token]) * (R / 2) + i;
    const float c = cos_table[row];
    const float s = INVERSE ? -sin_table[row] : sin_table[row];
    out[base] = T(a * c - b * s);
    out[base + 1] = T(a * s + b * c);
}
