module github.com/memolock/memolock

go 1.24.0

require (
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/maypok86/otter/v2 v2.4.0
	github.com/petermattis/goid v0.0.0-20261109124353-7cfa343ad0ab
	github.com/redis/go-redis/v9 v9.22.0
	go.opentelemetry.io/otel v1.40.0
	go.opentelemetry.io/otel/metric v1.40.0
	go.opentelemetry.io/otel/sdk v1.40.0
	go.opentelemetry.io/otel/sdk/metric v1.40.0
	go.opentelemetry.io/otel/trace v1.40.0
	go.uber.org/goleak v1.3.0
	golang.org/x/sync v0.18.0
	golang.org/x/sys v0.40.0
	golang.org/x/term v0.39.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.uber.org/atomic v1.11.0 // indirect
)
