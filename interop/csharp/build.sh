#!/usr/bin/env bash
# Builds the library, the CLI and the test runner into bin/ with Mono's mcs.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
mkdir -p bin
flags=(-langversion:latest -nologo -warn:4 -nowarn:1591 -debug- -optimize+)
mcs "${flags[@]}" -target:library -r:System.Numerics.dll -out:bin/MemoLockNet.dll src/*.cs
mcs "${flags[@]}" -target:exe -out:bin/memolock.exe -r:bin/MemoLockNet.dll cli/*.cs
install -m 755 cli/memolock.sh bin/memolock # the launcher: argv as raw bytes (cli/Argv.cs)
mcs "${flags[@]}" -target:exe -out:bin/tests.exe -r:bin/MemoLockNet.dll tests/*.cs cli/Signals.cs
