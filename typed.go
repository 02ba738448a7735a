package memolock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
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

// Typed gets values of type T through a Client, encoded by Codec (JSON when
// nil). Peers in other languages must use the same encoding. The zero value
// is not usable; set Client:
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

// Get is Client.Get for values of type T. Every caller, the holder's too,
// decodes its own copy from the stored bytes, so callers share no memory.
// An encoding error is a fetch error; a decoding error names the id. A panic
// in the codec is an error too.
func (t Typed[T]) Get(ctx context.Context, id string, fetch TypedFetchFunc[T]) (T, error) {
	var zero T
	if t.Client == nil {
		return zero, fmt.Errorf("%w: Typed.Client is nil", ErrInvalid)
	}
	if fetch == nil {
		return zero, fmt.Errorf("%w: fetch is nil", ErrInvalid)
	}
	codec := t.codec()
	data, err := t.Client.Get(ctx, id, func(ctx context.Context, l *Lease) ([]byte, time.Duration, error) {
		v, ttl, err := fetch(ctx, l)
		if err != nil {
			return nil, 0, err
		}
		data, err := codec.Marshal(v)
		if err != nil {
			return nil, 0, fmt.Errorf("memolock: encoding value of id %s: %w", quote(id), err)
		}
		return data, ttl, nil
	})
	if err != nil {
		return zero, err
	}
	var v T
	if p := callUser(func() { v, err = codec.Unmarshal(data) }); p != nil {
		err = fmt.Errorf("%w: %v", errCodecPanicked, p)
	}
	if err != nil {
		return zero, fmt.Errorf("memolock: decoding value of id %s: %w", quote(id), err)
	}
	return v, nil
}

var errCodecPanicked = errors.New("codec panicked")

func (t Typed[T]) codec() Codec[T] {
	if t.Codec == nil {
		return JSON[T]{}
	}
	return t.Codec
}
