// Scalar activations shared by the router and the Sinkhorn split.

// log(1 + u) for u >= 0 without the cancellation of log(1.0f + u) when u is small
// (D. Goldberg, "What every computer scientist should know about floating-point
// arithmetic", Theorem 4): the rounding of w = 1 + u is undone by u / (w - 1).
inline float log1p_accurate(float u) {
    const float w = 1.0f + u;
    return w == 1.0f ? u : log(w) * (u / (w - 1.0f));
}

// softplus(z) = log(1 + e^z) = max(z, 0) + log(1 + e^-|z|): no overflow for large z, and
// full relative accuracy for very negative z (where softplus(z) ~ e^z).
inline float softplus(float z) {
    return max(z, 0.0f) + log1p_accurate(exp(-abs(z)));
}

inline float sigmoid(float z) {
    return 1.0f / (1.0f + exp(-z));
}
