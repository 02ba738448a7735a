package memolock

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock/internal/redistest"
)

// roundTrips counts the round trips a go-redis client makes: a pipeline is
// one, whatever it holds.
type roundTrips struct {
	n        atomic.Int64
	commands sync.Map // command name: *atomic.Int64
}

func countRoundTrips(rdb redis.UniversalClient) *roundTrips {
	r := &roundTrips{}
	rdb.AddHook(r)
	return r
}

func (r *roundTrips) named(name string) int64 {
	if n, ok := r.commands.Load(name); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

func (r *roundTrips) add(cmd redis.Cmder) {
	n, _ := r.commands.LoadOrStore(cmd.Name(), new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
}

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.n.Add(1)
		r.add(cmd)
		return next(ctx, cmd)
	}
}
func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.n.Add(1)
		for _, cmd := range cmds {
			r.add(cmd)
		}
		return next(ctx, cmds)
	}
}

// fetchByID returns a fetch that counts its calls per id and answers
// "v-<id>", or fails for the ids in fail.
func fetchByID(calls *sync.Map, fail ...string) FetchIDFunc {
	return func(_ context.Context, id string, _ *Lease) ([]byte, time.Duration, error) {
		n, _ := calls.LoadOrStore(id, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		if slices.Contains(fail, id) {
			return nil, 0, fmt.Errorf("no value for %s", id)
		}
		return []byte("v-" + id), time.Minute, nil
	}
}

func callsOf(calls *sync.Map, id string) int64 {
	if n, ok := calls.Load(id); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

// batchByID returns a Batch that records the ids of each call and answers
// "v-<id>" for each.
func batchByID(mu *sync.Mutex, got *[][]string) BatchFetchFunc {
	return func(_ context.Context, ids []string) (map[string]BatchValue, error) {
		mu.Lock()
		*got = append(*got, slices.Clone(ids))
		mu.Unlock()
		res := make(map[string]BatchValue, len(ids))
		for _, id := range ids {
			res[id] = BatchValue{Value: []byte("v-" + id), TTL: time.Minute}
		}
		return res, nil
	}
}

var noFetchID FetchIDFunc = func(context.Context, string, *Lease) ([]byte, time.Duration, error) {
	return nil, 0, errors.New("this fetch must not run")
}

var failFetchID FetchIDFunc = func(context.Context, string, *Lease) ([]byte, time.Duration, error) {
	return nil, 0, errors.New("benchmark: unexpected miss")
}

// describe renders items as "id=value/served" or "id=error: text".
func describe(items []Item) []string {
	out := make([]string, len(items))
	for i, it := range items {
		if it.Err != nil {
			out[i] = it.ID + "=error: " + it.Err.Error()
		} else {
			out[i] = it.ID + "=" + string(it.Value) + "/" + it.Served.String()
		}
	}
	return out
}

func TestGetMany_AnswersInInputOrderWithHitsMissesAndDuplicates(t *testing.T) {
	for _, b := range backends(t) {
		for _, batch := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/batch=%v", b.name, batch), func(t *testing.T) {
				for _, hashIDs := range []bool{false, true} {
					tag := fmt.Sprintf("order%v%v", batch, hashIDs)
					c := newTestClient(t, b.addr, tag, &Options{HashIDs: hashIDs})
					raw := rawClient(t, b.addr)
					for _, id := range []string{"h1", "h2"} {
						key := id
						if hashIDs {
							key = HashID(id)
						}
						raw.Set(bg(), c.Keys().Value(key), "stored-"+id, time.Minute)
					}
					var calls sync.Map
					var mu sync.Mutex
					var batches [][]string
					opts := &ManyOptions{}
					if batch {
						opts.Batch = batchByID(&mu, &batches)
					}
					ids := []string{"m1", "h1", "m2", "h1", "h2", "m1", "", "m3"}
					items, err := c.GetMany(bg(), ids, fetchByID(&calls), opts)
					if err != nil {
						t.Fatal(err)
					}
					want := []string{"m1=v-m1/computed", "h1=stored-h1/redis", "m2=v-m2/computed", "h1=stored-h1/redis",
						"h2=stored-h2/redis", "m1=v-m1/computed", "=v-/computed", "m3=v-m3/computed"}
					if got := describe(items); !slices.Equal(got, want) {
						t.Errorf("HashIDs=%v:\n got %q\nwant %q", hashIDs, got, want)
					}
					for _, id := range []string{"m1", "m2", "m3", ""} {
						if n := callsOf(&calls, id); !batch && n != 1 {
							t.Errorf("fetch ran %d times for %q", n, id)
						}
					}
					if batch && len(batches) != 1 {
						t.Errorf("Batch ran %d times: %q", len(batches), batches)
					}
					// Everything is stored now: one round trip, all hits.
					before := c.commands.n.Load()
					items, err = c.GetMany(bg(), ids, noFetchID, nil)
					if err != nil || c.commands.n.Load()-before != 1 {
						t.Fatalf("second GetMany: %v, %d commands", err, c.commands.n.Load()-before)
					}
					for _, it := range items {
						if it.Err != nil || it.Served != ServedRedis {
							t.Errorf("second GetMany, %q: %s, %v", it.ID, it.Served, it.Err)
						}
					}
				}
			})
		}
	}
}

