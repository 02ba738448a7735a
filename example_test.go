package memolock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/memolock/memolock"
)

// A stampede: 100 goroutines in each of 3 clients (think 3 processes) miss
// the same key at once, and the value is computed once.
func ExampleClient_Get() {
	srv, _ := miniredis.Run()
	defer srv.Close()

	var computed atomic.Int64
	countLikes := func(ctx context.Context, _ *memolock.Lease) ([]byte, time.Duration, error) {
		computed.Add(1)
		time.Sleep(50 * time.Millisecond) // the expensive part
		return []byte("42"), time.Minute, nil
	}

	var wg sync.WaitGroup
	for range 3 {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		defer rdb.Close()
		likes, err := memolock.New(rdb, "likes", nil)
		if err != nil {
			panic(err)
		}
		defer likes.Close()
		for range 100 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := likes.Get(context.Background(), "kristoff", countLikes); err != nil {
					panic(err)
				}
			}()
		}
	}
	wg.Wait()
	v, _ := srv.Get("likes:kristoff")
	fmt.Printf("computed %d time(s), stored %q\n", computed.Load(), v)
	// Output: computed 1 time(s), stored "42"
}

type User struct {
	Name  string `json:"name"`
	Admin bool   `json:"admin"`
}

// Typed values are stored as JSON unless another Codec is given.
func ExampleTyped_Get() {
	srv, _ := miniredis.Run()
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	c, _ := memolock.New(rdb, "users", nil)
	defer c.Close()

	users := memolock.Typed[User]{Client: c}
	u, err := users.Get(context.Background(), "7", func(ctx context.Context, _ *memolock.Lease) (User, time.Duration, error) {
		return User{Name: "ada", Admin: true}, time.Hour, nil
	})
	stored, _ := srv.Get("users:7")
	fmt.Println(u.Name, err, stored)
	// Output: ada <nil> {"name":"ada","admin":true}
}

// The basic use, against a Redis on 127.0.0.1:6379. (Not run by go test:
// it needs that server.)
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	likes, err := memolock.New(rdb, "likes", &memolock.Options{LockTTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer likes.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v, err := likes.Get(ctx, "kristoff", func(ctx context.Context, lease *memolock.Lease) ([]byte, time.Duration, error) {
		n, err := countLikes(ctx, "kristoff") // runs once across all processes
		return []byte(strconv.Itoa(n)), time.Minute, err
	})
	switch {
	case errors.Is(err, memolock.ErrTimeout):
		log.Print("no value within 2s") // the computation goes on for others
	case err != nil:
		log.Print(err)
	default:
		fmt.Printf("%s likes\n", v)
	}
}

func countLikes(ctx context.Context, user string) (int, error) { return 42, nil }

// Typed values, with the JSON codec.
func ExampleTyped() {
	srv, _ := miniredis.Run()
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	c, _ := memolock.New(rdb, "users", nil)
	defer c.Close()
	ctx := context.Background()

	users := memolock.Typed[User]{Client: c}
	u, err := users.Get(ctx, "42", func(ctx context.Context, _ *memolock.Lease) (User, time.Duration, error) {
		return loadUser(ctx, 42)
	})
	fmt.Println(u.Name, err)
	// Output: ada <nil>
}

func loadUser(ctx context.Context, id int) (User, time.Duration, error) {
	return User{Name: "ada"}, time.Hour, nil
}

// Not found, stale on error and refresh ahead: the layered cache options.
func ExampleOptions() {
	srv, _ := miniredis.Run()
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	cache, err := memolock.New(rdb, "users", &memolock.Options{
		NegTTL:       30 * time.Second,
		StaleTTL:     time.Hour,
		RefreshAhead: 10 * time.Second,
		Logger:       slog.Default(),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer cache.Close()
	r, err := cache.GetResult(ctx, "42", func(ctx context.Context, _ *memolock.Lease) ([]byte, time.Duration, error) {
		u, err := loadUserRow(ctx, 42)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, 0, memolock.ErrNotFound
		}
		return u, time.Minute, err
	})
	switch {
	case errors.Is(err, memolock.ErrNotFound):
		fmt.Println("no such user")
	case err != nil:
		log.Print(err)
	case r.Served == memolock.ServedStale:
		fmt.Printf("%s (stale: the database is failing)\n", r.Value)
	default:
		fmt.Printf("%s\n", r.Value)
	}
	// Output: {"name":"ada"}
}

func loadUserRow(ctx context.Context, id int) ([]byte, error) {
	if id != 42 {
		return nil, sql.ErrNoRows
	}
	return []byte(`{"name":"ada"}`), nil
}
