"""Go's time.ParseDuration, for the CLI's flags ("10s", "1m30s", "500ms")."""

_UNITS = {"ns": 1, "us": 1000, "\u00b5s": 1000, "\u03bcs": 1000, "ms": 10**6, "s": 10**9, "m": 60 * 10**9,
          "h": 3600 * 10**9}
_MAX = (1 << 63) - 1


def parse_duration_ns(s):
    """Returns the duration s in nanoseconds, or raises ValueError as Go would."""
    orig = s
    neg = False
    if s and s[0] in "+-":
        neg = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(f"time: invalid duration {orig!r}")
    total = 0
    while s:
        i = 0
        while i < len(s) and s[i].isdigit() and s[i] in "0123456789":
            i += 1
        pre = i > 0
        v = int(s[:i]) if pre else 0
        s = s[i:]
        f, scale, post = 0, 1.0, False
        if s.startswith("."):
            s = s[1:]
            i = 0
            overflow = False
            while i < len(s) and s[i] in "0123456789":
                if not overflow:
                    if f > _MAX // 10:
                        overflow = True
                    else:
                        f = f * 10 + int(s[i])
                        scale *= 10
                i += 1
            post = i > 0
            s = s[i:]
        if not pre and not post:
            raise ValueError(f"time: invalid duration {orig!r}")
        i = 0
        while i < len(s) and s[i] != "." and s[i] not in "0123456789":
            i += 1
        if i == 0:
            raise ValueError(f"time: missing unit in duration {orig!r}")
        u = s[:i]
        s = s[i:]
        if u not in _UNITS:
            raise ValueError(f"time: unknown unit {u!r} in duration {orig!r}")
        unit = _UNITS[u]
        if v > _MAX // unit:
            raise ValueError(f"time: invalid duration {orig!r}")
        v *= unit
        if f > 0:
            v += int(float(f) * (float(unit) / scale))
            if v > _MAX:
                raise ValueError(f"time: invalid duration {orig!r}")
        total += v
        if total > _MAX:
            raise ValueError(f"time: invalid duration {orig!r}")
    return -total if neg else total


def format_duration(ns):
    """A short rendering of a duration in ns, for messages (not Go-exact)."""
    if ns % 10**9 == 0:
        return f"{ns // 10**9}s"
    if ns % 10**6 == 0:
        return f"{ns // 10**6}ms"
    return f"{ns / 1e9}s"


def go_duration(ns):
    """ns as Go's time.Duration.String writes it ("1.5s", "2m0s", "300ms",
    "500µs"): the CLI's messages say durations as Go's CLI does."""
    if ns == 0:
        return "0s"
    sign, u = ("-", -ns) if ns < 0 else ("", ns)

    def frac(v, prec):
        digits = f"{v % 10**prec:0{prec}d}".rstrip("0")
        return v // 10**prec, ("." + digits if digits else "")

    if u < 10**9:
        if u < 1000:
            return f"{sign}{u}ns"
        prec, unit = (3, "\u00b5s") if u < 10**6 else (6, "ms")
        whole, f = frac(u, prec)
        return f"{sign}{whole}{f}{unit}"
    secs, f = frac(u, 9)
    out = f"{secs % 60}{f}s"
    mins = secs // 60
    if mins:
        out = f"{mins % 60}m" + out
        if mins // 60:
            out = f"{mins // 60}h" + out
    return sign + out
