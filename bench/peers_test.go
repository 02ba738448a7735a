package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-redis/cache/v9"
	"github.com/memolock/memolock"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidisaside"
	"golang.org/x/sync/singleflight"
)

// The libraries that the cross-process benchmarks (BenchmarkMassMiss,
// BenchmarkHotKeyProcesses) compare, each run in processes of its own. Each
// reads a key and computes it on a miss with the caller's fetch:
//
//   - memolock: memolock.Client.Get, without L1;
//   - singleflight-GET: x/sync/singleflight around a go-redis GET, and on a
//     miss the fetch and a SET: what a Go service writes by hand;
//   - go-redis-cache-TinyLFU: go-redis/cache's Once (its singleflight, local
//     TinyLFU, GET, and SET after the fetch);
//   - rueidisaside: rueidisaside's Get (client-side caching, and a lock of
//     its own in the key while one client computes).
const (
	libMemolock = "memolock"
	libSFGet    = "singleflight-GET"
	libTinyLFU  = "go-redis-cache-TinyLFU"
	libAside    = "rueidisaside"
)

var allLibs = []string{libMemolock, libSFGet, libTinyLFU, libAside}

// valueTTL is the TTL of every value a fetch stores (each round uses new
// keys, so the private server does not fill up).
const valueTTL = time.Minute

// memolockTag is the tag of the memolock peer: it reads key k at
// memolockTag+":"+k.
const memolockTag = "mlp"

// peer is one client of one library, in a child process.
type peer interface {
	// get returns key's value; on a miss the library calls fetch (at most
	// once per computation it makes).
	get(ctx context.Context, key string, fetch func() ([]byte, error)) ([]byte, error)
	close()
}

// redisKey is where lib keeps key in Redis: the parent stores the hot key
// there. Each library has keys of its own.
func redisKey(lib, key string) string {
	switch lib {
	case libMemolock:
		return memolockTag + ":" + key
	case libSFGet:
		return "sfp:" + key
	case libTinyLFU:
		return "grcp:" + key
	case libAside:
		return "ruep:" + key
	}
	panic("unknown library " + lib)
}

func newPeer(lib, addr string) (peer, error) {
	switch lib {
	case libMemolock:
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		c, err := memolock.New(rdb, memolockTag, nil)
		if err != nil {
			_ = rdb.Close()
			return nil, err
		}
		return &memolockPeer{rdb: rdb, c: c}, nil
	case libSFGet:
		return &sfPeer{rdb: redis.NewClient(&redis.Options{Addr: addr})}, nil
	case libTinyLFU:
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		return &tinyLFUPeer{rdb: rdb, cd: cache.New(&cache.Options{Redis: rdb, LocalCache: cache.NewTinyLFU(l1Size, localTTL)})}, nil
	case libAside:
		ca, err := rueidisaside.NewClient(rueidisaside.ClientOption{
			ClientOption: rueidis.ClientOption{InitAddress: []string{addr}},
		})
		if err != nil {
			return nil, err
		}
		return &asidePeer{ca: ca}, nil
	}
	return nil, fmt.Errorf("unknown library %q (known: %v)", lib, allLibs)
}

type memolockPeer struct {
	rdb *redis.Client
	c   *memolock.Client
}

func (p *memolockPeer) get(ctx context.Context, key string, fetch func() ([]byte, error)) ([]byte, error) {
	return p.c.Get(ctx, key, func(context.Context, *memolock.Lease) ([]byte, time.Duration, error) {
		v, err := fetch()
		return v, valueTTL, err
	})
}

func (p *memolockPeer) close() {
	_ = p.c.Close()
	_ = p.rdb.Close()
}

type sfPeer struct {
	rdb *redis.Client
	g   singleflight.Group
}

func (p *sfPeer) get(ctx context.Context, key string, fetch func() ([]byte, error)) ([]byte, error) {
	k := redisKey(libSFGet, key)
	v, err, _ := p.g.Do(k, func() (any, error) {
		v, err := p.rdb.Get(ctx, k).Bytes()
		if !errors.Is(err, redis.Nil) {
			return v, err
		}
		if v, err = fetch(); err != nil {
			return nil, err
		}
		return v, p.rdb.Set(ctx, k, v, valueTTL).Err()
	})
	if err != nil {
		return nil, err
	}
	return v.([]byte), nil
}

func (p *sfPeer) close() { _ = p.rdb.Close() }

type tinyLFUPeer struct {
	rdb *redis.Client
	cd  *cache.Cache
}

func (p *tinyLFUPeer) get(ctx context.Context, key string, fetch func() ([]byte, error)) ([]byte, error) {
	var v []byte
	err := p.cd.Once(&cache.Item{
		Ctx:   ctx,
		Key:   redisKey(libTinyLFU, key),
		Value: &v,
		TTL:   valueTTL,
		Do:    func(*cache.Item) (any, error) { return fetch() },
	})
	return v, err
}

func (p *tinyLFUPeer) close() { _ = p.rdb.Close() }

type asidePeer struct {
	ca rueidisaside.CacheAsideClient
}

func (p *asidePeer) get(ctx context.Context, key string, fetch func() ([]byte, error)) ([]byte, error) {
	v, err := p.ca.Get(ctx, valueTTL, redisKey(libAside, key), func(context.Context, string) (string, error) {
		v, err := fetch()
		return string(v), err
	})
	return []byte(v), err
}

func (p *asidePeer) close() { p.ca.Close() }
