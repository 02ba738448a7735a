package pubsub

import (
	"errors"
	"testing"
)

func TestSlotIsRedisClusterKeySlot(t *testing.T) {
	// Values from CLUSTER KEYSLOT on redis-server 7.0.
	for key, want := range map[string]int{
		"a": 15495, "foo": 12182, "bar": 5061, "{user1000}.following": 3443,
		"{}x": 10595, "x{}": 2608, "x{b}y{c}": 3300, "{a}n": 15495, "n{a}": 15495,
	} {
		if got := slot(key); got != want {
			t.Errorf("slot(%q) = %d, want %d", key, got, want)
		}
	}
	if hashTag("{}x") != "{}x" || hashTag("{a") != "{a" || hashTag("x{b}y{c}") != "b" {
		t.Error("hashTag does not follow Redis's rule")
	}
}

func TestWatchOfNoChannelsCarriesAnError(t *testing.T) {
	f := newFakeRedis()
	s := fakeSubscriber(t, f, false, Config{})
	w := s.Watch(nil)
	if err := w.Take().Err; !errors.Is(err, errNoChannels) {
		t.Fatalf("a watch of no channels: %v", err)
	}
	w.Stop()
	if f.opened() != 0 {
		t.Fatal("a watch of no channels opened a connection")
	}
}
