package memolock

import (
	"bytes"
	"crypto/sha1"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memolock/memolock/internal/engine"
	"github.com/memolock/memolock/internal/wire"
)

// interop/vectors.json is the machine-readable part of interop/PROTOCOL.md:
// every implementation loads it and checks every entry. TestVectors checks
// Go against it. After a deliberate protocol change, regenerate it with
//
//	go test -run TestVectors -update-vectors
//
// and update the Python and C# peers until their tests pass again.
var updateVectors = flag.Bool("update-vectors", false, "rewrite interop/vectors.json from the Go implementation")

const vectorsPath = "interop/vectors.json"

type vectors struct {
	Comment      string                  `json:"comment"`
	Scripts      map[string]scriptVector `json:"scripts"`
	LingerMS     int64                   `json:"linger_ms"`
	MaxEventText int                     `json:"max_event_text"`
	Limits       limitsVector            `json:"limits"`
	Tags         []tagVector             `json:"tags"`
	Keys         []keyVector             `json:"keys"`
	HashedIDs    []hashVector            `json:"hashed_ids"`
	PlacedIDs    []placedVector          `json:"placed_ids"`
	Events       []eventVector           `json:"events"`
	Parse        []parseVector           `json:"parse"`
	Hosts        []hostVector            `json:"hosts"`
	Timers       []timerVector           `json:"timers"`
	ValueTTLs    []valueTTLVector        `json:"value_ttls"`
	LockTTLs     []lockTTLVector         `json:"lock_ttls"`
	CLIIDs       []cliIDVector           `json:"cli_ids"`
	JSON         []jsonVector            `json:"json"`
	Durations    []durationVector        `json:"durations"`
}

// scriptVector is one script as a peer sends it: its exact text, final
// newline included (PROTOCOL.md [S1]), the SHA-1 of that text (what EVALSHA
// sends), and, for a script that publishes, the SHA-1 of its sharded form
// ([Q1]).
type scriptVector struct {
	SHA1        string `json:"sha1"`
	Src         string `json:"src"`
	ShardedSHA1 string `json:"sharded_sha1,omitempty"`
}

// limitsVector holds the bounds of PROTOCOL.md's "Numbers" that are not
// constants of internal/wire.
type limitsVector struct {
	MaxDurationMS int64 `json:"max_duration_ms"` // [S4]
	MinLockTTLMS  int64 `json:"min_lock_ttl_ms"` // [L1], [S4]
	CenturyMS     int64 `json:"century_ms"`      // [W9]
	MaxSpreadMS   int64 `json:"max_spread_ms"`   // [W7]
	ProbeMS       int64 `json:"probe_ms"`        // [P6]
}

// placedVector is an id and the id a peer that places ids for a cluster
// sends in its place, or nil when it must refuse it ([K6]).
type placedVector struct {
	ID     []byte `json:"id_b64"`
	Placed []byte `json:"placed_b64"`
}

// timerVector bounds a waiter's lock timer after a busy reply ([W7]-[W9]):
// it fires between EarliestUS and LatestUS microseconds after the reply.
type timerVector struct {
	PTTLMS     int64 `json:"pttl_ms"`
	LockTTLMS  int64 `json:"lock_ttl_ms"`
	EarliestUS int64 `json:"earliest_us"`
	LatestUS   int64 `json:"latest_us"`
}

// valueTTLVector is a value TTL and the argument the store script gets for
// it, or nil for a negative TTL, which is never stored ([C3], [C6]).
type valueTTLVector struct {
	NS  int64   `json:"ns"`
	Arg *string `json:"arg"`
}

// lockTTLVector is a lock TTL and the argument that acquire and renew get
// for it, or nil when a peer must refuse it ([L5]).
type lockTTLVector struct {
	NS  int64   `json:"ns"`
	Arg *string `json:"arg"`
}

// cliIDVector is an argument of an id flag of the run command and the id
// bytes it gives, or nil when the CLI must refuse it ([A1], [A2]).
type cliIDVector struct {
	Flag string `json:"flag"`
	Arg  []byte `json:"arg_b64"`
	ID   []byte `json:"id_b64"`
}

type tagVector struct {
	Tag   string `json:"tag"`
	Valid bool   `json:"valid"`
}

