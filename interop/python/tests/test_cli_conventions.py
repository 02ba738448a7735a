"""The Go CLI's conventions in the Python CLI (issue 16): help pages, the
version, usage errors, error prefixes and Redis hints, the status line on a
terminal and off it, and the fail texts waiters read ([A6]). Go's own tests
of them: cmd/memolock/cli_test.go, status_linux_test.go."""

import os
import re
import shutil
import socket
import subprocess
import time

import pytest
import redis

from conftest import PKG_ROOT, PYTHON
from memolock import protocol as P

WAIT = 30
PROG = "python3 -m memolock"
ENV = dict(os.environ, MEMOLOCK_REDIS="redis://u:s3cret-pw@127.0.0.1:1")
#: A flag written -name, as Python's argparse or Go's flag package write them.
SINGLE_DASH = re.compile(r"(^|[\s\"'(\[])-[a-z][a-z-]+")


def cli(*args, env=None, timeout=WAIT):
    p = subprocess.run([PYTHON, "-m", "memolock", *args], cwd=PKG_ROOT, capture_output=True, timeout=timeout,
                       env=env or dict(os.environ))
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


PAGES = {
    "run": ["-- CMD [ARGS...]", "Only standard output is cached", "not the command", "--ttl DURATION",
            "--lock-ttl DURATION", "(default 10s)", "--id-hex HEX", "--id-base64 BASE64", "--quiet",
            "MEMOLOCK_REDIS", "124", "127", "128+N", "the run command alone",
            f"{PROG} run --tag reports --id 2026-11 --ttl 1h -- ./build-report 2026-11"],
    "version": ["--version"],
    "help": ["help [COMMAND]"],
}


@pytest.mark.parametrize("name", sorted(PAGES))
def test_every_command_has_a_page(name):
    for args in ([name, "--help"], [name, "-h"], ["help", name]):
        code, page, err = cli(*args, env=ENV)
        assert (code, err) == (0, ""), (args, code, err)
        parts = [f"{PROG} {name}: ", f"\nUsage:\n  {PROG} {name}"]
        if name != "help":
            parts += ["\nFlags:\n", "  -h, --help "]
        if name == "run":
            parts.append("\nEnvironment:\n  MEMOLOCK_REDIS")
        parts.append("\nExit status:\n")
        if name == "run":
            parts.append("\nExamples:\n  # ")
        last = -1
        for p in parts:
            i = page.find(p)
            assert i > last, (args, p, page)
            last = i
        for w in PAGES[name]:
            assert w in page, (args, w, page)
        assert not SINGLE_DASH.search(page), (args, SINGLE_DASH.search(page), page)
        assert "s3cret" not in page
        for line in page.splitlines():
            assert len(line) <= 100, (args, line)
    if name == "run":
        # The flags' column, and the exit statuses'.
        assert "\n  --lock-ttl DURATION     how long others wait" in page
        assert "\n  124      --wait ran out" in page


def test_main_help():
    for args in (["--help"], ["-h"], ["help"]):
        code, out, err = cli(*args)
        assert (code, err) == (0, ""), args
        for name in PAGES:
            assert f"\n  {name} " in out, (args, name, out)
        for w in ("MEMOLOCK_REDIS", "redis://:PASSWORD@host", "Exit status:", "Examples:", f"{PROG} help COMMAND",
                  "the run command alone"):
            assert w in " ".join(out.split()), (args, w, out)
    code, out, err = cli()
    assert (code, out) == (2, "") and "Commands:" in err
    for args in (["frobnicate"], ["help", "frobnicate"]):
        code, out, err = cli(*args)
        assert code == 2 and 'unknown command "frobnicate"' in err and f"{PROG} --help" in err, (args, err)


def test_version():
    for args in (["--version"], ["version"]):
        code, out, err = cli(*args)
        assert code == 0 and out.startswith(f"{PROG} 0.1.0 ") and "Python 3." in out and "redis-py" in out, out
    code, out, err = cli("version", "x")
    assert code == 2 and err == f'{PROG} version: unexpected argument "x"\nRun \'{PROG} version --help\' for usage.\n'


RUN = ["run", "--redis", "redis://127.0.0.1:1", "--tag", "t", "--id", "i"]


