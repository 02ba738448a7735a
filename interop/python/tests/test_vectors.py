"""Checks every entry of ../vectors.json (written from the Go implementation)."""

import base64
import hashlib
import json
import os
import re

import pytest

from memolock import gojson, protocol as P
from memolock.cli import redact
from memolock.durations import parse_duration_ns

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VECTORS = os.path.join(ROOT, "..", "vectors.json")
PROTOCOL_GO = os.path.join(ROOT, "..", "..", "internal", "wire", "scripts.go")


def b64(s):
    return base64.b64decode(s)


@pytest.fixture(scope="module")
def vectors():
    if not os.path.exists(VECTORS):
        pytest.skip("interop/vectors.json not present")
    with open(VECTORS, encoding="utf-8") as fh:
        return json.load(fh)


#: The scripts every peer sends (PROTOCOL.md, Checklist); Go has more.
CORE_SCRIPTS = {"acquire", "store", "release", "renew", "not_found"}


def sharded(src):
    return src.replace("redis.call('PUBLISH', ", "redis.call('SPUBLISH', ")


def test_scripts_sha1(vectors):
    assert CORE_SCRIPTS <= set(P.SCRIPTS) <= set(vectors["scripts"])
    for name, v in vectors["scripts"].items():
        src = v["src"]
        # The text as sent, final newline included ([S1]): the SHA-1 matches only so.
        assert src.endswith("\n") and not src.endswith("\n\n") and src == src.lstrip(), name
        assert hashlib.sha1(src.encode()).hexdigest() == v["sha1"], name
        if sharded(src) != src:
            assert hashlib.sha1(sharded(src).encode()).hexdigest() == v["sharded_sha1"], name
        else:
            assert "sharded_sha1" not in v, name
    for name, src in P.SCRIPTS.items():
        assert src == vectors["scripts"][name]["src"], name
        assert hashlib.sha1(src.encode()).hexdigest() == vectors["scripts"][name]["sha1"], name


def test_scripts_match_go_source():
    assert os.path.exists(PROTOCOL_GO), "the Go scripts (internal/wire/scripts.go) are not where this test looks"
    src = open(PROTOCOL_GO, encoding="utf-8").read()
    go_names = {"not_found": "NotFound"}  # vectors.json's name -> scripts.go's
    for name, text in P.SCRIPTS.items():
        go = go_names.get(name, name[:1].upper() + name[1:])
        m = re.search(r"const " + go + r"Src = `([^`]*)`", src)
        assert m, name
        assert m.group(1) == text, name


def test_vector_scripts_are_the_go_source(vectors):
    """Every script text in vectors.json, Go's own included, is the Go source."""
    src = open(PROTOCOL_GO, encoding="utf-8").read()
    go_names = {"not_found": "NotFound"}
    for name, v in vectors["scripts"].items():
        go = go_names.get(name, name[:1].upper() + name[1:])
        m = re.search(r"const " + go + r"Src = `([^`]*)`", src)
        assert m and m.group(1) == v["src"], name


def test_constants(vectors):
    assert vectors["linger_ms"] == P.LINGER_MS
    assert vectors["max_event_text"] == P.MAX_EVENT_TEXT


def test_limits(vectors):
    """[S4]: this peer never sends a duration over the limit, and refuses
    (does not clamp) one it cannot send."""
    lim = vectors["limits"]
    assert P.MAX_SECONDS * 1000 <= lim["max_duration_ms"]
    assert P.duration_ms(P.MAX_SECONDS, "ttl") == P.MAX_SECONDS * 1000
    with pytest.raises(ValueError, match="too long"):
        P.duration_ms(lim["max_duration_ms"] / 1000 + 1, "ttl")
    assert P.duration_ms(lim["min_lock_ttl_ms"] / 1000, "lock_ttl", allow_zero=False) == lim["min_lock_ttl_ms"]
    with pytest.raises(ValueError):
        P.duration_ms(lim["min_lock_ttl_ms"] / 2000, "lock_ttl", allow_zero=False)


def test_value_ttls(vectors):
    """[C3], [C6]: the value TTL argument of the store script; a negative TTL
    is refused (this peer treats it as a failure of fetch)."""
    assert vectors["value_ttls"]
    for v in vectors["value_ttls"]:
        seconds = v["ns"] / 10**9
        if v["arg"] is None:
            with pytest.raises(ValueError, match="negative"):
                P.check_value(b"x", seconds)
        else:
            assert str(P.check_value(b"x", seconds)[1]) == v["arg"], v


