package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock"
)

func demo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("memolock demo", flag.ContinueOnError)
	fs.SetOutput(flagOutput(stderr, args))
	redisURL := fs.String("redis", "", "Redis URL (default: an embedded miniredis)")
	clients := fs.Int("clients", 8, "independent clients, each with its own connections, like separate processes")
	goroutines := fs.Int("goroutines", 200, "goroutines per client")
	fetch := fs.Duration("fetch", 200*time.Millisecond, "how long the expensive computation takes")
	interop := fs.Bool("interop", false, "run Go, Python and C# processes (memolock run) on one key instead (--fetch at least 1s)")
	interopDir := fs.String("interop-dir", "interop", "with --interop: the repository's interop directory")
	perPeer := fs.Int("processes", 2, "with --interop: processes per language")
	metrics := fs.Bool("metrics", false, "print the memolock run's OpenTelemetry metrics, as the SDK recorded them")
	cluster := fs.Bool("cluster", false, "--redis is a Redis Cluster: redis://host:port?addr=host2:port2&addr=... (seed nodes)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "memolock demo: unexpected argument %q; --cluster takes no value, give the URL with --redis\n", redactArg(fs.Arg(0)))
		return 2
	}
	if *perPeer < 1 || *perPeer > 50 {
		fmt.Fprintln(stderr, "memolock demo: --processes must be between 1 and 50")
		return 2
	}
	if *clients < 1 || *goroutines < 1 || *fetch < 0 {
		fmt.Fprintln(stderr, "memolock demo: --clients and --goroutines must be at least 1, --fetch not negative")
		return 2
	}
	if *clients > maxClients || *clients**goroutines > maxGoroutines {
		fmt.Fprintf(stderr, "memolock demo: %d clients x %d goroutines is too many: the demo runs at most %d clients and %d goroutines in all (each costs a few KB)\n",
			*clients, *goroutines, maxClients, maxGoroutines)
		return 2
	}

	if *cluster && (*redisURL == "" || *interop) {
		fmt.Fprintln(stderr, "memolock demo: --cluster needs --redis with a cluster URL, and does not apply to --interop")
		return 2
	}
	opts := &redis.Options{}
	// newRDB makes one client: of one server, or of the cluster.
	newRDB := func() redis.UniversalClient { o := *opts; return redis.NewClient(&o) }
	where := "embedded miniredis"
	url := *redisURL
	if *cluster {
		copts, err := redis.ParseClusterURL(*redisURL)
		if err != nil || redact(*redisURL) == withheld {
			fmt.Fprintf(stderr, "memolock demo: --redis %s is not a valid Redis Cluster URL\n", redact(*redisURL))
			return 2
		}
		newRDB = func() redis.UniversalClient { o := *copts; return redis.NewClusterClient(&o) }
		where = "cluster " + redact(*redisURL)
	} else if *redisURL == "" {
		m, err := miniredis.Run()
		if err != nil {
			fmt.Fprintf(stderr, "memolock demo: starting miniredis: %v\n", err)
			return 1
		}
		defer m.Close()
		opts.Addr = m.Addr()
		url = "redis://" + m.Addr()
		where += " on " + m.Addr()
	} else {
		var err error
		if opts, err = parseRedisURL(*redisURL); err != nil {
			fmt.Fprintf(stderr, "memolock demo: --redis %v\n", err)
			return 2
		}
		where = redact(*redisURL)
	}

	// A fresh key, so that the demo never reads an old value and can clean
	// up after itself on a shared server.
	var b [8]byte
	_, _ = rand.Read(b[:])
	id := "report-" + hex.EncodeToString(b[:])
	const tag = "memolock-demo"
	if *interop {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if set["clients"] || set["goroutines"] {
			fmt.Fprintln(stderr, "memolock demo: --clients and --goroutines do not apply to --interop; use --processes")
			return 2
		}
		if *fetch < time.Second {
			*fetch = time.Second // so that every process, Mono's and Python's too, starts before it ends
		}
		defer func() {
			cleanup := redis.NewClient(opts)
			_ = cleanup.Del(context.Background(), tag+":"+id, tag+"/lock:"+id).Err()
			_ = cleanup.Close()
		}()
		return demoInterop(*interopDir, url, where, id, *perPeer, *fetch, stdout, stderr)
	}

	fmt.Fprintf(stdout, "memolock demo: %d clients x %d goroutines ask for one missing key at once;\n", *clients, *goroutines)
	fmt.Fprintf(stdout, "computing it takes %v. Redis: %s.\n\n", *fetch, where)

	plainKey := tag + ":" + id + ":unprotected"
	defer func() {
		cleanup := newRDB()
		wire := id
		if *cluster {
			wire, _ = memolock.PlaceID(id)
		}
		// One key at a time: on a cluster they are in different slots.
		for _, k := range []string{tag + ":" + wire, tag + "/lock:" + wire, plainKey} {
			_ = cleanup.Del(context.Background(), k).Err()
		}
		_ = cleanup.Close()
	}()

	var meters *demoMeters
	if *metrics {
		meters = newDemoMeters()
		defer meters.shutdown()
	}
	fmt.Fprintf(stdout, "%-15s %13s %12s %12s %15s\n", "", "computations", "p50 latency", "p99 latency", "redis commands")
	protected, err := stampede(newRDB, *clients, *goroutines, *fetch, tag, meters, func(rdb redis.UniversalClient, c *memolock.Client, compute func()) error {
		_, err := c.Get(context.Background(), id, func(context.Context, *memolock.Lease) ([]byte, time.Duration, error) {
			compute()
			return []byte("the report"), time.Minute, nil
		})
		return err
	})
	code := 0
	if !printRow(stdout, stderr, "memolock", protected, err) {
		code = 1
	} else if protected.computations != 1 {
		fmt.Fprintf(stderr, "memolock demo: expected 1 computation with memolock, got %d\n", protected.computations)
		code = 1
	}
	unprotected, err := stampede(newRDB, *clients, *goroutines, *fetch, "", nil, func(rdb redis.UniversalClient, _ *memolock.Client, compute func()) error {
		ctx := context.Background()
		if err := rdb.Get(ctx, plainKey).Err(); err != redis.Nil {
			return err
		}
		compute()
		return rdb.Set(ctx, plainKey, "the report", time.Minute).Err()
	})
	if !printRow(stdout, stderr, "no protection", unprotected, err) {
		code = 1
	}
	fmt.Fprintf(stdout, "\nRedis commands are counted by the clients (connection set-up excluded).\n")
	if meters != nil {
		meters.print(stdout)
	}
	return code
}