// One id's failure, whatever its kind, leaves the others their values.
func TestGetMany_OneFailureFailsOnlyItsID(t *testing.T) {
	b := miniBackend(t)
	cases := []struct {
		name  string
		fetch FetchIDFunc
		batch BatchFetchFunc
		want  map[string]string // id: error text it must contain; others get v-<id>
	}{
		{
			name:  "fetch fails",
			fetch: fetchByID(new(sync.Map), "bad"),
			want:  map[string]string{"bad": "no value for bad"},
		},
		{
			name: "fetch panics",
			fetch: func(_ context.Context, id string, _ *Lease) ([]byte, time.Duration, error) {
				if id == "bad" {
					panic("boom")
				}
				return []byte("v-" + id), time.Minute, nil
			},
			want: map[string]string{"bad": "fetch panicked: boom"},
		},
		{
			name: "batch fails one id and omits another",
			batch: func(_ context.Context, ids []string) (map[string]BatchValue, error) {
				res := map[string]BatchValue{}
				for _, id := range ids {
					switch id {
					case "bad":
						res[id] = BatchValue{Err: errors.New("no value for bad")}
					case "omitted":
					default:
						res[id] = BatchValue{Value: []byte("v-" + id), TTL: time.Minute}
					}
				}
				return res, nil
			},
			want: map[string]string{"bad": "no value for bad", "omitted": `batch fetch returned no value for id "omitted"`},
		},
		{
			name: "fetch returns an error whose methods panic",
			fetch: func(_ context.Context, id string, _ *Lease) ([]byte, time.Duration, error) {
				if id == "bad" {
					return nil, 0, (*nilPointerError)(nil)
				}
				return []byte("v-" + id), time.Minute, nil
			},
			want: map[string]string{"bad": "fetch returned an error of type *memolock.nilPointerError whose methods panic"},
		},
		{
			name: "batch gives one id an error whose methods panic",
			batch: func(_ context.Context, ids []string) (map[string]BatchValue, error) {
				res := map[string]BatchValue{}
				for _, id := range ids {
					res[id] = BatchValue{Value: []byte("v-" + id), TTL: time.Minute}
				}
				res["bad"] = BatchValue{Err: (*nilPointerError)(nil)}
				res["omitted"] = BatchValue{Err: errors.Join(errors.New("no value"), (*nilPointerError)(nil))}
				return res, nil
			},
			want: map[string]string{
				"bad": "batch fetch returned an error of type *memolock.nilPointerError whose methods panic",
				// Named by the error that panics, not by its wrapper.
				"omitted": "batch fetch returned an error of type *memolock.nilPointerError whose methods panic",
			},
		},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestClient(t, b.addr, fmt.Sprint("fail", i), nil)
			raw := rawClient(t, b.addr)
			raw.Set(bg(), c.Keys().Value("hit"), "v-hit", time.Minute)
			ids := []string{"a", "bad", "hit", "omitted", "b", "bad"}
			items, err := c.GetMany(bg(), ids, tc.fetch, &ManyOptions{Batch: tc.batch})
			if err != nil {
				t.Fatal(err)
			}
			for i, it := range items {
				if it.ID != ids[i] {
					t.Errorf("item %d is %q, want %q", i, it.ID, ids[i])
				}
				if text, ok := tc.want[it.ID]; ok {
					if it.Err == nil || !strings.Contains(it.Err.Error(), text) || it.Value != nil || it.Served != 0 {
						t.Errorf("%q: %q/%v, %v; want an error containing %q", it.ID, it.Value, it.Served, it.Err, text)
					}
					continue
				}
				if it.Err != nil || string(it.Value) != "v-"+it.ID {
					t.Errorf("%q: %q, %v", it.ID, it.Value, it.Err)
				}
			}
			for id := range tc.want {
				if raw.Exists(bg(), c.Keys().Value(id)).Val() != 0 {
					t.Errorf("a value was stored for failed id %q", id)
				}
			}
			if raw.Get(bg(), c.Keys().Value("b")).Val() != "v-b" {
				t.Errorf("the value of b was not stored")
			}
		})
	}
	// A batch's own failure fails the ids of that call, never the hits.
	for i, batch := range []BatchFetchFunc{
		func(context.Context, []string) (map[string]BatchValue, error) { return nil, errors.New("backend down") },
		func(context.Context, []string) (map[string]BatchValue, error) { panic("backend down") },
	} {
		c := newTestClient(t, b.addr, fmt.Sprint("failall", i), nil)
		rawClient(t, b.addr).Set(bg(), c.Keys().Value("hit"), "v-hit", time.Minute)
		items, err := c.GetMany(bg(), []string{"a", "hit", "b"}, nil, &ManyOptions{Batch: batch})
		if err != nil {
			t.Fatal(err)
		}
		if got := describe(items); got[1] != "hit=v-hit/redis" {
			t.Errorf("batch %d: the hit got %q", i, got[1])
		}
		for _, it := range []Item{items[0], items[2]} {
			if it.Err == nil || !strings.Contains(it.Err.Error(), "backend down") || (i == 1) != errors.Is(it.Err, ErrFetchPanicked) {
				t.Errorf("batch %d, %q: %v", i, it.ID, it.Err)
			}
		}
	}
}

