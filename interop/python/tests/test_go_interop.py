"""Go and Python `run` processes on one key. Opt-in: set MEMOLOCK_GO_BIN to
a built Go binary (go build -o /tmp/memolock-go ./cmd/memolock); the
repository's interop/interop_test.go covers the same ground from Go."""

import os
import subprocess
import time

import pytest

from conftest import PKG_ROOT, PYTHON

GO_BIN = os.environ.get("MEMOLOCK_GO_BIN")
pytestmark = pytest.mark.skipif(not GO_BIN or not os.path.exists(GO_BIN), reason="MEMOLOCK_GO_BIN not set")
WAIT = 60
ID = "k ünï 🦀"
VALUE_FMT = r"h\303\251llo \001\377\000 bytes\n"
VALUE = b"h\xc3\xa9llo \x01\xff\x00 bytes\n"


def start(lang, url, tag, script, *args, flags=()):
    head = [GO_BIN] if lang == "go" else [PYTHON, "-m", "memolock"]
    argv = head + ["run", "--redis", url, "--tag", tag, "--id", ID, "--ttl", "1m", *flags, "--", "sh", "-c",
                   script, "sh", *args]
    return subprocess.Popen(argv, cwd=PKG_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def runs(path):
    return open(path).read().count("\n") if os.path.exists(path) else 0


def until(cond):
    deadline = time.monotonic() + WAIT
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.mark.parametrize("holder,waiter", [("go", "python"), ("python", "go")])
def test_one_computes_other_waits(server, rdb, tag, tmp_path, holder, waiter):
    r, g = str(tmp_path / "runs"), str(tmp_path / "go")
    gated = 'echo run >> "$1"; while [ ! -e "$2" ]; do sleep 0.01; done; printf "$3"'
    procs = [start(holder, server.url, tag, gated, r, g, VALUE_FMT)]
    try:
        until(lambda: runs(r) == 1)
        procs.append(start(waiter, server.url, tag, gated, r, g, "must not run"))
        until(lambda: dict(rdb.pubsub_numsub(f"{tag}/notif:{ID}")).get(f"{tag}/notif:{ID}".encode(), 0) >= 1)
        open(g, "w").close()
        for p in procs:
            out, err = p.communicate(timeout=WAIT)
            assert p.returncode == 0 and out == VALUE, err
        assert runs(r) == 1
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.communicate()


@pytest.mark.parametrize("holder,waiter", [("go", "python"), ("python", "go")])
def test_failing_holder(server, rdb, tag, tmp_path, holder, waiter):
    r, g = str(tmp_path / "runs"), str(tmp_path / "go")
    script = 'echo run >> "$1"; while [ ! -e "$2" ]; do sleep 0.01; done; echo "backend down" >&2; exit 3'
    procs = [start(holder, server.url, tag, script, r, g, flags=["--lock-ttl", "30s"])]
    try:
        until(lambda: runs(r) == 1)
        procs.append(start(waiter, server.url, tag, 'echo run >> "$1"', r, flags=["--lock-ttl", "30s"]))
        until(lambda: dict(rdb.pubsub_numsub(f"{tag}/notif:{ID}")).get(f"{tag}/notif:{ID}".encode(), 0) >= 1)
        open(g, "w").close()
        procs[0].communicate(timeout=WAIT)
        t0 = time.monotonic()
        out, err = procs[1].communicate(timeout=WAIT)
        assert procs[0].returncode == 3
        assert procs[1].returncode == 1 and out == b"", err
        assert time.monotonic() - t0 < 10
        assert runs(r) == 1
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.communicate()


def test_raw_id_bytes_are_one_key_for_go_and_python(server, rdb, tag, tmp_path):
    # Go's --id is argv's bytes; Python's --id is the same bytes
    # (os.fsencode), and --id-hex names them too.
    raw = b"\xff\xfe\xc3(-\x80"
    counter = tmp_path / "runs"
    script = f'echo run >> {counter}; printf "from %s" "$1"'

    def run(head, id_flags, who):
        p = subprocess.run(head + ["run", "--redis", server.url, "--tag", tag, *id_flags, "--ttl", "1m", "--",
                                   "sh", "-c", script, "sh", who], cwd=PKG_ROOT, capture_output=True, timeout=WAIT)
        return p.returncode, p.stdout, p.stderr

    assert run([GO_BIN], [b"--id", raw], "go")[:2] == (0, b"from go")
    assert rdb.get(tag.encode() + b":" + raw) == b"from go"
    py = [PYTHON, "-m", "memolock"]
    assert run(py, [b"--id", raw], "python")[:2] == (0, b"from go")
    assert run(py, ["--id-hex", raw.hex()], "python")[:2] == (0, b"from go")
    assert counter.read_text().count("run") == 1
