package l1

import (
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/memolock/memolock/internal/mono"
)

type freshTracker struct{}

func (freshTracker) Tracking() (uint64, bool)           { return 1, true }
func (freshTracker) Heard(uint64) (time.Duration, bool) { return mono.Now(), true }

// A value whose PTTL is centuries (wire.MaxPTTL, as the original Go peer
// writes them) is cached like any other: now+ttl must not wrap negative
// (found by a review).
func TestPutWithAPTTLOfCenturies(t *testing.T) {
	time.Sleep(2 * time.Millisecond) // mono.Now() > 1 ms, as in any process that has run a while
	c := New(100, "v:", "n:")
	defer c.Close()
	var tr freshTracker
	maxPTTL := time.Duration(1<<63 - 1 - int64(time.Millisecond)) // wire.MaxPTTL
	c.Put("k", []byte("v"), maxPTTL, c.Snap(tr, "k"))
	if _, _, ok := c.Get("k"); !ok {
		t.Fatal("a value with a PTTL of centuries is not served from the L1 (expires wrapped negative)")
	}
}

// An entry is served only while its connection proved itself fresh
// within FreshFor, in the epoch it was read in.
func TestGetServesOnlyWhatAFreshConnectionKeeps(t *testing.T) {
	c := New(100, "v:", "n:")
	defer c.Close()
	tr := &heardTracker{epoch: 1}
	tr.heard.Store(int64(mono.Now()))
	c.Put("k", []byte("v"), time.Hour, c.Snap(tr, "k"))
	if _, _, ok := c.Get("k"); !ok {
		t.Fatal("not served while fresh")
	}
	tr.heard.Store(int64(mono.Now() - FreshFor - time.Millisecond))
	if _, _, ok := c.Get("k"); ok {
		t.Fatal("served although its connection last proved itself fresh more than FreshFor ago")
	}
	tr.heard.Store(int64(mono.Now()))
	if _, _, ok := c.Get("k"); !ok {
		t.Fatal("not served again once fresh")
	}
	tr.epoch = 2 // the entry's epoch (1) ended
	if _, _, ok := c.Get("k"); ok {
		t.Fatal("served in another epoch")
	}
}

// heardTracker is a Tracker whose freshness the test sets.
type heardTracker struct {
	epoch uint64
	heard atomic.Int64
}

func (h *heardTracker) Tracking() (uint64, bool) { return h.epoch, true }
func (h *heardTracker) Heard(epoch uint64) (time.Duration, bool) {
	return time.Duration(h.heard.Load()), epoch == h.epoch
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
