"""MSL as text: everything mtwork reads or writes in Metal source, with no backend behind it.

- `lexing`: masks of comments and literals, bracket matching, top-level splitting;
- `body`: MLX's body form (`mx.fast.metal_kernel`'s generated kernel, byte for byte);
- `signature`: full-source kernels, their parameters, function constants, instantiations;
- `types`: Metal's scalar and vector types and their dtypes;
- `constants`: function constants set at compile time;
- `includes`: finding, listing and inlining ``#include`` files;
- `templates`: template arguments and constant values written as source text;
- `wrap`: a full-source kernel written as an MLX body-form kernel.
"""
