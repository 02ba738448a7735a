package main

import (
	"encoding/base64"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Ids are any bytes, and a shell cannot pass every byte string (a NUL, say),
// nor can every launcher pass argv through unchanged: --id-hex and
// --id-base64 give an id as text. --id takes the argument's bytes as they
// are. The errors are worded as the C# CLI's (interop/csharp/cli/IdCodec.cs),
// so that the three CLIs say the same.

// idArg is one id flag as given: its name ("id", "id-hex" or "id-base64")
// and value.
type idArg struct{ flag, value string }

// idFlags collects the id flags of a command, in the order given.
type idFlags struct{ args []idArg }

type idFlag struct {
	into *idFlags
	name string
}

func (f idFlag) String() string { return "" }

func (f idFlag) Set(s string) error {
	f.into.args = append(f.into.args, idArg{f.name, s})
	return nil
}

// define adds --id, --id-hex and --id-base64 to fs, whose usage ends with
// more.
func (ids *idFlags) define(fs *flag.FlagSet, more string) {
	fs.Var(idFlag{ids, "id"}, "id", "the key's `ID`: the argument's bytes as they are"+more)
	fs.Var(idFlag{ids, "id-hex"}, "id-hex", "the id as `HEX` digits, two per byte, either case"+more)
	fs.Var(idFlag{ids, "id-base64"}, "id-base64", "the id in standard `BASE64` (A-Z a-z 0-9 + /), padding optional"+more)
}

// one returns the single id of a command that takes exactly one, or what
// is wrong. An id flag given twice counts as given once, the last value
// winning, as for any other flag.
func (ids *idFlags) one() (id string, given bool, err error) {
	last := map[string]string{}
	var names []string
	for _, a := range ids.args {
		if _, ok := last[a.flag]; !ok {
			names = append(names, "--"+a.flag)
		}
		last[a.flag] = a.value
	}
	switch len(names) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", true, fmt.Errorf("give one of --id, --id-hex and --id-base64, not %s", strings.Join(names, " and "))
	}
	for flagName, v := range last {
		id, err := decodeID(flagName, v)
		return id, true, err
	}
	return "", false, nil
}

// all returns every id given, decoded, in order.
func (ids *idFlags) all() ([]string, error) {
	var out []string
	for _, a := range ids.args {
		id, err := decodeID(a.flag, a.value)
		if err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, nil
}

// decodeID returns the id that flag name gives as v.
func decodeID(name, v string) (string, error) {
	var (
		b   []byte
		why string
	)
	switch name {
	case "id":
		return v, nil
	case "id-hex":
		b, why = fromHex(v)
	case "id-base64":
		b, why = fromBase64(v)
	}
	if why != "" {
		return "", fmt.Errorf("--%s %s: %s", name, quoteArg(v), why)
	}
	return string(b), nil
}

// fromHex decodes hex digits of either case, two per byte; or says what
// is wrong.
func fromHex(s string) ([]byte, string) {
	i := 0
	for _, r := range s {
		if nibble(r) < 0 {
			return nil, fmt.Sprintf("%s at %d is not a hex digit", quoteRune(r), i)
		}
		i++
	}
	if len(s)%2 != 0 {
		return nil, fmt.Sprintf("odd length: %d hex digits (two per byte)", len(s))
	}
	b := make([]byte, len(s)/2)
	for i := range b {
		b[i] = byte(nibble(rune(s[2*i]))<<4 | nibble(rune(s[2*i+1])))
	}
	return b, ""
}

func nibble(r rune) int {
	switch {
	case r >= '0' && r <= '9':
		return int(r - '0')
	case r >= 'a' && r <= 'f':
		return int(r-'a') + 10
	case r >= 'A' && r <= 'F':
		return int(r-'A') + 10
	}
	return -1
}

// fromBase64 decodes the standard alphabet, with or without its padding;
// or says what is wrong.
func fromBase64(s string) ([]byte, string) {
	end := len(strings.TrimRight(s, "="))
	pad := len(s) - end
	i := 0
	for _, r := range s[:end] {
		if !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '+' || r == '/') {
			return nil, fmt.Sprintf("%s at %d is not in the standard base64 alphabet (A-Z a-z 0-9 + /, then = padding)", quoteRune(r), i)
		}
		i++
	}
	if end%4 == 1 {
		return nil, fmt.Sprintf("a length of %d base64 characters cannot be decoded", end)
	}
	want := (4 - end%4) % 4
	if pad != 0 && pad != want {
		return nil, fmt.Sprintf("wrong padding: %d '=' after %d characters (want %d)", pad, end, want)
	}
	// Not strict: unused bits that are not zero ("aGl=") are ignored, as
	// the C# decoder ignores them.
	b, err := base64.RawStdEncoding.DecodeString(s[:end])
	if err != nil {
		return nil, err.Error()
	}
	return b, ""
}

// quoteArg returns an argument in double quotes for an error message:
// as it is if it prints plainly, else with Go's escapes.
func quoteArg(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || r == '"' || r == '\\' || !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return `"` + s + `"`
}

// quoteRune returns r in single quotes for an error message.
func quoteRune(r rune) string {
	if r != utf8.RuneError && unicode.IsPrint(r) && r != '\'' && r != '\\' {
		return "'" + string(r) + "'"
	}
	return strconv.QuoteRune(r)
}
