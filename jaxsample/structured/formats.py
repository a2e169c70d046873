"""JSON Schema string formats as expression trees over the decoded string (RFC grammars).

Every format of JSON Schema 2020-12 except ``regex`` (not a regular language), which covers all
formats llguidance and XGrammar know. Each language is the format's RFC grammar, or a *subset*
of it where the exact language needs counting that a DFA can only do with thousands of states
(outputs always conform; some conforming strings cannot be produced):

==================== =========================================================================
``date``             RFC 3339 ``full-date``, leap years exact; year 0000 excluded (Python's
                     ``date`` and ``jsonschema`` reject it)
``time``             RFC 3339 ``full-time`` (``Z``/``z`` or an offset); leap seconds excluded
``date-time``        ``date`` ``T``/``t`` ``time``
``duration``         RFC 3339 appendix A (ISO 8601 ``P..``), exact
``email``            RFC 5321 ``Mailbox`` with a dot-atom local part (<= 64 octets, no quoted
                     local parts) and a domain (``hostname`` label rules, labels capped so the
                     address stays <= 254 octets: at most 5 labels) or an IPv4/IPv6 literal
``hostname``         RFC 1123 labels (1-63 letters/digits/hyphens, no hyphen at either end); the
                     253-octet total is guaranteed by capping later labels: at most 7 labels of at
                     most 63, 63, 40, 30, 20, 15, 10 characters
``idn-hostname``     ASCII subset of ``hostname``: lower case (IDNA 2008 disallows upper case), no
                     ``--`` (IDNA 2008 reserves ``??--`` labels)
``idn-email``        ``email`` (ASCII subset)
``ipv4``             dotted decimal without leading zeros, exact
``ipv6``             RFC 3986 ``IPv6address`` (``::`` compression, embedded IPv4), no zone id, exact
``uri``              RFC 3986 ``URI``, exact (IP literals, percent-encoding, one ``#``)
``uri-reference``    RFC 3986 ``URI-reference``, exact
``iri``              ``uri`` (ASCII subset of RFC 3987)
``iri-reference``    ``uri-reference`` (ASCII subset)
``uri-template``     RFC 6570 (level 4), exact
``uuid``             RFC 4122 text form, exact
``json-pointer``     RFC 6901, exact
``relative-json-pointer``  draft-handrews-relative-json-pointer, exact
==================== =========================================================================

>>> from jaxsample.structured.automaton import compile_expr
>>> d = compile_expr(format_expr("email"))
>>> [d.matches(x) for x in (b"a.b@x.io", b".a@x.io", b"a..b@x.io", b"a@-x.io", b"a@x-.io")]
[True, False, False, False, False]
"""

from __future__ import annotations

import functools

import numpy as np

from jaxsample.structured import dfa_ops
from jaxsample.structured.automaton import Chars, compile_expr, complement, repeat, seq
from jaxsample.structured.regex import parse_regex

# ------------------------------------------------------------------------------ building blocks
_HEX = "[0-9A-Fa-f]"
_DEC_OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_DEC_OCTET}(\.{_DEC_OCTET}){{3}}"
_H16 = f"{_HEX}{{1,4}}"
_LS32 = f"({_H16}:{_H16}|{_IPV4})"


def _ipv6() -> str:
    """RFC 3986 section 3.2.2 ``IPv6address``: at most 8 groups, ``::`` for one or more."""
    forms = [f"({_H16}:){{6}}{_LS32}", f"::({_H16}:){{5}}{_LS32}"]
    for before, after in ((0, 4), (1, 3), (2, 2), (3, 1), (4, 0)):  # [ *n( h16 ":" ) h16 ] "::" k( h16 ":" ) ls32
        head = f"(({_H16}:){{0,{before}}}{_H16})?" if before else f"({_H16})?"
        forms.append(f"{head}::({_H16}:){{{after}}}{_LS32}")
    forms.append(f"(({_H16}:){{0,5}}{_H16})?::{_H16}")
    forms.append(f"(({_H16}:){{0,6}}{_H16})?::")
    return "(" + "|".join(f"({f})" for f in forms) + ")"


