"""A JSON encoder whose output is byte-identical to Go's encoding/json.

Go's json.Marshal writes compact JSON, sorts map keys, escapes < > & and
U+2028/U+2029, writes control characters as \\b \\f \\n \\r \\t or \\u00XX,
replaces invalid UTF-8 (lone surrogates here) with U+FFFD, and formats
floats as strconv's shortest form: plain decimal for 1e-6 <= |x| < 1e21,
otherwise exponent form like 1e+21 or 1.5e-7. Python ints print as integers.
"""

import decimal
import json
import math

_ESC = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f",
        "<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _string(s, out):
    out.append('"')
    for ch in s:
        e = _ESC.get(ch)
        if e is not None:
            out.append(e)
        elif ch < " ":
            out.append("\\u%04x" % ord(ch))
        elif "\ud800" <= ch <= "\udfff":
            out.append("\ufffd")
        else:
            out.append(ch)
    out.append('"')


def format_float(f):
    """Formats a float as Go's encoding/json does."""
    if math.isnan(f) or math.isinf(f):
        raise ValueError(f"json: unsupported value: {f!r}")
    if f == 0:
        return "-0" if math.copysign(1, f) < 0 else "0"
    sign, digits, exp = decimal.Decimal(repr(f)).normalize().as_tuple()
    ds = "".join(map(str, digits))
    # value = 0.ds * 10**(point) with point = len(ds) + exp
    point = len(ds) + exp
    neg = "-" if sign else ""
    a = abs(f)
    if 1e-6 <= a < 1e21:
        if point <= 0:
            return neg + "0." + "0" * (-point) + ds
        if point >= len(ds):
            return neg + ds + "0" * (point - len(ds))
        return neg + ds[:point] + "." + ds[point:]
    e = point - 1
    mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
    es = "-" if e < 0 else "+"
    ea = abs(e)
    return neg + mant + "e" + es + ("%02d" % ea if e >= 0 else str(ea))


def _encode(v, out):
    if v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, int):
        out.append(str(int(v)))
    elif isinstance(v, float):
        out.append(format_float(v))
    elif isinstance(v, str):
        _string(v, out)
    elif isinstance(v, dict):
        items = []
        for k, x in v.items():
            if not isinstance(k, str):
                raise TypeError(f"json: unsupported map key type {type(k).__name__}")
            items.append((k.encode("utf-8", "surrogatepass"), k, x))
        items.sort(key=lambda t: t[0])
        out.append("{")
        for i, (_, k, x) in enumerate(items):
            if i:
                out.append(",")
            _string(k, out)
            out.append(":")
            _encode(x, out)
        out.append("}")
    elif isinstance(v, (list, tuple)):
        out.append("[")
        for i, x in enumerate(v):
            if i:
                out.append(",")
            _encode(x, out)
        out.append("]")
    else:
        raise TypeError(f"json: unsupported type {type(v).__name__}")


def dumps(v):
    """Encodes v (None, bool, int, float, str, list, tuple, dict) as Go would: bytes."""
    out = []
    _encode(v, out)
    return "".join(out).encode("utf-8", "surrogatepass")


def loads(data):
    """Decodes JSON bytes."""
    return json.loads(data)