def test_lock_ttls(vectors):
    """[L5]: the lock TTL that acquire and renew get, in whole ms, truncated;
    a lock TTL under 1 ms is refused, never sent as 0 or rounded up."""
    from memolock import core
    assert vectors["lock_ttls"]
    for v in vectors["lock_ttls"]:
        seconds = v["ns"] / 10**9
        if v["arg"] is None:
            with pytest.raises(ValueError):
                core.Core("t", seconds, False, 0)
        else:
            assert str(core.Core("t", seconds, False, 0).lock_ttl_ms) == v["arg"], v


def test_timers(vectors):
    """[W7]-[W9]: a waiter looks again between the earliest and the latest
    moment after a busy reply, whatever its random draw."""
    from memolock import core
    assert vectors["timers"]
    wrong = []
    for t in vectors["timers"]:
        got = []
        for draw in (0.0, 0.5, 1.0 - 2**-53):
            c = core.Core("t", t["lock_ttl_ms"] / 1000, False, 0, rand=lambda d=draw: d)
            got.append(c.timer(t["pttl_ms"]) * 10**6)
        # Floats in seconds: allow a microsecond of rounding.
        if not (abs(got[0] - t["earliest_us"]) <= 1 and all(t["earliest_us"] - 1 <= g <= t["latest_us"] + 1 for g in got)):
            wrong.append((t, got))
    assert not wrong, wrong


def test_cli_ids(vectors):
    """[A1], [A2]: what --id, --id-hex and --id-base64 give, or refuse."""
    from memolock.cli import UsageError, one_id
    assert vectors["cli_ids"]
    wrong = []
    for c in vectors["cli_ids"]:
        raw = b64(c["arg_b64"])
        arg = os.fsdecode(raw)  # what Python's argv holds for those bytes
        want = None if c["id_b64"] is None else b64(c["id_b64"])
        try:
            got = one_id([(c["flag"][2:], arg)])
            if not got:
                raise UsageError("--tag and --id (or --id-hex, --id-base64) are required")  # as run() refuses it
        except UsageError as e:
            if want is not None or c["flag"] not in str(e):
                wrong.append((c["flag"], raw, want, str(e)))
            continue
        if got != want:
            wrong.append((c["flag"], raw, want, got))
    assert not wrong, wrong


def test_keys(vectors):
    assert vectors["keys"]
    for k in vectors["keys"]:
        ks = P.KeyScheme(k["tag"])
        id = b64(k["id_b64"])
        wire = P.hash_id(id) if k["hash_ids"] else id
        assert ks.value(wire) == b64(k["value_b64"]), k["name"]
        assert ks.lock(wire) == b64(k["lock_b64"]), k["name"]
        assert ks.notif(wire) == b64(k["notif_b64"]), k["name"]
        assert ks.events(wire) == b64(k["events_b64"]), k["name"]
        assert ks.not_found(wire) == b64(k["not_found_b64"]), k["name"]
        assert ks.stale(wire) == b64(k["stale_b64"]), k["name"]
        assert ks.id_keys(wire) == [ks.value(wire), ks.lock(wire), ks.not_found(wire), ks.stale(wire)]


def test_hashed_ids(vectors):
    for h in vectors.get("hashed_ids", []):
        assert P.hash_id(b64(h["id_b64"])) == h["hashed"].encode()


def test_events(vectors):
    assert vectors["events"]
    for e in vectors["events"]:
        token = e["token"].encode()
        msg = b64(e["message_b64"])
        want = b64(e["payload_b64"])
        if e["kind"] == "fail":
            got = P.fail_event(token, msg)
        elif e["kind"] == "abandon":
            got = P.abandon_event(token)
        else:
            assert e["kind"] in ("notfound", "stale"), e["name"]
            assert not msg, e["name"]
            got = P.event(e["kind"].encode(), token)
        assert got == want, e["name"]
        kind, tok, text = P.parse_event(want)
        assert kind == e["kind"].encode() and tok == token, e["name"]


def test_hosts(vectors):
    assert vectors["hosts"]
    for h in vectors["hosts"]:
        assert P.holder_suffix(b64(h["host_b64"]), pid="") == h["suffix"], h