@pytest.mark.parametrize("args,want", [
    (RUN + ["--ttl", "5", "--", "true"], '--ttl "5": a duration needs a unit: 5s, 5ms, 5m or 5h'),
    (RUN + ["--ttl", "1m", "--wait", "soon", "--", "true"],
     '--wait "soon": not a duration: write it as 500ms, 30s, 10m or 1h30m'),
    (RUN + ["--ttl", "1m", "--bogus", "--", "true"], "unknown flag --bogus"),
    (RUN + ["--ttl"], "--ttl needs a value"),
    (RUN + ["--ttl", "1m", "--quiet=maybe", "--", "true"], '--quiet "maybe": a switch takes no value (or =true, =false)'),
    (RUN + ["--ttl", "-1s", "--", "true"], "--ttl -1s is negative; give how long the output stays cached, or 0 for ever"),
    (RUN + ["--ttl", "1s", "--wait", "-2m", "--", "true"], "--wait -2m0s is negative; give a limit, or 0 for none"),
    (RUN + ["--ttl", "1s", "--lock-ttl", "500us", "--", "true"], "--lock-ttl 500\u00b5s is under 1ms"),
    (RUN + ["--ttl", "1s"], "no command given; put it after --"),
    (RUN[:5] + ["--ttl", "1s", "--", "true"], "--tag and --id (or --id-hex, --id-base64) are required"),
    (RUN[:-2] + ["--id", "x", "--id-hex", "78", "--ttl", "1s", "--", "true"],
     "give one of --id, --id-hex and --id-base64, not --id and --id-hex"),
    (RUN + ["--ttl", "1s", "---x", "--", "true"], "bad flag syntax: ---x"),
    (RUN + ["--ttl", "1s", "--quiet", "redis://:s3cret-pw@h:1", "--", "true"],
     'unexpected argument "redis://xxxxx@h:1" before the command'),
    (["run", "--tag", "t", "--ttl", "1s", "--redis=redis://:s3cret-pw@h:1", "--unknown=redis://:s3cret-pw@h", "--",
      "true"], "unknown flag --unknown"),
    (["run", "--tag", "a/lock", "--id", "i", "--ttl", "1s", "--redis", "redis://127.0.0.1:1", "--", "true"],
     "tag b'a/lock' contains b'/lock'"),
])
def test_usage_errors(args, want):
    code, out, err = cli(*args)
    assert code == 2 and out == "" and err.startswith(f"{PROG} run: {want}"), (args, code, err)
    assert err.endswith(f"Run '{PROG} run --help' for usage.\n") and "Flags:" not in err, err
    assert err.count(f"{PROG} run: ") == 1 and "memolock: " not in err.replace(f"{PROG} run: ", "")
    assert not SINGLE_DASH.search(err), err
    assert "s3cret" not in err


@pytest.mark.parametrize("url,want", [
    ("redis://127.0.0.1:1/0?password=s3cret-pw",
     'unknown parameter "password"; a password goes in the URL itself: redis://:PASSWORD@host:port'),
    ("redis://127.0.0.1:1/s3cret-pw", "the database (its path) is not a number"),
    ("redis://:s3cret%zz@127.0.0.1:1", "bad %-escape"),
    ("rediss://127.0.0.1:1?bogus=s3cret-pw&socket_timeout=2", 'unknown parameter "bogus"'),
    ("127.0.0.1:6379", "(URL withheld) is not of the form redis://[[user]:password@]host:port[/db]"),
    ("s3cret-pw@127.0.0.1:6379", "(URL withheld) is not of the form"),
    ("http://127.0.0.1:1", "its scheme is not redis://, rediss:// (TLS) or unix://"),
])
def test_redis_url_errors_say_which_part(url, want):
    code, out, err = cli("run", "--redis", url, "--tag", "t", "--id", "i", "--ttl", "1s", "--", "true")
    assert code == 2 and f"{PROG} run: --redis " in err and want in err and "s3cret" not in err, (url, err)


def test_auth_errors_say_how_to_write_the_password(own_server):
    own_server.client().config_set("requirepass", "s3cretPW")
    addr = f"127.0.0.1:{own_server.port}"
    cases = [
        (f"redis://s3cretPW@{addr}", "write redis://:PASSWORD@host"),
        (f"redis://{addr}", "the server wants a password: redis://:PASSWORD@host"),
        (f"redis://:wrong@{addr}", "the user name or the password is wrong"),
    ]
    for url, want in cases:
        code, out, err = cli("run", "--redis", url, "--tag", "t", "--id", "i", "--ttl", "1s", "--", "echo", "never")
        assert code == 1 and want in err and "s3cretPW" not in err, (url, err)
        assert err.startswith(f"{PROG} run: ") and "(redis redis://" in err and "memolock: " not in err, err
        assert len(err.splitlines()) == 1, err
    code, out, err = cli("run", "--redis", f"redis://:s3cretPW@{addr}", "--tag", "t", "--id", "i", "--ttl", "1s",
                         "--", "echo", "ok")
    assert (code, out) == (0, "ok\n"), err


