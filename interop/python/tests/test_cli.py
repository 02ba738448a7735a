"""`python3 -m memolock run` as separate processes."""

import os
import signal
import subprocess
import time

import pytest

from conftest import PKG_ROOT, PYTHON, key_misses

WAIT = 30


class Procs:
    """Every process a test starts, killed at the end whatever happens."""

    def __init__(self):
        self.procs = []

    def run(self, url, tag, id, *cmd, ttl="10s", extra=(), env=None):
        args = [PYTHON, "-m", "memolock", "run", "--redis", url, "--tag", tag, "--id", id, "--ttl", ttl,
                *extra, "--", *cmd]
        p = subprocess.Popen(args, cwd=PKG_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=env or dict(os.environ))
        self.procs.append(p)
        return p

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


@pytest.fixture
def procs():
    ps = Procs()
    yield ps
    ps.kill_all()


def wait_file(path, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while not (os.path.exists(path) and os.path.getsize(path) > 0):
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} never appeared")
        time.sleep(0.02)


def kill_pidfile(path):
    try:
        os.kill(int(open(path).read().split()[0]), signal.SIGKILL)
    except (OSError, ValueError, IndexError):
        pass


def test_stampede_runs_once(server, procs, tag, tmp_path):
    count = tmp_path / "count"
    cmd = ["sh", "-c", f"echo run >> {count}; sleep 1; printf 'value-%s\\000\\377' $$"]
    ps = [procs.run(server.url, tag, "s", *cmd) for _ in range(4)]
    outs = [p.communicate(timeout=WAIT) for p in ps]
    assert [p.returncode for p in ps] == [0] * 4, [o[1] for o in outs]
    assert len({o[0] for o in outs}) == 1 and outs[0][0].startswith(b"value-")
    assert count.read_text() == "run\n"
    waited = [o[1] for o in outs if b"waiting for" in o[1]]
    assert waited, outs  # the others said they wait, and on whom
    # A later invocation hits the cache.
    p = procs.run(server.url, tag, "s", "sh", "-c", f"echo run >> {count}; echo other")
    assert p.communicate(timeout=WAIT)[0] == outs[0][0]
    assert count.read_text() == "run\n"


def test_takeover_after_sigkill(server, procs, tag, tmp_path):
    pidfile = tmp_path / "pid"
    a = procs.run(server.url, tag, "k", "sh", "-c", f"echo $$ > {pidfile}; exec sleep 60",
                  extra=["--lock-ttl", "1s"])
    try:
        wait_file(pidfile)
        b = procs.run(server.url, tag, "k", "echo", "from b", extra=["--lock-ttl", "1s"])
        time.sleep(0.3)
        a.kill()
        out, err = b.communicate(timeout=WAIT)
        assert b.returncode == 0, err
        assert out == b"from b\n"
    finally:
        kill_pidfile(pidfile)


def test_failing_holder(server, procs, tag, tmp_path, rdb):
    started, go = tmp_path / "started", tmp_path / "go"
    # The holder fails only once the waiter listens for holder events, so a
    # slow interpreter start cannot make the waiter find the lock already free
    # and run the command itself.
    before = key_misses(rdb)
    a = procs.run(server.url, tag, "f", "sh", "-c",
                  f"echo x > {started}; while [ ! -e {go} ]; do sleep 0.05; done; echo partial; exit 3",
                  extra=["--lock-ttl", "60s"])
    wait_file(started)
    lookup = key_misses(rdb) - before
    assert lookup > 0, "the holder's lookup missed no key"
    b = procs.run(server.url, tag, "f", "echo", "never", extra=["--lock-ttl", "60s"])
    # And once the waiter has looked up again after its subscription went
    # live: a failure released before that lookup leaves the lock free
    # (PROTOCOL.md, step 2). Its two lookups miss what the holder's did.
    deadline = time.monotonic() + WAIT
    while key_misses(rdb) < before + 3 * lookup:
        assert time.monotonic() < deadline, "the waiter never looked up twice"
        time.sleep(0.02)
    go.write_text("x")
    t0 = time.monotonic()
    out_b, err_b = b.communicate(timeout=WAIT)
    assert time.monotonic() - t0 < 20  # not the 60 s lock TTL
    out_a, _ = a.communicate(timeout=WAIT)
    assert a.returncode == 3 and out_a == b"partial\n"
    assert b.returncode == 1 and out_b == b"" and b"command exited with status 3" in err_b, err_b


