package memolock

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/memolock/memolock/internal/engine"
)

// A Codec turns values of type T into the bytes stored in Redis and back.
type Codec[T any] interface {
	Marshal(v T) ([]byte, error)
	Unmarshal(data []byte) (T, error)
}

// JSON is the default Codec: encoding/json.
type JSON[T any] struct{}

// Marshal encodes v as JSON.
func (JSON[T]) Marshal(v T) ([]byte, error) { return json.Marshal(v) }

// Unmarshal decodes JSON into a new T.
func (JSON[T]) Unmarshal(data []byte) (T, error) {
	var v T
	err := json.Unmarshal(data, &v)
	return v, err
}

// Typed is the Client for values of type T, encoded by Codec (JSON when
// nil): every call of Client that takes or returns a value has its typed
// twin here, so a typed caller never encodes or decodes by hand. Peers in
// other languages must use the same encoding. Every caller decodes its own
// copy from the stored bytes, so callers share no memory. An encoding error
// is a fetch error (a Set error for Set); a decoding error names the id; a
// panic in the codec is an error too. The zero value is not usable; set
// Client:
//
//	users := memolock.Typed[User]{Client: c}
//	u, err := users.Get(ctx, "42", func(ctx context.Context, _ *memolock.Lease) (User, time.Duration, error) {
//		return loadUser(ctx, 42)
//	})
type Typed[T any] struct {
	Client *Client
	Codec  Codec[T]
}

// TypedFetchFunc is FetchFunc for values of type T.
type TypedFetchFunc[T any] func(ctx context.Context, lease *Lease) (value T, ttl time.Duration, err error)

// TypedFetchIDFunc is FetchIDFunc for values of type T.
type TypedFetchIDFunc[T any] func(ctx context.Context, id string, lease *Lease) (value T, ttl time.Duration, err error)

// TypedResult is a value of type T and how it was served.
type TypedResult[T any] struct {
	Value  T
	Served Served
}

// Get is Client.Get for values of type T.
func (t Typed[T]) Get(ctx context.Context, id string, fetch TypedFetchFunc[T]) (T, error) {
	r, err := t.GetResult(ctx, id, fetch)
	return r.Value, err
}

// GetResult is Client.GetResult for values of type T: the value, and how
// it was served (ServedStale for a stale copy).
func (t Typed[T]) GetResult(ctx context.Context, id string, fetch TypedFetchFunc[T]) (TypedResult[T], error) {
	if err := t.usable(); err != nil {
		return TypedResult[T]{}, err
	}
	if fetch == nil {
		return TypedResult[T]{}, t.Client.refused(errNilFetch)
	}
	r, err := t.Client.GetResult(ctx, id, func(ctx context.Context, l *Lease) ([]byte, time.Duration, error) {
		v, ttl, err := fetch(ctx, l)
		if err != nil {
			return nil, 0, err
		}
		data, err := t.encode(id, v)
		return data, ttl, err
	})
	return t.result(id, r, err)
}

// GetExternal is Client.GetExternal for values of type T: the external
// producer stores the value encoded with the same Codec.
func (t Typed[T]) GetExternal(ctx context.Context, id string, start StartFunc) (T, error) {
	var zero T
	if err := t.usable(); err != nil {
		return zero, err
	}
	data, err := t.Client.GetExternal(ctx, id, start)
	if err != nil {
		return zero, err
	}
	return t.decode(id, data)
}

// Lookup is Client.Lookup for values of type T.
func (t Typed[T]) Lookup(ctx context.Context, id string) (TypedResult[T], error) {
	if err := t.usable(); err != nil {
		return TypedResult[T]{}, err
	}
	r, err := t.Client.Lookup(ctx, id)
	return t.result(id, r, err)
}

// Set is Client.Set for values of type T.
func (t Typed[T]) Set(ctx context.Context, id string, v T, ttl time.Duration) error {
	if err := t.usable(); err != nil {
		return err
	}
	data, err := t.encode(id, v)
	if err != nil {
		return err
	}
	return t.Client.Set(ctx, id, data, ttl)
}

// Delete is Client.Delete.
func (t Typed[T]) Delete(ctx context.Context, id string) (bool, error) {
	if err := t.usable(); err != nil {
		return false, err
	}
	return t.Client.Delete(ctx, id)
}

// TypedPeeked is Peeked with the value decoded.
type TypedPeeked[T any] struct {
	Peeked
	Value T // decoded when Peeked.Found
}

