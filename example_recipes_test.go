package memolock_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock"
)

// newDemoClient is a memolock client of tag on a fresh embedded Redis.
func newDemoClient(tag string, opts *memolock.Options) (*memolock.Client, *miniredis.Miniredis, func()) {
	srv, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	c, err := memolock.New(rdb, tag, opts)
	if err != nil {
		panic(err)
	}
	return c, srv, func() {
		_ = c.Close()
		_ = rdb.Close()
		srv.Close()
	}
}

// An HTTP handler that serves a typed JSON value: the request's context
// bounds the wait, and a thousand concurrent requests for one missing user,
// across every instance of the service, cost one database query.
func Example_httpHandler() {
	c, _, done := newDemoClient("users", nil)
	defer done()
	users := memolock.Typed[User]{Client: c}

	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.URL.Query().Get("id")
		u, err := users.Get(r.Context(), id, func(ctx context.Context, _ *memolock.Lease) (User, time.Duration, error) {
			return loadUser(ctx, 42) // the database
		})
		switch {
		case errors.Is(err, memolock.ErrTimeout):
			http.Error(w, "try again", http.StatusServiceUnavailable)
		case err != nil:
			http.Error(w, "internal error", http.StatusInternalServerError)
		default:
			fmt.Fprintf(w, "hello, %s\n", u.Name)
		}
	})

	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest("GET", "/user?id=42", nil))
	body, _ := io.ReadAll(rec.Body)
	fmt.Print(rec.Code, " ", string(body))
	// Output: 200 hello, ada
}

// Negative caching: fetch reports "not found" with ErrNotFound, and for
// NegTTL every lookup of the id answers so at once, without calling fetch.
func ExampleOptions_negativeCaching() {
	c, _, done := newDemoClient("users", &memolock.Options{NegTTL: 30 * time.Second})
	defer done()
	var queries atomic.Int64
	find := func(ctx context.Context, _ *memolock.Lease) ([]byte, time.Duration, error) {
		queries.Add(1)
		return nil, 0, memolock.ErrNotFound // no such row
	}
	for range 3 {
		_, err := c.Get(context.Background(), "ghost", find)
		fmt.Println(errors.Is(err, memolock.ErrNotFound))
	}
	fmt.Println("queries:", queries.Load())
	// Output:
	// true
	// true
	// true
	// queries: 1
}

// Stale on error: with StaleTTL, a copy of each value outlives it; when
// fetch then fails, callers get the copy, flagged stale, instead of the
// error, and nobody calls fetch again for ResurrectTTL.
func ExampleOptions_staleOnError() {
	c, srv, done := newDemoClient("prices", &memolock.Options{StaleTTL: time.Hour})
	defer done()
	ctx := context.Background()
	_ = c.Set(ctx, "btc", []byte("67000"), time.Minute)
	srv.FastForward(2 * time.Minute) // the value expires; its copy stays

	r, err := c.GetResult(ctx, "btc", func(ctx context.Context, _ *memolock.Lease) ([]byte, time.Duration, error) {
		return nil, 0, errors.New("exchange API down")
	})
	fmt.Println(string(r.Value), r.Served, err)
	// Output: 67000 stale <nil>
}

// Refresh ahead: a value read within RefreshAhead of its expiry is returned
// at once, and one caller across all processes refreshes it in the
// background, so that a hot key never misses.
func ExampleOptions_refreshAhead() {
	c, srv, done := newDemoClient("rates", &memolock.Options{RefreshAhead: 10 * time.Second})
	defer done()
	ctx := context.Background()
	var version atomic.Int64
	fetch := func(ctx context.Context, _ *memolock.Lease) ([]byte, time.Duration, error) {
		return []byte(fmt.Sprint("v", version.Add(1))), time.Minute, nil
	}
	v, _ := c.Get(ctx, "eur", fetch)
	fmt.Println(string(v))
	srv.FastForward(55 * time.Second) // 5 s left: inside the window
	v, _ = c.Get(ctx, "eur", fetch)
	fmt.Println(string(v), "(the current value, while v2 is fetched)")
	for version.Load() < 2 || c.Stats().Refreshes < 1 {
		time.Sleep(time.Millisecond)
	}
	v, _ = c.Get(ctx, "eur", fetch)
	fmt.Println(string(v))
	// Output:
	// v1
	// v1 (the current value, while v2 is fetched)
	// v2
}

// GetMany with a batch loader: the ids that Redis does not hold, and that
// this call wins, are loaded with one query.
func ExampleClient_GetMany_batch() {
	c, _, done := newDemoClient("names", nil)
	defer done()
	ctx := context.Background()
	_ = c.Set(ctx, "1", []byte("ada"), time.Hour)

	var queries atomic.Int64
	loadNames := func(ctx context.Context, ids []string) (map[string]memolock.BatchValue, error) {
		queries.Add(1) // SELECT id, name FROM users WHERE id IN (...)
		out := map[string]memolock.BatchValue{}
		for _, id := range ids {
			out[id] = memolock.BatchValue{Value: []byte("user" + id), TTL: time.Hour}
		}
		return out, nil
	}
	items, err := c.GetMany(ctx, []string{"1", "2", "3"}, nil, &memolock.ManyOptions{Batch: loadNames})
	if err != nil {
		panic(err)
	}
	for _, it := range items {
		fmt.Println(it.ID, string(it.Value), it.Served)
	}
	fmt.Println("queries:", queries.Load())
	// Output:
	// 1 ada redis
	// 2 user2 computed
	// 3 user3 computed
	// queries: 1
}

// A standalone lock, for work that must run on one machine at a time.
func ExampleClient_TryLock() {
	c, _, done := newDemoClient("jobs", nil)
	defer done()
	ctx := context.Background()

	lease, err := c.TryLock(ctx, "nightly-report", time.Minute)
	if err != nil {
		fmt.Println("not this time:", errors.Is(err, memolock.ErrBusy))
		return
	}
	defer lease.Release(context.WithoutCancel(ctx))
	stop := lease.KeepAlive(ctx) // renews it while the job runs
	defer stop()

	_, err = c.TryLock(ctx, "nightly-report", time.Minute) // another machine, say
	fmt.Println("a second taker is busy:", errors.Is(err, memolock.ErrBusy))
	fmt.Println("running the report:", strings.ToUpper("done"))
	// Output:
	// a second taker is busy: true
	// running the report: DONE
}
