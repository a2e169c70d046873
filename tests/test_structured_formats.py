"""String formats against their RFCs: sampled members pass independent RFC checks, known examples.

The oracle is ``tests/_format_rules.py`` (procedural RFC checks, plus ``jsonschema``'s format
checker where it checks); its own behaviour is pinned by the examples below.
"""

import json

import numpy as np
import pytest

from jaxsample.structured import automaton as am
from jaxsample.structured.formats import FORMATS, format_expr
from jaxsample.structured.json_text import json_encoded
from tests._format_rules import RULES, format_checker
from tests.test_structured_regex import random_member

VALID = {
    "date": ["2024-02-29", "2000-02-29", "1999-12-31", "0001-01-01"],
    "time": ["23:59:59Z", "08:30:00.25+05:30", "00:00:00z", "12:00:00-12:00"],
    "date-time": ["2024-01-01T00:00:00Z", "1985-04-12t23:20:50.52z"],
    "duration": ["P1D", "PT1H", "P1Y2M3DT4H5M6S", "P4W", "PT36H", "P1M"],
    "email": ["a@b.co", "first.last+tag@sub.example.org", "x@[127.0.0.1]", "x@[IPv6:::1]", "a!#$%&'*+/=?^_`{|}~-@x.io"],
    "idn-email": ["a@b.co"],
    "hostname": ["a", "example.com", "xn--bcher-kva.example", "1host", "a-b.c-d"],
    "idn-hostname": ["example.com", "a-b"],
    "ipv4": ["0.0.0.0", "255.255.255.255", "192.168.1.10"],
    "ipv6": ["::", "::1", "1:2:3:4:5:6:7:8", "fe80::1:2", "::ffff:1.2.3.4", "1::", "1:2:3:4:5:6:1.2.3.4"],
    "uri": ["http://example.com", "a:b", "urn:isbn:0451450523", "http://[::1]:80/p?q=1#f", "mailto:x@y.z",
            "ftp://u:p@h/%20x", "a://[v1.x]/"],
    "iri": ["http://example.com/x"],
    "uri-reference": ["", "/a/b", "a/b?c#d", "//host", "#frag", "http://x.y/z"],
    "iri-reference": ["x/y"],
    "uri-template": ["http://x/{id}", "{+path}/here", "{?a,b*,c:3}", "/a%20b/{x.y}"],
    "uuid": ["123e4567-e89b-12d3-a456-426614174000", "AAAAAAAA-BBBB-CCCC-DDDD-EEEEEEEEEEEE"],
    "json-pointer": ["", "/a", "/a~0b/c~1d", "/", "//"],
    "relative-json-pointer": ["0", "1/a", "2#", "10/x~1y"],
}  # fmt: skip
INVALID = {
    "date": ["2023-02-29", "1900-02-29", "2024-13-01", "2024-1-01", "0000-01-01", "2024-04-31"],
    "time": ["24:00:00Z", "23:60:00Z", "12:00:00", "12:00:00+24:00", "1:00:00Z"],
    "date-time": ["2024-01-01 00:00:00Z", "2024-01-01T00:00:00"],
    "duration": ["P", "PT", "P1H", "PT1D", "P1D2Y", "P1W1D", "1D"],
    "email": ["a", "@b.co", "a@", ".a@b.co", "a.@b.co", "a..b@b.co", "a@-b.co", "a@b-.co", "a@b..co", "a b@c.de"],
    "idn-email": ["a"],
    "hostname": ["", "-a", "a-", "a..b", "a_b", "a" * 64, ".".join(["a" * 63] * 4), "a.b."],
    "idn-hostname": ["ab--cd.com", "-x", "a_b"],
    "ipv4": ["256.1.1.1", "01.2.3.4", "1.2.3", "1.2.3.4.5", "1.2.3.a"],
    "ipv6": ["1:2:3:4:5:6:7:8:9", ":::", "1::2::3", "fe80::1%eth0", "12345::", "1:2:3:4:5:6:7:1.2.3.4"],
    "uri": ["", "a", "1a:b", "a:[", "a:]", "a:b#c#d", "a:%zz", "a:%4", "a b:c", "http://[::1", "a:<>"],
    "iri": ["x"],
    "uri-reference": ["a:b:c#%", "%zz", "a b", "#a#b"],
    "iri-reference": ["#a#b"],
    "uri-template": ["{", "{}", "{a b}", "{.}", "{a:0}", "a}"],
    "uuid": ["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400", "g23e4567-e89b-12d3-a456-426614174000"],
    "json-pointer": ["a", "/~", "/~2"],
    "relative-json-pointer": ["", "01", "-1", "1a", "#"],
}  # fmt: skip
_DFAS: dict = {}


def dfa(name):
    if name not in _DFAS:
        _DFAS[name] = am.compile_expr(json_encoded(format_expr(name)))
    return _DFAS[name]


def _encoded(text: str) -> bytes:
    return json.dumps(text, ensure_ascii=False)[1:-1].encode()


@pytest.mark.parametrize("name", FORMATS)
def test_the_oracle_agrees_with_the_examples(name):
    checker = format_checker()
    for text in VALID[name]:
        assert RULES[name](text) and checker.conforms(text, name), text
    for text in INVALID[name]:
        assert not (RULES[name](text) and checker.conforms(text, name)), text


@pytest.mark.parametrize("name", FORMATS)
def test_format_languages_against_the_rfcs(name):
    d = dfa(name)
    for text in INVALID[name]:
        assert not d.matches(_encoded(text)), text
    for text in VALID[name]:  # (the examples are inside the subsets of the non-exact formats too)
        assert d.matches(_encoded(text)), text
    checker = format_checker()
    rng = np.random.default_rng(0)
    for i in range(60):
        text = json.loads('"' + random_member(d, rng, stop=0.05 + 0.1 * (i % 5), limit=300).decode() + '"')
        assert RULES[name](text) and checker.conforms(text, name), text
