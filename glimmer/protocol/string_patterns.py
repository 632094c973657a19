"""A JSON-schema string's `pattern` and `format` as regexes a raw ATEM value must match whole.

A parameter that admits strings is written as raw text (P-VAL-1), not as a JSON string, so the grammar engine's own
handling of `pattern` and `format` (inside `%json`) does not reach it: the turn grammar intersects its raw-value
terminal with these regexes instead. They are written in the grammar engine's regex dialect (Rust's `regex` syntax,
inside Lark's `/.../`), each matching a whole value.

- `pattern` is an ECMA-262 regex that matches when it matches anywhere in the string (JSON Schema §6.3.3): each
  top-level alternative is padded with "any text" on the sides its `^` and `$` do not anchor, and `\\d`, `\\w` (and
  their negations) are ASCII, as in ECMA-262.
- `format` follows the RFCs JSON Schema names (§7.3): RFC 3339 `date`, `time`, `date-time` (February 29th in leap
  years only) and its Appendix A `duration`; RFC 4122 `uuid`; RFC 2673 `ipv4`; RFC 4291 `ipv6`; RFC 1123 `hostname`;
  RFC 5321 `email` (a dot-atom local part); RFC 3986 `uri`; `unknown` admits any text.

Pure text, no grammar engine: the engine reports the regexes it cannot compile when the grammar is compiled.
"""

from __future__ import annotations

ANY_TEXT = r"(?s:.*)"


class UnsupportedPattern(ValueError):
    """A pattern whose `^` or `$` stands where a whole-value regex cannot express it (inside a group)."""


def search_regex(pattern: str) -> str:
    """The regex matching exactly the texts in which ECMA-262 `pattern` finds a match (JSON Schema's `pattern`).

    Raises UnsupportedPattern for a `^` or `$` that is not at the start or the end of a top-level alternative."""
    alternatives = []
    for alternative in _top_level_alternatives(pattern):
        anchored_start = alternative.startswith("^")
        body = alternative[1:] if anchored_start else alternative
        anchored_end = _ends_with_anchor(body)
        body = body[:-1] if anchored_end else body
        if _has_anchor(body):
            raise UnsupportedPattern(f"pattern {pattern!r}: a '^' or '$' inside a group cannot be enforced in a raw "
                                     "value; anchor the whole pattern or one of its top-level alternatives")
        alternatives.append(f"{'' if anchored_start else ANY_TEXT}(?:{_ascii_classes(body)})"
                            f"{'' if anchored_end else ANY_TEXT}")
    return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(f"(?:{a})" for a in alternatives) + ")"


def _scan(pattern: str):
    """(index, character, escaped, in_class, depth) for each character of `pattern`: `escaped` for the character
    after a backslash, `in_class` inside `[...]` (the bracket characters themselves count as outside), `depth` the
    parentheses open before it."""
    escaped = in_class = False
    depth = 0
    for index, char in enumerate(pattern):
        if escaped:
            yield index, char, True, in_class, depth
            escaped = False
            continue
        if char == "\\":
            escaped = True
            yield index, char, False, in_class, depth
            continue
        if in_class:
            if char == "]":
                in_class = False
            yield index, char, False, in_class, depth
            continue
        if char == "[":
            yield index, char, False, False, depth
            in_class = True
            continue
        if char == "(":
            yield index, char, False, False, depth
            depth += 1
            continue
        if char == ")":
            depth = max(depth - 1, 0)
        yield index, char, False, False, depth


def _top_level_alternatives(pattern: str) -> list[str]:
    cuts = [index for index, char, escaped, in_class, depth in _scan(pattern)
            if char == "|" and not escaped and not in_class and depth == 0]
    bounds = [-1, *cuts, len(pattern)]
    return [pattern[start + 1:end] for start, end in zip(bounds, bounds[1:], strict=False)]


def _ends_with_anchor(body: str) -> bool:
    last = None
    for index, char, escaped, in_class, depth in _scan(body):
        last = (index, char, escaped, in_class, depth)
    return last is not None and last[1] == "$" and not last[2] and not last[3] and last[4] == 0


def _has_anchor(body: str) -> bool:
    return any(char in "^$" and not escaped and not in_class
               for _, char, escaped, in_class, _ in _scan(body))


_ASCII_CLASSES = {"d": "0-9", "w": "0-9A-Za-z_"}


def _ascii_classes(body: str) -> str:
    """`body` with ECMA's ASCII `\\d`, `\\w`, `\\D`, `\\W` spelled as classes (Rust's are Unicode) and `/` escaped (it
    would end Lark's `/.../`)."""
    out = []
    for _, char, escaped, _, _ in _scan(body):
        if escaped and char.lower() in _ASCII_CLASSES:
            out.pop()  # the backslash
            negated = "^" if char.isupper() else ""
            out.append(f"[{negated}{_ASCII_CLASSES[char.lower()]}]")
        elif char == "/" and not escaped:
            out.append("\\/")
        else:
            out.append(char)
    return "".join(out)