// All the hits cost one round trip, with or without hashed ids, where N
// single Gets cost N lookups.
func TestGetMany_HitsCostOneRoundTrip(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			for _, hashIDs := range []bool{false, true} {
				tag := fmt.Sprint("rt", hashIDs)
				c := newTestClient(t, b.addr, tag, &Options{HashIDs: hashIDs})
				c.rdb.Ping(bg()) // dial: HELLO and CLIENT SETINFO go through hooks too
				rt := countRoundTrips(c.rdb)
				raw := rawClient(t, b.addr)
				ids := make([]string, 50)
				for i := range ids {
					ids[i] = fmt.Sprint("id", i)
					key := ids[i]
					if hashIDs {
						key = HashID(key)
					}
					raw.Set(bg(), c.Keys().Value(key), "v"+ids[i], time.Minute)
				}
				for _, ctx := range []context.Context{bg(), context.WithoutCancel(bg())} {
					withDeadline, cancel := context.WithTimeout(ctx, 5*time.Second)
					for _, ctx := range []context.Context{ctx, withDeadline} {
						before := rt.n.Load()
						items, err := c.GetMany(ctx, ids, noFetchID, nil)
						if err != nil {
							t.Fatal(err)
						}
						if n := rt.n.Load() - before; n != 1 {
							t.Errorf("HashIDs=%v: %d round trips for 50 hits, want 1", hashIDs, n)
						}
						for i, it := range items {
							if it.Err != nil || string(it.Value) != "v"+ids[i] || it.Served != ServedRedis {
								t.Errorf("%q: %q/%v, %v", it.ID, it.Value, it.Served, it.Err)
							}
						}
					}
					cancel()
				}
				if rt.named("mget") != 4 {
					t.Errorf("MGETs: %d, want 4", rt.named("mget"))
				}
				if s := c.Stats(); s.Hits != 200 || s.Gets != 200 {
					t.Errorf("Stats: %d hits, %d gets; want 200 each", s.Hits, s.Gets)
				}
			}
		})
	}
}

