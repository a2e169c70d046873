"""Golden outputs of the real ``wakong==1.1.1``, for ``tests/test_wakong_reference.py``.

Run with a Python that has the reference package installed (its top-level name is also ``wakong``,
so it must not see this repository's package)::

    /work/wakong_ref_venv/bin/python tests/data/make_wakong_golden.py > tests/data/wakong_golden.json

``--schemes SEEDS MAX_LEN`` instead prints, for the live differential test, one JSON line per seed:
the schemes of ``Random(seed)`` for every length ``0..MAX_LEN`` drawn in a row from one generator
(``"ValueError"`` where the reference raises), then the generator's next 64 bits.
"""

import contextlib
import importlib.util
import io
import json
import random
import sys

import wakong

if importlib.util.find_spec("wakong.probs_list") is None:  # our package has no probs_list module
    sys.exit("this script must run against the reference wakong==1.1.1, not the repository's package")

from wakong.probs_list import probs_list  # noqa: E402

LENGTHS = list(range(61)) + [100, 256, 512, 1250, 2048]
SEEDS = list(range(48)) + [-7, 2**40 + 3, "wakong", 3.5]
WORD_LISTS = [
    [],
    ["a"],
    ["a", "b"],
    "the quick brown fox jumps over the lazy dog".split(),
    [f"w{i}" for i in range(40)],
    [f"v{i}" for i in range(123)],
]


def chained_schemes(seed, lengths):
    """Schemes for ``lengths`` drawn one after another from ``Random(seed)``, then 64 more bits."""
    rng = random.Random(seed)
    out = []
    for seq_len in lengths:
        try:
            out.append(wakong.generate_mask_scheme(rng, seq_len))
        except ValueError as err:
            out.append(["ValueError", str(err)])
    return out, rng.getrandbits(64)


def printed(seq_len, scheme):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        wakong.pretty_print_mask_scheme(seq_len, scheme)
    return buf.getvalue()


def golden():
    schemes = []
    for seed in SEEDS:
        out, tail = chained_schemes(seed, LENGTHS)
        schemes.append({"seed": seed, "schemes": out, "next64": tail})
    fresh = []  # one fresh generator per (seed, length): also pins the first draws of each length
    for seq_len in [1, 2, 3, 7, 40, 100, 512, 1250]:
        for seed in [*range(8), 42]:
            rng = random.Random(seed)
            try:
                scheme = wakong.generate_mask_scheme(rng, seq_len)
            except ValueError:
                scheme = "ValueError"
            fresh.append({"seed": seed, "seq_len": seq_len, "scheme": scheme, "next64": rng.getrandbits(64)})
    classes = []
    for seed in [0, 1, 42, "corpus", -3]:
        masker = wakong.Wakong(seed)
        outputs = [masker(words) for words in WORD_LISTS]
        outputs.append(masker(WORD_LISTS[4], mask_token="[MASK]"))
        classes.append({"seed": seed, "outputs": outputs, "next64": masker.rng.getrandbits(64)})
    words = list("abcdefghij")
    apply_cases = [
        [(0, 0), (1, 3), (6, 1), (8, 0)],
        [(2, 2), (6, 0), (10, 0)],
        [(0, 10)],
        [(7, 1), (2, 2)],  # out of order: the reference silently drops the second span
        [(3, 1), (3, 1)],
        [(10, 0)],
    ]
    return {
        "package_version": wakong.__version__,
        "lengths": LENGTHS,
        "chained": schemes,
        "fresh": fresh,
        "wakong_class": {"word_lists": WORD_LISTS, "runs": classes},
        "apply": [{"words": words, "scheme": c, "out": wakong.apply_mask_scheme(words, c)} for c in apply_cases],
        "apply_token": wakong.apply_mask_scheme(words, [(1, 2), (10, 0)], mask_token="<M>"),
        "pretty_print": [
            {"seq_len": n, "scheme": c, "out": printed(n, c)}
            for n, c in [(12, [(0, 0), (2, 3), (8, 1), (12, 0)]), (40, [(5, 4), (23, 2)]), (5, []), (3, [(0, 3)])]
        ],
        "probs_list_hex": [[float(x).hex() for x in row] for row in probs_list],
    }


def main(argv):
    if argv[:1] == ["--schemes"]:
        seeds, max_len = int(argv[1]), int(argv[2])
        for seed in range(seeds):
            out, tail = chained_schemes(seed, range(max_len + 1))
            print(json.dumps({"seed": seed, "schemes": out, "next64": tail}, separators=(",", ":")))
        return
    json.dump(golden(), sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])