_IPV6 = _ipv6()
_UNRESERVED = r"A-Za-z0-9\-._~"
_SUB_DELIMS = r"!$&'()*+,;="
_PCT = f"%{_HEX}{{2}}"
_PCHAR = f"([{_UNRESERVED}{_SUB_DELIMS}:@]|{_PCT})"
_SEGMENT = f"{_PCHAR}*"
_SEGMENT_NZ = f"{_PCHAR}+"
_SEGMENT_NZ_NC = f"([{_UNRESERVED}{_SUB_DELIMS}@]|{_PCT})+"
_IP_LITERAL = rf"\[({_IPV6}|v{_HEX}+\.[{_UNRESERVED}{_SUB_DELIMS}:]+)\]"
_REG_NAME = f"([{_UNRESERVED}{_SUB_DELIMS}]|{_PCT})*"
_AUTHORITY = f"(([{_UNRESERVED}{_SUB_DELIMS}:]|{_PCT})*@)?({_IP_LITERAL}|{_REG_NAME})(:[0-9]*)?"
_PATH_ABEMPTY = f"(/{_SEGMENT})*"
_PATH_ABSOLUTE = f"/({_SEGMENT_NZ}(/{_SEGMENT})*)?"
_QUERY = rf"(\?([/?]|{_PCHAR})*)?"
_FRAGMENT = rf"(#([/?]|{_PCHAR})*)?"
_HIER_PART = f"(//{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}|{_SEGMENT_NZ}(/{_SEGMENT})*|)"
_URI = f"[A-Za-z][A-Za-z0-9+.\\-]*:{_HIER_PART}{_QUERY}{_FRAGMENT}"
_RELATIVE_PART = f"(//{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}|{_SEGMENT_NZ_NC}(/{_SEGMENT})*|)"
_URI_REFERENCE = f"({_URI}|{_RELATIVE_PART}{_QUERY}{_FRAGMENT})"

_UCSCHAR = (r"\u00A0-\uD7FF\uF900-\uFDCF\uFDF0-\uFFEF\U00010000-\U0001FFFD\U00020000-\U0002FFFD"
            r"\U00030000-\U0003FFFD\U00040000-\U0004FFFD\U00050000-\U0005FFFD\U00060000-\U0006FFFD"
            r"\U00070000-\U0007FFFD\U00080000-\U0008FFFD\U00090000-\U0009FFFD\U000A0000-\U000AFFFD"
            r"\U000B0000-\U000BFFFD\U000C0000-\U000CFFFD\U000D0000-\U000DFFFD\U000E1000-\U000EFFFD")  # fmt: skip
_IPRIVATE = r"\uE000-\uF8FF\U000F0000-\U000FFFFD\U00100000-\U0010FFFD"
_VARCHAR = f"([A-Za-z0-9_]|{_PCT})"
_VARSPEC = rf"{_VARCHAR}(\.?{_VARCHAR})*(:[1-9][0-9]{{0,3}}|\*)?"
_URI_TEMPLATE = (rf"([!#$&(-;=?-\[\]_a-z~{_UCSCHAR}{_IPRIVATE}]|{_PCT}"
                 rf"|\{{[+#./;?&=,!@|]?{_VARSPEC}(,{_VARSPEC})*\}})*")  # fmt: skip

_YEAR = "([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_LEAP = "(0[48]|[2468][048]|[13579][26])"
_DATE = (f"({_YEAR}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
         f"|02-(0[1-9]|1[0-9]|2[0-8]))|([0-9]{{2}}{_LEAP}|{_LEAP}00)-02-29)")  # fmt: skip
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_DUR_TIME = "T([0-9]+H([0-9]+M([0-9]+S)?)?|[0-9]+M([0-9]+S)?|[0-9]+S)"
_DURATION = f"P(([0-9]+D|[0-9]+M([0-9]+D)?|[0-9]+Y([0-9]+M([0-9]+D)?)?)({_DUR_TIME})?|{_DUR_TIME}|[0-9]+W)"
_POINTER = "(/([^/~]|~[01])*)*"

