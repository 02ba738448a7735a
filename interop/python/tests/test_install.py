"""`pip install ./interop/python` with Debian's pip and setuptools and no
package index: a fresh venv that sees the system's packages, the package
installed there, and its `memolock-py` console script against a
redis-server of the tests' own. Needs python3-venv and python3-wheel;
skipped without them, except under CI=true, where it fails."""

import os
import shutil
import subprocess

import pytest

from conftest import PKG_ROOT, PYTHON

WAIT = 120  # a venv and a build on a loaded 2-core machine


def venv_or_skip(path):
    """A venv that sees the system's packages, with what the build needs
    (python3-venv; python3-wheel for setuptools' bdist_wheel)."""
    p = subprocess.run([PYTHON, "-c", "import wheel, setuptools"], capture_output=True, timeout=WAIT)
    why = None
    if p.returncode != 0:
        why = f"{PYTHON} has no wheel or setuptools (apt-get install python3-wheel python3-setuptools)"
    else:
        p = subprocess.run([PYTHON, "-m", "venv", "--system-site-packages", str(path)], capture_output=True,
                           timeout=WAIT)
        if p.returncode != 0:
            why = f"{PYTHON} -m venv failed (apt-get install python3-venv): {p.stderr.decode(errors='replace')}"
    if why is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


def test_pip_install_gives_import_and_console_script(server, rdb, tag, tmp_path):
    # Build from a copy: pip builds in the source folder (build/, *.egg-info).
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(PKG_ROOT, name), src)
    shutil.copytree(os.path.join(PKG_ROOT, "memolock"), src / "memolock",
                    ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    venv_or_skip(venv)
    # The interop suite runs with PYTHONPATH naming the source folder: drop
    # it, so that only the installed copy can be imported; and no pip
    # settings of this machine's (find-links, an index): only the flags.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME") and not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INPUT="1", PYTHONDONTWRITEBYTECODE="1")
    pip = [str(venv / "bin" / "pip"), "install", "--no-index", "--no-build-isolation", "--no-cache-dir",
           "--disable-pip-version-check", str(src)]
    p = subprocess.run(pip, cwd=tmp_path, env=env, capture_output=True, timeout=WAIT)
    assert p.returncode == 0, p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")

    p = subprocess.run([str(venv / "bin" / "python"), "-c", "import memolock; print(memolock.__file__)"],
                       cwd=tmp_path, env=env, capture_output=True, timeout=WAIT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode().strip().startswith(str(venv)), p.stdout  # the installed copy

    script = str(venv / "bin" / "memolock-py")
    runs = tmp_path / "runs"

    def run(*id_flags):
        return subprocess.run([script, "run", "--redis", server.url, "--tag", tag, *id_flags, "--ttl", "1m", "--",
                               "sh", "-c", f'echo run >> {runs}; printf "installed\\000value"'],
                              cwd=tmp_path, env=env, capture_output=True, timeout=WAIT)

    p = run("--id", "k")
    assert (p.returncode, p.stdout) == (0, b"installed\x00value"), p.stderr
    p = run("--id-hex", "6b")  # the same id: a hit
    assert (p.returncode, p.stdout) == (0, b"installed\x00value"), p.stderr
    assert runs.read_text().count("run") == 1
    assert rdb.get(f"{tag}:k") == b"installed\x00value"
    p = subprocess.run([script], cwd=tmp_path, env=env, capture_output=True, timeout=WAIT)
    assert p.returncode == 2 and b"Commands:" in p.stderr  # exit codes as python3 -m memolock's
    # Its pages and messages carry its own name.
    p = subprocess.run([script, "run", "--help"], cwd=tmp_path, env=env, capture_output=True, timeout=WAIT)
    assert p.returncode == 0 and p.stdout.startswith(b"memolock-py run: ") and b"\n  memolock-py run --tag" in p.stdout
    p = subprocess.run([script, "run", "--ttl", "5"], cwd=tmp_path, env=env, capture_output=True, timeout=WAIT)
    assert p.returncode == 2 and p.stderr == (b'memolock-py run: --ttl "5": a duration needs a unit: 5s, 5ms, 5m or '
                                              b"5h\nRun 'memolock-py run --help' for usage.\n"), p.stderr
