package pubsub

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// go-redis logs every failed dial; the fault tests make many on purpose.
	redis.SetLogger(quietLogger{})
	goleak.VerifyTestMain(m)
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// replyError is an error reply from Redis, as go-redis returns it.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

var (
	errBusy    = replyError("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.")
	errLoading = replyError("LOADING Redis is loading the dataset in memory")
	errNoPerm  = replyError("NOPERM this user has no permissions to access one of the channels used as arguments")
	errMoved   = replyError("MOVED 3999 127.0.0.1:7001")
)