def test_wait_limit_and_signal_handover(server, procs, tag, tmp_path, rdb):
    started, pidfile = tmp_path / "started", tmp_path / "pid"
    a = procs.run(server.url, tag, "w", "sh", "-c", f"echo $$ > {pidfile}; echo x > {started}; sleep 60",
                  extra=["--lock-ttl", "60s"])
    try:
        wait_file(started)
        b = procs.run(server.url, tag, "w", "echo", "b", extra=["--wait", "500ms"])
        b.communicate(timeout=WAIT)
        assert b.returncode == 124
        c = procs.run(server.url, tag, "w", "echo", "from c", extra=["--lock-ttl", "60s"])
        time.sleep(0.5)
        a.send_signal(signal.SIGTERM)
        _, err_a = a.communicate(timeout=WAIT)
        assert a.returncode == 128 + signal.SIGTERM, err_a
        # The command was stopped before the lock went.
        pid = int(pidfile.read_text().split()[0])
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
        out_c, err_c = c.communicate(timeout=WAIT)
        assert c.returncode == 0 and out_c == b"from c\n", err_c
    finally:
        kill_pidfile(pidfile)


def test_exit_codes(server, procs, tag, tmp_path):
    p = procs.run(server.url, tag, "nf", "no-such-command-memolock")
    p.communicate(timeout=WAIT)
    assert p.returncode == 127
    noexec = tmp_path / "noexec"
    noexec.write_text("echo hi\n")
    p = procs.run(server.url, tag, "ne", str(noexec))
    p.communicate(timeout=WAIT)
    assert p.returncode == 126
    p = procs.run(server.url, tag, "sig", "sh", "-c", "kill -9 $$")
    p.communicate(timeout=WAIT)
    assert p.returncode == 128 + 9
    p = procs.run(server.url, tag, "st", "sh", "-c", "exit 7")
    p.communicate(timeout=WAIT)
    assert p.returncode == 7


def test_usage_errors(procs, tag):
    for extra in ([], ["--ttl", "-1s"], ["--ttl", "ten"], ["--bogus", "1"], ["--wait", "-1s"]):
        args = [PYTHON, "-m", "memolock", "run", "--tag", tag, "--id", "x", *extra, "--", "true"]
        p = subprocess.run(args, cwd=PKG_ROOT, capture_output=True, timeout=WAIT)
        assert p.returncode == 2, (extra, p.stderr)
    p = subprocess.run([PYTHON, "-m", "memolock", "run", "--tag", tag, "--id", "x", "--ttl", "1s"],
                       cwd=PKG_ROOT, capture_output=True, timeout=WAIT)
    assert p.returncode == 2 and b"no command" in p.stderr


def test_unreachable_redis_redacted(procs, tag):
    from conftest import free_port
    url = f"redis://user:s3cret@127.0.0.1:{free_port()}/0"
    p = procs.run(url, tag, "x", "true")
    _, err = p.communicate(timeout=WAIT)
    assert p.returncode == 1
    assert b"s3cret" not in err and b"xxxxx" in err, err


def test_waiter_interrupted(server, procs, tag, tmp_path):
    started, pidfile = tmp_path / "started", tmp_path / "pid"
    a = procs.run(server.url, tag, "wi", "sh", "-c", f"echo $$ > {pidfile}; echo x > {started}; sleep 60",
                  extra=["--lock-ttl", "60s"])
    try:
        wait_file(started)
        b = procs.run(server.url, tag, "wi", "echo", "b")
        deadline = time.monotonic() + WAIT
        err = b""
        while b"waiting for" not in err and time.monotonic() < deadline:
            err += os.read(b.stderr.fileno(), 4096)
        b.send_signal(signal.SIGINT)
        b.communicate(timeout=WAIT)
        assert b.returncode == 130
        assert a.poll() is None  # the holder goes on
        a.send_signal(signal.SIGTERM)
        a.communicate(timeout=WAIT)
        assert a.returncode == 143
    finally:
        kill_pidfile(pidfile)