// Without Batch, at most Concurrency missing ids are pursued at once.
func TestGetMany_ConcurrencyLimitHolds(t *testing.T) {
	b := miniBackend(t)
	for _, tc := range []struct{ limit, want int }{{3, 3}, {0, DefaultManyConcurrency}, {1, 1}} {
		t.Run(fmt.Sprint("limit=", tc.limit), func(t *testing.T) {
			c := newTestClient(t, b.addr, fmt.Sprint("conc", tc.limit), nil)
			var running, peak atomic.Int64
			fetch := func(_ context.Context, id string, _ *Lease) ([]byte, time.Duration, error) {
				n := running.Add(1)
				defer running.Add(-1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				// Hold on until the limit is reached, so that the peak shows
				// what the limit allows, however slowly the pursuers start;
				// a limit below it makes each fetch wait 10s, and the test
				// fail.
				deadline := time.Now().Add(10 * time.Second)
				for peak.Load() < int64(tc.want) && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
				time.Sleep(5 * time.Millisecond)
				return []byte("v-" + id), time.Minute, nil
			}
			ids := make([]string, 40)
			for i := range ids {
				ids[i] = fmt.Sprint(i)
			}
			items, err := c.GetMany(bg(), ids, fetch, &ManyOptions{Concurrency: tc.limit})
			if err != nil {
				t.Fatal(err)
			}
			for _, it := range items {
				if it.Err != nil || string(it.Value) != "v-"+it.ID {
					t.Errorf("%q: %q, %v", it.ID, it.Value, it.Err)
				}
			}
			if p := peak.Load(); p != int64(tc.want) {
				t.Errorf("peak of %d fetches at once, want %d", p, tc.want)
			}
		})
	}
}

// A missing id joins a Get of the same id already running in this process:
// its fetch runs once.
func TestGetMany_JoinsAGetInFlightInThisProcess(t *testing.T) {
	b := miniBackend(t)
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			c := newTestClient(t, b.addr, fmt.Sprint("join", batch), nil)
			started, release := make(chan struct{}, 1), make(chan struct{})
			got := getAsync(c, bg(), "k", blockingFetch(started, release, "from Get"))
			<-started
			var calls sync.Map
			var mu sync.Mutex
			var batches [][]string
			opts := &ManyOptions{}
			if batch {
				opts.Batch = batchByID(&mu, &batches)
			}
			done := make(chan []Item, 1)
			go func() {
				items, err := c.GetMany(bg(), []string{"x", "k"}, fetchByID(&calls), opts)
				if err != nil {
					t.Error(err)
				}
				done <- items
			}()
			eventually(t, 5*time.Second, "GetMany to join the flight of k", func() bool { return c.Stats().Coalesced == 1 })
			close(release)
			within(t, 5*time.Second, got, "from Get", "Get")
			items := <-done
			want := []string{"x=v-x/computed", "k=from Get/computed"}
			if got := describe(items); !slices.Equal(got, want) {
				t.Errorf("got %q, want %q", got, want)
			}
			if callsOf(&calls, "k") != 0 {
				t.Errorf("GetMany's fetch ran for k, which a Get was computing")
			}
			if batch && (len(batches) != 1 || !slices.Equal(batches[0], []string{"x"})) {
				t.Errorf("Batch calls: %q, want one with x alone", batches)
			}
		})
	}
}

// A missing id whose lock another client holds waits for that holder's
// value instead of computing it; with Batch, the batch does not wait for
// it either: it runs at once with the ids this call won.
func TestGetMany_WaitsForAHolderInAnotherClient(t *testing.T) {
	for _, b := range backends(t) {
		for _, batch := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/batch=%v", b.name, batch), func(t *testing.T) {
				tag := fmt.Sprint("away", batch)
				holder := newTestClient(t, b.addr, tag, nil)
				c := newTestClient(t, b.addr, tag, nil)
				k := countLookups(c.rdb, tag+":k")
				started, release := make(chan struct{}, 1), make(chan struct{})
				held := getAsync(holder, bg(), "k", blockingFetch(started, release, "from holder"))
				<-started
				batched := make(chan []string, 4)
				opts := &ManyOptions{}
				if batch {
					opts.Batch = func(_ context.Context, ids []string) (map[string]BatchValue, error) {
						batched <- ids
						return map[string]BatchValue{"x": {Value: []byte("v-x"), TTL: time.Minute}}, nil
					}
				}
				var calls sync.Map
				done := make(chan []Item, 1)
				go func() {
					ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
					defer cancel()
					items, err := c.GetMany(ctx, []string{"k", "x"}, fetchByID(&calls), opts)
					if err != nil {
						t.Error(err)
					}
					done <- items
				}()
				if batch {
					select {
					case ids := <-batched:
						if !slices.Equal(ids, []string{"x"}) {
							t.Errorf("Batch got %q, want x alone", ids)
						}
					case <-time.After(5 * time.Second):
						t.Fatal("Batch waited for an id held by another client")
					}
				}
				parkedAndLive(t, k, 2)
				close(release)
				within(t, 5*time.Second, held, "from holder", "the holder")
				items := <-done
				want := []string{"k=from holder/waited", "x=v-x/computed"}
				if got := describe(items); !slices.Equal(got, want) {
					t.Errorf("got %q, want %q", got, want)
				}
				if callsOf(&calls, "k") != 0 {
					t.Errorf("fetch ran for k, which another client held")
				}
			})
		}
	}
}

