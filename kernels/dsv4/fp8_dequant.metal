// FP8 e4m3 blocks -> T: out[r, c] = e4m3(weight[r, c]) * scales[r / BLOCK, c / BLOCK].
// Thread (x, r) writes columns [x * EPT, (x + 1) * EPT) of row r; EPT divides BLOCK, so
// they share one scale.
const uint row = thread_position_in_grid.y;
const uint first = thread_position_in_grid.x * EPT;
const uint cols = weight_shape[1];
const float scale = scales[(row / BLOCK) * scales_shape[1] + first / BLOCK];
for (uint k = 0; k < EPT; ++k) {
    const uint i = row * cols + first + k;
    out[i] = T(e4m3_to_float(weight[i]) * scale);
}
