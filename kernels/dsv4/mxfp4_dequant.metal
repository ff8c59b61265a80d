// MXFP4 -> T. Thread t writes elements [t * EPT, (t + 1) * EPT); EPT is even and divides
// 32, so they share one scale and whole bytes (element 2i: low nibble of byte i).
const uint first = thread_position_in_grid.x * EPT;
const float scale = e8m0_to_float(scales[first / MX_BLOCK]);
for (uint k = 0; k < EPT; k += 2) {
    const uint8_t byte = packed[(first + k) / 2];
    // An e2m1 value times a power of two is exact in float (barring overflow and
    // underflow): the only rounding is the store to T.
    out[first + k] = T(E2M1_VALUES[byte & 15] * scale);
    out[first + k + 1] = T(E2M1_VALUES[byte >> 4] * scale);
}
