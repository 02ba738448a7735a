package memolock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type user struct {
	Name  string `json:"name"`
	Likes int    `json:"likes"`
}

func TestTyped_JSONRoundTripAcrossClients(t *testing.T) {
	b := miniBackend(t)
	var calls atomic.Int64
	fetch := func(ctx context.Context, _ *Lease) (user, time.Duration, error) {
		calls.Add(1)
		time.Sleep(20 * time.Millisecond)
		return user{Name: "kristoff", Likes: 7}, time.Minute, nil
	}
	var wg sync.WaitGroup
	for range 4 {
		users := Typed[user]{Client: newTestClient(t, b.addr, "users", nil).Client}
		for range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				u, err := users.Get(bg(), "1", fetch)
				if err != nil || u != (user{"kristoff", 7}) {
					t.Errorf("Get = %+v, %v", u, err)
				}
			}()
		}
	}
	wg.Wait()
	if calls.Load() != 1 {
		t.Errorf("fetch ran %d times", calls.Load())
	}
	if got, _ := b.mini.Get("users:1"); got != `{"name":"kristoff","likes":7}` {
		t.Errorf("stored %q, want JSON", got)
	}
}

// decimal stores ints as decimal text, as a peer in another language might.
type decimal struct{}

func (decimal) Marshal(v int) ([]byte, error) { return []byte(strconv.Itoa(v)), nil }
func (decimal) Unmarshal(b []byte) (int, error) {
	return strconv.Atoi(string(b))
}

func TestTyped_CustomCodec(t *testing.T) {
	b := miniBackend(t)
	counts := Typed[int]{Client: newTestClient(t, b.addr, "n", nil).Client, Codec: decimal{}}
	n, err := counts.Get(bg(), "a", func(context.Context, *Lease) (int, time.Duration, error) { return 12, 0, nil })
	if err != nil || n != 12 {
		t.Fatalf("Get = %d, %v", n, err)
	}
	if got, _ := b.mini.Get("n:a"); got != "12" {
		t.Errorf("stored %q", got)
	}
	b.mini.Set("n:bad", "twelve")
	_, err = counts.Get(bg(), "bad", func(context.Context, *Lease) (int, time.Duration, error) { return 0, 0, nil })
	if err == nil || !strings.Contains(err.Error(), `decoding value of id "bad"`) {
		t.Fatalf("undecodable value: got %v", err)
	}
}

func TestTyped_RejectsBadInput(t *testing.T) {
	if _, err := (Typed[int]{}).Get(bg(), "x", func(context.Context, *Lease) (int, time.Duration, error) { return 0, 0, nil }); !errors.Is(err, ErrInvalid) {
		t.Errorf("nil Client: %v", err)
	}
	b := miniBackend(t)
	typed := Typed[int]{Client: newTestClient(t, b.addr, "n", nil).Client}
	if _, err := typed.Get(bg(), "x", nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("nil fetch: %v", err)
	}
	_, err := Typed[func()]{Client: typed.Client}.Get(bg(), "f", func(context.Context, *Lease) (func(), time.Duration, error) {
		return func() {}, 0, nil
	})
	if err == nil || !strings.Contains(err.Error(), "encoding value") {
		t.Errorf("unencodable value: %v", err)
	}
}
