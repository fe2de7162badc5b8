"""The benchmark's arithmetic (its timings live in the README, not in tests)."""

import pytest

from conformance.bench import matmul_peak, time_forward, vit_flops
from impls import get_config


@pytest.mark.parametrize(
    "name, gmacs", [("vit_tiny_patch16_224", 1.3), ("vit_small_patch16_224", 4.6), ("vit_base_patch16_224", 17.6)]
)
def test_flop_count_matches_timms_published_gmacs(name, gmacs):
    """timm's model cards give 1.3, 4.6 and 17.6 GMACs for ViT-Ti, S and B/16 at 224."""
    assert round(vit_flops(get_config(name), 1) / 2 / 1e9, 1) == gmacs
    assert vit_flops(get_config(name), 8) == 8 * vit_flops(get_config(name), 1)


def test_timing_and_peak_helpers_return_numbers():
    peak = matmul_peak(n=64, repeats=1)
    assert set(peak) == {"torch", "numpy"} and all(v > 0 for v in peak.values())
    seconds, _ = time_forward(lambda x: sum(x), [1, 2, 3], warmup=1, repeats=3, base=0)
    assert seconds >= 0


@pytest.mark.parametrize(
    "args, words",
    [
        (["--repeats", "0"], "--repeats must be a finite number above 0"),
        (["--batches", "0"], "--batches must be a finite number above 0"),
        (["--warmup", "-1"], "--warmup must be a finite number at least 0"),
        (["--fit"], "--fit fits the verify benchmark's rows: give it with --verify"),
        (["--verify", "--fit", "no_such_rows.json"], "no such file"),
    ],
)
def test_a_bench_argument_that_measures_nothing_is_exit_2_at_once(cli, args, words):
    code, out, err = cli("bench", *args)
    assert code == 2 and words in out + err, out + err


def test_the_fit_reads_the_rows_it_is_given(cli, tmp_path):
    """The companion: --fit on the checkout's recorded rows prints the budget's constants."""
    from conformance.commands.bench import DATA

    code, out, err = cli("bench", "--verify", "--fit", str(DATA))
    assert code == 0 and "SECONDS_PER_CASE = " in out, out + err


def test_docs_outside_a_checkout_is_exit_2(monkeypatch, tmp_path, capsys):
    import argparse

    import conformance.commands.docs as docs

    monkeypatch.setattr(docs, "DOCS", tmp_path / "docs")
    assert docs.main(argparse.Namespace(check=True)) == 2
    assert "a checkout's docs" in capsys.readouterr().err
