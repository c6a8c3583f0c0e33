"""The x86 levels' integer kernels (engine/quant/paths.py's Level table): avx2.py (AVX2 and
AVX-VNNI) and avx512.py (AVX-512 BW and VNNI) register their K-format and Q8_0 block bodies with
int8_dot.py at import; lowbit.py has the low-bit formats' rows, tiles and AVX-512 VNNI panels.
Nothing here imports the dispatcher (kernels.py) or another ISA folder."""
