#!/usr/bin/env bash
# Builds, then runs every test against redis-servers the tests start on free
# ports. Exits non-zero on any failure. Usage: test.sh [name-filter...]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$here/build.sh"
exec mono --debug "$here/bin/tests.exe" "$@"
