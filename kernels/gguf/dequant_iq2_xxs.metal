// iq2_xxs -> T. Thread t writes weights [t * EPT, (t + 1) * EPT), all in one 256-weight
// super-block (EPT divides 256).
const uint first = thread_position_in_grid.x * EPT;
device const block_iq2_xxs& block = ((device const block_iq2_xxs*)blocks)[first / QK_K];
const float d = float(block.d);
for (uint k = 0; k < EPT; ++k) {
    const uint i = first % QK_K + k;  // weight index in the super-block
    const uint g = i / 32;            // 32-weight group: four uint16 words of qs
    const uint part = (i % 32) / 8;   // 8 weights share a grid point and a sign pattern
    const uint j = i % 8;
    const uint indices = uint(block.qs[4 * g]) | (uint(block.qs[4 * g + 1]) << 16);
    const uint signs_scale = uint(block.qs[4 * g + 2]) | (uint(block.qs[4 * g + 3]) << 16);
    const float db = d * (0.5f + float(signs_scale >> 28)) * 0.25f;
    const uint point = (indices >> (8 * part)) & 255;
    const uint signs = ksigns_iq2xs[(signs_scale >> (7 * part)) & 127];
    const float magnitude = float((iq2xxs_grid[point] >> (8 * j)) & 255);
    // db has at most 16 significant bits and magnitude 6: the product is exact in float.
    const float w = db * magnitude;
    out[first + k] = T((signs >> j) & 1 ? -w : w);
}
