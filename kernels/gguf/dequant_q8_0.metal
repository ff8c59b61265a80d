// q8_0 -> T. Thread t writes weights [t * EPT, (t + 1) * EPT), all in one 32-weight block
// (EPT divides 32), so it reads that block's scale once.
const uint first = thread_position_in_grid.x * EPT;
device const block_q8_0& block = ((device const block_q8_0*)blocks)[first / QK8_0];
const float d = float(block.d);
const uint offset = first % QK8_0;
for (uint k = 0; k < EPT; ++k) {
    // An int8 times an fp16 is exact in float: the only rounding is the store to T.
    out[first + k] = T(d * float(block.qs[offset + k]));
}