type parseVector struct {
	Payload []byte `json:"payload_b64"`
	Kind    string `json:"kind"`
	Token   string `json:"token"`
	Text    []byte `json:"text_b64"`
}

type keyVector struct {
	Name    string `json:"name"`
	Tag     string `json:"tag"`
	ID      []byte `json:"id_b64"`
	HashIDs bool   `json:"hash_ids"`
	Value   []byte `json:"value_b64"`
	Lock    []byte `json:"lock_b64"`
	Notif   []byte `json:"notif_b64"`
	Events  []byte `json:"events_b64"`
	// NotFound and Stale are the side keys of Options.NegTTL and StaleTTL.
	NotFound []byte `json:"not_found_b64"`
	Stale    []byte `json:"stale_b64"`
}

type hashVector struct {
	ID     []byte `json:"id_b64"`
	Hashed string `json:"hashed"`
}

type eventVector struct {
	Name    string `json:"name"`
	Kind    string `json:"kind"`
	Token   string `json:"token"`
	Message []byte `json:"message_b64"`
	Payload []byte `json:"payload_b64"`
}

type hostVector struct {
	Host   []byte `json:"host_b64"`
	Suffix string `json:"suffix"`
}

type jsonVector struct {
	Name    string          `json:"name"`
	Value   json.RawMessage `json:"value"`
	Encoded []byte          `json:"encoded_b64"`
}

type durationVector struct {
	Text string `json:"text"`
	MS   *int64 `json:"ms"` // truncated
	NS   *int64 `json:"ns"`
}

