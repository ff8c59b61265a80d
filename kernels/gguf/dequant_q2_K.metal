// q2_K -> T. Thread t writes weights [t * EPT, (t + 1) * EPT), all in one 256-weight
// super-block (EPT divides 256).
const uint first = thread_position_in_grid.x * EPT;
device const block_q2_K& block = ((device const block_q2_K*)blocks)[first / QK_K];
const float d = float(block.d);
const float dmin = float(block.dmin);
for (uint k = 0; k < EPT; ++k) {
    const uint i = first % QK_K + k;  // weight index in the super-block
    // llama.cpp's order: weight 128h + 32s + l sits in byte 32h + l at bits 2s, 2s + 1.
    const uint h = i / 128;
    const uint shift = 2 * ((i % 128) / 32);
    const uint q = (block.qs[32 * h + i % 32] >> shift) & 3;
    const uint sc = block.scales[i / 16];  // 16 weights share a scale and a min
    // Both products are exact in float, so the subtraction is the one rounding before T.
    out[first + k] = T(d * float(sc & 15) * float(q) - dmin * float(sc >> 4));
}
