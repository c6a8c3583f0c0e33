"""arm64's integer kernels for the levels with dot products (Graviton2-4; engine/quant/paths.py's
Level table): neon.py (`sdot` block bodies registered with int8_dot.py, `smmla` row pairs),
x4.py (Q4_K/Q6_K four rows interleaved), tiles.py (the njit drivers of both) and lowbit.py (the
low-bit formats' `sdot` rows and tiles). Nothing here imports the dispatcher (kernels.py) or
another ISA folder."""
