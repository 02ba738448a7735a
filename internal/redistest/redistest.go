// Package redistest starts private redis-server processes for tests, on free
// ports, so that tests can kill and restart them without touching a shared
// server.
//
// When redis-server is not installed, Start skips the test, unless the
// environment variable CI is "true": then it fails, so that CI never passes
// by skipping.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is one redis-server process.
type Server struct {
	Addr string
	port int
	bin  string
	args []string
	cmd  *exec.Cmd
	dir  string
}

// Start starts a redis-server with no persistence on a free loopback port
// and stops it when the test ends. extra are added to its command line.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server not found and CI=true: install it (apt-get install -y redis-server)")
		}
		t.Skip("redis-server not installed; set CI=true to make this a failure")
	}
	s := &Server{bin: bin, dir: t.TempDir()}
	var lastErr error
	for range 5 {
		s.port, lastErr = freePort()
		if lastErr != nil {
			continue
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		s.args = append([]string{
			"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", s.dir,
			"--daemonize", "no", "--loglevel", "warning",
		}, extra...)
		if lastErr = s.start(); lastErr == nil {
			t.Cleanup(s.Kill)
			return s
		}
	}
	t.Fatalf("starting redis-server: %v", lastErr)
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) start() error {
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.dir
	dieWithParent(cmd)
	log, err := os.Create(s.dir + "/redis.log")
	if err != nil {
		return err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd = cmd
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if s.ping() == nil {
			if err := s.owned(); err != nil {
				s.Kill()
				return err
			}
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.Kill()
	out, _ := os.ReadFile(s.dir + "/redis.log")
	return fmt.Errorf("redis-server on %s did not answer PING: %s", s.Addr, out)
}

// ping speaks RESP over a raw connection, so that checking the server
// leaves no client goroutines behind.
func (s *Server) ping() error {
	c, err := net.DialTimeout("tcp", s.Addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("unexpected reply %q", line)
	}
	return nil
}

// owned checks that the server answering on s.Addr is the process s
// started: between freePort and the server's bind, another test binary
// (another package's, or a second run on the same machine) may have taken
// the port, and this server then failed to bind while that one answers.
func (s *Server) owned() error {
	c, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("INFO server\r\n")); err != nil {
		return err
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if !strings.HasPrefix(head, "$") || err != nil {
		return fmt.Errorf("INFO server on %s: unexpected reply %q", s.Addr, head)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return err
	}
	want := "process_id:" + strconv.Itoa(s.cmd.Process.Pid) + "\r\n"
	if !strings.Contains(string(body), want) {
		return fmt.Errorf("the server on %s is not the one started there (pid %d): the port was taken", s.Addr, s.cmd.Process.Pid)
	}
	return nil
}

// Kill stops the server at once with SIGKILL, as a crash would. It is safe
// to call on a server that is already down.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart kills the server and starts a new, empty one on the same port.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Kill()
	var err error
	for range 50 {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("restarting redis-server: %v", err)
}

// Client returns a go-redis client of the server, closed when the test ends.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Do runs one command on a connection of its own and returns its result.
func (s *Server) Do(t testing.TB, args ...any) any {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Protocol: 2})
	defer c.Close()
	v, err := c.Do(context.Background(), args...).Result()
	if err != nil && err != redis.Nil {
		t.Fatalf("%v: %v", args, err)
	}
	return v
}

// StartSentinel starts a Redis Sentinel watching master under the name
// "mymaster", with a quorum of 1, and stops it when the test ends.
func StartSentinel(t testing.TB, master *Server) *Server {
	t.Helper()
	s := Start(t) // a port and a directory; replaced below
	s.Kill()
	conf := s.dir + "/sentinel.conf"
	host, port, _ := net.SplitHostPort(master.Addr)
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor mymaster %s %s 1\n", s.port, s.dir, host, port)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	s.args = []string{conf, "--sentinel"}
	if err := s.start(); err != nil {
		t.Fatalf("starting redis sentinel: %v", err)
	}
	return s
}

