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

// Every call that takes or returns a value has its typed twin: a typed
// caller never encodes or decodes by hand.
func TestTyped_EveryCallIsTyped(t *testing.T) {
	b := miniBackend(t)
	users := Typed[user]{Client: newTestClient(t, b.addr, "tu", &Options{StaleTTL: time.Minute}).Client}
	kr := user{Name: "kristoff", Likes: 7}
	if err := users.Set(bg(), "1", kr, time.Minute); err != nil {
		t.Fatal(err)
	}
	if r, err := users.Lookup(bg(), "1"); err != nil || r.Value != kr || r.Served != ServedRedis {
		t.Errorf("Lookup = %+v, %v", r, err)
	}
	if p, err := users.Peek(bg(), "1"); err != nil || !p.Found || p.Value != kr || p.TTL <= 0 {
		t.Errorf("Peek = %+v, %v", p, err)
	}
	noFetch := func(context.Context, *Lease) (user, time.Duration, error) {
		return user{}, 0, errors.New("fetch must not run")
	}
	if r, err := users.GetResult(bg(), "1", noFetch); err != nil || r.Value != kr || r.Served != ServedRedis {
		t.Errorf("GetResult = %+v, %v", r, err)
	}
	if _, err := users.Lookup(bg(), "none"); !errors.Is(err, ErrMiss) {
		t.Errorf("Lookup of nothing = %v, want ErrMiss", err)
	}

	if ok, err := users.Delete(bg(), "gone"); err != nil || ok {
		t.Errorf("Delete of nothing = %v, %v", ok, err)
	}

	// GetMany, with a fetch per id and with a batch.
	fetchID := func(_ context.Context, id string, _ *Lease) (user, time.Duration, error) {
		n, _ := strconv.Atoi(id)
		return user{Name: "u" + id, Likes: n}, time.Minute, nil
	}
	items, err := users.GetMany(bg(), []string{"1", "2", "3"}, fetchID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if items[0].Value != kr || items[0].Served != ServedRedis || items[1].Value != (user{"u2", 2}) || items[2].Served != ServedComputed {
		t.Errorf("GetMany = %+v", items)
	}
	batch := func(_ context.Context, ids []string) (map[string]TypedBatchValue[user], error) {
		out := map[string]TypedBatchValue[user]{}
		for _, id := range ids {
			out[id] = TypedBatchValue[user]{Value: user{Name: "b" + id}, TTL: time.Minute}
		}
		return out, nil
	}
	items, err = users.GetMany(bg(), []string{"4", "1"}, nil, &TypedManyOptions[user]{Batch: batch})
	if err != nil || items[0].Value != (user{Name: "b4"}) || items[1].Value != kr {
		t.Errorf("GetMany with a batch = %+v, %v", items, err)
	}

	// A value another program stored that the codec cannot read fails its
	// id alone, naming it.
	if err := users.Client.Set(bg(), "bad", []byte("not json"), time.Minute); err != nil {
		t.Fatal(err)
	}
	items, err = users.GetMany(bg(), []string{"bad", "1"}, fetchID, nil)
	if err != nil || items[0].Err == nil || !strings.Contains(items[0].Err.Error(), `"bad"`) || items[1].Value != kr {
		t.Errorf("GetMany with an undecodable value = %+v, %v", items, err)
	}
	if _, err := users.Peek(bg(), "bad"); err == nil {
		t.Error("Peek of an undecodable value gave no error")
	}
	if ok, err := users.Delete(bg(), "1"); err != nil || !ok {
		t.Errorf("Delete = %v, %v", ok, err)
	}
}

// A typed caller sees how its value was served, stale included.
func TestTyped_GetResultReportsStale(t *testing.T) {
	b := miniBackend(t)
	users := Typed[user]{Client: newTestClient(t, b.addr, "ts", &Options{StaleTTL: time.Hour}).Client}
	kr := user{Name: "kristoff", Likes: 7}
	if err := users.Set(bg(), "1", kr, time.Second); err != nil {
		t.Fatal(err)
	}
	b.mini.FastForward(2 * time.Second) // the value expires; its stale copy stays
	r, err := users.GetResult(bg(), "1", func(context.Context, *Lease) (user, time.Duration, error) {
		return user{}, 0, errors.New("db down")
	})
	if err != nil || r.Value != kr || r.Served != ServedStale {
		t.Errorf("GetResult after a failed fetch = %+v, %v; want the stale copy, served stale", r, err)
	}
}
