"""GBNF subset: llama.cpp's JSON grammar, recursion cut-off, syntax errors."""

import json
import re

import numpy as np
import pytest

from jaxsample import structured as st
from jaxsample.structured import automaton as am
from jaxsample.structured.gbnf import parse_gbnf
from tests._structured_vocab import bpe_vocab
from tests.test_structured_regex import random_member

# llama.cpp grammars/json.gbnf (number exponent digits as upstream)
JSON_GBNF = r'''
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
'''


@pytest.fixture(scope="module")
def json_dfa():
    return am.compile_expr(parse_gbnf(JSON_GBNF, max_depth=6))


def test_json_grammar_members_parse(json_dfa):
    rng = np.random.default_rng(0)
    for _ in range(40):
        doc = random_member(json_dfa, rng, stop=0.3, limit=300).decode("utf-8")
        assert isinstance(json.loads(doc), dict)


def test_json_grammar_accepts_and_rejects(json_dfa):
    assert json_dfa.matches(b'{"a": [1, {"b": null}], "c": "x\\n"}')
    assert json_dfa.matches(json.dumps({"k": [1.5, -2e3, True]}, indent=2).encode() + b"\n")
    for bad in (b'{"a": [1, {"b": nul}]}', b"[1]", b'{"a" 1}', b'{"a": 01}', b"{'a': 1}"):
        assert not json_dfa.matches(bad)


ARITHMETIC = r'''
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")"
'''


def test_recursion_is_a_stack_not_a_cut():
    """Regression: the arithmetic grammar refused ((1+2)) at defaults, and max_depth=15 refused 7 levels
    (unrolling spent depth on every rule of the cycle). Now one frame per nested call."""
    default = am.compile_expr(parse_gbnf(ARITHMETIC))
    assert default.matches(b"((1+2))") and default.matches(b"(1+2)*3") and not default.matches(b"((1+2)")
    assert default.matches(b"(" * 32 + b"7" + b")" * 32) and not default.matches(b"(" * 33 + b"7" + b")" * 33)
    fifteen = am.compile_expr(parse_gbnf(ARITHMETIC, max_depth=15))
    for n in (7, 15, 16):
        assert fifteen.matches(b"(" * n + b"1+2" + b")" * n) == (n <= 15), n
    g = 'root ::= "(" root ")" | "x"'  # the root rule's own parentheses take no frame; each inner root one
    d2 = am.compile_expr(parse_gbnf(g, max_depth=2))
    assert d2.matches(b"((x))") and not d2.matches(b"(((x)))")  # the innermost x is a call too
    right = am.compile_expr(parse_gbnf('root ::= "a" root | "b"', max_depth=0))  # tail calls push nothing
    assert right.matches(b"a" * 500 + b"b")


@pytest.mark.parametrize(
    "text, message",
    [
        ('root ::= root "a" | "b"', "left-recursive"),
        ('root ::= "[" x "]"\nx ::= "a" | "(" x ")" | "(a)"', "two ways"),
        ('root ::= "(" y "a)"\ny ::= "b" "a"* | "(" y "a)"', "go on or end"),
    ],
)
def test_grammars_a_deterministic_stack_cannot_follow_raise(text, message):
    with pytest.raises(am.GrammarError, match=message):
        am.compile_expr(parse_gbnf(text))


def test_rules_classes_escapes_repetitions_comments():
    g = r'''
    root ::= greeting " " name{1,2} "!"?   # comment
    greeting ::= ("hi" | "hello") [,.]?
    name ::= [A-Z] [a-z]* | "\x41\u00e9"
    '''
    d = am.compile_expr(parse_gbnf(g))
    pattern = r"(hi|hello)[,.]? ([A-Z][a-z]*|Aé){1,2}!?"
    rng = np.random.default_rng(1)
    for _ in range(30):
        assert re.fullmatch(pattern, random_member(d, rng).decode())
    assert d.matches("hello, AéBob!".encode()) and not d.matches(b"hey Bob")


def test_compile_gbnf_to_tokens():
    g = st.compile_gbnf('root ::= "yes" | "no"', bpe_vocab())
    allowed = [bpe_vocab().token_bytes[i] for i in np.flatnonzero(g.allowed(g.start))]
    assert allowed and all(b"yes".startswith(b) or b"no".startswith(b) for b in allowed)


@pytest.mark.parametrize(
    "text, message",
    [
        ('root ::= "a" missing', "not defined"),
        ('start ::= "a"', "no 'root' rule"),
        ('root ::= "a\nroot ::= "b"', "unterminated|twice"),
        ('root ::= <[123]>', "token terminals"),
        ('root ::= ("a"', r"missing '\)'"),
        ('root = "a"', "::="),
        ('root ::= "a"{2,x}', "repetition"),
        ('root ::= "\\q"', "unknown escape"),
        ('root ::= "\\U00110000"', r"beyond U\+10FFFF"),
    ],
)
def test_errors(text, message):
    with pytest.raises(am.GrammarError, match=message):
        parse_gbnf(text)
