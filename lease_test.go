package memolock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Lease.Held, Extend and Renew refuse a nil context with ErrInvalid, as
// every Client method does, instead of panicking inside go-redis; the lease
// stays held. Both kinds of lease: fetch's, and TryLock's.
func TestLease_NilContextRefused(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "nilctx", &Options{LockTTL: 10 * time.Second})
	var nilCtx context.Context // the bad input
	check := func(kind string, l *Lease) {
		t.Helper()
		calls := []struct {
			name string
			call func() error
		}{
			{"Held", func() error { _, err := l.Held(nilCtx); return err }},
			{"Extend", func() error { return l.Extend(nilCtx, time.Minute) }},
			{"Renew", func() error { return l.Renew(nilCtx, time.Minute) }},
		}
		for _, call := range calls {
			err := refusedWithoutPanic(call.call)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "context is nil") {
				t.Errorf("%s lease: %s(nil) = %v; want ErrInvalid saying the context is nil", kind, call.name, err)
			}
		}
		if held, err := l.Held(bg()); !held || err != nil {
			t.Errorf("%s lease: Held = %v, %v after the refused calls; want still held", kind, held, err)
		}
	}
	if _, err := c.Get(bg(), "k", func(ctx context.Context, l *Lease) ([]byte, time.Duration, error) {
		check("fetch", l)
		return []byte("v"), time.Minute, nil
	}); err != nil {
		t.Fatal(err)
	}
	l, err := c.TryLock(bg(), "nightly", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	check("TryLock", l)
}

// refusedWithoutPanic returns call's error, or an error describing its
// panic.
func refusedWithoutPanic(call func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panicked: %v", p)
		}
	}()
	return call()
}
