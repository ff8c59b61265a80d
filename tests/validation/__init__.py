"""The GPU model's validation set: published before/after timings of Apple-GPU kernels
(MLX and llama.cpp pull requests and issues, the project's seeds), both sides' sources
fetched from their own published packages, dispatched as their host code did, profiled on
`sim` and modelled on the published chip. `bench/gpu_model_validation.py` prints it; the
tests run a part of it by default and all of it as slow tests."""