// The inputs of the vectors. Their outputs come from the Go implementation.
var (
	vectorKeys = []struct {
		name, tag, id string
		hashed        bool
	}{
		{"ascii", "likes", "kristoff", false},
		{"tag with colon", "app:likes", "42", false},
		{"utf-8", "users", "ünïcødé", false},
		{"emoji", "t", "emoji 🦀🔥", false},
		{"binary", "bin", "\x00\xff\x01\r\n", false},
		{"empty id", "e", "", false},
		{"nested tags: an id of app naming a lock of app:x", "app", "x/lock:y", false},
		{"hash tag for Redis Cluster", "c", "{user-42}", false},
		{"long", "long", strings.Repeat("0123456789", 30), false},
		{"hashed ascii", "likes", "kristoff", true},
		{"hashed binary", "bin", "\x00\xff\x01\r\n", true},
		{"hashed empty", "e", "", true},
	}
	vectorEvents = []struct {
		name, kind, message string
		token               string // "": vectorToken
	}{
		{"fail", wire.EventFail, "backend down", ""},
		{"fail keeps only the first line", wire.EventFail, "first line\nsecond line\n\tat frame", ""},
		{"fail with UTF-8", wire.EventFail, "échec: 数据库 🦀", ""},
		{"fail cut at 4096 bytes", wire.EventFail, strings.Repeat("x", 5000), ""},
		{"fail cut at a UTF-8 boundary", wire.EventFail, strings.Repeat("€", 2000), ""},
		{"fail with an empty message", wire.EventFail, "", ""},
		{"fail keeps a carriage return", wire.EventFail, "line one\r\nline two", ""},
		{"fail whose first line is empty", wire.EventFail, "\nthe rest", ""},
		{"fail with bytes that are not UTF-8", wire.EventFail, "bad \xff\xfe bytes", ""},
		{"fail of exactly 4096 bytes", wire.EventFail, strings.Repeat("y", 4096), ""},
		{"fail of 4097 bytes", wire.EventFail, strings.Repeat("y", 4097), ""},
		{"fail of stray continuation bytes", wire.EventFail, strings.Repeat("\x80", 5000), ""},
		{"abandon", wire.EventAbandon, "", ""},
		{"notfound", wire.EventNotFound, "", ""},
		{"stale", wire.EventStale, "", ""},
		{"fail of a traced holder", wire.EventFail, "backend down", vectorTracedToken},
		{"abandon of a traced holder", wire.EventAbandon, "", vectorTracedToken},
		{"fail after a failed store", wire.EventFail, `memolock: redis: storing "likes:kristoff": OOM command not allowed when used memory > 'maxmemory'.`, ""},
		{"fail cut inside a 4-byte character", wire.EventFail, strings.Repeat("x", 4094) + "🦀 and more", ""},
		// Not UTF-8: the cut looks at bytes alone, never decodes ([EV2]).
		// Bytes 4095 and 4096 (from 0) are stray continuation bytes: the cut
		// moves back to 4094 and drops a whole "x". A lead byte whose
		// continuation is missing stays.
		{"fail cut before stray continuation bytes", wire.EventFail, strings.Repeat("x", 4095) + "\x80\x80 and more", ""},
		{"fail cut after a lone lead byte", wire.EventFail, strings.Repeat("x", 4095) + "\xc3 and more", ""},
	}
	vectorHosts = []string{"build-7", "web01.example.com", "my_host", "héllo wörld", "box🦀", "a:b/c@d", "", "h\xffst", "h\xe2\x82st"}
	vectorTags  = []string{"likes", "app:likes", "a/b", "ünï", "", "a/lock", "a/locks", "x/notif", "a/lock-event", "/notif"}
	vectorParse = []string{"fail\ntok\nmsg", "fail\ntok\nmsg\nwith\nlines", "abandon\ntok\n", "abandon\ntok",
		"fail\ntok\n", "fail\ntok", "fail", "", "future-kind\ntok\nwhatever", "fail\n\nno token",
		"notfound\ntok\n", "stale\ntok\n", "fail\ntok\nnot \xff\xfe UTF-8", "fail\ntok\nline one\r\nline two", "\ntok\n",
		"fail\n" + vectorTracedToken + "\nbackend down", "notfound\ntok\nunexpected text", "abandon\n\n"}
	vectorJSON = []struct{ name, value string }{
		{"string", `"hello"`},
		{"HTML characters", `"<a href=\"x\">Tom & Jerry</a>"`},
		{"UTF-8", `"héllo wörld 日本 🦀"`},
		{"line separators", `"a\u2028b\u2029c"`},
		{"control characters", `"\u0000\u0001\b\f\n\r\t\u001f\u007f\""` + ``},
		{"escaped slash and backslash", `"a/b\\c"`},
		{"integers", `[0, 1, -1, 42, 123456789012, 9007199254740991]`},
		{"floats", `[1.5, -0.25, 3.141592653589793, 0.1, 1e20, 1e21, 1.5e-7, 0.000001, 1e-6, 123456.789, 5e-324, 1.7976931348623157e308]`},
		{"integral floats", `[1.0, 100.0, 2.5e3]`},
		{"literals", `[true, false, null]`},
		{"object keys sorted", `{"b": 1, "a": [true, false, null], "c": {"z": "", "y": {}}, "A": 0, "é": 1, "aa": 2}`},
		{"empty", `[[], {}, ""]`},
		{"record", `{"id": 42, "name": "Ada Lovelace", "tags": ["math", "engines"], "score": 99.5, "active": true, "manager": null}`},
	}
	vectorDurations = []string{"10s", "1m30s", "500ms", "1h", "1.5s", "2h45m10s", "0", "0s", "250ms", "1m", "",
		"10", "1x", "s", "1 s", "ten seconds", "500us", "500µs", "1.5ms", ".5s", "1.s", "+1s", "-1s", "1h1h", "10000000h"}
	vectorPlaced = []string{"user-42", "{user-42}", "x}", "a{b}c", "", "}", "}x", HashID("")}
	// Busy replies' PTTLs, with the waiter's lock TTL: the renewal moments
	// of a 3 s and a 10 s lock, the original Go peer's nanoseconds taken for
	// seconds (about 1e13 ms), a century and past it, and locks without TTL.
	vectorTimers = []struct{ pttl, lockTTL int64 }{
		{0, 10000}, {5, 10000}, {99, 10000}, {3000, 3000}, {10000, 10000}, {20000, 10000}, {9999999, 10000},
		{specCenturyMS, 10000}, {specCenturyMS + 1, 10000}, {10000000000000, 10000}, {1<<63 - 1, 10000},
		{-1, 10000}, {-1, 3000},
		// pttl/10 is exact, not rounded: 123.4 ms and 0.7 ms.
		{1234, 10000}, {7, 10000},
	}
	vectorValueTTLs = []time.Duration{0, 1, 400 * time.Microsecond, time.Millisecond, 1900 * time.Microsecond,
		1500 * time.Millisecond, 24 * time.Hour, 9223372036 * time.Second, -1, -time.Second}
	// Lock TTLs as a peer's user gives them: whole milliseconds go
	// truncated, anything under 1 ms is refused ([L5]). Inputs stay whole
	// microseconds, which every peer's duration type holds exactly.
	vectorLockTTLs = []time.Duration{time.Millisecond, 1900 * time.Microsecond, 2999 * time.Microsecond,
		1500 * time.Millisecond, 3 * time.Second, 10 * time.Second, 24 * time.Hour,
		999 * time.Microsecond, time.Microsecond, -time.Millisecond, -10 * time.Second}
	vectorCLIIDs = []struct{ flag, arg string }{
		{"--id", "kristoff"}, {"--id", "ünïcødé"}, {"--id", "with space"}, {"--id", "\xff\xfe\xc3(-\x80"},
		{"--id-hex", "00ff"}, {"--id-hex", "00FF"}, {"--id-hex", "6b726973746f6666"}, {"--id-hex", "DeadBeef"},
		{"--id-hex", "0"}, {"--id-hex", "0g"}, {"--id-hex", " 00"}, {"--id-hex", "0x00"}, {"--id-hex", "00 ff"},
		{"--id-hex", "00ff\n"},
		{"--id-base64", "QQ=="}, {"--id-base64", "QQ"}, {"--id-base64", "QUJD"}, {"--id-base64", "AP8="},
		{"--id-base64", "AP8"}, {"--id-base64", "+/+/"}, {"--id-base64", "QR=="}, {"--id-base64", "a3Jpc3RvZmY"},
		{"--id-base64", "QQ="}, {"--id-base64", "QQ==="}, {"--id-base64", "QUJD="}, {"--id-base64", "QUJD===="},
		{"--id-base64", "Q"}, {"--id-base64", "Q==="}, {"--id-base64", "QUJDR"}, {"--id-base64", "QQ\n"},
		{"--id-base64", " QQ"}, {"--id-base64", "-_8"}, {"--id-base64", "=QQ"}, {"--id-base64", "Q=Q="},
	}
)

