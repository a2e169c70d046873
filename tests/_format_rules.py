"""Independent RFC checks of JSON Schema string formats, and a validator that applies them.

``jsonschema``'s format checker only checks the formats whose optional packages are installed
(here: date, email — only for an ``@`` —, ipv4, ipv6, uuid, idn-*, regex). The checks below are
written procedurally from the RFCs (not from the grammars in ``jaxsample.structured.formats``), so
a test comparing the two is a real second opinion:

* ``date``/``time``/``date-time``: RFC 3339 section 5.6 (leap second only at 23:59:60 UTC);
* ``duration``: RFC 3339 appendix A; ``email``: RFC 5321 ``Mailbox`` with its length limits;
* ``hostname``: RFC 1123 (253 octets, labels of 1-63); ``ipv4``/``ipv6``: RFC 2673/4291
  (``ipaddress``, no zone id); ``uri``/``uri-reference``: RFC 3986; ``uri-template``: RFC 6570;
* ``json-pointer``: RFC 6901; ``relative-json-pointer``; ``uuid``: RFC 4122.

:func:`validator` returns a ``jsonschema`` validator for a schema that checks these formats,
rejects duplicate keys (via :func:`loads`), and computes ``multipleOf`` in exact decimals (the
JSON Schema definition; ``jsonschema`` divides floats, so it rejects e.g. 0.07 for 0.01).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import string
import uuid
from decimal import Decimal

_ALPHA = set(string.ascii_letters)
_DIGIT = set(string.digits)
_HEXDIG = set(string.hexdigits)
_UNRESERVED = _ALPHA | _DIGIT | set("-._~")
_SUB_DELIMS = set("!$&'()*+,;=")
_PCHAR = _UNRESERVED | _SUB_DELIMS | set(":@")


def _pct_ok(s: str, allowed: set) -> bool:
    """Every character in ``allowed`` or part of a ``%HH`` escape."""
    i = 0
    while i < len(s):
        if s[i] == "%":
            if i + 2 >= len(s) or s[i + 1] not in _HEXDIG or s[i + 2] not in _HEXDIG:
                return False
            i += 3
        elif s[i] in allowed:
            i += 1
        else:
            return False
    return True


def is_date(s: str) -> bool:
    if len(s) != 10 or s[4] != "-" or s[7] != "-" or not (s[:4] + s[5:7] + s[8:]).isdigit() or not s.isascii():
        return False
    try:
        datetime.date(int(s[:4]), int(s[5:7]), int(s[8:]))
    except ValueError:
        return False
    return True


def is_time(s: str) -> bool:
    if len(s) < 9 or s[2] != ":" or s[5] != ":" or not s.isascii():
        return False
    hh, mm, ss = s[:2], s[3:5], s[6:8]
    if not (hh + mm + ss).isdigit():
        return False
    rest = s[8:]
    if rest.startswith("."):
        j = 1
        while j < len(rest) and rest[j].isdigit():
            j += 1
        if j == 1:
            return False
        rest = rest[j:]
    if rest in ("Z", "z"):
        off = 0
    elif len(rest) == 6 and rest[0] in "+-" and rest[3] == ":" and (rest[1:3] + rest[4:]).isdigit():
        oh, om = int(rest[1:3]), int(rest[4:])
        if oh > 23 or om > 59:
            return False
        off = (oh * 60 + om) * (1 if rest[0] == "+" else -1)
    else:
        return False
    h, m, sec = int(hh), int(mm), int(ss)
    if h > 23 or m > 59 or sec > 60:
        return False
    if sec == 60:  # leap second: 23:59:60 in UTC
        utc = (h * 60 + m - off) % (24 * 60)
        return utc == 23 * 60 + 59
    return True


def is_date_time(s: str) -> bool:
    return len(s) > 11 and s[10] in "Tt" and is_date(s[:10]) and is_time(s[11:])


def is_duration(s: str) -> bool:
    """RFC 3339 appendix A: P (dur-date [dur-time] | dur-time | dur-week)."""
    if not s.startswith("P") or not s.isascii():
        return False

    def units(text: str, order: str) -> bool:
        """``text`` is 1*DIGIT unit groups, units consecutive in ``order`` (no gaps)."""
        if not text:
            return False
        seen, num = [], ""
        for ch in text:
            if ch.isdigit():
                num += ch
            elif ch in order and num:
                seen.append(ch)
                num = ""
            else:
                return False
        if num or not seen:
            return False
        idx = [order.index(u) for u in seen]
        return idx == list(range(idx[0], idx[0] + len(idx)))

    body = s[1:]
    if body.endswith("W"):
        return body[:-1].isdigit() and bool(body[:-1])
    date_part, t, time_part = body.partition("T")
    if t and not units(time_part, "HMS"):
        return False
    return (not date_part and bool(t)) or units(date_part, "YMD")


def is_hostname(s: str) -> bool:
    if not s or len(s) > 253 or not s.isascii():
        return False
    for label in s.split("."):
        if not 1 <= len(label) <= 63 or label[0] == "-" or label[-1] == "-":
            return False
        if any(c not in _ALPHA | _DIGIT | {"-"} for c in label):
            return False
    return True


def is_idn_hostname(s: str) -> bool:
    """IDNA 2008 via ``idna`` (as ``jsonschema``); without it, the ASCII rule (lower-case LDH labels,
    no ``--`` in positions 3-4)."""
    try:
        import idna
    except ImportError:
        return is_hostname(s) and s == s.lower() and all(label[2:4] != "--" for label in s.split("."))
    try:
        idna.encode(s)
    except idna.IDNAError:
        return False
    return len(s) <= 253


def is_ipv4(s: str) -> bool:
    parts = s.split(".")
    return len(parts) == 4 and all(p.isdigit() and p.isascii() and (p == "0" or p[0] != "0") and int(p) <= 255 for p in parts)


def is_ipv6(s: str) -> bool:
    if "%" in s or not s.isascii():
        return False
    try:
        ipaddress.IPv6Address(s)
    except ValueError:
        return False
    return True


def is_email(s: str) -> bool:
    """RFC 5321 ``Mailbox`` (dot-string or quoted local part, domain or address literal), <= 254 octets."""
    if "@" not in s or len(s.encode()) > 254 or not s.isascii():
        return False
    local, _, domain = s.rpartition("@")
    if local.startswith('"'):
        if len(local) < 2 or not local.endswith('"'):
            return False
        inner, i = local[1:-1], 0
        while i < len(inner):
            if inner[i] == "\\":
                if i + 1 >= len(inner) or not 32 <= ord(inner[i + 1]) <= 126:
                    return False
                i += 2
            elif 32 <= ord(inner[i]) <= 126 and inner[i] not in '"\\':
                i += 1
            else:
                return False
    else:
        atext = _ALPHA | _DIGIT | set("!#$%&'*+-/=?^_`{|}~")
        if not local or any(not a or any(c not in atext for c in a) for a in local.split(".")):
            return False
    if len(local.encode()) > 64:
        return False
    if domain.startswith("[") and domain.endswith("]"):
        lit = domain[1:-1]
        return is_ipv6(lit[5:]) if lit.startswith("IPv6:") else is_ipv4(lit)
    return is_hostname(domain)


def _authority_ok(auth: str) -> bool:
    userinfo, at, hostport = auth.rpartition("@")
    if at and not _pct_ok(userinfo, _UNRESERVED | _SUB_DELIMS | {":"}):
        return False
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            return False
        ip, port = hostport[1:end], hostport[end + 1 :]
        if ip[:1] in "vV":
            ver, dot, rest = ip[1:].partition(".")
            if not (ver and all(c in _HEXDIG for c in ver) and dot and rest and all(c in _UNRESERVED | _SUB_DELIMS | {":"} for c in rest)):
                return False
        elif not is_ipv6(ip):
            return False
        if port and (port[0] != ":" or not all(c in _DIGIT for c in port[1:])):
            return False
        return True
    host, colon, port = hostport.partition(":")
    return _pct_ok(host, _UNRESERVED | _SUB_DELIMS) and all(c in _DIGIT for c in port)


def _path_ok(path: str) -> bool:
    return all(_pct_ok(seg, _PCHAR) for seg in path.split("/"))


def _after_scheme_ok(rest: str, relative: bool) -> bool:
    rest, hash_, fragment = rest.partition("#")
    if hash_ and not _pct_ok(fragment, _PCHAR | {"/", "?"}):
        return False
    rest, q, query = rest.partition("?")
    if q and not _pct_ok(query, _PCHAR | {"/", "?"}):
        return False
    if rest.startswith("//"):
        auth, slash, path = rest[2:].partition("/")
        return _authority_ok(auth) and _path_ok(slash + path)
    if relative and ":" in rest.split("/", 1)[0]:
        return False  # path-noscheme: no colon in the first segment
    return _path_ok(rest)


def is_uri(s: str) -> bool:
    scheme, colon, rest = s.partition(":")
    if not colon or not scheme or scheme[0] not in _ALPHA or any(c not in _ALPHA | _DIGIT | set("+-.") for c in scheme):
        return False
    return _after_scheme_ok(rest, relative=False)


def is_uri_reference(s: str) -> bool:
    return is_uri(s) or _after_scheme_ok(s, relative=True)


def is_uri_template(s: str) -> bool:
    """RFC 6570 (level 4)."""
    literal = set(range(0x21, 0x7F)) - {0x22, 0x25, 0x27, 0x3C, 0x3E, 0x5C, 0x5E, 0x60, 0x7B, 0x7C, 0x7D}
    i = 0
    while i < len(s):
        c = s[i]
        if c == "{":
            end = s.find("}", i)
            if end < 0:
                return False
            body = s[i + 1 : end]
            if body[:1] and body[0] in "+#./;?&=,!@|":
                body = body[1:]
            for spec in body.split(","):
                name, _, mod = spec.partition(":")
                if spec.endswith("*") and not mod:
                    name = spec[:-1]
                if mod and not (mod[0] in "123456789" and mod.isdigit() and len(mod) <= 4):
                    return False
                if not name or name.startswith(".") or name.endswith(".") or ".." in name:
                    return False
                if not _pct_ok(name.replace(".", ""), _ALPHA | _DIGIT | {"_"}):
                    return False
            i = end + 1
        elif c == "%":
            if i + 2 >= len(s) or s[i + 1] not in _HEXDIG or s[i + 2] not in _HEXDIG:
                return False
            i += 3
        elif ord(c) in literal or ord(c) >= 0xA0:
            i += 1
        else:
            return False
    return True


def is_json_pointer(s: str) -> bool:
    if s and not s.startswith("/"):
        return False
    i = s.find("~")
    while i >= 0:
        if s[i + 1 : i + 2] not in ("0", "1"):
            return False
        i = s.find("~", i + 2)
    return True


def is_relative_json_pointer(s: str) -> bool:
    i = 0
    while i < len(s) and s[i].isdigit() and s[i].isascii():
        i += 1
    if i == 0 or (s[0] == "0" and i > 1):
        return False
    return s[i:] == "#" or is_json_pointer(s[i:])


def is_uuid(s: str) -> bool:
    try:
        uuid.UUID(s)
    except ValueError:
        return False
    return len(s) == 36 and all(s[i] == "-" for i in (8, 13, 18, 23))


RULES = {
    "date": is_date,
    "time": is_time,
    "date-time": is_date_time,
    "duration": is_duration,
    "email": is_email,
    "idn-email": is_email,
    "hostname": is_hostname,
    "idn-hostname": is_idn_hostname,
    "ipv4": is_ipv4,
    "ipv6": is_ipv6,
    "uri": is_uri,
    "iri": is_uri,
    "uri-reference": is_uri_reference,
    "iri-reference": is_uri_reference,
    "uri-template": is_uri_template,
    "json-pointer": is_json_pointer,
    "relative-json-pointer": is_relative_json_pointer,
    "uuid": is_uuid,
}


def format_checker(cls=None):
    """The format checker of ``jsonschema``'s validator class ``cls`` (default 2020-12) with
    :data:`RULES` added (both must pass where both check)."""
    import jsonschema

    cls = cls or jsonschema.Draft202012Validator
    checker = jsonschema.FormatChecker(())
    checker.checkers = dict(cls.FORMAT_CHECKER.checkers)
    for name, rule in RULES.items():
        previous = checker.checkers.get(name)

        def check(instance, rule=rule, previous=previous):
            if not isinstance(instance, str):
                return True
            if previous is not None and not previous[0](instance):
                return False
            return rule(instance)

        checker.checkers[name] = (check, ())
    return checker


def _multiple_of(validator, m, instance, schema):
    import jsonschema

    if not validator.is_type(instance, "number"):
        return
    q = Decimal(repr(instance) if isinstance(instance, float) else instance) / Decimal(repr(m) if isinstance(m, float) else m)
    if q != q.to_integral_value():
        yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {m!r}")


def validator(schema):
    """A validator (draft from ``$schema``, default 2020-12) with :func:`format_checker` and exact ``multipleOf``."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    checker = format_checker(cls)
    return jsonschema.validators.extend(cls, {"multipleOf": _multiple_of})(schema, format_checker=checker)


def loads(text: str):
    """``json.loads`` that rejects duplicate object keys (a ``ValueError``)."""

    def pairs(items):
        keys = [k for k, _ in items]
        if len(set(keys)) != len(keys):
            raise ValueError(f"duplicate keys in {keys}")
        return dict(items)

    return json.loads(text, object_pairs_hook=pairs)
