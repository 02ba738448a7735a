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

var demoCommand = command{
	name:    "demo",
	summary: "show a stampede on one missing key, with memolock and without it",
	usage: []string{
		"demo [--redis URL [--cluster]] [--clients N] [--goroutines N] [--fetch DURATION]",
		"demo --interop [--redis URL] [--processes N] [--interop-dir DIR]",
	},
	about: `Starts --clients independent clients of --goroutines goroutines each, which all ask at once for one missing key whose computation takes --fetch: first through memolock, then with plain GET and SET. It prints how many computations each way took, their latencies, and how many Redis commands they sent. Without --redis it runs on an embedded miniredis; with --redis it uses fresh keys, and deletes them after.

With --interop it starts memolock run in Go, Python and C# processes on one key instead, from a clone's interop directory, and shows that one of them ran the command and all printed its output. It needs two languages at least: Debian's /usr/bin/python3 with python3-redis, and mono with mcs.`,
	flags: []string{"redis", "cluster", "clients", "goroutines", "fetch", "metrics", "interop", "processes", "interop-dir"},
	exits: [][2]string{
		{"0", "the demo ran, and memolock computed once"},
		{"1", "a run failed; or, with --interop, fewer than two languages could run, or their outputs differ"},
		{"2", "bad usage"},
	},
	example: [][2]string{
		{"The stampede on an embedded Redis.", "memolock demo"},
		{"The same on a real server, 1,600 callers.", "memolock demo --redis redis://127.0.0.1:6379 --clients 8 --goroutines 200"},
		{"Go, Python and C# processes on one key, from a clone's root.", "memolock demo --interop"},
	},
}

func demo(args []string, stdout, stderr io.Writer) int {
	c := &demoCommand
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	redisURL := fs.String("redis", "", "`URL` of the Redis server to run on, redis:// or rediss:// (default: an embedded miniredis)")
	clients := newInt(fs, "clients", 8, "`N` independent clients, each with connections of its own, as separate processes would have")
	goroutines := newInt(fs, "goroutines", 200, "`N` goroutines per client")
	fetch := newDuration(fs, "fetch", 200*time.Millisecond, "how long the expensive computation takes, a `DURATION`")
	interop := fs.Bool("interop", false, "run Go, Python and C# processes (memolock run) on one key instead; --fetch at least 1s")
	interopDir := fs.String("interop-dir", "interop", "with --interop: the interop directory of a memolock clone, a `DIR`")
	perPeer := newInt(fs, "processes", 2, "with --interop: `N` processes per language, 1 to 50")
	metrics := fs.Bool("metrics", false, "print the memolock run's OpenTelemetry metrics, as the SDK recorded them")
	cluster := fs.Bool("cluster", false, clusterUsage)
	if code, ok := parse(c, fs, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(c, stderr, "unexpected argument %q; --cluster takes no value, give the URL with --redis", redactArg(fs.Arg(0)))
	}
	if *perPeer < 1 || *perPeer > 50 {
		return usageError(c, stderr, "--processes must be between 1 and 50")
	}
	if *clients < 1 || *goroutines < 1 || *fetch < 0 {
		return usageError(c, stderr, "--clients and --goroutines must be at least 1, --fetch not negative")
	}
	if *clients > maxClients || *clients**goroutines > maxGoroutines {
		return usageError(c, stderr, "%d clients x %d goroutines is too many: the demo runs at most %d clients and %d goroutines in all (each costs a few KB)",
			*clients, *goroutines, maxClients, maxGoroutines)
	}

	if *cluster && (*redisURL == "" || *interop) {
		return usageError(c, stderr, "--cluster needs --redis with a cluster URL, and does not apply to --interop")
	}
	opts := &redis.Options{}
	// newRDB makes one client: of one server, or of the cluster.
	newRDB := func() redis.UniversalClient { o := *opts; return redis.NewClient(&o) }
	where := "embedded miniredis"
	url := *redisURL
	if *cluster {
		copts, err := parseClusterURL(*redisURL)
		if err != nil {
			return usageError(c, stderr, "--redis %v", err)
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
			return usageError(c, stderr, "--redis %v", err)
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
			return usageError(c, stderr, "--clients and --goroutines do not apply to --interop; use --processes")
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
		fmt.Fprintf(stderr, "memolock demo: %s run: %s\n", name, libError(err))
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