#: Label length caps of ``hostname`` (sum of caps + dots <= 253) and of an email domain (<= 189,
#: so that a 64-octet local part, ``@`` and the domain stay within RFC 5321's 254 octets).
HOSTNAME_LABELS = (63, 63, 40, 30, 20, 15, 10)
EMAIL_DOMAIN_LABELS = (63, 63, 30, 20, 9)
EMAIL_LOCAL_MAX = 64


def _labels(caps, letters: str = "A-Za-z0-9") -> str:
    """``label ("." label)*`` with the i-th label at most ``caps[i]`` characters."""
    out = ""
    for cap in reversed(caps):
        label = f"[{letters}]([{letters}-]{{0,{cap - 2}}}[{letters}])?"
        out = label + (rf"(\.{out})?" if out else "")
    return out


_REGEX_FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}[Tt]{_TIME}",
    "duration": _DURATION,
    "ipv4": _IPV4,
    "ipv6": _IPV6,
    "uuid": f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}",
    "hostname": _labels(HOSTNAME_LABELS),
    "uri": _URI,
    "iri": _URI,
    "uri-reference": _URI_REFERENCE,
    "iri-reference": _URI_REFERENCE,
    "uri-template": _URI_TEMPLATE,
    "json-pointer": _POINTER,
    "relative-json-pointer": f"(0|[1-9][0-9]*)(#|{_POINTER})",
}
_ATEXT = r"[A-Za-z0-9!#$%&'*+\-/=?^_`{|}~]"

#: Formats whose language is exactly the RFC's (the others are the subsets above).
EXACT = frozenset({"duration", "ipv4", "ipv6", "uuid", "uri", "uri-reference", "uri-template", "json-pointer",
                   "relative-json-pointer"})  # fmt: skip
#: Formats of JSON Schema 2020-12 that are not supported (``regex``: not a regular language).
UNSUPPORTED = ("regex",)
FORMATS = tuple(sorted([*_REGEX_FORMATS, "email", "idn-email", "idn-hostname"]))


def _ascii_dfa(expr):
    return compile_expr(expr)  # ASCII-only languages: the byte DFA is the character DFA


_JSON_SAFE = np.zeros(256, bool)
_JSON_SAFE[0x20:0x7F] = True
_JSON_SAFE[[0x22, 0x5C]] = False


def _language(name: str):
    if name in _REGEX_FORMATS:
        return parse_regex(_REGEX_FORMATS[name])
    if name in ("email", "idn-email"):
        length = _ascii_dfa(repeat(Chars(complement(())), 1, EMAIL_LOCAL_MAX))
        local = dfa_ops.intersect(_ascii_dfa(parse_regex(rf"{_ATEXT}+(\.{_ATEXT}+)*")), length)
        domain = parse_regex(rf"({_labels(EMAIL_DOMAIN_LABELS)}|\[({_IPV4}|IPv6:{_IPV6})\])")
        return seq(dfa_ops.Automaton.of(local), parse_regex("@"), domain)
    if name == "idn-hostname":
        lower = _ascii_dfa(parse_regex(_labels(HOSTNAME_LABELS, "a-z0-9")))
        return dfa_ops.Automaton.of(dfa_ops.difference(lower, _ascii_dfa(parse_regex(".*--.*"))))
    raise KeyError(name)


@functools.cache
def format_expr(name: str):
    """Expression tree of the decoded strings of format ``name`` (see the module docstring).

    Formats written with printable ASCII other than ``"`` and ``\\`` (all but the JSON pointers)
    come as one :class:`~jaxsample.structured.dfa_ops.Automaton` leaf, determinised once per
    process; such a leaf is already its own JSON encoding.

    Raises:
      KeyError: for a name outside :data:`FORMATS`.
    """
    expr = _language(name)
    dfa = compile_expr(expr)
    used = (dfa.delta != 0).any(axis=0)[dfa.byte_class]
    return dfa_ops.Automaton.of(dfa) if _JSON_SAFE[used].all() else expr


def is_json_safe(expr) -> bool:
    """Whether ``expr`` is a format leaf that needs no JSON escaping (see :func:`format_expr`)."""
    return isinstance(expr, dfa_ops.Automaton)