def test_unix_socket_url_and_env(server, procs, tag):
    env = dict(os.environ, MEMOLOCK_REDIS=f"unix://{server.sock}")
    args = [PYTHON, "-m", "memolock", "run", "--tag", tag, "--id", "u", "--ttl", "0", "--", "sh", "-c",
            "sleep 0.5; echo via unix"]
    ps = [subprocess.Popen(args, cwd=PKG_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
          for _ in range(2)]
    procs.procs.extend(ps)
    for p in ps:
        out, err = p.communicate(timeout=WAIT)
        assert p.returncode == 0 and out == b"via unix\n", err


# --- ids as bytes: --id is argv's own bytes (as Go's), --id-hex, --id-base64 --

RAW_ID = b"\xff\xfe\xc3(-\x80"  # not UTF-8


def run_id(server, tag, id_args, value, counter):
    """`run` with the given id flags (bytes or str argv items); returns
    (exit code, stdout, stderr)."""
    args = [PYTHON, "-m", "memolock", "run", "--redis", server.url, "--tag", tag, *id_args, "--ttl", "1m",
            "--", "sh", "-c", f'echo run >> {counter}; printf "%s" "$1"', "sh", value]
    p = subprocess.run(args, cwd=PKG_ROOT, capture_output=True, timeout=WAIT)
    return p.returncode, p.stdout, p.stderr


def test_raw_id_bytes_name_one_key_whatever_the_flag(server, rdb, tag, tmp_path):
    counter = tmp_path / "runs"
    code, out, err = run_id(server, tag, [b"--id", RAW_ID], "first", counter)
    assert code == 0 and out == b"first", err
    # The key is the argument's bytes, as Go names it (not a UTF-8
    # encoding of Python's surrogates).
    assert rdb.get(tag.encode() + b":" + RAW_ID) == b"first"
    for flags in (["--id-hex", RAW_ID.hex()], ["--id-hex", RAW_ID.hex().upper()],
                  ["--id-base64", "//7DKC2A"], ["--id-base64=//7DKC2A"],
                  [b"--id", RAW_ID]):
        code, out, err = run_id(server, tag, flags, "again", counter)
        assert (code, out) == (0, b"first"), (flags, err)
    assert counter.read_text().count("run") == 1


def test_base64_padding_is_optional(server, rdb, tag, tmp_path):
    counter = tmp_path / "runs"
    assert run_id(server, tag, ["--id-base64", "aWQ"], "v", counter)[:2] == (0, b"v")
    assert run_id(server, tag, ["--id-base64", "aWQ="], "other", counter)[:2] == (0, b"v")
    assert run_id(server, tag, ["--id", "id"], "other", counter)[:2] == (0, b"v")
    assert rdb.get(f"{tag}:id") == b"v"
    assert counter.read_text().count("run") == 1


@pytest.mark.parametrize("flags,names", [
    # The Go and C# CLIs' words (cmd/memolock/ids.go, interop/csharp/cli/IdCodec.cs).
    (["--id-hex", "zz"], [b"""run: --id-hex "zz": 'z' at 0 is not a hex digit\n"""]),
    (["--id-hex", "abc"], [b"""run: --id-hex "abc": odd length: 3 hex digits (two per byte)\n"""]),
    (["--id-hex", "ab cd"], [b"""run: --id-hex "ab cd": ' ' at 2 is not a hex digit\n"""]),
    (["--id-base64", "a-_b"], [b"""run: --id-base64 "a-_b": '-' at 1 is not in the standard base64 alphabet"""]),
    (["--id-base64", "Q"], [b"""run: --id-base64 "Q": a length of 1 base64 characters cannot be decoded\n"""]),
    (["--id-base64", "QQ==QQ=="], [b"""run: --id-base64 "QQ==QQ==": '=' at 2 is not in the standard base64"""]),
    (["--id-base64", "aGk=="], [b"""--id-base64 "aGk==": wrong padding: 2 '=' after 3 characters (want 1)"""]),
    (["--id-base64", "h\u00e9"], [b"--id-base64", b"at 1 is not in the standard base64 alphabet"]),
    (["--id", "x", "--id-hex", "41"], [b"give one of --id, --id-hex and --id-base64, not --id and --id-hex"]),
    (["--id-hex", "41", "--id-base64", "QQ"], [b"not --id-hex and --id-base64"]),
    # Given, if empty: two id flags, as Go's and C#'s CLIs count them.
    (["--id", "", "--id-hex", "00"], [b"not --id and --id-hex"]),
    ([], [b"run: --tag and --id (or --id-hex, --id-base64) are required\n"]),
    (["--id", ""], [b"run: --tag and --id (or --id-hex, --id-base64) are required\n"]),
])
def test_bad_ids_are_usage_errors_naming_the_flag(server, tag, tmp_path, flags, names):
    code, out, err = run_id(server, tag, flags, "v", tmp_path / "runs")
    assert code == 2 and out == b"", err
    for n in names:
        assert n in err, err
    assert b"Traceback" not in err and err.endswith(b"Run 'python3 -m memolock run --help' for usage.\n"), err
    assert not (tmp_path / "runs").exists()