// The demo's limits: each goroutine costs a few KB, each client its
// connections.
const (
	maxClients    = 1000
	maxGoroutines = 1_000_000
)

// printRow prints one line of the table, or why that run failed. It
// reports whether the run succeeded.
func printRow(stdout, stderr io.Writer, name string, res result, err error) bool {
	if err != nil {
		fmt.Fprintf(stdout, "%-15s %13s\n", name, "failed")
		fmt.Fprintf(stderr, "memolock demo: %s run: %v\n", name, err)
		return false
	}
	fmt.Fprintf(stdout, "%-15s %13d %12v %12v %15d\n", name, res.computations,
		res.p50.Round(time.Millisecond/10), res.p99.Round(time.Millisecond/10), res.commands)
	return true
}

type result struct {
	computations int64
	commands     int64
	p50, p99     time.Duration
}

// stampede runs get on every goroutine of every client at once and counts
// computations, commands and latencies. With a tag, each client also gets a
// memolock.Client, whose metrics go to meters if set.
func stampede(newRDB func() redis.UniversalClient, clients, goroutines int, fetch time.Duration, tag string, meters *demoMeters,
	get func(redis.UniversalClient, *memolock.Client, func()) error) (result, error) {
	var (
		computed atomic.Int64
		counters []*counter
		mcs      []*memolock.Client
		rdbs     []redis.UniversalClient
	)
	defer func() {
		for _, c := range mcs {
			if c != nil {
				_ = c.Close()
			}
		}
		for _, r := range rdbs {
			_ = r.Close()
		}
	}()
	for range clients {
		rdb := newRDB()
		cnt := &counter{}
		rdb.AddHook(cnt)
		rdbs, counters = append(rdbs, rdb), append(counters, cnt)
		if tag != "" {
			opts := &memolock.Options{LockTTL: 30 * time.Second}
			if meters != nil {
				opts.MeterProvider = meters.provider
			}
			c, err := memolock.New(rdb, tag, opts)
			if err != nil {
				return result{}, err
			}
			mcs = append(mcs, c)
		} else {
			mcs = append(mcs, nil)
		}
	}
	compute := func() {
		computed.Add(1)
		time.Sleep(fetch)
	}

	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		lat   = make([]time.Duration, clients*goroutines)
		errs  = make(chan error, clients*goroutines)
	)
	for i := range clients {
		for j := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				t0 := time.Now()
				if err := get(rdbs[i], mcs[i], compute); err != nil {
					errs <- err
				}
				lat[i*goroutines+j] = time.Since(t0)
			}()
		}
	}
	close(start)
	wg.Wait()
	close(errs)
	if n := len(errs); n > 0 {
		return result{}, fmt.Errorf("%d of %d callers failed, the first with: %w", n, clients*goroutines, <-errs)
	}

	res := result{computations: computed.Load()}
	for i, cnt := range counters {
		res.commands += cnt.n.Load()
		if mcs[i] != nil {
			res.commands += mcs[i].Stats().PubSubCommands()
		}
	}
	slices.Sort(lat)
	res.p50, res.p99 = lat[len(lat)/2], lat[len(lat)*99/100]
	if meters != nil {
		if err := meters.collect(); err != nil {
			return res, fmt.Errorf("collecting metrics: %w", err)
		}
	}
	return res, nil
}

// counter is a go-redis hook that counts the commands a client sends.
type counter struct{ n atomic.Int64 }

func (h *counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}
func (h *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.count(cmd)
		}
		return next(ctx, cmds)
	}
}

// count skips the commands go-redis sends to set up each new connection.
func (h *counter) count(cmd redis.Cmder) {
	switch cmd.Name() {
	case "hello", "client", "auth", "select":
	default:
		h.n.Add(1)
	}
}