# RFC 3339 §5.6 full-date, with the day counts of §5.7 (February 29th when the year is divisible by 4 but not by
# 100, or by 400)
_MONTH_DAY = ("(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|"
              "02-(?:0[1-9]|1[0-9]|2[0-8]))")
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)"
_DATE = f"(?:[0-9]{{4}}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
# RFC 3339 §5.6 full-time: partial-time and a time offset
_TIME = ("(?:[01][0-9]|2[0-3]):[0-5][0-9]:(?:[0-5][0-9]|60)(?:\\.[0-9]+)?"
         "(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])")


def _duration() -> str:
    """RFC 3339 Appendix A: dur-date, dur-time or dur-week after a `P`."""
    second = "[0-9]+S"
    minute = f"[0-9]+M(?:{second})?"
    hour = f"[0-9]+H(?:{minute})?"
    time = f"T(?:{hour}|{minute}|{second})"
    day = "[0-9]+D"
    month = f"[0-9]+M(?:{day})?"
    year = f"[0-9]+Y(?:{month})?"
    return f"P(?:(?:{day}|{month}|{year})(?:{time})?|{time}|[0-9]+W)"


_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = f"{_OCTET}(?:\\.{_OCTET}){{3}}"


def _ipv6() -> str:
    """RFC 4291 §2.2's text forms, as RFC 3986 §3.2.2 spells them (`::` standing for one or more zero groups)."""
    h16 = "[0-9A-Fa-f]{1,4}"
    ls32 = f"(?:{h16}:{h16}|{_IPV4})"
    forms = [f"(?:{h16}:){{6}}{ls32}"]
    tails = [f"(?:{h16}:){{5}}{ls32}", f"(?:{h16}:){{4}}{ls32}", f"(?:{h16}:){{3}}{ls32}",
             f"(?:{h16}:){{2}}{ls32}", f"{h16}:{ls32}", ls32, h16, ""]
    for before, tail in enumerate(tails):  # at most `before` groups ahead of the `::`
        head = "" if before == 0 else f"(?:(?:{h16}:){{0,{before - 1}}}{h16})?"
        forms.append(f"{head}::{tail}")
    return "(?:" + "|".join(forms) + ")"


_IPV6 = _ipv6()
_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = f"{_LABEL}(?:\\.{_LABEL})*"
# RFC 5321 §4.1.2 Mailbox: a dot-atom local part (atext, RFC 5322 §3.2.3) and a domain or an address literal
_ATEXT = "[A-Za-z0-9!#$%&'*+\\/=?^_`{|}~-]"
_EMAIL = f"{_ATEXT}+(?:\\.{_ATEXT}+)*@(?:{_HOSTNAME}|\\[{_IPV4}\\]|\\[IPv6:{_IPV6}\\])"


def _uri() -> str:
    """RFC 3986 §3: scheme ":" hier-part ["?" query] ["#" fragment]."""
    pct = "%[0-9A-Fa-f]{2}"
    unreserved, sub_delims = "A-Za-z0-9._~\\-", "!$&'()*+,;="
    pchar = f"(?:[{unreserved}{sub_delims}:@]|{pct})"
    userinfo = f"(?:[{unreserved}{sub_delims}:]|{pct})*"
    reg_name = f"(?:[{unreserved}{sub_delims}]|{pct})*"
    ip_literal = f"\\[(?:{_IPV6}|v[0-9A-Fa-f]+\\.[{unreserved}{sub_delims}:]+)\\]"
    authority = f"(?:{userinfo}@)?(?:{ip_literal}|{_IPV4}|{reg_name})(?::[0-9]*)?"
    segments = f"(?:\\/{pchar}*)*"
    hier = f"(?:\\/\\/{authority}{segments}|\\/(?:{pchar}+{segments})?|{pchar}+{segments}|)"
    rest = f"(?:{pchar}|[\\/?])*"
    return f"[A-Za-z][A-Za-z0-9+.-]*:{hier}(?:\\?{rest})?(?:#{rest})?"


FORMATS: dict[str, tuple[str, ...]] = {
    "date": (_DATE,),
    "time": (_TIME,),
    "date-time": (f"{_DATE}[Tt]{_TIME}",),
    "duration": (_duration(),),
    "uuid": ("[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}",),
    "ipv4": (_IPV4,),
    "ipv6": (_IPV6,),
    "hostname": (_HOSTNAME, "(?s:.){1,253}"),
    "email": (_EMAIL,),
    "uri": (_uri(),),
    "unknown": (),
}
"""Each `format` the grammar engine knows in a JSON value, as the regexes (all to be matched) of a raw value."""
