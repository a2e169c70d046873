"""JSON objects as expression trees: declared properties in any (or schema) order, extras, counts.

An object body is an automaton over *which declared properties were written* (and how many
additional ones, when ``minProperties``/``maxProperties`` need it): ``after(j, present, count)``
is the expression for the rest of the object. Presence conditions (``required``,
``dependentRequired``, presence-only ``anyOf``/``oneOf``/``not`` branches) are a predicate checked
where the object may close, so they cost no states beyond the tracked set.

Any order tracks every declared property: a value's states are repeated for every set of written
properties that can end with it. :meth:`ObjectBuilder.any_order_size` estimates that; past the
compiler's ``max_order_states`` the object keeps schema order (optional properties skippable,
required ones not), tracking only the names its predicate needs. With option ``value_calls`` such
an object first makes its large values **calls** of rules compiled
once (a value's states are then not repeated per set; the set stays in the caller's states; one
stack frame per called value) and keeps any order if that fits; ``2**n`` sets of keys alone can
still be too many (then schema order). With the compiler's ``key_register`` (by default for a
schema holding such an object) objects record their written keys in a per-row register instead
(:meth:`ObjectBuilder.build_registered`): any order in linear size.

>>> from jaxsample.structured.automaton import compile_expr
>>> from jaxsample.structured.json_schema import schema_expr
>>> d = compile_expr(schema_expr({"properties": {"a": {}, "b": {}}, "maxProperties": 1}, whitespace="compact"))
>>> [d.matches(x) for x in (b'{"b":1}', b'{"a":1,"b":2}', b'{}')]
[True, False, True]
"""

from __future__ import annotations

import functools

from jaxsample.structured import dfa_ops
from jaxsample.structured import schema_merge as sm
from jaxsample.structured.automaton import EMPTY, EPSILON, ByteDFA, KeyOp, alt, compile_expr, key_test, lit, seq, star
from jaxsample.structured.json_text import encoded_literal, escape, names_dfa, other_names_dfa
from jaxsample.structured.schema_merge import error

#: Values larger than this (estimated states) are all called once an object needs calls to fit.
CALL_MIN_STATES = 16
#: Most ``dependentRequired`` conditions of an object recording its keys (its ``}`` tests one of
#: ``2**n`` alternatives; :data:`~jaxsample.structured.automaton.MAX_EITHER` at most).
MAX_DEPENDENCIES = 3


def _dependency(pred) -> tuple | None:
    """``(name, names it requires)`` of a ``dependentRequired`` presence condition, else ``None``."""
    if pred[0] == "any" and len(pred[1]) == 2 and pred[1][0][0] == "not" and pred[1][0][1][0] == "has":
        then = pred[1][1]
        if then[0] == "all" and all(q[0] == "has" for q in then[1]):
            return pred[1][0][1][1], [q[1] for q in then[1]]
    return None


class RegisterWanted(Exception):
    """Option ``key_register="auto"``: an object (at the JSON pointer given) is too large for any order
    in the tracked-set form and can record its keys; the schema is compiled with the register."""