def test_json(vectors):
    assert vectors["json"]
    for j in vectors["json"]:
        assert gojson.dumps(j["value"]) == b64(j["encoded_b64"]), j["name"]


def test_durations(vectors):
    assert vectors["durations"]
    for d in vectors["durations"]:
        want = d["ns"] if "ns" in d else (None if d["ms"] is None else d["ms"] * 10**6)
        if want is None:
            with pytest.raises(ValueError):
                parse_duration_ns(d["text"])
        else:
            assert parse_duration_ns(d["text"]) == want, d["text"]


def test_tags(vectors):
    for t in vectors.get("tags", []):
        if t["valid"]:
            P.KeyScheme(t["tag"])
        else:
            with pytest.raises(ValueError):
                P.KeyScheme(t["tag"])


def test_parse(vectors):
    assert any(not_utf8(b64(p["text_b64"])) for p in vectors["parse"])
    for p in vectors.get("parse", []):
        kind, token, text = P.parse_event(b64(p["payload_b64"]))
        assert (kind, token, text) == (p["kind"].encode(), p["token"].encode(), b64(p["text_b64"])), p


def not_utf8(b):
    try:
        b.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_event_kinds(vectors):
    kinds = {e["kind"] for e in vectors["events"]}
    assert {"fail", "abandon", "notfound", "stale"} <= kinds
    assert P.EVENT_NOTFOUND == b"notfound" and P.EVENT_STALE == b"stale"


def test_decode_acquire_replies():
    tok = b"mine@h:1"
    assert P.decode_acquire(b"1", tok).kind == P.HIT  # a bulk "1" is a value
    assert P.decode_acquire(1, tok).kind == P.LOCKED
    r = P.decode_acquire([1234], tok)
    assert (r.kind, r.pttl) == (P.NOT_FOUND, 1234)
    assert P.decode_acquire([-1], tok).kind == P.NOT_FOUND  # a marker without TTL
    for flag in (1, 2):  # Go-only replies to ARGV[3]/ARGV[4]: plain hits here
        r = P.decode_acquire([b"v", flag], tok)
        assert (r.kind, r.value) == (P.HIT, b"v")
    r = P.decode_acquire([500, b"other@h:2", b"stale copy"], tok)  # ARGV[4]'s third element: ignored
    assert (r.kind, r.pttl, r.holder, r.value) == (P.BUSY, 500, b"other@h:2", None)
    r = P.decode_acquire([500, b"other@h:2", None], tok)
    assert (r.kind, r.holder) == (P.BUSY, b"other@h:2")
    r = P.decode_acquire([500, tok], tok)
    assert (r.kind, r.pttl) == (P.LOCKED, 500)
    for bad in (0, 2, [], [b"v"], [b"v", 3], [None, None], None):
        with pytest.raises(ValueError):
            P.decode_acquire(bad, tok)


def test_token_format():
    t = P.new_token().decode()
    assert re.fullmatch(r"[0-9a-f]{32}@[A-Za-z0-9._-]+:\d+", t), t
    assert P.new_token() != P.new_token()


def test_truncate_utf8():
    s = "é".encode() * 3000  # 6000 bytes, 2 per character
    cut = P.truncate_utf8(s, 4095)
    assert len(cut) == 4094 and cut.decode()


def test_go_float_format():
    cases = [(1e-7, "1e-7"), (1.5e-7, "1.5e-7"), (1e21, "1e+21"), (1e20, "100000000000000000000"),
             (1e-6, "0.000001"), (0.0, "0"), (-0.0, "-0"), (100.0, "100"), (2.5, "2.5"),
             (1.7976931348623157e308, "1.7976931348623157e+308"), (5e-324, "5e-324"), (123.456, "123.456")]
    for f, want in cases:
        assert gojson.format_float(f) == want, f
    assert gojson.dumps({"b": 1, "a": ["<&>", None]}) == b'{"a":["\\u003c\\u0026\\u003e",null],"b":1}'


def test_redact():
    assert redact("redis://user:secret@host:6379/0") == "redis://xxxxx@host:6379/0"
    assert redact("redis://secret@host:6379") == "redis://xxxxx@host:6379"
    assert "secret" not in redact("redis://host:6379/0?password=secret")
    assert redact("unix:///tmp/redis.sock") == "unix:///tmp/redis.sock"
    assert redact("host:6379") == "(URL withheld)"
    assert redact("http://x:y@host") == "(URL withheld)"
