// CSA / HCA compressor pool: window w of RATE tokens becomes one entry,
//   out[w, d] = sum_s softmax_s(z_s[d]) x_s[d],   z_s = gate_s + ape[s mod RATE],
// a softmax over the window's slots for every channel d separately. HCA (OVERLAP false):
// the slots are the window's RATE tokens, channels [0, D) of kv and gate. CSA (OVERLAP
// true, kv and gate 2D wide): the previous window's tokens on channels [0, D) come first,
// then this window's on [D, 2D); window 0 has no previous one, so only its own.
// One thread per (channel, window), one pass over the slots with an online softmax (a
// running maximum, the sum of exponentials and the weighted sum, rescaled when the maximum
// grows): the inputs are read once.
constexpr uint WIDTH = OVERLAP ? 2 * D : D;  // channels of a token in kv, gate and ape
constexpr uint SLOTS = OVERLAP ? 2 * RATE : RATE;
const uint d = thread_position_in_grid.x;
const uint w = thread_position_in_grid.y;
const uint first = (OVERLAP && w == 0) ? RATE : 0;  // window 0 has no previous window

float running_max = -INFINITY;
float total = 0.0f;  // sum of e^(z - running_max)
float acc = 0.0f;    // sum of e^(z - running_max) x
for (uint s = first; s < SLOTS; ++s) {
    const bool previous = OVERLAP && s < RATE;
    const uint token = previous ? (w - 1) * RATE + s : w * RATE + s % RATE;
    const uint channel = (OVERLAP && !previous) ? D + d : d;
    const float z = float(gate[token * WIDTH + channel]) + ape[(s % RATE) * WIDTH + channel];
    const float x = float(kv[token * WIDTH + channel]);
    const float new_max = max(running_max, z);
    const float rescale = exp(running_max - new_max);  // 0 at the first slot
    const float p = exp(z - new_max);
    total = total * rescale + p;
    acc = acc * rescale + p * x;
    running_max = new_max;
}
out[w * D + d] = T(acc / total);
