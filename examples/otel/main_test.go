package main

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"net/http"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/memolock/memolock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The wiring serves memolock's instruments: a computed Get and a Redis hit
// show up on /metrics, with the tag and never the id.
func TestServeMetrics(t *testing.T) {
	mr := miniredis.RunT(t)
	mux := http.NewServeMux()
	mp, err := serveMetrics(mux, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Shutdown(t.Context())
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	c, err := memolock.New(rdb, "example", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 2 {
		if err := getOnce(c); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		`memolock_gets_total{memolock_result="value",memolock_served="computed",memolock_tag="example"`,
		`memolock_gets_total{memolock_result="value",memolock_served="redis",memolock_tag="example"`,
		`memolock_fetch_duration_seconds_count{memolock_tag="example"`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(text, "greeting") {
		t.Error("/metrics names an id")
	}
	if t.Failed() {
		t.Log(text)
	}
}