// StartCluster starts a Redis Cluster of n masters, no replicas, and stops
// it when the test ends. It returns the nodes.
func StartCluster(t testing.TB, n int) []*Server {
	t.Helper()
	return StartClusterWithReplicas(t, n, 0)
}

// StartClusterWithReplicas starts masters redis-servers in cluster mode,
// each with replicas replicas, and a node timeout of 1s so that a killed
// master fails over within seconds. The masters come first in the result,
// then the replicas (which replica follows which master is the cluster's
// choice: ask CLUSTER NODES). extra are added to every server's command
// line.
func StartClusterWithReplicas(t testing.TB, masters, replicas int, extra ...string) []*Server {
	t.Helper()
	n := masters * (1 + replicas)
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-cli not found and CI=true: install redis-tools")
		}
		t.Skip("redis-cli not installed")
	}
	var nodes []*Server
	args := []string{"--cluster", "create"}
	for range n {
		s := Start(t, append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000"}, extra...)...)
		nodes = append(nodes, s)
		args = append(args, s.Addr)
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range nodes {
		for {
			info, _ := s.Do(t, "CLUSTER", "INFO").(string)
			repl, _ := s.Do(t, "INFO", "replication").(string)
			// A replica counts once it has synced: one that never did
			// cannot take over when its master dies.
			synced := !strings.Contains(repl, "role:slave") || strings.Contains(repl, "master_link_status:up")
			if strings.Contains(info, "cluster_state:ok") && synced {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster on %s not ready: %s", s.Addr, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nodes
}

// Stall makes the server stall, as a frozen Redis would, until the test
// ends: it sends DEBUG SLEEP (start the server with
// --enable-debug-command yes), and returns once a PING has gone a whole
// second without an answer. The test's cleanup kills the server, which ends
// the sleep. A stall that outlasts the test, rather than one of a few
// seconds, never ends early on a loaded machine, so a test can give what it
// checks all the time it needs.
func (s *Server) Stall(t testing.TB) {
	t.Helper()
	// No read timeout and no retries: go-redis would otherwise give up on
	// the sleep after ReadTimeout and send it again.
	sleeper := redis.NewClient(&redis.Options{Addr: s.Addr, Protocol: 2, ReadTimeout: -1, MaxRetries: -1})
	if err := sleeper.Ping(context.Background()).Err(); err != nil {
		_ = sleeper.Close()
		t.Fatalf("redis-server on %s before the stall: %v", s.Addr, err)
	}
	slept := make(chan error, 1)
	go func() { slept <- sleeper.Do(context.Background(), "DEBUG", "SLEEP", stallSeconds).Err() }()
	t.Cleanup(func() {
		s.Kill()
		<-slept // the connection dropped with the server
		_ = sleeper.Close()
	})
	deadline := time.Now().Add(30 * time.Second)
	for !stalledFor(s.Addr, time.Second) {
		select {
		case err := <-slept:
			slept <- err // for the cleanup
			t.Fatalf("DEBUG SLEEP on %s returned early: %v (start the server with --enable-debug-command yes)", s.Addr, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s still answers PING 30s after DEBUG SLEEP", s.Addr)
		}
	}
}

// stallSeconds is how long Stall's DEBUG SLEEP lasts: longer than any test.
const stallSeconds = 3600

// stalledFor reports whether the server at addr leaves a PING unanswered
// for d, as during DEBUG SLEEP. A short d can mistake a busy machine for a
// stall.
func stalledFor(addr string, d time.Duration) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	_, err = bufio.NewReader(c).ReadString('\n')
	var nerr net.Error
	return errors.As(err, &nerr) && nerr.Timeout()
}

// Silent starts a server that accepts connections and never answers, and
// stops it when the test ends. It returns its address.
func Silent(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}
