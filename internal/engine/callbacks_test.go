package engine

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// nilPointerError's methods dereference their receiver, as most do: a nil
// *nilPointerError returned as an error panics in Error and Is.
type nilPointerError struct{ code int }

func (e *nilPointerError) Error() string        { return "code " + string(rune('0'+e.code)) }
func (e *nilPointerError) Is(target error) bool { return e.code == 1 && target == nil }

// isPanicsFor's Is panics for one target only.
type isPanicsFor struct{ target error }

func (e isPanicsFor) Error() string { return "fine to print" }
func (e isPanicsFor) Is(target error) bool {
	if target == e.target {
		panic("Is asked about " + target.Error())
	}
	return false
}

// asPanics's As panics.
type asPanics struct{}

func (asPanics) Error() string { return "fine to print" }
func (asPanics) As(any) bool   { panic("As called") }

func TestTame(t *testing.T) {
	plain := errors.New("database down")
	if got := tame("fetch", nil); got != nil {
		t.Errorf("tame(nil) = %v", got)
	}
	if got := tame("fetch", plain); got != plain {
		t.Errorf("tame(plain) = %v, want it unchanged", got)
	}
	wrapped := errors.Join(errors.New("first"), isPanicsFor{target: errors.New("never asked")})
	if got := tame("fetch", wrapped); got != wrapped {
		t.Errorf("tame(an error whose Is panics only for a target the engine never asks) = %v, want it unchanged", got)
	}
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"nil pointer", (*nilPointerError)(nil), "*engine.nilPointerError"},
		{"nil pointer, wrapped", errors.Join(plain, (*nilPointerError)(nil)), "*errors.joinError"},
		{"Is panics for ErrNotFound", isPanicsFor{target: ErrNotFound}, "engine.isPanicsFor"},
		{"Is panics for context.Canceled", isPanicsFor{target: context.Canceled}, "engine.isPanicsFor"},
		{"As panics", asPanics{}, "engine.asPanics"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := tame("batch fetch", tc.err)
			if !errors.Is(got, ErrPanicked) {
				t.Fatalf("tame = %v, want an error wrapping ErrPanicked", got)
			}
			if msg := got.Error(); !strings.Contains(msg, tc.want) || !strings.Contains(msg, "batch fetch returned") {
				t.Errorf("tame's error %q should name the callback and the type %s", msg, tc.want)
			}
			// The tamed error leaves the original out of its chain: asking
			// it anything is safe.
			for _, target := range askedOfCallbackErrors {
				_ = errors.Is(got, target)
			}
			var u *unreachableError
			_ = errors.As(got, &u)
		})
	}
}

// bomb's Error panics with a bomb: fmt recovers the first panic, and
// re-panics on the second, inside its own recovery.
type bomb struct{}

func (bomb) Error() string { panic(bomb{}) }

// A panic value, or an error, whose Error panics while it is being
// described, still becomes an error wrapping ErrPanicked: nothing escapes
// to the engine's goroutines, where it would kill the process.
func TestDescribeSurvivesAPanickingPanicValue(t *testing.T) {
	if err := tame("fetch", bomb{}); !errors.Is(err, ErrPanicked) || !strings.Contains(err.Error(), "engine.bomb") {
		t.Errorf("tame(bomb) = %v, want an error wrapping ErrPanicked naming engine.bomb", err)
	}
	if err := panicError(bomb{}); !errors.Is(err, ErrPanicked) || !strings.Contains(err.Error(), "a engine.bomb whose Error or String method panics") {
		t.Errorf("panicError(bomb) = %v", err)
	}
	if got := describe("boom"); got != "boom" {
		t.Errorf("describe(\"boom\") = %q", got)
	}
}
