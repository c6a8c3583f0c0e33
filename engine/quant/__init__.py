"""Weight formats (numpy reference codecs) and their numba kernels.

``formats``: get_format, row_bytes, dequantize, quantize, UnsupportedWeightType.
``kernels``: dequantize_rows_into, matvec, bench_matvec (imported lazily: it compiles numba code).
"""

from .formats import (  # noqa: F401
    QuantFormat,
    UnsupportedWeightType,
    dequantize,
    get_format,
    quantize,
    row_bytes,
    supported_types,
)
