import pytest

from bench import prefill_matrix


@pytest.mark.parametrize("fmt", ["IQ4_XS", "Q4_K"])
def test_prefill_matrix_times_both_paths_on_the_same_product(fmt):
    r = prefill_matrix.run(fmt, 24, 512, 6, 1)
    # the tile and dequantize + BLAS compute one product (up to the activations' int8 rounding)
    assert r["tile_rel_err_vs_blas"] < 2e-2
    assert r["tile"]["gmac_s"] > 0 and r["dequantize+blas"]["gmac_s"] > 0


def test_prefill_matrix_names_the_formats_it_takes():
    with pytest.raises(SystemExit, match="--format Q8_0: choose one of"):
        prefill_matrix.run("Q8_0", 24, 512, 6, 1)
