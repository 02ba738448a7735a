// Package bench compares memolock with the caches a Go team would pick
// instead: go-redis/cache with its TinyLFU local cache, and rueidisaside
// (rueidis's cache-aside client on server-assisted client-side caching).
// It is a module of its own so that the library's go.mod never depends on
// them. See README.md.
package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// redisAddr is the address of the private redis-server TestMain starts, or
// "" when there is none (redis-server missing outside CI).
var redisAddr string

// redisPID is the process id of that redis-server: the cross-process
// benchmarks read its CPU time.
var redisPID int

// redisServer is a variable so that the CI=true failure path can be tried:
// go test -ldflags "-X github.com/memolock/memolock/bench.redisServer=/nonexistent".
var redisServer = "/usr/bin/redis-server"

// TestMain starts a private redis-server on a free loopback port (never a
// server someone else runs), runs the tests and benchmarks, stops it, and
// then checks that no goroutine leaked.
func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChild(spec)) // a process of the cross-process benchmarks
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// go-redis logs failed dials; the server stops before the leak check.
	redis.SetLogger(quietLogger{})
	stop, err := startRedis()
	switch {
	case err != nil && os.Getenv("CI") == "true":
		fmt.Fprintf(os.Stderr, "FAIL: CI=true and no private redis-server: %v\n", err)
		return 1
	case err != nil:
		fmt.Fprintf(os.Stderr, "skipping every test and benchmark: %v\n", err)
	}
	code := m.Run()
	if stop != nil {
		stop()
	}
	if code == 0 {
		// No IgnoreTopFunction: memolock, go-redis/cache (TinyLFU keeps no
		// goroutine), go-redis and rueidis all stop their goroutines on Close,
		// and every test and benchmark closes what it opens.
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			return 1
		}
	}
	return code
}

// startRedis starts redis-server on a free port without persistence and
// returns a function that kills it.
func startRedis() (stop func(), err error) {
	if _, err := os.Stat(redisServer); err != nil {
		return nil, fmt.Errorf("%s: %w", redisServer, err)
	}
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(redisServer,
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--daemonize", "no",
			"--loglevel", "warning")
		// Its own process group, so a ^C to the test does not race us.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		kill := func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if err := waitPing(addr, 5*time.Second); err != nil {
			kill() // probably lost the port to someone else: try another
			continue
		}
		redisAddr, redisPID = addr, cmd.Process.Pid
		return kill, nil
	}
	return nil, errors.New("redis-server did not start on a free port in 5 attempts")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func waitPing(addr string, within time.Duration) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// needRedis skips when TestMain found no redis-server (outside CI only).
func needRedis(tb testing.TB) string {
	tb.Helper()
	if redisAddr == "" {
		tb.Skip("no private redis-server")
	}
	return redisAddr
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