// Batch receives every missing id at once, and its values are stored.
func TestGetMany_BatchReceivesAllMissingIDsInOneCall(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := newTestClient(t, b.addr, "all", nil)
			raw := rawClient(t, b.addr)
			var ids, want []string
			for i := range 100 {
				id := fmt.Sprint(i)
				ids = append(ids, id)
				if i%4 == 0 {
					raw.Set(bg(), c.Keys().Value(id), "v-"+id, time.Minute)
				} else {
					want = append(want, id)
				}
			}
			var mu sync.Mutex
			var batches [][]string
			ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
			defer cancel()
			items, err := c.GetMany(ctx, ids, nil, &ManyOptions{Batch: batchByID(&mu, &batches)})
			if err != nil {
				t.Fatal(err)
			}
			for i, it := range items {
				if it.Err != nil || string(it.Value) != "v-"+ids[i] {
					t.Errorf("%q: %q, %v", it.ID, it.Value, it.Err)
				}
			}
			if len(batches) != 1 {
				t.Fatalf("Batch ran %d times, want once", len(batches))
			}
			got := slices.Clone(batches[0])
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("Batch got %q, want the %d missing ids", got, len(want))
			}
			for _, id := range want {
				if v := raw.Get(bg(), c.Keys().Value(id)).Val(); v != "v-"+id {
					t.Errorf("stored %q for %q", v, id)
				}
			}
			if s := c.Stats(); s.Fetches != int64(len(want)) {
				t.Errorf("Stats.Fetches = %d, want %d", s.Fetches, len(want))
			}
		})
	}
}

// Clients that GetMany the same cold ids at once, each with a Batch, split
// the locks between them. No batch may wait for an id another client holds
// (that client's batch may be waiting for one of ours), and each id is
// computed once in all.
func TestGetMany_BatchStampedeAcrossClientsComputesEachIDOnce(t *testing.T) {
	b := realBackend(t)
	ids := make([]string, 40)
	for i := range ids {
		ids[i] = fmt.Sprint(i)
	}
	var computed atomic.Int64
	var wg sync.WaitGroup
	for n := range 4 {
		c := newTestClient(t, b.addr, "herd", &Options{LockTTL: 30 * time.Second})
		wg.Add(1)
		go func() {
			defer wg.Done()
			order := slices.Clone(ids)
			if n%2 == 1 {
				slices.Reverse(order)
			}
			batch := func(ctx context.Context, ids []string) (map[string]BatchValue, error) {
				computed.Add(int64(len(ids)))
				time.Sleep(50 * time.Millisecond)
				res := make(map[string]BatchValue, len(ids))
				for _, id := range ids {
					res[id] = BatchValue{Value: []byte("v-" + id), TTL: time.Minute}
				}
				return res, nil
			}
			ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
			defer cancel()
			items, err := c.GetMany(ctx, order, nil, &ManyOptions{Batch: batch})
			if err != nil {
				t.Error(err)
				return
			}
			for _, it := range items {
				if it.Err != nil || string(it.Value) != "v-"+it.ID {
					t.Errorf("client %d, %q: %q, %v", n, it.ID, it.Value, it.Err)
				}
			}
		}()
	}
	wg.Wait()
	if n := computed.Load(); n != int64(len(ids)) {
		t.Errorf("%d ids computed, want %d", n, len(ids))
	}
}

