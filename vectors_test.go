package memolock

import (
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
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
	Tags         []tagVector             `json:"tags"`
	Keys         []keyVector             `json:"keys"`
	HashedIDs    []hashVector            `json:"hashed_ids"`
	Events       []eventVector           `json:"events"`
	Parse        []parseVector           `json:"parse"`
	Hosts        []hostVector            `json:"hosts"`
	JSON         []jsonVector            `json:"json"`
	Durations    []durationVector        `json:"durations"`
}

type scriptVector struct {
	SHA1 string `json:"sha1"`
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
	}{
		{"fail", eventFail, "backend down"},
		{"fail keeps only the first line", eventFail, "first line\nsecond line\n\tat frame"},
		{"fail with UTF-8", eventFail, "échec: 数据库 🦀"},
		{"fail cut at 4096 bytes", eventFail, strings.Repeat("x", 5000)},
		{"fail cut at a UTF-8 boundary", eventFail, strings.Repeat("€", 2000)},
		{"fail with an empty message", eventFail, ""},
		{"fail keeps a carriage return", eventFail, "line one\r\nline two"},
		{"fail whose first line is empty", eventFail, "\nthe rest"},
		{"fail with bytes that are not UTF-8", eventFail, "bad \xff\xfe bytes"},
		{"fail of exactly 4096 bytes", eventFail, strings.Repeat("y", 4096)},
		{"fail of 4097 bytes", eventFail, strings.Repeat("y", 4097)},
		{"fail of stray continuation bytes", eventFail, strings.Repeat("\x80", 5000)},
		{"abandon", eventAbandon, ""},
		{"notfound", eventNotFound, ""},
		{"stale", eventStale, ""},
	}
	vectorHosts = []string{"build-7", "web01.example.com", "my_host", "héllo wörld", "box🦀", "a:b/c@d", "", "h\xffst"}
	vectorTags  = []string{"likes", "app:likes", "a/b", "ünï", "", "a/lock", "a/locks", "x/notif", "a/lock-event", "/notif"}
	vectorParse = []string{"fail\ntok\nmsg", "fail\ntok\nmsg\nwith\nlines", "abandon\ntok\n", "abandon\ntok",
		"fail\ntok\n", "fail\ntok", "fail", "", "future-kind\ntok\nwhatever", "fail\n\nno token",
		"notfound\ntok\n", "stale\ntok\n"}
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
)

const vectorToken = "9f86d081884c7d659a2feaa0c55ad015@build-7:4121"

func scriptSHA1(src string) string {
	sum := sha1.Sum([]byte(src))
	return hex.EncodeToString(sum[:])
}

// buildVectors computes every vector with the Go implementation.
func buildVectors(t *testing.T) vectors {
	v := vectors{
		Comment: "memolock test vectors: see interop/PROTOCOL.md. Generated by `go test -run TestVectors -update-vectors` " +
			"from the Go implementation; every implementation checks every entry. *_b64 fields are base64.",
		Scripts: map[string]scriptVector{
			"acquire": {scriptSHA1(acquireSrc)}, "store": {scriptSHA1(storeSrc)},
			"release": {scriptSHA1(releaseSrc)}, "renew": {scriptSHA1(renewSrc)},
			"not_found": {scriptSHA1(notFoundSrc)},
		},
		LingerMS:     lockLinger.Milliseconds(),
		MaxEventText: maxEventText,
	}
	for _, tag := range vectorTags {
		_, err := NewKeyScheme(tag)
		v.Tags = append(v.Tags, tagVector{Tag: tag, Valid: err == nil})
	}
	for _, p := range vectorParse {
		kind, token, text := parseEvent(p)
		v.Parse = append(v.Parse, parseVector{Payload: []byte(p), Kind: kind, Token: token, Text: []byte(text)})
	}
	for _, k := range vectorKeys {
		ks, err := NewKeyScheme(k.tag)
		if err != nil {
			t.Fatal(err)
		}
		id := k.id
		if k.hashed {
			id = HashID(id)
		}
		v.Keys = append(v.Keys, keyVector{Name: k.name, Tag: k.tag, ID: []byte(k.id), HashIDs: k.hashed,
			Value: []byte(ks.Value(id)), Lock: []byte(ks.Lock(id)), Notif: []byte(ks.Notif(id)), Events: []byte(ks.Events(id)),
			NotFound: []byte(ks.NotFound(id)), Stale: []byte(ks.Stale(id))})
	}
	for _, k := range vectorKeys {
		if k.hashed {
			v.HashedIDs = append(v.HashedIDs, hashVector{ID: []byte(k.id), Hashed: HashID(k.id)})
		}
	}
	for _, e := range vectorEvents {
		payload := e.kind + "\n" + vectorToken + "\n"
		if e.kind == eventFail {
			payload = failEvent(vectorToken, errors.New(e.message))
		}
		v.Events = append(v.Events, eventVector{Name: e.name, Kind: e.kind, Token: vectorToken, Message: []byte(e.message), Payload: []byte(payload)})
	}
	for _, h := range vectorHosts {
		v.Hosts = append(v.Hosts, hostVector{Host: []byte(h), Suffix: hostSuffix(h)})
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
	for _, d := range vectorDurations {
		dv := durationVector{Text: d}
		if p, err := time.ParseDuration(d); err == nil {
			ms, ns := p.Milliseconds(), p.Nanoseconds()
			dv.MS, dv.NS = &ms, &ns
		}
		v.Durations = append(v.Durations, dv)
	}
	return v
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
	if p := string(want.Events[4].Payload); len(p) > len("fail\n"+vectorToken+"\n")+maxEventText || !strings.HasSuffix(p, "€") {
		t.Errorf("the UTF-8 cut vector is not cut at a character boundary: %d bytes", len(p))
	}
}