// The bounds of PROTOCOL.md that no Go constant holds (the century is
// internal/engine's, unexported): the document is their source, and
// TestVectorsAreTheDocuments checks that it states each.
const (
	specMaxDurationMS = 1<<53 - 1
	specMinLockTTLMS  = 1
	specCenturyMS     = 100 * 365 * 24 * 3600 * 1000
	specMaxSpreadMS   = 1000
	specProbeMS       = 3000
)

const (
	vectorToken       = "9f86d081884c7d659a2feaa0c55ad015@build-7:4121"
	vectorTracedToken = vectorToken + "/00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
)

func scriptSHA1(src string) string {
	sum := sha1.Sum([]byte(src))
	return hex.EncodeToString(sum[:])
}

// protocolScripts are the scripts PROTOCOL.md quotes, by the names of its
// sections and of vectors.json.
var protocolScripts = map[string]string{
	"acquire": wire.AcquireSrc, "store": wire.StoreSrc, "release": wire.ReleaseSrc, "renew": wire.RenewSrc,
	"not_found": wire.NotFoundSrc, "publish": wire.PublishSrc, "resurrect": wire.ResurrectSrc,
	"delete": wire.DeleteSrc, "set": wire.SetSrc, "peek": wire.PeekSrc,
}

// timerBounds is PROTOCOL.md's lock timer ([W7]-[W9]) in microseconds after
// the busy reply: pttl + 1 ms plus an extra of up to min(pttl/10, 1 s), a
// PTTL over a century taken as a century, and the waiter's own lock TTL for
// a lock without expiry. internal/engine's waitFor is the Go implementation,
// which this package cannot call.
func timerBounds(pttl, lockTTL int64) (earliest, latest int64) {
	if pttl < 0 {
		return lockTTL * 1000, lockTTL * 1000
	}
	pttl = min(pttl, specCenturyMS)
	earliest = (pttl + 1) * 1000
	return earliest, earliest + min(pttl*100, specMaxSpreadMS*1000)
}