// On a cluster, ids in different slots are read with one pipeline of GETs,
// which go-redis splits by node; the misses take the path of Get.
func TestGetMany_WorksOnCluster(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr}})
	t.Cleanup(func() { _ = rdb.Close() })
	rt := countRoundTrips(rdb)
	c, err := New(rdb, "cl", &Options{LockTTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	var ids []string
	slots := map[int64]bool{}
	for i := range 30 {
		id := fmt.Sprintf("id%d", i)
		ids = append(ids, id)
		placed, _ := PlaceID(id)
		slots[rdb.ClusterKeySlot(bg(), c.Keys().Value(placed)).Val()] = true
		if i%2 == 0 {
			if err := rdb.Set(bg(), c.Keys().Value(placed), "v-"+id, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(slots) < 3 {
		t.Fatalf("ids fell in %d slots", len(slots))
	}
	var calls sync.Map
	ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
	defer cancel()
	items, err := c.GetMany(ctx, ids, fetchByID(&calls), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, it := range items {
		want := "computed"
		if i%2 == 0 {
			want = "redis"
		}
		if it.Err != nil || string(it.Value) != "v-"+it.ID || it.Served.String() != want {
			t.Errorf("%q: %q/%v, %v; want %s", it.ID, it.Value, it.Served, it.Err, want)
		}
	}
	// Now all hits: GETs alone, no lookup, no MGET (CROSSSLOT).
	evals := rt.named("evalsha") + rt.named("eval")
	items, err = c.GetMany(ctx, ids, noFetchID, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if it.Err != nil || it.Served != ServedRedis {
			t.Errorf("%q: %v, %v", it.ID, it.Served, it.Err)
		}
	}
	if n := rt.named("evalsha") + rt.named("eval") - evals; n != 0 || rt.named("mget") != 0 {
		t.Errorf("all hits cost %d lookups and %d MGETs", n, rt.named("mget"))
	}
}

// The caller's deadline holds while Redis stalls and go-redis ignores
// context deadlines on reads (its default): for the hits' read and for the
// misses' lookups.
func TestGetMany_DeadlineHoldsWhileRedisStalls(t *testing.T) {
	srv := redistest.Start(t, "--enable-debug-command", "yes")
	c := stalledClient(t, srv, "stall", func(c *testClient) {
		if _, err := c.Get(bg(), "warm", constFetch(new(atomic.Int64), "w", 0)); err != nil {
			t.Fatal(err)
		}
	})

	ids := []string{"a", "b", "warm", "a"}
	for _, opts := range []*ManyOptions{nil, {Batch: batchByID(new(sync.Mutex), new([][]string))}} {
		ctx, cancel := context.WithTimeout(bg(), 200*time.Millisecond)
		t0 := time.Now()
		items, err := c.GetMany(ctx, ids, noFetchID, opts)
		d := time.Since(t0)
		cancel()
		if err != nil || d > stalledBound {
			t.Fatalf("GetMany returned %v after %v (deadline 200ms; go-redis would give up after %v)", err, d, stalledReadTimeout)
		}
		for _, it := range items {
			if !errors.Is(it.Err, ErrTimeout) || !errors.Is(it.Err, context.DeadlineExceeded) {
				t.Errorf("%q: %v, want ErrTimeout and DeadlineExceeded", it.ID, it.Err)
			}
		}
	}
}

func TestGetMany_RejectsBadInputAndAClosedClient(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "bad", nil)
	closed := newTestClient(t, b.addr, "bad", nil)
	if err := closed.Close(); err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(bg())
	cancel()
	fetch := fetchByID(new(sync.Map))
	var nilCtx context.Context
	cases := []struct {
		name  string
		c     *Client
		ctx   context.Context
		fetch FetchIDFunc
		opts  *ManyOptions
		want  error
		text  string
	}{
		{"nil context", c.Client, nilCtx, fetch, nil, ErrInvalid, "context is nil"},
		{"nil fetch without Batch", c.Client, bg(), nil, &ManyOptions{Concurrency: 4}, ErrInvalid, "fetch is nil"},
		{"negative concurrency", c.Client, bg(), fetch, &ManyOptions{Concurrency: -1}, ErrInvalid, "Concurrency -1"},
		{"closed client", closed.Client, bg(), fetch, nil, ErrClosed, ""},
		{"nil client", nil, bg(), fetch, nil, ErrInvalid, "nil"},
		{"zero client", &Client{}, bg(), fetch, nil, ErrInvalid, "nil"},
		{"context done", c.Client, done, fetch, nil, ErrTimeout, ""},
	}
	before := c.commands.n.Load()
	for _, tc := range cases {
		items, err := tc.c.GetMany(tc.ctx, []string{"a"}, tc.fetch, tc.opts)
		if !errors.Is(err, tc.want) || !strings.Contains(fmt.Sprint(err), tc.text) || items != nil {
			t.Errorf("%s: %v, %v; want %v containing %q", tc.name, items, err, tc.want, tc.text)
		}
	}
	items, err := c.GetMany(bg(), nil, fetch, nil)
	if err != nil || items == nil || len(items) != 0 {
		t.Errorf("no ids: %v, %v; want an empty slice", items, err)
	}
	if n := c.commands.n.Load() - before; n != 0 {
		t.Errorf("%d commands sent for bad input and no ids", n)
	}
}

// Close during a GetMany whose batch is running ends the batch's context,
// and every caller returns.
func TestGetMany_CloseEndsARunningBatch(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "closing", nil)
	started := make(chan struct{})
	batch := func(ctx context.Context, ids []string) (map[string]BatchValue, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	done := make(chan []Item, 1)
	go func() {
		items, _ := c.GetMany(bg(), []string{"a", "b"}, nil, &ManyOptions{Batch: batch})
		done <- items
	}()
	<-started
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case items := <-done:
		for _, it := range items {
			if !errors.Is(it.Err, ErrClosed) {
				t.Errorf("%q: %v, want ErrClosed", it.ID, it.Err)
			}
		}
	case <-time.After(5 * time.Second):
		t.Fatal("GetMany did not return after Close")
	}
}

// BenchmarkGetMany compares reading 100 stored values with one GetMany,
// with 100 Gets one after another, and with 100 Gets at once (which the
// batcher pipelines).
func BenchmarkGetMany(b *testing.B) {
	const n = 100
	srv := realBackend(b)
	ids := storeKeys(b, rawClient(b, srv.addr), "many", n)
	run := func(b *testing.B, get func(c *Client)) {
		rdb := rawClient(b, srv.addr)
		rt := countRoundTrips(rdb)
		c, err := New(rdb, "many", nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close() })
		get(c) // load the scripts
		before := rt.n.Load()
		b.ResetTimer()
		for b.Loop() {
			get(c)
		}
		b.ReportMetric(float64(rt.n.Load()-before)/float64(b.N), "roundtrips/op")
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/id")
	}
	b.Run("GetMany", func(b *testing.B) {
		run(b, func(c *Client) {
			items, err := c.GetMany(bg(), ids, failFetchID, nil)
			if err != nil {
				b.Fatal(err)
			}
			for _, it := range items {
				if it.Err != nil || it.Served != ServedRedis {
					b.Fatalf("%q: %v, %v", it.ID, it.Served, it.Err)
				}
			}
		})
	})
	b.Run("Get-sequential", func(b *testing.B) {
		run(b, func(c *Client) {
			for _, id := range ids {
				if _, err := c.Get(bg(), id, failFetch); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("Get-concurrent", func(b *testing.B) {
		run(b, func(c *Client) {
			var wg sync.WaitGroup
			for _, id := range ids {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, err := c.Get(bg(), id, failFetch); err != nil {
						b.Error(err)
					}
				}()
			}
			wg.Wait()
		})
	})
}

// goexitError's Error ends the goroutine that asks it (a test helper's
// error type calling t.FailNow, say).
type goexitError struct{}

func (goexitError) Error() string { runtime.Goexit(); return "" }

// However a batch ends, every member gets an answer: a per-id error whose
// Error calls runtime.Goexit fails its own id alone. It once ended the
// loop that answers the batch's members (the error was examined there),
// leaving the other ids and Close waiting for good.
func TestGetMany_ABatchErrorThatEndsItsGoroutineFailsOnlyItsID(t *testing.T) {
	b := miniBackend(t)
	c := newTestClient(t, b.addr, "goexit", nil)
	ctx, cancel := context.WithTimeout(bg(), 10*time.Second) // a bound for "answered at all"
	defer cancel()
	items, err := c.GetMany(ctx, []string{"a", "b", "c"}, nil, &ManyOptions{Batch: func(_ context.Context, ids []string) (map[string]BatchValue, error) {
		res := map[string]BatchValue{}
		for _, id := range ids {
			res[id] = BatchValue{Value: []byte("v-" + id), TTL: time.Minute}
		}
		res["a"] = BatchValue{Err: goexitError{}}
		return res, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		switch {
		case it.ID == "a" && it.Err == nil:
			t.Errorf("a: %q; want an error", it.Value)
		case it.ID != "a" && (it.Err != nil || string(it.Value) != "v-"+it.ID):
			t.Errorf("%s: %q, %v; want its value", it.ID, it.Value, it.Err)
		}
	}
}