class ObjectBuilder:
    """Object languages: declared properties in any order (or schema order), extras, counts, predicates."""

    def __init__(self, c, s: dict, path: str):
        self.c, self.s, self.path = c, s, path
        for k in ("minProperties", "maxProperties"):
            if k in s and (isinstance(s[k], bool) or not isinstance(s[k], int) or s[k] < 0):
                raise error(path, k, f"must be a non-negative integer, got {s[k]!r}")
        if not isinstance(s.get("properties", {}), dict):
            raise error(path, "properties", "must be an object")
        props = dict(s.get("properties", {}))
        preds = [("has", n) for n in s.get("required", [])]
        for name, deps in s.get("dependentRequired", {}).items():
            preds.append(("any", [("not", ("has", name)), ("all", [("has", d) for d in deps])]))
        preds += s.get("_presence", [])
        self.pred = ("all", preds)
        self.required = set(s.get("required", []))
        additional = s.get("additionalProperties")
        if additional is None:
            additional = s.get("unevaluatedProperties")
        if additional is None:
            additional = True if c.opts["open_objects"] else False
        self.additional = additional
        patterns = s.get("patternProperties", {})
        for name in sorted(sm.predicate_names(self.pred) - props.keys()):  # named but undeclared: declare
            if any(c.pattern_dfa(p, f"{path}/patternProperties").matches(escape(name).encode()) for p in patterns):
                props[name] = True  # its pattern schemas are applied below
            else:  # the JSON Schema meaning of an undeclared name, whatever open_objects says
                props[name] = s.get("additionalProperties", s.get("unevaluatedProperties", True))
        name_filter = self.names_filter()
        self.members, self.keys, self.values, self.subs = [], {}, {}, {}
        for name, sub in props.items():
            sub_path = f"{path}/properties/{sm.pointer_token(name)}"
            for p, v in patterns.items():
                if c.pattern_dfa(p, f"{path}/patternProperties").matches(escape(name).encode()):
                    sub = {"allOf": [sub, v]}
            if name_filter is not None and not name_filter.matches(escape(name).encode()):
                sub = False
            value = c.compile(sub, sub_path)
            if value != EMPTY:
                self.keys[name] = seq(lit('"'), encoded_literal(name), lit('"'), c.colon)
                self.members.append((name, seq(self.keys[name], value)))
                self.values[name] = value
                self.subs[name] = sub
        first = c.first[0] if c.first is not None and c.first[1] == c.level else None
        self.first = first if first in self.values and first in self.required else None
        if self.first is not None:  # written first: it leads the schema order too
            self.members.sort(key=lambda m: m[0] != self.first)
        self.declared = [n for n, _ in self.members]
        self.extra_keys: list[ByteDFA] = []  # the key automaton of each extra part
        self.extra_parts = self.extra_members(list(props), name_filter)
        self.extras = None if self.extra_parts is None else self.extras_expr(calls=False)

    def names_filter(self) -> ByteDFA | None:
        """DFA of the allowed (JSON-encoded) property names, from ``propertyNames``."""
        pn = self.s.get("propertyNames")
        if pn is None or pn is True:
            return None
        at = f"{self.path}/propertyNames"
        v = self.c.view(pn, at, [])
        if v is True:
            return None
        if v is False:
            return dfa_ops.EMPTY_DFA
        types = sm.types_of(v)
        if types is not None and "string" not in types:
            return dfa_ops.EMPTY_DFA
        keys = {k for k in v if k not in sm.ANNOTATIONS and not k.startswith("x-")}
        if not keys <= sm.FAMILIES["string"] | {"enum", "type", "_not"}:
            bad = sorted(keys - sm.FAMILIES["string"])[0]
            raise error(at, bad, "propertyNames: only string keywords are supported")
        v = self.c.apply_not(v, at) if "_not" in v else v
        if v is False:
            return dfa_ops.EMPTY_DFA
        if "enum" in v:
            return names_dfa([x for x in v["enum"] if isinstance(x, str)])
        return compile_expr(self.c.string_body(v, at))

    def extra_members(self, names, name_filter):
        """``(key automaton, schema, value)`` of the undeclared names (pattern properties, then the rest)."""
        c, s = self.c, self.s
        patterns = s.get("patternProperties", {})
        if not patterns and self.additional is False:
            return None
        taken = names_dfa(names)
        out = []
        at = f"{self.path}/patternProperties"
        keys = {p: dfa_ops.difference(c.pattern_dfa(p, at), taken) for p in patterns}
        for region, key in self.regions(keys, at):  # keys matching exactly the patterns of ``region``
            if name_filter is not None:
                key = dfa_ops.intersect(key, name_filter)
            sub = patterns[region[0]] if len(region) == 1 else {"allOf": [patterns[p] for p in region]}
            value = c.compile(sub, f"{at}/{sm.pointer_token(region[0])}")
            if value != EMPTY and not dfa_ops.is_empty(key):
                out.append((dfa_ops.Automaton.of(key), sub, value))
                self.extra_keys.append(key)
        if self.additional is not False:
            key = other_names_dfa(tuple(names))
            for other in keys.values():
                key = dfa_ops.difference(key, other)
            if name_filter is not None:
                key = dfa_ops.intersect(key, name_filter)
            value = c.compile(self.additional, f"{self.path}/additionalProperties")
            if value != EMPTY and not dfa_ops.is_empty(key):
                out.append((dfa_ops.Automaton.of(key), self.additional, value))
                self.extra_keys.append(key)
        return out or None

    def extras_expr(self, calls: bool):
        """Any one undeclared member; with ``calls``, values over :data:`CALL_MIN_STATES` are calls."""
        c = self.c
        return alt(*(seq(lit('"'), key, lit('"'), c.colon,
                         c.value_call(sub, value) if calls and c.size(value) > CALL_MIN_STATES else value)
                     for key, sub, value in self.extra_parts))  # fmt: skip

    def groups(self) -> list[list[str]]:
        """Declared names grouped by value expression (equal values share their states)."""
        out: dict = {}
        for name, _ in self.members:
            out.setdefault(id(self.values[name]), []).append(name)
        return list(out.values())

    def any_order_size(self, called=frozenset()) -> int:
        """Estimated DFA states of the object in any order: a value's states are repeated for every
        set of written properties that can end with it (equal values merge: a set holding several
        properties with the same value expression counts it once); a ``called`` value counts one.

        With ``value_calls`` keys and undeclared members are counted apart from their values (a
        value flattened into its member can count differently there); without, the estimate the
        defaults were measured with (keys as member minus value)."""
        c, n = self.c, len(self.members)
        cost = sum((1 if names[0] in called else c.size(self.values[names[0]])) * (2**n - 2 ** (n - len(names)))
                   for names in self.groups())  # fmt: skip
        if not c.opts["value_calls"]:
            keys = sum(c.size(m) - c.size(self.values[name]) for name, m in self.members)
            return cost + keys * 2 ** max(n - 1, 0) + (0 if self.extras is None else 2**n * c.size(self.extras))
        cost += sum(c.size(self.keys[name]) for name, _ in self.members) * 2 ** max(n - 1, 0)
        if self.extras is not None:
            extras = sum(c.size(key) + 3 + c.size(c.colon) for key, _, _ in self.extra_parts)
            extras += sum(1 if called and c.size(v) > CALL_MIN_STATES else c.size(v) for _, _, v in self.extra_parts)
            cost += 2**n * extras
        return cost

    def value_calls(self, budget: int):
        """Names whose values become calls so that any order fits ``budget`` estimated states: every
        value over :data:`CALL_MIN_STATES`, then smaller ones, largest first (an inline value is
        copied for every set of written properties); ``None`` if calling every value does not fit."""
        called: set = set()
        for names in sorted(self.groups(), key=lambda g: -self.c.size(self.values[g[0]])):
            small = self.c.size(self.values[names[0]]) <= CALL_MIN_STATES
            if small and self.any_order_size(frozenset(called)) <= budget:
                break
            called.update(names)
        return called if self.any_order_size(frozenset(called)) <= budget else None

    def call_member(self, name: str):
        """The member ``"name": <call of its value's rule>`` (see :meth:`_Compiler.value_call`)."""
        return seq(self.keys[name], self.c.value_call(self.subs[name], self.values[name]))

    @staticmethod
    def regions(keys: dict, at: str):
        """``(patterns, keys)``: the key languages matched by exactly these patterns (non-empty ones)."""
        regions = []
        for p, key in keys.items():
            nxt = []
            for names, d in regions:
                both = dfa_ops.intersect(d, key)
                if dfa_ops.is_empty(both):
                    nxt.append((names, d))
                    continue
                nxt.append((names + (p,), both))
                rest = dfa_ops.difference(d, key)
                if not dfa_ops.is_empty(rest):
                    nxt.append((names, rest))
                key = dfa_ops.difference(key, d)
            if not dfa_ops.is_empty(key):
                nxt.append(((p,), key))
            regions = nxt
            if len(regions) > 64:
                raise error(at, "", "overlapping patternProperties make more than 64 key regions")
        return regions

    def registrable(self) -> bool:
        """Whether the object can record its keys in the key register: any order, presence conditions
        that are ``required`` and at most :data:`MAX_DEPENDENCIES` ``dependentRequired``, no property
        counts, outside called rules, some member."""
        c, s = self.c, self.s
        deps = [_dependency(p) for p in self.pred[1] if p[0] != "has"]
        writable = all(d is not None and (d[0] not in self.values or set(d[1]) <= self.values.keys()) for d in deps)
        return bool(not c.in_rule and c.opts["property_order"] == "any" and (self.members or self.extras is not None)
                    and writable and len(deps) <= MAX_DEPENDENCIES
                    and "minProperties" not in s and "maxProperties" not in s)  # fmt: skip

    def registered(self) -> bool:
        """Whether the object records its keys in the key register (option ``key_register=True``)."""
        return self.c.keys_recorded() and self.registrable()

    def build_registered(self):
        """``{ member (, member)* }`` over every declared member and extra: a declared key marks its bit
        (absent before: each at most once) before its closing quote; ``}`` needs the required bits (and
        for each dependency its name's bit clear or its required bits set: alternatives) and clears
        the nesting's bits for the next object there; ``{`` clears them too (they are clear there
        already; it tells the automaton, whose completability analysis needs it)."""
        c = self.c
        c.key_ops = True
        bits = {name: c.key_bit(name, self.path) for name in self.declared}
        members = []
        for name in self.declared:
            mark = KeyOp(absent=bits[name], add=bits[name])
            members.append(seq(lit('"'), encoded_literal(name), mark, lit('"'), c.colon, self.values[name]))
        if self.extras is not None:
            c.open_levels.append((c.level, frozenset(self.declared)))
            members.append(self.marked_extras() if c.known else self.extras)
        member = alt(*members)
        start = members[self.declared.index(self.first)] if self.first is not None else member
        needed = {p[1] for p in self.pred[1] if p[0] == "has"}
        if not needed <= bits.keys():  # a required property that no value can have
            return EMPTY
        tests = [(sum(bits[n] for n in needed), 0)]
        for name, deps in filter(None, map(_dependency, self.pred[1])):
            if name in bits:  # absent, or every dependency present (each can be written: registrable)
                tests = [t for s, a in tests for t in [(s, a | bits[name]), (s | sum(bits[d] for d in deps), a)]]
        test = key_test(tests, clear=c.level_keys())
        close = seq(test, lit("}"))
        items = seq(start, star(seq(c.comma, member)), c.ws)
        open_ = seq(KeyOp(clear=c.level_keys()), lit("{"))  # (clear already: says so to the automaton)
        out = seq(open_, c.ws, alt(EPSILON, items) if test.apply(0) is not None and self.first is None else items, close)
        c._sizes[id(out)] = (out, sum(c.size(m) for m in members) + 1)
        return out

    def marked_extras(self):
        """The undeclared members, where a key is a property name that objects at this nesting declare
        elsewhere (a union's other branches) marking its bit as theirs do: the objects then read the
        key alike (a repeated undeclared key of such a name is refused: duplicate keys)."""
        c = self.c
        others = [n for n in c.known.get(c.level, {}) if n not in self.values and escape(n) == n]
        if not others:
            return self.extras
        taken = names_dfa(others)
        parts = []
        for key, (_, sub, value) in zip(self.extra_keys, self.extra_parts):
            plain = c.unmarked_key(key, taken)
            parts.append(seq(lit('"'), plain, lit('"'), c.colon, value))
            for name in others:
                if key.matches(name.encode()):
                    bit = c.key_bit(name, self.path)
                    parts.append(seq(lit('"'), lit(name), KeyOp(absent=bit, add=bit), lit('"'), c.colon, value))
        return alt(*parts)

    def marked_members(self, members: dict) -> dict:
        """For an object keeping the tracked-set form where others at its nesting record keys: its
        members whose name another object's bit stands for, marking it as theirs do (and its extras
        likewise, :meth:`marked_extras`), so that union branches read a key alike; in the first pass
        (names not known yet) none, only noted for the second."""
        c = self.c
        c.open_levels.append((c.level, frozenset()))
        if not c.known:
            return {}
        known = c.known.get(c.level, {})
        if self.extras is not None:
            self.extras = self.marked_extras()
        out = {}
        for name in self.declared:
            if name in known:
                bit = c.key_bit(name, self.path)
                key = seq(lit('"'), encoded_literal(name), KeyOp(absent=bit, add=bit), lit('"'), c.colon)
                value = members[name].items[len(self.keys[name].items):]  # (a member: its key's items, then its value)
                out[name] = seq(key, *value)
        return out

    def build(self):
        c, s = self.c, self.s
        if self.registered():
            return self.build_registered()
        lo, hi = s.get("minProperties", 0), s.get("maxProperties")
        n = len(self.members)
        # with 0 or 1 declared properties there is no order to track; their size counts for the
        # parent's estimate (with value_calls only: the defaults keep the estimates they were measured with)
        cost = self.any_order_size() if n > 1 or c.opts["value_calls"] else 0
        any_order = c.opts["property_order"] == "any" and (n <= 1 or cost <= c.opts["max_order_states"])
        members = dict(self.members)
        if c.opts["property_order"] == "any" and not any_order and c.opts["value_calls"]:
            called = self.value_calls(c.opts["max_order_states"])
            if called is not None:
                any_order, cost = True, self.any_order_size(frozenset(called))
                members.update((name, self.call_member(name)) for name in called)
                if self.extras is not None:
                    self.extras = self.extras_expr(calls=True)
        if not any_order and c.opts["key_register"] == "auto" and self.registrable():
            raise RegisterWanted(self.path)
        if c.keys_recorded() and (self.members or self.extras is not None):
            members.update(self.marked_members(members))
        tracked = set(self.declared) if any_order else sm.predicate_names(self.pred)
        if (lo or hi is not None) and not any_order:
            tracked = set(self.declared)  # counting needs the set anyway
            if 2**n > c.opts["max_order_states"]:
                raise error(self.path, "minProperties" if lo else "maxProperties", f"counting properties of an "
                            f"object with {n} declared properties needs more than max_order_states states")  # fmt: skip
        # extras counted: up to maxProperties, and (keys may repeat) at most one toward minProperties
        cap = 0 if self.extras is None else hi if hi is not None else (1 if lo else 0)
        order = {name: i for i, name in enumerate(self.declared)}
        required = [n for n in self.declared if n in self.required]

        def candidates(j, present):
            if any_order:
                return [x for x in self.declared if x not in present]
            out = []
            for name in self.declared[j:]:  # schema order: optional ones may be skipped, required ones not
                out.append(name)
                if name in self.required:
                    break
            return out

        def close_ok(j, present, count):
            if not any_order:  # schema order: required members are never skipped, so all are written
                if any(order[r] >= j for r in required):
                    return False
                present = present | set(required)
            distinct = len(present) + min(count, 1)
            return sm.evaluate(self.pred, present) and distinct >= lo and (hi is None or len(present) + count <= hi)

        def step(j, present, name):
            nxt = present | {name} if name in tracked else present
            return (0 if any_order else order[name] + 1), frozenset(nxt)

        @functools.cache
        def after(j, present, count):
            """The rest of the object once >= 1 member is written; ``present``: tracked names written."""
            options = [EPSILON] if close_ok(j, present, count) else []
            room = hi is None or len(present) + count < hi
            for name in candidates(j, present) if room else []:
                options.append(seq(c.comma, members[name], after(*step(j, present, name), count)))
            body = alt(*options)
            if self.extras is not None and room:
                if count >= cap and hi is None:  # more extras no longer change anything
                    return seq(star(seq(c.comma, self.extras)), body)
                body = alt(body, seq(c.comma, self.extras, after(j, present, min(count + 1, cap))))
            return body

        start = frozenset()
        options = []
        if hi is None or hi > 0:
            for name in [self.first] if self.first is not None else candidates(0, start):
                options.append(seq(members[name], after(*step(0, start, name), 0)))
            if self.extras is not None and self.first is None:
                options.append(seq(self.extras, after(0, start, min(1, cap))))
        out = c.container("{", "}", alt(*options), close_ok(0, start, 0))
        if c.keys_recorded() and out != EMPTY:  # the same ops as registered objects' (union branches)
            c.key_ops = True
            out = seq(KeyOp(clear=c.level_keys()), *out.items[:-1], KeyOp(clear=c.level_keys()), out.items[-1])
        extras = 0 if self.extras is None or not c.opts["value_calls"] else c.size(self.extras)
        c._sizes[id(out)] = (out, cost if any_order else sum(c.size(m) for _, m in self.members) + extras + 1)
        return out