// specIDArg is PROTOCOL.md's reading of an id flag of the run command ([A1],
// [A2]), written from the document: the CLIs are in package main, out of
// this package's reach. It reports false for an argument a CLI must refuse.
func specIDArg(flag, arg string) ([]byte, bool) {
	switch flag {
	case "--id":
		return []byte(arg), true
	case "--id-hex":
		b, err := hex.DecodeString(arg)
		return b, err == nil
	case "--id-base64":
		body := strings.TrimRight(arg, "=")
		for _, c := range body {
			if !strings.ContainsRune("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", c) {
				return nil, false // Go's decoder would skip line breaks
			}
		}
		if pad := len(arg) - len(body); pad > 0 {
			if pad > 2 || len(arg)%4 != 0 {
				return nil, false
			}
			b, err := base64.StdEncoding.DecodeString(arg)
			return b, err == nil
		}
		b, err := base64.RawStdEncoding.DecodeString(arg)
		return b, err == nil
	}
	panic("unknown id flag " + flag)
}

// buildVectors computes every vector with the Go implementation.
func buildVectors(t *testing.T) vectors {
	v := vectors{
		Comment: "memolock test vectors: see interop/PROTOCOL.md. Generated by `go test -run TestVectors -update-vectors` " +
			"from the Go implementation and, for limits, timers and cli_ids, from PROTOCOL.md; every implementation " +
			"checks the entries that apply to it (PROTOCOL.md, Conformance). *_b64 fields are base64.",
		Scripts:      map[string]scriptVector{},
		LingerMS:     wire.LockLinger.Milliseconds(),
		MaxEventText: wire.MaxEventText,
		Limits: limitsVector{MaxDurationMS: specMaxDurationMS, MinLockTTLMS: specMinLockTTLMS, CenturyMS: specCenturyMS,
			MaxSpreadMS: specMaxSpreadMS, ProbeMS: specProbeMS},
	}
	for name, src := range protocolScripts {
		sv := scriptVector{SHA1: scriptSHA1(src), Src: src}
		if sharded := wire.ShardedSrc(src); sharded != src {
			sv.ShardedSHA1 = scriptSHA1(sharded)
		}
		v.Scripts[name] = sv
	}
	buildNameVectors(t, &v)
	buildEventVectors(&v)
	buildTimeVectors(&v)
	for _, c := range vectorCLIIDs {
		id, ok := specIDArg(c.flag, c.arg)
		cv := cliIDVector{Flag: c.flag, Arg: []byte(c.arg)}
		if ok {
			cv.ID = id
		}
		v.CLIIDs = append(v.CLIIDs, cv)
	}
	for _, j := range vectorJSON {
		var val any
		if err := json.Unmarshal([]byte(j.value), &val); err != nil {
			t.Fatalf("%s: %v", j.name, err)
		}
		enc, err := JSON[any]{}.Marshal(val)
		if err != nil {
			t.Fatalf("%s: %v", j.name, err)
		}
		v.JSON = append(v.JSON, jsonVector{Name: j.name, Value: json.RawMessage(j.value), Encoded: enc})
	}
	return v
}

// buildNameVectors computes what names are made of: tags, keys, hashed and
// placed ids, and the host part of tokens.
func buildNameVectors(t *testing.T, v *vectors) {
	for _, tag := range vectorTags {
		_, err := NewKeyScheme(tag)
		v.Tags = append(v.Tags, tagVector{Tag: tag, Valid: err == nil})
	}
	for _, k := range vectorKeys {
		ks, err := NewKeyScheme(k.tag)
		if err != nil {
			t.Fatal(err)
		}
		id := k.id
		if k.hashed {
			id = HashID(id)
			v.HashedIDs = append(v.HashedIDs, hashVector{ID: []byte(k.id), Hashed: id})
		}
		v.Keys = append(v.Keys, keyVector{Name: k.name, Tag: k.tag, ID: []byte(k.id), HashIDs: k.hashed,
			Value: []byte(ks.Value(id)), Lock: []byte(ks.Lock(id)), Notif: []byte(ks.Notif(id)), Events: []byte(ks.Events(id)),
			NotFound: []byte(ks.NotFound(id)), Stale: []byte(ks.Stale(id))})
	}
	for _, id := range vectorPlaced {
		pv := placedVector{ID: []byte(id)}
		if placed, ok := wire.PlaceID(id); ok {
			pv.Placed = []byte(placed)
		}
		v.PlacedIDs = append(v.PlacedIDs, pv)
	}
	for _, h := range vectorHosts {
		v.Hosts = append(v.Hosts, hostVector{Host: []byte(h), Suffix: wire.HostSuffix(h)})
	}
}

