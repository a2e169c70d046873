"""Bit-exact parity of the ``wakong`` port with the real ``wakong==1.1.1``.

Golden outputs (``tests/data/wakong_golden.json``, made by ``tests/data/make_wakong_golden.py`` from
the real package) are checked always; when ``WAKONG_REFERENCE_PYTHON`` names a Python that has the
reference installed (CI sets it), a live differential test compares many more schemes.
"""

import contextlib
import io
import json
import os
import pathlib
import random
import subprocess

import numpy as np
import pytest

import wakong
from tests._helpers import unmask
from wakong import _exact
from wakong._distribution import span_length_cdfs

DATA = pathlib.Path(__file__).parent / "data"
GOLDEN = json.loads((DATA / "wakong_golden.json").read_text())


def _as_json(scheme):
    return [list(span) for span in scheme]


def _chained(seed, lengths):
    """Our port's version of ``make_wakong_golden.chained_schemes``."""
    rng = random.Random(seed)
    out = []
    for seq_len in lengths:
        try:
            out.append(_as_json(wakong.generate_mask_scheme(rng, seq_len)))
        except ValueError as err:
            out.append(["ValueError", str(err)])
    return out, rng.getrandbits(64)


def test_golden_is_from_the_reference_version():
    assert GOLDEN["package_version"] == wakong.__version__ == "1.1.1"


@pytest.mark.parametrize("case", GOLDEN["chained"], ids=lambda c: f"seed={c['seed']}")
def test_chained_schemes_and_generator_state(case):
    schemes, next64 = _chained(case["seed"], GOLDEN["lengths"])
    assert schemes == case["schemes"]
    assert next64 == case["next64"]


def test_golden_covers_the_value_error_and_long_lengths():
    flat = [s for case in GOLDEN["chained"] for s in case["schemes"]]
    assert any(s and s[0] == "ValueError" for s in flat)
    assert max(len(s) for s in flat) > 70  # seq_len 2048 has ~76 spans


def test_fresh_generators():
    for case in GOLDEN["fresh"]:
        rng = random.Random(case["seed"])
        try:
            scheme = _as_json(wakong.generate_mask_scheme(rng, case["seq_len"]))
        except ValueError:
            scheme = "ValueError"
        assert scheme == case["scheme"], case
        assert rng.getrandbits(64) == case["next64"], case


def test_article_example():
    # The article's test(): Random(42), 100 words. Also our docstring example.
    assert wakong.generate_mask_scheme(random.Random(42), 40) == [(3, 2), (9, 1), (33, 1)]
    fresh = {(c["seed"], c["seq_len"]): c["scheme"] for c in GOLDEN["fresh"]}
    assert _as_json(wakong.generate_mask_scheme(random.Random(42), 100)) == fresh[42, 100]


def test_value_error_message_matches():
    messages = {s[1] for case in GOLDEN["chained"] for s in case["schemes"] if s and s[0] == "ValueError"}
    assert messages == {"Sample larger than population or is negative"}


@pytest.mark.parametrize("run", GOLDEN["wakong_class"]["runs"], ids=lambda r: f"seed={r['seed']}")
def test_wakong_class(run):
    masker = wakong.Wakong(run["seed"])
    word_lists = GOLDEN["wakong_class"]["word_lists"]
    outputs = [masker(words) for words in word_lists]
    outputs.append(masker(word_lists[4], mask_token="[MASK]"))
    assert outputs == run["outputs"]
    assert masker.rng.getrandbits(64) == run["next64"]


def test_wakong_short_inputs_are_copies_and_draw_nothing():
    masker = wakong.Wakong(0)
    state = masker.rng.getstate()
    for words in ([], ["only"]):
        out = masker(words)
        assert out == words and out is not words
    assert masker.rng.getstate() == state


@pytest.mark.parametrize("case", GOLDEN["apply"], ids=lambda c: str(c["scheme"]))
def test_apply_mask_scheme(case):
    scheme = [tuple(span) for span in case["scheme"]]
    assert wakong.apply_mask_scheme(case["words"], scheme) == case["out"]