// Peek is Client.Peek for values of type T: the value is decoded when
// there is one.
func (t Typed[T]) Peek(ctx context.Context, id string) (TypedPeeked[T], error) {
	if err := t.usable(); err != nil {
		return TypedPeeked[T]{}, err
	}
	p, err := t.Client.Peek(ctx, id)
	if err != nil || !p.Found {
		return TypedPeeked[T]{Peeked: p}, err
	}
	v, err := t.decode(id, p.Value)
	return TypedPeeked[T]{Peeked: p, Value: v}, err
}

// TypedItem is GetMany's answer for one id, for values of type T.
type TypedItem[T any] struct {
	ID     string
	Value  T
	Served Served
	Err    error // this id's error alone, a decoding error included
}

// TypedBatchValue is BatchValue for values of type T.
type TypedBatchValue[T any] struct {
	Value T
	TTL   time.Duration
	Err   error
}

// TypedBatchFunc is BatchFetchFunc for values of type T.
type TypedBatchFunc[T any] func(ctx context.Context, ids []string) (map[string]TypedBatchValue[T], error)

// TypedManyOptions is ManyOptions for values of type T.
type TypedManyOptions[T any] struct {
	Concurrency int               // see ManyOptions.Concurrency
	Batch       TypedBatchFunc[T] // see ManyOptions.Batch
}

// GetMany is Client.GetMany for values of type T.
func (t Typed[T]) GetMany(ctx context.Context, ids []string, fetch TypedFetchIDFunc[T], opts *TypedManyOptions[T]) ([]TypedItem[T], error) {
	if err := t.usable(); err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &TypedManyOptions[T]{}
	}
	mo := &ManyOptions{Concurrency: opts.Concurrency, Batch: t.batch(opts.Batch)}
	var raw FetchIDFunc
	if fetch != nil {
		raw = func(ctx context.Context, id string, l *Lease) ([]byte, time.Duration, error) {
			v, ttl, err := fetch(ctx, id, l)
			if err != nil {
				return nil, 0, err
			}
			data, err := t.encode(id, v)
			return data, ttl, err
		}
	}
	items, err := t.Client.GetMany(ctx, ids, raw, mo)
	if err != nil {
		return nil, err
	}
	out := make([]TypedItem[T], len(items))
	for i, it := range items {
		out[i] = TypedItem[T]{ID: it.ID, Served: it.Served, Err: it.Err}
		if it.Err == nil {
			out[i].Value, out[i].Err = t.decode(it.ID, it.Value)
		}
	}
	return out, nil
}

// batch encodes what a typed batch function returns.
func (t Typed[T]) batch(b TypedBatchFunc[T]) BatchFetchFunc {
	if b == nil {
		return nil
	}
	return func(ctx context.Context, ids []string) (map[string]BatchValue, error) {
		vals, err := b(ctx, ids)
		if err != nil {
			return nil, err
		}
		out := make(map[string]BatchValue, len(vals))
		for id, v := range vals {
			bv := BatchValue{TTL: v.TTL, Err: v.Err}
			if v.Err == nil {
				bv.Value, bv.Err = t.encode(id, v.Value)
			}
			out[id] = bv
		}
		return out, nil
	}
}

func (t Typed[T]) usable() error {
	if t.Client == nil {
		return fmt.Errorf("%w: Typed.Client is nil", ErrInvalid)
	}
	return nil
}

// result decodes a Result's value.
func (t Typed[T]) result(id string, r Result, err error) (TypedResult[T], error) {
	if err != nil {
		return TypedResult[T]{Served: r.Served}, err
	}
	v, err := t.decode(id, r.Value)
	if err != nil {
		return TypedResult[T]{}, err
	}
	return TypedResult[T]{Value: v, Served: r.Served}, nil
}

// encode encodes v, through the callback runner's inline form: a codec
// that panics gives an error.
func (t Typed[T]) encode(id string, v T) ([]byte, error) {
	var data []byte
	err := engine.Inline("the codec's Marshal", "encoding", id, func() (err error) {
		data, err = t.codec().Marshal(v)
		return err
	})
	if err != nil {
		return nil, err
	}
	return data, nil
}

// decode decodes data, through the callback runner's inline form: a codec
// that panics gives an error.
func (t Typed[T]) decode(id string, data []byte) (T, error) {
	var v T
	err := engine.Inline("the codec's Unmarshal", "decoding", id, func() (err error) {
		v, err = t.codec().Unmarshal(data)
		return err
	})
	if err != nil {
		var zero T
		return zero, err
	}
	return v, nil
}

func (t Typed[T]) codec() Codec[T] {
	if t.Codec == nil {
		return JSON[T]{}
	}
	return t.Codec
}