// buildEventVectors computes the payloads holders publish and what
// receivers read from payloads.
func buildEventVectors(v *vectors) {
	for _, e := range vectorEvents {
		token := e.token
		if token == "" {
			token = vectorToken
		}
		payload := e.kind + "\n" + token + "\n"
		if e.kind == wire.EventFail {
			payload = wire.FailEvent(token, errors.New(e.message))
		}
		v.Events = append(v.Events, eventVector{Name: e.name, Kind: e.kind, Token: token, Message: []byte(e.message), Payload: []byte(payload)})
	}
	for _, p := range vectorParse {
		kind, token, text := wire.ParseEvent(p)
		v.Parse = append(v.Parse, parseVector{Payload: []byte(p), Kind: kind, Token: token, Text: []byte(text)})
	}
}

// buildTimeVectors computes the waiter's timer bounds, the value and lock
// TTL arguments, and the run command's durations.
func buildTimeVectors(v *vectors) {
	for _, tv := range vectorTimers {
		earliest, latest := timerBounds(tv.pttl, tv.lockTTL)
		v.Timers = append(v.Timers, timerVector{PTTLMS: tv.pttl, LockTTLMS: tv.lockTTL, EarliestUS: earliest, LatestUS: latest})
	}
	for _, d := range vectorValueTTLs {
		tv := valueTTLVector{NS: d.Nanoseconds()}
		if d >= 0 {
			arg := wire.TTLMillis(d)
			tv.Arg = &arg
		}
		v.ValueTTLs = append(v.ValueTTLs, tv)
	}
	for _, d := range vectorLockTTLs {
		lv := lockTTLVector{NS: d.Nanoseconds()}
		var cfg engine.Config
		if err := (&Options{LockTTL: d}).durations(&cfg); err == nil {
			arg := strconv.FormatInt(cfg.LockTTL.Milliseconds(), 10)
			lv.Arg = &arg
		}
		v.LockTTLs = append(v.LockTTLs, lv)
	}
	for _, d := range vectorDurations {
		dv := durationVector{Text: d}
		if p, err := time.ParseDuration(d); err == nil {
			ms, ns := p.Milliseconds(), p.Nanoseconds()
			dv.MS, dv.NS = &ms, &ns
		}
		v.Durations = append(v.Durations, dv)
	}
}