def test_apply_quirks():
    words = list("abcdefghij")
    # Empty scheme: the input list object itself comes back (aliasing), as in the reference.
    assert wakong.apply_mask_scheme(words, []) is words
    # Spans out of order: once (7, 1) is applied the scan is past word 2, so (2, 2) is silently dropped.
    assert wakong.apply_mask_scheme(words, [(7, 1), (2, 2)]) == list("abcdefg") + ["<mask>"] + list("ij")
    assert wakong.apply_mask_scheme(words, [(1, 2), (10, 0)], mask_token="<M>") == GOLDEN["apply_token"]


@pytest.mark.parametrize("case", GOLDEN["pretty_print"], ids=lambda c: str(c["scheme"]))
def test_pretty_print(case):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        wakong.pretty_print_mask_scheme(case["seq_len"], [tuple(s) for s in case["scheme"]])
    assert buf.getvalue() == case["out"]


def test_span_length_cdfs_bit_exact():
    ours = [[float(x).hex() for x in row] for row in span_length_cdfs()]
    assert ours == GOLDEN["probs_list_hex"]


def test_shipped_table_is_the_numpyro_derivation():
    """The build step (python -m wakong._distribution) and the shipped table agree bit for bit."""
    from wakong._distribution import derive_span_length_cdfs

    assert derive_span_length_cdfs() == span_length_cdfs()


def test_value_error_rate_at_one_word():
    # generate_mask_scheme(rng, 1) raises when a one-word span is drawn: exactly 0.188 * (1 - 0.19230762).
    p = _exact.outcomes(1)["ValueError"]
    assert abs(p - 0.15185) < 5e-6
    rng, n, errors = random.Random(2024), 40_000, 0
    for _ in range(n):
        try:
            wakong.generate_mask_scheme(rng, 1)
        except ValueError:
            errors += 1
    assert abs(errors / n - p) <= 5 * np.sqrt(p * (1 - p) / n)


def _check_invariants(scheme, seq_len):
    whole = int(seq_len * 0.188)
    assert scheme == sorted(scheme)
    for pos, length in scheme:
        assert 0 <= pos and pos + length <= seq_len and 0 <= length <= 10
    for (p0, s0), (p1, _) in zip(scheme, scheme[1:]):
        assert p1 - (p0 + s0) >= 2  # at least two unmasked words between spans (the article asks for one)
    cost = sum(length + 1 for _, length in scheme)
    assert cost in (whole, whole + 1, whole + 2)  # sum(s + 1) is M or M + 1, M in {floor, floor + 1}
    assert (len(scheme) == 0) == (cost == 0)


def test_invariants_for_many_lengths():
    rng = random.Random(7)
    for seq_len in list(range(2, 300)) + [rng.randrange(2, 10_000) for _ in range(200)]:
        for _ in range(3):
            _check_invariants(wakong.generate_mask_scheme(rng, seq_len), seq_len)


def test_apply_round_trip():
    rng = random.Random(3)
    for seq_len in [2, 5, 17, 64, 300]:
        words = [f"w{i}" for i in range(seq_len)]
        for _ in range(20):
            scheme = wakong.generate_mask_scheme(rng, seq_len)
            out = wakong.apply_mask_scheme(words, scheme)
            assert len(out) == seq_len - sum(s for _, s in scheme) + len(scheme)
            assert out.count("<mask>") == len(scheme)
            # Fill every mask with its span's words: the original sentence comes back.
            assert unmask(out, words, scheme) == words


REFERENCE = os.environ.get("WAKONG_REFERENCE_PYTHON")


@pytest.mark.skipif(not REFERENCE, reason="set WAKONG_REFERENCE_PYTHON to a Python with wakong==1.1.1")
def test_live_differential_against_the_reference():
    seeds, max_len = 150, 320
    proc = subprocess.run(
        [REFERENCE, str(DATA / "make_wakong_golden.py"), "--schemes", str(seeds), str(max_len)],
        capture_output=True,
        text=True,
        check=True,
        cwd=DATA,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    lines = proc.stdout.splitlines()
    assert len(lines) == seeds
    for line in lines:
        case = json.loads(line)
        schemes, next64 = _chained(case["seed"], range(max_len + 1))
        assert schemes == case["schemes"], f"seed {case['seed']}"
        assert next64 == case["next64"]
