// Decoders of the OCP low-precision formats DeepSeek-V4 stores weights in.
// e2m1: OCP Microscaling Formats (MX) v1.0, 5.3.3. e8m0: MX v1.0, 5.4.1.
// e4m3: OCP 8-bit Floating Point Specification (OFP8) v1.0, the "E4M3" encoding.

constant constexpr uint MX_BLOCK = 32;  // e2m1 elements sharing one e8m0 scale

// Every e2m1 value, by code: sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0.
constant constexpr float E2M1_VALUES[16] = {
    0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

// 2^(e - 127) built from its bits; 0xFF is NaN. e = 0 gives 2^-127, a float subnormal.
inline float e8m0_to_float(uint8_t e) {
    if (e == 0xFF) {
        return NAN;
    }
    return e == 0 ? as_type<float>(0x00400000u) : as_type<float>(uint(e) << 23);
}

// e4m3 -> float, exactly. The magnitude bits EEEEMMM moved to float's exponent and
// mantissa fields (<< 20) and rebiased (+120 = 127 - 7) give every normal value; the
// subnormals (E = 0) are M * 2^-9. S.1111.111 is NaN; there is no infinity.
inline float e4m3_to_float(uint8_t code) {
    const uint magnitude = code & 0x7Fu;
    float v;
    if (magnitude == 0x7Fu) {
        v = NAN;
    } else if (magnitude < 8u) {
        v = float(magnitude) * (1.0f / 512.0f);
    } else {
        v = as_type<float>((magnitude << 20) + (120u << 23));
    }
    return (code & 0x80u) ? -v : v;
}
