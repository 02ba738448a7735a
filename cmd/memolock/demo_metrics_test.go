package main

import (
	"strconv"
	"strings"
	"testing"
)

// demo --metrics prints the instruments as the SDK recorded them: every
// caller counted once by how it was served, one fetch, and its duration.
func TestDemo_MetricsPrintsTheInstruments(t *testing.T) {
	inv := memolockCmd(t, nil, "demo", "--metrics", "--clients", "4", "--goroutines", "50", "--fetch", "100ms")
	if inv.code != 0 {
		t.Fatalf("exit %d: %s", inv.code, inv.stderr)
	}
	_, report, ok := strings.Cut(inv.stdout, "OpenTelemetry metrics")
	if !ok {
		t.Fatalf("no metrics in the output:\n%s", inv.stdout)
	}
	value := func(prefix string) (n int, found bool) {
		for _, line := range strings.Split(report, "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && strings.HasPrefix(strings.Join(f, " "), prefix) {
				v, err := strconv.Atoi(f[len(f)-1])
				if err != nil {
					t.Fatalf("line %q: %v", line, err)
				}
				n += v
				found = true
			}
		}
		return n, found
	}
	gets, _ := value("memolock.gets result=value")
	if gets != 200 {
		t.Errorf("memolock.gets with a value add up to %d, want the 200 callers\n%s", gets, report)
	}
	if n, ok := value("memolock.gets result=value served=computed"); !ok || n == 0 {
		t.Errorf("no computed gets\n%s", report)
	}
	if n, _ := value("memolock.fetches"); n != 1 {
		t.Errorf("memolock.fetches = %d, want 1\n%s", n, report)
	}
	for _, want := range []string{"memolock.fetch.duration", "memolock.get.duration", "memolock.wait.duration",
		"memolock.takeovers", "memolock.waiting", "memolock.flights", "memolock.pubsub.channels", "memolock.outages"} {
		if !strings.Contains(report, want) {
			t.Errorf("no %s\n%s", want, report)
		}
	}
}
