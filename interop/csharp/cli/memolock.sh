#!/bin/sh
# memolock: runs memolock.exe with its arguments as raw bytes, as Go's CLI
# takes them. Mono decodes argv at start-up through MONO_EXTERNAL_ENCODINGS
# and exits 255 before Main on an argument that is not UTF-8 (an id such as
# $'\xff\xfe'); latin1 decodes every byte to one char, and memolock.exe,
# told so by MEMOLOCK_ARGV_ENCODING, turns them back into the exact bytes.
# The command it runs gets the caller's own MONO_EXTERNAL_ENCODINGS back.
if [ "${MONO_EXTERNAL_ENCODINGS+set}" = set ]; then
	MEMOLOCK_CALLER_MONO_EXTERNAL_ENCODINGS=$MONO_EXTERNAL_ENCODINGS
	export MEMOLOCK_CALLER_MONO_EXTERNAL_ENCODINGS
fi
MONO_EXTERNAL_ENCODINGS=latin1
MEMOLOCK_ARGV_ENCODING=latin1
export MONO_EXTERNAL_ENCODINGS MEMOLOCK_ARGV_ENCODING
exec mono "$(dirname "$0")/memolock.exe" "$@"