def test_wait_limit_says_what_it_waited_for(server, rdb, tag):
    # A server that accepts connections and never answers.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    try:
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}"
        code, out, err = cli("run", "--redis", url, "--tag", tag, "--id", "i", "--ttl", "1m", "--wait", "1s", "--",
                             "echo", "x")
        assert code == 124 and f"{PROG} run: Redis ({url}) did not answer within --wait 1s" in err, err
        assert "gave up waiting" not in err
    finally:
        silent.close()
    rdb.set(f"{tag}/lock:i", "the-holder", px=60000)
    # Limits long enough for the lookup on a loaded machine, short against the lock and the command.
    code, out, err = cli("run", "--redis", server.url, "--tag", tag, "--id", "i", "--ttl", "1m", "--wait", "2s",
                         "--", "echo", "x")
    assert code == 124 and out == "", err
    assert f"gave up waiting for {tag}:i after " in err and "(--wait 2s): the-holder computes it" in err, err
    code, out, err = cli("run", "--redis", server.url, "--tag", tag, "--id", "here", "--ttl", "1m", "--wait", "2s",
                         "--", "sleep", "30")
    assert code == 124 and "--wait 2s ran out while the command ran here" in err, err


def gated(server, tag, id, tmp_path, extra=()):
    """An invocation holding tag:id until the gate file appears."""
    gate = tmp_path / f"gate-{id}"
    p = subprocess.Popen([PYTHON, "-m", "memolock", "run", "--redis", server.url, "--tag", tag, "--id", id,
                          "--ttl", "1m", "--lock-ttl", "30s", *extra, "--", "sh", "-c",
                          f"while [ ! -e '{gate}' ]; do sleep 0.05; done; echo v"],
                         cwd=PKG_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return gate, p


def until(cond, what, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_off_a_terminal_a_wait_is_a_line_not_a_stream(server, rdb, tag, tmp_path):
    gate, holder = gated(server, tag, "k", tmp_path)
    try:
        until(lambda: rdb.exists(f"{tag}/lock:k"), "the holder's lock")
        t0 = time.monotonic()
        waiter = subprocess.Popen([PYTHON, "-m", "memolock", "run", "--redis", server.url, "--tag", tag, "--id", "k",
                                   "--ttl", "1m", "--", "echo", "never"], cwd=PKG_ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        notif = f"{tag}/notif:k"
        until(lambda: dict(rdb.pubsub_numsub(notif)).get(notif.encode(), 0) >= 1, "the waiter to wait")
        # Long enough for a line a second to show (the peers printed one),
        # short against the 30 s the status lines may come at.
        time.sleep(max(0.0, 3.5 - (time.monotonic() - t0)))
        gate.write_text("")
        w_out, w_err = waiter.communicate(timeout=WAIT)
        took = time.monotonic() - t0
        h_out, h_err = holder.communicate(timeout=WAIT)
    finally:
        gate.write_text("")
        for p in (holder,):
            if p.poll() is None:
                p.kill()
    assert (waiter.returncode, w_out, holder.returncode, h_out) == (0, b"v\n", 0, b"v\n"), (w_err, h_err)
    lines = w_err.decode().strip().split("\n")
    allowed = 1 + int(took / 30)
    assert len(lines) <= allowed and lines[0].startswith(f"{PROG} run: waiting for {tag}:k, computed by "), lines
    assert b"\r" not in w_err and b"\x1b" not in w_err
    assert h_err == b"", h_err  # the holder says nothing off a terminal
    rdb.set(f"{tag}/lock:q", "someone", px=300)
    code, out, err = cli("run", "--redis", server.url, "--tag", tag, "--id", "q", "--ttl", "1m", "--quiet", "--",
                         "echo", "q")
    assert (code, out, err) == (0, "q\n", "")


def on_terminal(line):
    """Runs shell line on a pseudo-terminal (script(1)); returns the process."""
    if shutil.which("script") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("script(1) is not installed (util-linux)")
        pytest.skip("script(1) is not installed (util-linux)")
    return subprocess.Popen(["script", "-qec", line, "/dev/null"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, cwd=PKG_ROOT)


class Reader:
    """Collects a process's output on a thread, for conditions on it."""

    def __init__(self, p):
        import threading
        self.buf, self.p = b"", p
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        while True:
            b = os.read(self.p.stdout.fileno(), 4096)
            if not b:
                return
            self.buf += b

    def done(self):
        self.p.wait(WAIT)
        self.t.join(WAIT)
        return self.buf


def test_on_a_terminal_the_wait_is_one_line_in_place(server, rdb, tag, tmp_path):
    gate, holder = gated(server, tag, "k", tmp_path)
    try:
        until(lambda: rdb.exists(f"{tag}/lock:k"), "the holder's lock")
        r = Reader(on_terminal(f"{PYTHON} -m memolock run --redis {server.url} --tag {tag} --id k --ttl 1m -- "
                               "echo never; echo exit:$?"))
        until(lambda: r.buf.count(f"{PROG} run: waiting for {tag}:k".encode()) >= 3,
              "three drawings of the status line")
        gate.write_text("")
        o = r.done()
        holder.communicate(timeout=WAIT)
    finally:
        gate.write_text("")
        if holder.poll() is None:
            holder.kill()
    first, last = o.find(b"run: waiting for"), o.rfind(b"run: waiting for")
    assert b"\n" not in o[first:last] and b"\r" in o[first:last], o
    assert re.search(rb"\(\d+\.\ds\)\x1b\[K", o), o  # the elapsed time
    assert b"\r\x1b[Kv\r\n" in o and b"exit:0" in o, o  # erased before the output


def test_on_a_terminal_the_holder_shows_its_command(server, tag, tmp_path):
    gate = tmp_path / "go"
    r = Reader(on_terminal(f"{PYTHON} -m memolock run --redis {server.url} --tag {tag} --id k --ttl 1m -- sh -c "
                           f"'echo to-stderr >&2; while [ ! -e {gate} ]; do sleep 0.05; done; echo v'; echo exit:$?"))
    until(lambda: r.buf.find(b"to-stderr") >= 0 and f"{PROG} run: computing {tag}:k (".encode()
          in r.buf[r.buf.find(b"to-stderr"):], "the status line after the command's stderr")
    gate.write_text("")
    o = r.done()
    assert b"\r\x1b[Kto-stderr\r\n" in o and b"exit:0" in o, o
    # --quiet: the command has the terminal, and nothing is said.
    q = Reader(on_terminal(f"{PYTHON} -m memolock run --quiet --redis {server.url} --tag {tag} --id q --ttl 1m -- "
                           "sh -c 'test -t 2 && echo stderr-is-a-terminal'; echo exit:$?")).done()
    assert b"run:" not in q and b"stderr-is-a-terminal" in q and b"exit:0" in q, q


def fail_event(server, tag, id, *cmd):
    """Runs cmd under run, and returns the text of the fail event its
    invocation published, and the invocation's exit status."""
    r = server.client()
    ps = r.pubsub()
    ps.subscribe(f"{tag}/lock-event:{id}")
    try:
        until(lambda: ps.get_message(timeout=0.1) is not None, "the subscription")
        code, _, err = cli("run", "--redis", server.url, "--tag", tag, "--id", id, "--ttl", "1m", "--", *cmd)
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            m = ps.get_message(timeout=1)
            if m and m["type"] == "message":
                kind, _, text = P.parse_event(m["data"])
                if kind == P.EVENT_FAIL:
                    return text.decode(), code, err
        raise AssertionError("no fail event")
    finally:
        ps.close()
        r.close()


def test_fail_texts_are_gos(server, tag, tmp_path):
    # What a waiter elsewhere prints is what the holder published: the
    # same words whichever CLI ran the command (PROTOCOL.md, [A6]).
    noexec = tmp_path / "noexec"
    noexec.write_text("echo hi\n")
    cases = [
        (["sh", "-c", "kill -9 $$"], "command killed by signal 9 (killed)", 137),
        (["sh", "-c", "kill -TERM $$"], "command killed by signal 15 (terminated)", 143),
        (["sh", "-c", "exit 7"], "command exited with status 7", 7),
        (["no-such-command-memolock"], 'exec: "no-such-command-memolock": executable file not found in $PATH', 127),
        (["/nonexistent/x"], "fork/exec /nonexistent/x: no such file or directory", 127),
        ([str(noexec)], f"fork/exec {noexec}: permission denied", 126),
    ]
    for i, (cmd, want, status) in enumerate(cases):
        text, code, err = fail_event(server, tag, f"f{i}", *cmd)
        assert (text, code) == (want, status), (cmd, err)