func TestVectors(t *testing.T) {
	want := buildVectors(t)
	if *updateVectors {
		out, err := json.MarshalIndent(want, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(vectorsPath, append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(vectorsPath)
	if err != nil {
		t.Fatal(err)
	}
	var got vectors
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("%s: %v", vectorsPath, err)
	}
	// Compare section by section, so that a failure names what differs.
	for name, pair := range map[string][2]any{
		"scripts": {got.Scripts, want.Scripts}, "linger_ms": {got.LingerMS, want.LingerMS},
		"max_event_text": {got.MaxEventText, want.MaxEventText}, "keys": {got.Keys, want.Keys},
		"tags": {got.Tags, want.Tags}, "parse": {got.Parse, want.Parse},
		"hashed_ids": {got.HashedIDs, want.HashedIDs}, "events": {got.Events, want.Events},
		"hosts": {got.Hosts, want.Hosts}, "durations": {got.Durations, want.Durations},
		"limits": {got.Limits, want.Limits}, "placed_ids": {got.PlacedIDs, want.PlacedIDs},
		"timers": {got.Timers, want.Timers}, "value_ttls": {got.ValueTTLs, want.ValueTTLs},
		"cli_ids": {got.CLIIDs, want.CLIIDs}, "lock_ttls": {got.LockTTLs, want.LockTTLs},
	} {
		if !reflect.DeepEqual(pair[0], pair[1]) {
			t.Errorf("%s: section %q disagrees with the Go implementation (see the comment on updateVectors)", vectorsPath, name)
		}
	}
	if len(got.JSON) != len(want.JSON) {
		t.Fatalf("%s: %d json vectors, want %d", vectorsPath, len(got.JSON), len(want.JSON))
	}
	for i, j := range got.JSON {
		var val any
		if err := json.Unmarshal(j.Value, &val); err != nil {
			t.Fatalf("json %q: %v", j.Name, err)
		}
		enc, _ := JSON[any]{}.Marshal(val)
		if !bytes.Equal(enc, j.Encoded) || j.Name != want.JSON[i].Name {
			t.Errorf("json %q: Go encodes %q, the vector says %q", j.Name, enc, j.Encoded)
		}
	}
	// The vectors are only worth something if they exercise the cases.
	if p := string(want.Events[4].Payload); len(p) > len("fail\n"+vectorToken+"\n")+wire.MaxEventText || !strings.HasSuffix(p, "€") {
		t.Errorf("the UTF-8 cut vector is not cut at a character boundary: %d bytes", len(p))
	}
}

// TestVectorsAreTheDocuments keeps interop/PROTOCOL.md and vectors.json
// telling one story: the document lists every section of the vectors and
// states every bound they hold, and its Conformance table has a row for
// every requirement it labels.
func TestVectorsAreTheDocuments(t *testing.T) {
	raw, err := os.ReadFile("interop/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	vectorsSection := doc[strings.Index(doc, "## Test vectors"):]
	vectorsSection = vectorsSection[:strings.Index(vectorsSection, "\n## ")]
	for i, f := range reflect.VisibleFields(reflect.TypeOf(vectors{})) { // field 0 is the comment
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if i > 0 && !strings.Contains(vectorsSection, "`"+name+"`") {
			t.Errorf("PROTOCOL.md's \"Test vectors\" does not list the section %q", name)
		}
	}
	for _, n := range []int64{specMaxDurationMS, specCenturyMS, specMaxSpreadMS, wire.LockLinger.Milliseconds(), wire.MaxEventText} {
		if !strings.Contains(doc, strconv.FormatInt(n, 10)) {
			t.Errorf("PROTOCOL.md does not state the bound %d", n)
		}
	}
	rows := conformanceRows(t, doc[strings.Index(doc, "## Conformance"):])
	body := doc[:strings.Index(doc, "## Conformance")]
	labelled := 0
	for _, chunk := range strings.Split(body, "**[")[1:] {
		label, _, ok := strings.Cut(chunk, "]")
		if !ok || strings.ContainsAny(label, " \n") {
			continue
		}
		labelled++
		if !rows["["+label+"]"] {
			t.Errorf("PROTOCOL.md labels the requirement [%s], which its Conformance table lacks", label)
		}
	}
	if labelled < 50 {
		t.Errorf("PROTOCOL.md labels %d requirements; the labels are not where this test looks", labelled)
	}
}

// conformanceRows returns the labels that the rows of PROTOCOL.md's
// Conformance table name, ranges such as [X1]-[X3] spelled out.
func conformanceRows(t *testing.T, conformance string) map[string]bool {
	rows := map[string]bool{}
	for _, line := range strings.Split(conformance, "\n") {
		if !strings.HasPrefix(line, "| [") {
			continue
		}
		cell := strings.Split(line, "|")[1]
		for _, part := range strings.Split(cell, ",") {
			first, last, isRange := strings.Cut(strings.TrimSpace(part), "-")
			if !isRange {
				rows[first] = true
				continue
			}
			// A range such as [X1]-[X3]: one prefix, numbers from first to last.
			prefix := strings.TrimRight(strings.Trim(first, "[]"), "0123456789")
			from, err1 := strconv.Atoi(strings.TrimPrefix(strings.Trim(first, "[]"), prefix))
			to, err2 := strconv.Atoi(strings.TrimPrefix(strings.Trim(last, "[]"), prefix))
			if err1 != nil || err2 != nil {
				t.Fatalf("Conformance row %q: unreadable range %q", line, part)
			}
			for n := from; n <= to; n++ {
				rows["["+prefix+strconv.Itoa(n)+"]"] = true
			}
		}
	}
	return rows
}
