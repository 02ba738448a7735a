package wire

import (
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDecodeAcquire_EveryShape(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  any
		want Reply
		ok   bool
	}{
		{"hit", "v", Reply{Kind: Hit, Value: []byte("v")}, true},
		{"a bulk 1 is a value", "1", Reply{Kind: Hit, Value: []byte("1")}, true},
		{"locked", int64(1), Reply{Kind: Locked, PTTL: -1}, true},
		{"not found", []any{int64(1500)}, Reply{Kind: NotFound, PTTL: 1500 * time.Millisecond}, true},
		{"refresh", []any{"v", int64(1)}, Reply{Kind: Refresh, Value: []byte("v")}, true},
		{"stale", []any{"v", int64(2)}, Reply{Kind: Hit, Value: []byte("v"), Resurrected: true}, true},
		{"hit with its TTL", []any{"v", int64(0), int64(2500)}, Reply{Kind: Hit, Value: []byte("v"), ValueTTL: 2500 * time.Millisecond, HasTTL: true}, true},
		{"hit without expiry", []any{"v", int64(0), int64(-1)}, Reply{Kind: Hit, Value: []byte("v"), ValueTTL: -time.Millisecond, HasTTL: true}, true},
		{"refresh with its TTL", []any{"v", int64(1), int64(90)}, Reply{Kind: Refresh, Value: []byte("v"), ValueTTL: 90 * time.Millisecond, HasTTL: true}, true},
		{"stale with its TTL", []any{"v", int64(2), int64(90)}, Reply{Kind: Hit, Value: []byte("v"), Resurrected: true, ValueTTL: 90 * time.Millisecond, HasTTL: true}, true},
		{"busy", []any{int64(700), "tok"}, Reply{Kind: Busy, PTTL: 700 * time.Millisecond, Holder: "tok"}, true},
		{"busy with a stale copy", []any{int64(700), "tok", "old"}, Reply{Kind: Busy, PTTL: 700 * time.Millisecond, Holder: "tok", Value: []byte("old")}, true},
		{"busy, lock gone meanwhile", []any{int64(-2), nil}, Reply{Kind: Busy}, true},
		{"a plain hit is never a table without its TTL", []any{"v", int64(0)}, Reply{}, false},
		{"unknown flag", []any{"v", int64(7)}, Reply{}, false},
		{"integer 2", int64(2), Reply{Kind: Locked, PTTL: -1}, false},
		{"nil", nil, Reply{}, false},
	} {
		got, ok := DecodeAcquire(tc.res)
		if ok != tc.ok || (ok && !equalReply(got, tc.want)) {
			t.Errorf("%s: DecodeAcquire(%#v) = %+v, %v; want %+v, %v", tc.name, tc.res, got, ok, tc.want, tc.ok)
		}
	}
}

func equalReply(a, b Reply) bool {
	return a.Kind == b.Kind && string(a.Value) == string(b.Value) && a.Resurrected == b.Resurrected &&
		a.PTTL == b.PTTL && a.Holder == b.Holder && a.ValueTTL == b.ValueTTL && a.HasTTL == b.HasTTL
}

// Sources lists every script the clients run, in both forms: a script
// added to Scripts, or to the package's variables, must be added there
// too, or memolock check would not know the commands it calls.
func TestSources_EveryScript(t *testing.T) {
	for _, shardedPubSub := range []bool{false, true} {
		listed := map[string]bool{}
		for _, src := range Sources(shardedPubSub) {
			listed[redis.NewScript(src).Hash()] = true
		}
		scripts := []*redis.Script{Acquire, Peek}
		v := reflect.ValueOf(*ScriptsFor(shardedPubSub))
		for i := 0; i < v.NumField(); i++ {
			if s, ok := v.Field(i).Interface().(*redis.Script); ok {
				scripts = append(scripts, s)
			}
		}
		if len(scripts) != len(listed) {
			t.Errorf("sharded %v: %d scripts, %d sources", shardedPubSub, len(scripts), len(listed))
		}
		for _, s := range scripts {
			if !listed[s.Hash()] {
				t.Errorf("sharded %v: script %s is not in Sources", shardedPubSub, s.Hash())
			}
		}
	}
}
